#!/usr/bin/env python3
"""Runs a build's meson tests from its introspection data, without meson.

The GPU machine has neither this project's meson nor its build's sources of
truth (meson-private), only the build folder carried to it, at another path.
This reads BUILD/meson-info/intro-tests.json, maps the paths recorded at
configure time onto where the source and build folders are now, and runs
the tests the way `meson test` would (in the build folder unless a test
names its own): exit 0 passes, 77 skips, anything
else or the time limit fails; tests marked parallel run alongside others.

usage: run_tests.py BUILD [--suite S ...] [--no-suite S ...] [--exclude NAME ...]
                    [--jobs N] [--budget SECONDS] [--log FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def load(build):
    info = os.path.join(build, "meson-info")
    with open(os.path.join(info, "meson-info.json")) as f:
        dirs = json.load(f)["directories"]
    with open(os.path.join(info, "intro-tests.json")) as f:
        tests = json.load(f)
    root = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    # The build folder first: it lies inside the source folder when configured.
    maps = [(dirs["build"], os.path.realpath(build)), (dirs["source"], root)]

    def remap(s):
        for old, new in maps:
            if s == old or s.startswith(old + "/"):
                return new + s[len(old):]
        return s

    for t in tests:
        t["cmd"] = [remap(a) for a in t["cmd"]]
        t["env"] = {k: remap(v) for k, v in t["env"].items()}
        if t.get("workdir"):
            t["workdir"] = remap(t["workdir"])
    return tests


def suites(t):
    # meson names suites "project:suite"; both spellings select.
    out = set()
    for s in t["suite"]:
        out.add(s)
        out.update(s.split(":")[1:])
    return out


def run(t, deadline, build):
    limit = max(1, min(t["timeout"] or 600, deadline - time.monotonic()))
    env = dict(os.environ)
    for k, v in t["env"].items():
        # meson prepends the build's library folders to the caller's path.
        env[k] = v + ":" + env[k] if k.endswith("PATH") and env.get(k) else v
    start = time.monotonic()
    try:
        p = subprocess.run(t["cmd"], env=env, cwd=t.get("workdir") or build, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=limit)
        rc, out = p.returncode, p.stdout
        verdict = "OK" if rc == 0 else "SKIP" if rc == 77 else "FAIL"
    except subprocess.TimeoutExpired as e:
        rc, out, verdict = None, e.stdout or b"", "TIMEOUT"
    return verdict, rc, time.monotonic() - start, out.decode("utf-8", "replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--no-suite", action="append", default=[])
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--budget", type=float, default=1800)
    ap.add_argument("--log")
    a = ap.parse_args()

    tests = [t for t in load(a.build)
             if (not a.suite or suites(t) & set(a.suite)) and not suites(t) & set(a.no_suite)
             and t["name"] not in a.exclude]
    deadline = time.monotonic() + a.budget
    log = open(a.log, "w") if a.log else None
    counts = {}
    width = len(str(len(tests)))
    done = 0

    def report(t, res):
        nonlocal done
        verdict, rc, dur, out = res
        done += 1
        counts[verdict] = counts.get(verdict, 0) + 1
        line = f"{done:>{width}}/{len(tests)} {t['name']:45} {verdict:8} {dur:6.1f}s"
        if verdict == "FAIL":
            line += f"  (exit {rc})"
        print(line, flush=True)
        if log:
            log.write(f"==== {t['name']}: {verdict} {dur:.1f}s\n$ {' '.join(t['cmd'])}\n{out}\n")
            log.flush()
        if verdict in ("FAIL", "TIMEOUT"):
            tail = out.splitlines()[-25:]
            print("\n".join("    " + s for s in tail), flush=True)

    def go(t):
        if time.monotonic() >= deadline:
            return "TIMEOUT", None, 0.0, "not started: out of budget"
        return run(t, deadline, os.path.realpath(a.build))

    # Parallel tests run in a pool beside the serial ones, as meson does.
    parallel = [t for t in tests if t["is_parallel"]]
    serial = [t for t in tests if not t["is_parallel"]]
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = [(t, pool.submit(go, t)) for t in parallel]
        for t in serial:
            report(t, go(t))
        for t, f in futures:
            report(t, f.result())
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"summary: {summary}")
    return 0 if not counts.get("FAIL") and not counts.get("TIMEOUT") else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""meson test: bench/summarize.py's copy tables on a trimmed bench_ordo run
(copies_fixture.json). Every share it prints is recomputed here from the
fixture's own numbers, so a wrong ratio, a missing path or a floor shown for
a pinned path fails."""
import json
import os
import re
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
fixture = os.path.join(here, "copies_fixture.json")
out = subprocess.run([sys.executable, os.path.join(here, "summarize.py"), fixture],
                     check=True, capture_output=True, text=True).stdout

rates, lat = {}, {}
for b in json.load(open(fixture))["benchmarks"]:
    if b.get("run_type") == "aggregate":
        continue
    name = re.sub(r"/(min_time:[0-9.]+|real_time|manual_time)", "", b["name"])
    if "bytes_per_second" in b:
        rates[name] = max(rates.get(name, 0), b["bytes_per_second"] / 1e9)
    elif name == "ordo/sync_null_call":
        ns = b["real_time"] * {"ns": 1, "us": 1e3}[b["time_unit"]]
        lat[name] = min(lat.get(name, ns), ns)

sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
fails = []


def row(path):
    m = re.search(r"^\| `" + re.escape(path) + r"` \|(.*)\|$", out, re.M)
    return [c.strip() for c in m.group(1).split("|")] if m else None


paths = sorted({re.sub(r"/[0-9]+$", "", n) for n in rates if n.startswith("copy/")})
if len(paths) < 4:
    fails.append(f"the fixture holds {len(paths)} copy paths; it should hold pinned and pageable, both ways")
checked = 0
for path in paths:
    cells = row(path)
    if cells is None:
        fails.append(f"no row for {path}")
        continue
    if len(cells) != len(sizes):
        fails.append(f"{path}: {len(cells)} cells for {len(sizes)} sizes")
        continue
    for n, c in zip(sizes, cells):
        name = f"{path}/{n}"
        if name not in rates:
            if c != "-":
                fails.append(f"{name}: '{c}' for a size the fixture lacks")
            continue
        if path.startswith("copy/null/pinned_"):  # no byte moves: a rate without a share
            if not re.match(r"[0-9.,]+$", c):
                fails.append(f"{name}: cell '{c}' shows a share for a copy that moves nothing")
            checked += 1
            continue
        m = re.match(r"([0-9.,]+) \(([0-9]+)%\)(?: \[([0-9]+)%\])?$", c)
        if not m:
            fails.append(f"{name}: cell '{c}' is not 'GB/s (share%)'")
            continue
        share = 100 * rates[name] / rates[f"baseline/memcpy/{n}"]
        if abs(int(m.group(2)) - share) > 0.51:
            fails.append(f"{name}: share {m.group(2)}% printed, {share:.1f}% in the fixture")
        floor = rates.get(f"baseline/staged_memcpy_{path[-3:]}/{n}")
        if "/pageable_" in path and floor:
            if m.group(3) is None or abs(int(m.group(3)) - 100 * rates[name] / floor) > 0.51:
                fails.append(f"{name}: floor share '{m.group(3)}' printed, {100 * rates[name] / floor:.1f}% expected")
        elif m.group(3) is not None:
            fails.append(f"{name}: a staged-floor share for a path that has no floor")
        checked += 1

for path in paths:
    if f"{path}/4096" not in rates:
        continue
    m = re.search(r"^\| `" + re.escape(path) + r"/4096` \| ([0-9.,]+) \| ([0-9.]+) \|$", out, re.M)
    want = 4096 / rates[f"{path}/4096"] / lat["ordo/sync_null_call"]
    if not m:
        fails.append(f"no 4 KiB latency row for {path}")
    elif abs(float(m.group(2)) - want) > 0.006:
        fails.append(f"{path}/4096: latency ratio {m.group(2)} printed, {want:.3f} expected")
    else:
        checked += 1

if fails:
    print(out)
    print("FAIL:\n  " + "\n  ".join(fails))
    sys.exit(1)
print(f"PASS: {checked} copy ratios checked")

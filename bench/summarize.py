#!/usr/bin/env python3
"""Markdown tables and target ratios from bench_ordo JSON runs.

  build/bench/bench_ordo --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \\
      --benchmark_out=run1.json --benchmark_out_format=json
  bench/summarize.py run1.json [run2.json ...]

Copies get a table per run: each path as a share of memcpy of the same size
(pageable ones also of the staged floor), and 4 KiB latency against the sync
null call.

One column per run, so the spread between runs is visible next to the numbers.
With repetitions a cell is "best (median)": best is the fastest repetition, the
one least disturbed by other load on a shared machine. Paired benchmarks report
their own ratios per repetition; those cells are "median [min-max]".
"""
import json
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        d = json.load(f)
    reps = {}
    for b in d["benchmarks"]:
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue
        name = re.sub(r"/(min_time:[0-9.]+|real_time|manual_time)", "", b["name"])
        reps.setdefault(name, []).append(b)
    # Registration order, also when --benchmark_enable_random_interleaving shuffled the runs.
    order = sorted(reps, key=lambda n: (reps[n][0]["family_index"], reps[n][0]["per_family_instance_index"]))
    return d["context"], {n: reps[n] for n in order}


def value(b):
    """(number, unit) that the table shows for one benchmark."""
    if "bytes_per_second" in b:
        return b["bytes_per_second"] / 1e9, "GB/s"
    if "ns_per_call" in b:
        return b["ns_per_call"], "ns/call"
    if "items_per_second" in b:
        return b["items_per_second"] / 1e6, "M items/s"
    scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
    return b["real_time"] * scale, "ns/pass" if "idle_pass" in b["name"] else "ns/round trip"


def fmt(x):
    return f"{x:,.2f}" if x < 10 else f"{x:,.0f}"


def best_median(reps):
    vals = sorted(value(b)[0] for b in reps)
    best = vals[-1] if value(reps[0])[1].endswith("/s") else vals[0]
    return best, vals[len(vals) // 2]


def cell(reps):
    best, median = best_median(reps)
    return fmt(best) if len(reps) == 1 else f"{fmt(best)} ({fmt(median)})"


def spread(vals):
    if not vals:
        return "-"
    m = statistics.median(vals)
    return fmt(m) if len(vals) == 1 else f"{fmt(m)} [{fmt(min(vals))}-{fmt(max(vals))}]"


def counter(rows, name, key):
    return [b[key] for b in rows.get(name, []) if key in b]


def ratio(rows, num, den):
    a, b = rows.get(num), rows.get(den)
    if not a or not b:
        return "-"
    return f"{best_median(a)[0] / best_median(b)[0]:.2f}"


PAIRED = [
    ("paired/sync_vs_pingpong", [("sync RT ns", "sync_rt_ns"), ("ping-pong RT ns", "pingpong_rt_ns"),
                                 ("sync / ping-pong", "sync_over_pingpong")]),
    ("paired/ordering/independent", [("on M/s", "on_Mitems_s"), ("off M/s", "off_Mitems_s"),
                                     ("on / off", "on_over_off")]),
    ("paired/ordering/mixed_legacy", [("on M/s", "on_Mitems_s"), ("off M/s", "off_Mitems_s"),
                                      ("on / off", "on_over_off")]),
    ("paired/ordering/independent_control_on_vs_on", [("on / on (control)", "on_over_off")]),
]


COPY_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def size_name(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def copies(runs):
    """Issue 12's copy ratios, per run: each path's rate as a share of memcpy of
    the same size (and of the staged floor, two pinned threads copying through
    staging blocks), and a 4 KiB copy's latency against the sync null call."""
    for i, (_, rows) in enumerate(runs):
        paths = sorted({re.sub(r"/[0-9]+$", "", n) for n in rows if n.startswith("copy/")})
        if not paths or not any(f"baseline/memcpy/{n}" in rows for n in COPY_SIZES):
            continue
        rate = lambda name: best_median(rows[name])[0] if name in rows else None
        print(f"Copies, run {i + 1}: GB/s (best), share of memcpy of the same size"
              " [share of the staged floor]")
        print()
        print("| path | " + " | ".join(size_name(n) for n in COPY_SIZES) + " |")
        print("|---|" + "---|" * len(COPY_SIZES))
        base = {n: rate(f"baseline/memcpy/{n}") for n in COPY_SIZES}
        print("| `baseline/memcpy` | " + " | ".join(fmt(base[n]) if base[n] else "-" for n in COPY_SIZES) + " |")
        for path in ["baseline/staged_memcpy_h2d", "baseline/staged_memcpy_d2h"] + paths:
            cells = []
            for n in COPY_SIZES:
                r = rate(f"{path}/{n}")
                if r is None:
                    cells.append("-")
                    continue
                # The null backend moves no byte of a pinned copy: a rate, no share.
                moved = not path.startswith("copy/null/pinned_")
                c = fmt(r) + (f" ({100 * r / base[n]:.0f}%)" if base[n] and moved else "")
                floor = rate(f"baseline/staged_memcpy_{path[-3:]}/{n}")
                if "/pageable_" in path and floor:
                    c += f" [{100 * r / floor:.0f}%]"
                cells.append(c)
            if any(c != "-" for c in cells):
                print(f"| `{path}` | " + " | ".join(cells) + " |")
        print()
        sync = rows.get("ordo/sync_null_call")
        small = [p for p in paths if f"{p}/4096" in rows]
        if sync and small:
            sync_ns = best_median(sync)[0]
            print("| 4 KiB copy latency | ns | / sync null call |")
            print("|---|---|---|")
            print(f"| `ordo/sync_null_call` | {fmt(sync_ns)} | 1.00 |")
            for p in small:
                ns = 4096 / rate(f"{p}/4096")  # a copy's rate is bytes over its round trip
                print(f"| `{p}/4096` | {fmt(ns)} | {ns / sync_ns:.2f} |")
            print()


def main(paths):
    runs = [load(p) for p in paths]
    cols = " | ".join(f"run {i + 1}" for i in range(len(runs)))
    print(f"| benchmark | unit | {cols} |")
    print("|---|---|" + "---|" * len(runs))
    for name, b in runs[0][1].items():
        if name.startswith("paired/"):
            continue
        cells = [cell(r[name]) if name in r else "-" for _, r in runs]
        print(f"| `{name}` | {value(b[0])[1]} | " + " | ".join(cells) + " |")
    print()
    print(f"| paired benchmark | counter | {cols} |")
    print("|---|---|" + "---|" * len(runs))
    for name, keys in PAIRED:
        for label, key in keys:
            print(f"| `{name}` | {label} | " + " | ".join(spread(counter(r, name, key)) for _, r in runs) + " |")
    print()
    copies(runs)
    checks = [
        ("sync RT / ping-pong RT, separate benchmarks (target <= 2)",
         "ordo/sync_null_call", "baseline/cacheline_pingpong"),
        ("unix socket RT / sync RT (target >= 10)", "baseline/unix_socket_roundtrip", "ordo/sync_null_call"),
        ("spsc_queue RT / ping-pong RT", "baseline/spsc_queue_roundtrip", "baseline/cacheline_pingpong"),
    ]
    for group in ("independent", "mixed_legacy"):
        for t in (1, 2):
            checks.append((f"{group}, {t} thread(s): edges_on / edges_off items/s",
                           f"ordo/ordering/{group}/edges_on/threads:{t}",
                           f"ordo/ordering/{group}/edges_off/threads:{t}"))
    print(f"| ratio (best of each) | {cols} |")
    print("|---|" + "---|" * len(runs))
    for label, num, den in checks:
        print(f"| {label} | " + " | ".join(ratio(rows, num, den) for _, rows in runs) + " |")
    print()
    for i, (ctx, _) in enumerate(runs):
        print(f"run {i + 1}: {ctx.get('date')}, {ctx.get('num_cpus')} CPUs, pinned: {ctx.get('pinned', '?')}, "
              f"load average {', '.join(f'{x:.2f}' for x in ctx.get('load_avg', []))}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Native vs remoted rows from bench_cuda's Google Benchmark JSON output.

usage: summarize_bench.py bench_cuda.json
"""
import json
import sys


def metric(b):
    """(value, unit) for a benchmark row: rate for launches and copies, time for syncs."""
    if "bytes_per_second" in b:
        return b["bytes_per_second"] / 1e9, "GB/s"
    if "items_per_second" in b:
        return b["items_per_second"] / 1e6, "M launches/s"
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
    return b["real_time"] * scale, "us"


def main():
    with open(sys.argv[1]) as f:
        data = json.load(f)
    rows = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue
        name = b["name"]
        side = ("Native" if "/Native" in name else "RemoteOneDispatch" if "/RemoteOneDispatch" in name
                else "Remote" if "/Remote" in name else None)
        if side is None:
            continue
        key = name.replace("/" + side, "").replace("/real_time", "")
        rows.setdefault(key, {})[side] = metric(b)
    # RemoteOneDispatch: ordo with one dispatch thread, the baseline of the
    # default's several (launch rows only).
    print(f"{'benchmark':44} {'native':>12} {'ordo':>12} {'ordo, 1 disp':>12}  unit          ordo/native  1 disp/native")
    for key, sides in rows.items():
        n, r, one = sides.get("Native"), sides.get("Remote"), sides.get("RemoteOneDispatch")
        unit = (n or r or one)[1]
        ratio = lambda v: f"{v[0] / n[0]:.2f}" if n and v and n[0] else "-"
        fmt = lambda v: f"{v[0]:12.3f}" if v else f"{'-':>12}"
        print(f"{key:44} {fmt(n)} {fmt(r)} {fmt(one)}  {unit:13} {ratio(r):11}  {ratio(one)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Data files for bench/plot.sh from bench_ordo or bench_cuda JSON runs.

  bench/plot_data.py DATA_DIR MACHINE RUN.json [RUN.json ...]

Writes DATA_DIR/{latency,throughput,ordering,tracing,copies_h2d,copies_d2h,copies_sim_h2d,copies_sim_d2h}.dat
for the plots whose
benchmarks are present (a message on stderr for each one that is not), and
DATA_DIR/vars.gp with the note and axis ranges. A value is the median aggregate
of a file where it has repetitions, else the mean of its runs; over several
files, the median of the per-file values. Whiskers span every run of every file,
so they show the spread that a single number hides on a shared machine.
"""
import json
import os
import re
import statistics
import sys
from datetime import datetime


def metric(b, key):
    """One number from one benchmark entry: a counter, or real time in ns."""
    if key != "ns":
        return b.get(key)
    return b["real_time"] * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]


def load(path):
    """{name: (median aggregate or None, [runs])} for one file, and its context."""
    with open(path) as f:
        d = json.load(f)
    out = {}
    for b in d["benchmarks"]:
        if b.get("error_occurred"):
            continue
        # Names carry min_time and time-mode parts that differ between builds and flags.
        name = re.sub(r"/(min_time:[0-9.]+|real_time|manual_time)", "", b.get("run_name", b["name"]))
        entry = out.setdefault(name, [None, []])
        if b.get("run_type") != "aggregate":
            entry[1].append(b)
        elif b.get("aggregate_name") == "median":
            entry[0] = b
    return d["context"], out


class Runs:
    def __init__(self, paths):
        self.files = [load(p) for p in paths]
        self.context = self.files[0][0]

    def get(self, name, key):
        """(value, min, max) of one metric, or None when no file has it."""
        centers, every = [], []
        for _, rows in self.files:
            if name not in rows:
                continue
            median, runs = rows[name]
            vals = [v for v in (metric(b, key) for b in runs) if v is not None]
            if median is not None and metric(median, key) is not None:
                centers.append(metric(median, key))
            elif vals:
                centers.append(statistics.mean(vals))
            every += vals
        if not centers:
            return None
        c = statistics.median(centers)
        return c, min(every, default=c), max(every, default=c)


def write(data_dir, name, lines, why_missing):
    if not lines:
        print(f"plot: skipping {name}: {why_missing}", file=sys.stderr)
        return
    with open(os.path.join(data_dir, name + ".dat"), "w") as f:
        f.write("\n".join(lines) + "\n")


def latency(r, data_dir, gp):
    sync = r.get("ordo/sync_null_call", "ns")
    bars = [("ordo null_call", sync)]
    for label, name in [("ping-pong floor", "baseline/cacheline_pingpong"),
                        ("spsc_queue RT", "baseline/spsc_queue_roundtrip"),
                        ("Unix socket", "baseline/unix_socket_roundtrip")]:
        v = r.get(name, "ns")
        if v:
            bars.append((label, v))
    if not sync or len(bars) < 2:
        return write(data_dir, "latency", [], "needs ordo/sync_null_call and a baseline")
    lines = ["# label median_ns min_ns max_ns ratio_to_ordo_sync"]
    lines += [f'"{l}" {v[0]:.6g} {v[1]:.6g} {v[2]:.6g} {v[0] / sync[0]:.4g}' for l, v in bars]
    write(data_dir, "latency", lines, "")
    gp.append(f"lat_ymin = {min(v[1] for _, v in bars) / 3:.6g}")
    gp.append(f"lat_ymax = {max(v[2] for _, v in bars) * 6:.6g}")
    paired = r.get("paired/sync_vs_pingpong", "sync_over_pingpong")
    gp.append('lat_paired = "' + (f"paired phases, same run: sync / ping-pong = {paired[0]:.2f}"
                                  f" (reps {paired[1]:.2f}-{paired[2]:.2f})" if paired else "") + '"')


def throughput(r, data_dir, gp):
    # One block per series; its first line is the title (columnheader in gnuplot).
    blocks = []
    for title, family in [("independent streams", "ordo/throughput/independent"),
                          ("one shared stream", "ordo/throughput/shared_stream"),
                          ("sim backend, independent (reference)", "sim_backend/throughput/independent")]:
        pts = [(t, r.get(f"{family}/threads:{t}", "items_per_second")) for t in (1, 2, 4, 8, 16, 32)]
        pts = [f"{t} {v[0] / 1e6:.4g} {v[1] / 1e6:.4g} {v[2] / 1e6:.4g}" for t, v in pts if v]
        if pts:
            blocks.append("\n".join([f'"{title}"'] + pts))
    write(data_dir, "throughput", ["\n\n\n".join(blocks)] if blocks else [], "no ordo/throughput/* benchmarks")
    gp.append(f"tput_n = {len(blocks)}")


def pairs(data_dir, name, rows, why):
    """Clustered bars: label, A and B with their spreads, and the A/B label."""
    lines = []
    for label, a, b, ratio_text in rows:
        if a and b:
            lines.append(f'"{label}" {a[0]:.4g} {a[1]:.4g} {a[2]:.4g} {b[0]:.4g} {b[1]:.4g} {b[2]:.4g} "{ratio_text}"')
    write(data_dir, name, lines, why)


def ordering(r, data_dir):
    rows = []
    for label, name, text in [("independent streams", "paired/ordering/independent", "on/off"),
                              ("mixed legacy + blocking", "paired/ordering/mixed_legacy", "on/off"),
                              ("A/A control (on vs on)", "paired/ordering/independent_control_on_vs_on", "on/on")]:
        on, off, ratio = (r.get(name, k) for k in ("on_Mitems_s", "off_Mitems_s", "on_over_off"))
        if ratio:
            rows.append((label, on, off, f"{text} = {ratio[0]:.2f}"))
    pairs(data_dir, "ordering", rows, "no paired/ordering/* benchmarks")


def tracing(r, data_dir):
    rows = []
    for t in (1, 2, 4, 8):
        off = r.get(f"ordo/tracing/independent/trace_off/threads:{t}", "items_per_second")
        on = r.get(f"ordo/tracing/independent/trace_on/threads:{t}", "items_per_second")
        if on and off:
            mega = [tuple(x / 1e6 for x in v) for v in (off, on)]
            rows.append((f"{t} thread{'s' if t > 1 else ''}", *mega, f"on/off = {on[0] / off[0]:.2f}"))
    pairs(data_dir, "tracing", rows, "no ordo/tracing/* benchmarks")


def bandwidth(r, data_dir, gp, name, series, why_missing, min_series=1):
    """One plot of copy bandwidth against size: a line per (benchmark, label) in
    `series` that the run has, its points the benchmark's sizes."""
    sizes = [4 << 10 << (2 * i) for i in range(10)]  # 4 KiB .. 1 GiB: whatever the run has
    blocks = []
    for bench, label in series:
        pts = [(n, r.get(f"{bench}/{n}", "bytes_per_second")) for n in sizes]
        pts = [f"{n} {v[0] / 1e9:.4g} {v[1] / 1e9:.4g} {v[2] / 1e9:.4g}" for n, v in pts if v]
        if pts:
            blocks.append("\n".join([f'"{label}"'] + pts))
    write(data_dir, name, ["\n\n\n".join(blocks)] if len(blocks) >= min_series else [], why_missing)
    gp.append(f"{name}_n = {len(blocks)}")


def copies(r, data_dir, gp):
    """bench_cuda: copy bandwidth against size, native and through ordo, one plot per direction."""
    for d in ("H2D", "D2H"):
        series = [(f"Copy/{side}/{d}/{mem}", f"{label}, {mem.lower()}")
                  for side, label in (("Native", "native"), ("Remote", "ordo")) for mem in ("Pageable", "Pinned")]
        bandwidth(r, data_dir, gp, "copies_" + d.lower(), series, "no Copy/* benchmarks (bench_cuda)")


def sim_copies(r, data_dir, gp):
    """bench_ordo: copy bandwidth against size through the sim backend, with memcpy and the staged floor."""
    for d in ("h2d", "d2h"):
        series = [("baseline/memcpy", "memcpy"),
                  (f"baseline/staged_memcpy_{d}", "staged floor (two threads)"),
                  (f"copy/sim_64m/pageable_{d}", "ordo, pageable (64 MiB region)"),
                  (f"copy/sim/pinned_{d}", "ordo, pinned")]
        # memcpy alone is no plot: ordo's copies are what it is drawn for.
        bandwidth(r, data_dir, gp, "copies_sim_" + d, series, "no copy/* benchmarks (bench_ordo)", min_series=2)


def main(data_dir, machine, paths):
    r = Runs(paths)
    ctx = r.context
    when = ctx.get("date", "?")
    try:
        when = datetime.fromisoformat(when).strftime("%Y-%m-%d %H:%M %z")
    except ValueError:
        pass
    reps = max((b[0]["repetitions"] for _, rows in r.files for b in rows.values() if b[0]), default=1)
    load_avg = ", ".join(f"{x:.1f}" for x in ctx.get("load_avg", []))
    stat = f"median of {reps} repetitions" if reps > 1 else "mean of the runs"
    files = f", {len(paths)} files" if len(paths) > 1 else ""
    note = f"{machine}; run {when}, load avg {load_avg}; {stat}{files}, whiskers min-max"
    gp = [f'note = "{note}"', f'pinned = "pinned: {ctx.get("pinned", "?")}"']
    latency(r, data_dir, gp)
    throughput(r, data_dir, gp)
    ordering(r, data_dir)
    tracing(r, data_dir)
    copies(r, data_dir, gp)
    sim_copies(r, data_dir, gp)
    with open(os.path.join(data_dir, "vars.gp"), "w") as f:
        f.write("\n".join(gp) + "\n")
    if not os.environ.get("ORDO_PLOT_MACHINE") and ctx.get("num_cpus") and f"{ctx['num_cpus']} CPUs" not in machine:
        print(f"plot: the run had {ctx['num_cpus']} CPUs, this machine differs: set ORDO_PLOT_MACHINE", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

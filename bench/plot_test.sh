#!/usr/bin/env bash
# meson test: bench/plot.sh on a trimmed bench_ordo run (plot_fixture.json: no
# tracing benchmarks, throughput without median aggregates) writes valid PNGs
# and skips the plot it has no data for. Exits 77 (skipped) without gnuplot.
set -euo pipefail
for need in gnuplot python3; do
  command -v "$need" >/dev/null || { echo "SKIP: $need missing (apt-get install gnuplot-nox python3)"; exit 77; }
done
here=$(dirname "$0")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ORDO_PLOT_MACHINE="test machine" "$here/plot.sh" "$out" "$here/plot_fixture.json"
for p in latency throughput ordering; do
  magic=$(head -c 8 "$out/$p.png" | od -An -tx1 | tr -d ' \n')
  [ "$magic" = 89504e470d0a1a0a ] || { echo "FAIL: $p.png is not a PNG ($magic)"; exit 1; }
done
[ ! -e "$out/tracing.png" ] || { echo "FAIL: tracing.png written without tracing data"; exit 1; }
echo "PASS"

#!/usr/bin/env bash
# PNG plots from bench_ordo's or bench_cuda's Google Benchmark JSON (docs/BENCHMARKS.md, "Plots"):
#
#   build/bench/bench_ordo --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \
#       --benchmark_out=run.json --benchmark_out_format=json
#   bench/plot.sh OUT_DIR run.json [run2.json ...]
#
# Writes OUT_DIR/{latency,throughput,ordering,tracing,copies_h2d,copies_d2h,copies_sim_h2d,
# copies_sim_d2h}.png; a plot whose benchmarks are missing from the JSON is
# skipped with a message. The note on
# each plot names this machine (nproc, /proc/cpuinfo), so run it where the
# benchmark ran, or set ORDO_PLOT_MACHINE. Needs gnuplot (gnuplot-nox) and python3.
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,12s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi
out=$1
shift
command -v gnuplot >/dev/null || { echo "plot: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
machine=${ORDO_PLOT_MACHINE:-"${cpu:-unknown CPU}, $(nproc) CPUs"}
python3 "$(dirname "$0")/plot_data.py" "$data" "$machine" "$@"

# pngcairo draws antialiased text; the plain libgd png terminal is the fallback.
terminal=png
gnuplot -e 'set terminal pngcairo' 2>/dev/null && terminal=pngcairo

plot() {  # NAME GNUPLOT-COMMANDS: runs them when NAME.dat was written
  local name=$1
  [ -f "$data/$name.dat" ] || return 0
  gnuplot <<EOF
set terminal $terminal noenhanced size 800,500 font ",10"
set output "$out/$name.png"
load "$data/vars.gp"
f = "$data/$name.dat"
set bmargin 6
set label 100 note at screen 0.01, screen 0.02 font ",8"
set grid ytics
set style fill solid 0.75 border -1
$2
EOF
  echo "plot: wrote $out/$name.png"
}

# Two bars per row (A and B with min-max whiskers) and the A/B ratio above them.
pairs() {  # TITLE Y-LABEL A-TITLE B-TITLE
  cat <<EOF
set title "$1"
set ylabel "$2"
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set key at screen 0.5, screen 0.1 center center horizontal
set style data histograms
set style histogram errorbars gap 1 lw 1
plot f using 2:3:4:xtic(1) title "$3" lc rgb "#4477aa", \
     '' using 5:6:7 title "$4" lc rgb "#ee7733", \
     '' using 0:(\$4 > \$7 ? \$4 : \$7):8 with labels offset 0, 1 notitle
EOF
}

plot latency '
set title "Synchronous round trip: ordo vs baselines (lower is better)\n" . lat_paired
set ylabel "round-trip time (ns, log scale)"
set logscale y
set yrange [lat_ymin:lat_ymax]
set offsets 0.5, 0.5, 0, 0
set boxwidth 0.6
fmt(x) = x < 1000 ? sprintf("%.0f ns", x) : sprintf("%.1f us", x / 1000)
plot f using 0:2:xtic(1) with boxes lc rgb "#4477aa" notitle, \
     "" using 0:3:(0):($4 - $3) with vectors heads size screen 0.008, 90 lc black notitle, \
     "" using 0:($4 * 1.15):(fmt($2) . ($0 == 0 ? "" : sprintf("\n%.2fx ordo", $5))) with labels offset 0, 1.2 notitle
'

plot throughput '
set title "Async launch throughput vs guest threads (higher is better)\n" . pinned
set xlabel "guest threads"
set ylabel "throughput (M launches/s)"
set logscale x 2
set xtics 2
set offsets graph 0.05, graph 0.05, 0, 0
set yrange [0:*]
set key bottom right
plot for [i=0:tput_n - 1] f index i using 1:2:3:4 with yerrorlines pt 7 lw 2 title columnheader(1)
'

plot ordering "$(pairs "Ordering on vs off, paired A/B phases in one benchmark (higher is better)" \
  "throughput (M launches/s)" "ordering on" "ordering off (control: on)")"

plot tracing "$(pairs "Worker tracing (--trace) on vs off, independent streams (higher is better)" \
  "throughput (M launches/s)" "trace off" "trace on")"

copies() {  # NAME TITLE KEY-POSITION: bandwidth against size, one line per series
  cat <<EOF
set title "$2"
set xlabel "copy size (bytes, log scale)"
set ylabel "bandwidth (GB/s)"
set logscale x 4
set xtics ("4 KiB" 4096, "16 KiB" 16384, "64 KiB" 65536, "256 KiB" 262144, "1 MiB" 1048576, "4 MiB" 4194304, "16 MiB" 16777216, "64 MiB" 67108864, "256 MiB" 268435456)
set offsets graph 0.03, graph 0.03, 0, 0
set yrange [0:*]
set key $3
plot for [i=0:$1_n - 1] f index i using 1:2:3:4 with yerrorlines pt 7 lw 2 title columnheader(1)
EOF
}

for d in h2d d2h; do
  dir=$([ $d = h2d ] && echo "host to device" || echo "device to host")
  plot copies_$d "$(copies copies_$d "Copies $dir + stream synchronize, native CUDA vs through ordo (higher is better)" "top left")"
  plot copies_sim_$d "$(copies copies_sim_$d "Synchronous copies $dir through ordo's sim backend vs memcpy (higher is better)" "top right")"
done

#!/usr/bin/env bash
# Runs bench_cuda_api twice against one sim worker: on ordo's runtime shim
# (libcudart.so.13) and on NVIDIA's runtime over ordo's libcuda.so.1, and prints
# each benchmark's time through the driver as a ratio of the shim's in the same run
# (medians with --benchmark_repetitions).
#
#   cuda_api.sh WORKER TWINS SHIM_DIR DRIVER_PATH BENCH [BENCHMARK ARGS...]
set -euo pipefail
worker=$1 twins=$2 shim=$3 driver=$4 bench=$5
shift 5
region=/dev/shm/ordo-bench-api-$$
out=$(mktemp -d)
worker_pid=
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  rm -rf "$region" "$region.ready" "$region.doorbell" "$out"
}
trap cleanup EXIT
"$worker" --region "$region" --size 64M --backend sim --sim-kernels "$twins" --ready-file "$region.ready" --quiet &
worker_pid=$!
for _ in $(seq 100); do [ -e "$region.ready" ] && break; sleep 0.05; done
[ -e "$region.ready" ] || { echo "ordo-worker did not become ready"; exit 1; }
for lib in shim driver; do
  [ $lib = shim ] && path=$shim || path=$driver
  echo "== $lib (LD_LIBRARY_PATH=$path)"
  ORDO_REGION=$region LD_LIBRARY_PATH=$path "$bench" --benchmark_out="$out/$lib.json" \
    --benchmark_out_format=json "$@"
done
python3 - "$out/shim.json" "$out/driver.json" <<'PY'
import json, sys
def load(p):  # the median over repetitions when there are several
    rows = json.load(open(p))["benchmarks"]
    med = {b["run_name"]: b["real_time"] for b in rows if b.get("aggregate_name") == "median"}
    return med or {b["run_name"]: b["real_time"] for b in rows}
shim, drv = load(sys.argv[1]), load(sys.argv[2])
print(f"{'benchmark':<24}{'shim ns':>10}{'driver ns':>11}{'driver/shim':>13}")
for name in shim:
    if name in drv:
        print(f"{name:<24}{shim[name]:>10.1f}{drv[name]:>11.1f}{drv[name] / shim[name]:>13.2f}")
PY

#!/usr/bin/env bash
# Runs bench_cuda_api (a plain nvcc program: static cudart) through ordo's
# libcuda.so.1 against one sim worker and prints each runtime call's time as a
# ratio of the driver call it ends in, measured in the same run (medians with
# --benchmark_repetitions).
#
#   cuda_api.sh WORKER TWINS DRIVER_PATH BENCH [BENCHMARK ARGS...]
set -euo pipefail
worker=$1 twins=$2 driver=$3 bench=$4
shift 4
region=/dev/shm/ordo-bench-api-$$
out=$(mktemp -d)
worker_pid=
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  rm -rf "$region" "$region.ready" "$region".doorbell* "$out"
}
trap cleanup EXIT
"$worker" --region "$region" --size 64M --backend sim --sim-kernels "$twins" --ready-file "$region.ready" --quiet &
worker_pid=$!
for _ in $(seq 100); do [ -e "$region.ready" ] && break; sleep 0.05; done
[ -e "$region.ready" ] || { echo "ordo-worker did not become ready"; exit 1; }
ORDO_REGION=$region LD_LIBRARY_PATH=$driver "$bench" --benchmark_out="$out/run.json" --benchmark_out_format=json "$@"
python3 - "$out/run.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["benchmarks"]
t = {b["run_name"]: b["real_time"] for b in rows if b.get("aggregate_name") == "median"} \
    or {b["run_name"]: b["real_time"] for b in rows}
print(f"{'runtime call':<18}{'ns':>8}   {'driver call (baseline)':<24}{'ns':>8}{'runtime/driver':>16}")
for rt, drv in [("BM_GetDevice", "BM_DriverCtxGetDevice"), ("BM_LaunchAsync", "BM_DriverLaunchAsync")]:
    if rt in t and drv in t:
        print(f"{rt[3:]:<18}{t[rt]:>8.1f}   {drv[3:]:<24}{t[drv]:>8.1f}{t[rt] / t[drv]:>16.2f}")
if "BM_GetLastError" in t:
    print(f"{'GetLastError':<18}{t['BM_GetLastError']:>8.1f}   (no driver call)")
PY

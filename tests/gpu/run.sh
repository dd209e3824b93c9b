#!/usr/bin/env bash
# On a machine with a GPU: builds (if needed), runs the cuda backend's tests,
# the whole meson test suite (whose worker processes now default to the cuda
# backend), the demo on the cuda backend, every nvcc-built program of
# tests/cuda natively and through ordo (comparing their output), and
# bench_cuda. Writes a summary to SUMMARY_FILE. Each step has its own time
# limit so that the whole run ends within 8 minutes on an H200.
#
#   tests/gpu/run.sh SUMMARY_FILE [BUILD_DIR]      (BUILD_DIR defaults to build-gpu)
#
# Exit status: 0 if nothing failed (skips are not failures), 1 otherwise.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: tests/gpu/run.sh SUMMARY_FILE [BUILD_DIR]" >&2
  exit 2
fi
summary=$(realpath -m "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath -m "${2:-$root/build-gpu}")
start=$SECONDS
budget=470  # seconds: 8 minutes less a margin
work=$(mktemp -d /tmp/ordo-gpu-run.XXXXXX)
failed=0
workers=()

: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - (SECONDS - start))); }
# A step's limit: what it asks for, or what is left of the budget if less.
limit() { local l; l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
result() {  # result NAME STATUS [DETAIL]: STATUS is PASS, FAIL or SKIP
  note "$2  $1${3:+  ($3)}"
  [ "$2" = FAIL ] && failed=1
  return 0
}
cleanup() {
  for p in "${workers[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -f /dev/shm/ordo-gpu-run-$$-*
  rm -rf "$work"
}
trap cleanup EXIT

# start_worker NAME: an ordo-worker on the cuda backend; sets $region.
start_worker() {
  region=/dev/shm/ordo-gpu-run-$$-$1
  rm -f "$region.ready"
  "$build/src/worker/ordo-worker" --region "$region" --size 256M --backend cuda --stats --ready-file "$region.ready" \
    2>"$work/worker-$1.log" &
  local pid=$!
  workers+=("$pid")
  for _ in $(seq 1 1000); do
    [ -e "$region.ready" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  note "ordo-worker ($1) did not start:"
  sed 's/^/    /' "$work/worker-$1.log" | tee -a "$summary"
  return 1
}
stop_workers() {
  for p in "${workers[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  workers=()
}

note "ordo GPU run: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"
fi

# ---------------------------------------------------------------- build
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" -Dcuda=enabled >"$work/setup.log" 2>&1 || {
    result build FAIL "meson setup: see below"
    tail -20 "$work/setup.log" | tee -a "$summary"
    exit 1
  }
fi
if timeout "$(limit 240)" ninja -C "$build" >"$work/build.log" 2>&1; then
  result build PASS "$((SECONDS - start)) s"
else
  result build FAIL "ninja: see below"
  grep -E "error|FAILED" -A3 "$work/build.log" | head -40 | tee -a "$summary"
  exit 1
fi

# Is there a device at all? The backend test says so (exit 77) in its own words.
probe_out=$("$build/tests/gpu/test_cuda_backend" --gtest_list_tests 2>&1)
if [ $? -eq 77 ]; then
  result "GPU steps" SKIP "$probe_out"
  exit 0
fi

# ---------------------------------------------------------------- tests
# The gpu suite first (the backend alone), then everything else: worker
# processes started by the tests pick the cuda backend by default (auto).
for suite in gpu all; do
  args=(--suite gpu)
  [ $suite = all ] && args=(--no-suite gpu)
  if timeout "$(limit 200)" meson test -C "$build" "${args[@]}" --print-errorlogs >"$work/test-$suite.log" 2>&1; then
    result "meson test ($suite)" PASS "$(grep -E '^(Ok|Skipped):' "$work/test-$suite.log" | tr -s ' ' | paste -sd, -)"
  else
    result "meson test ($suite)" FAIL "see below"
    grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)' "$work/test-$suite.log" | tee -a "$summary"
    grep -E '^\[  FAILED  \]|Failure|Expected|Which is|  Actual' "$work/test-$suite.log" | head -40 | sed 's/^/    /' |
      tee -a "$summary"
  fi
done

# ---------------------------------------------------------------- the demo on the GPU
if start_worker demo; then
  if ORDO_REGION=$region timeout "$(limit 60)" "$build/src/guest/ordo-demo" >"$work/demo.log" 2>&1; then
    result "ordo-demo on the cuda backend" PASS
  else
    result "ordo-demo on the cuda backend" FAIL "see below"
    sed 's/^/    /' "$work/demo.log" | tail -20 | tee -a "$summary"
  fi
  grep -E 'PASS|FAIL' "$work/demo.log" | sed 's/^/    /' | tee -a "$summary"
  stop_workers
else
  result "ordo-demo on the cuda backend" FAIL "no worker"
fi

# ---------------------------------------------------------------- nvcc programs, native vs ordo
cuda_lib=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64
driver=$(find "$build/src/guest" -name 'libcuda.so.1' 2>/dev/null | sort | head -1)
progs=()
if [ -d "$build/tests/cuda" ]; then
  while IFS= read -r p; do progs+=("$p"); done < <(find "$build/tests/cuda" -maxdepth 1 -type f -perm -u+x ! -name '*.so*' | sort)
fi
if [ ${#progs[@]} -eq 0 ]; then
  result "tests/cuda programs" SKIP "none built under $build/tests/cuda"
elif [ -z "$driver" ]; then
  result "tests/cuda programs" SKIP "no guest libcuda.so.1 under $build/src/guest"
else
  for p in "${progs[@]}"; do
    name=$(basename "$p")
    [ "$(left)" -lt 150 ] && { result "$name" SKIP "out of time"; continue; }
    LD_LIBRARY_PATH=$cuda_lib timeout 60 "$p" >"$work/$name.native" 2>"$work/$name.native.err"
    nrc=$?
    if ! start_worker "$name"; then
      result "$name" FAIL "no worker"
      continue
    fi
    ORDO_REGION=$region LD_LIBRARY_PATH=$(dirname "$driver"):$cuda_lib timeout 60 "$p" >"$work/$name.ordo" 2>"$work/$name.ordo.err"
    orc=$?
    stop_workers
    if [ $nrc -ne 0 ]; then
      result "$name" FAIL "native run exited $nrc"
      tail -5 "$work/$name.native.err" | sed 's/^/    /' | tee -a "$summary"
    elif [ $orc -ne 0 ]; then
      result "$name" FAIL "through ordo exited $orc (native 0)"
      tail -5 "$work/$name.ordo.err" | sed 's/^/    /' | tee -a "$summary"
    elif ! cmp -s "$work/$name.native" "$work/$name.ordo"; then
      result "$name" FAIL "output differs from the native run"
      diff "$work/$name.native" "$work/$name.ordo" | head -10 | sed 's/^/    /' | tee -a "$summary"
    else
      result "$name" PASS "same output natively and through ordo"
    fi
  done
fi

# ---------------------------------------------------------------- benchmarks
bl=$(limit 240)
if [ "$bl" -lt 60 ]; then
  result bench_cuda SKIP "out of time ($bl s left)"
else
  if ORDO_WORKER=$build/src/worker/ordo-worker timeout "$bl" "$build/bench/bench_cuda" \
      --benchmark_out="$work/bench_cuda.json" --benchmark_out_format=json >"$work/bench.log" 2>&1; then
    result bench_cuda PASS
  else
    result bench_cuda FAIL "exit $? after $bl s limit; see below"
    tail -10 "$work/bench.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if [ -s "$work/bench_cuda.json" ]; then
    cp "$work/bench_cuda.json" "${summary%.*}.bench_cuda.json"
    python3 "$root/tests/gpu/summarize_bench.py" "$work/bench_cuda.json" | tee -a "$summary"
  fi
fi

note "total $((SECONDS - start)) s; $([ $failed -eq 0 ] && echo 'nothing failed' || echo 'FAILURES above')"
exit $failed

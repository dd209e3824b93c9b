#!/usr/bin/env bash
# On a machine with a GPU: builds (if needed), runs the cuda backend's tests,
# every nvcc-built program of tests/cuda natively and through ordo (comparing
# their output), bench_cuda, the demo on the cuda backend, and the rest of
# the test suite (whose worker processes default to the cuda backend there).
# Writes a summary to SUMMARY_FILE. Steps run most telling first, each with
# its own time limit, so that the whole run ends within ORDO_GPU_BUDGET
# seconds (default 470).
#
#   tests/gpu/run.sh SUMMARY_FILE [BUILD_DIR]      (BUILD_DIR defaults to build-gpu)
#
# BUILD_DIR may be a prebuilt folder carried from another machine (no
# meson-private, so nothing is rebuilt): tests run from its introspection data
# (run_tests.py), and shared libraries it needs that the GPU machine lacks
# are taken from BUILD_DIR/.runlibs (scripts/gpu-pack.sh makes such a folder).
# ORDO_GPU_LOGS=DIR keeps every step's log there as logs.tar.gz.
# ORDO_GPU_STEPS picks steps (default "gpu programs bench demo rest").
# ORDO_GPU_REHEARSE=1 rehearses the script on a machine without a GPU (device
# time is scarce): no probe, workers on the sim backend with the programs'
# kernel twins, no native runs, and bench_cuda's skip accepted.
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
budget=${ORDO_GPU_BUDGET:-470}
work=$(mktemp -d /tmp/ordo-gpu-run.XXXXXX)
failed=0
workers=()
rehearse=${ORDO_GPU_REHEARSE:-}
steps=" ${ORDO_GPU_STEPS:-gpu programs bench demo rest} "
step() { [[ $steps == *" $1 "* ]]; }
backend=(--backend cuda)
[ -n "$rehearse" ] && backend=(--backend sim --sim-kernels "$build/tests/cuda/libcuda_twins.so")

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
  if [ -n "${ORDO_GPU_LOGS:-}" ]; then
    mkdir -p "$ORDO_GPU_LOGS" && tar -C "$work" -czf "$ORDO_GPU_LOGS/logs.tar.gz" . 2>/dev/null
  fi
  local w
  for w in "${workers[@]}"; do kill -TERM "$w" 2>/dev/null && wait "$w" 2>/dev/null; done
  rm -f /dev/shm/ordo-gpu-run-$$-*
  rm -rf "$work"
}
trap cleanup EXIT

# start_worker NAME: an ordo-worker on the cuda backend; sets $region.
start_worker() {
  region=/dev/shm/ordo-gpu-run-$$-$1
  rm -f "$region.ready"
  "$build/src/worker/ordo-worker" --region "$region" --size 256M "${backend[@]}" --stats --ready-file "$region.ready" \
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
  local w
  for w in "${workers[@]}"; do kill -TERM "$w" 2>/dev/null && wait "$w" 2>/dev/null; done
  workers=()
}

commit=$(cat "$build/.commit" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')
note "ordo GPU run: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $commit"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"
fi

# ---------------------------------------------------------------- build
if [ -d "$build/.runlibs" ]; then
  export LD_LIBRARY_PATH=$build/.runlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ -d "$build/meson-private" ] || [ ! -e "$build" ]; then
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
else
  result build PASS "prebuilt: $build"
fi

# Is there a device at all? The backend test says so (exit 77) in its own words.
probe_out=$("$build/tests/gpu/test_cuda_backend" --gtest_list_tests 2>&1)
if [ $? -eq 77 ] && [ -z "$rehearse" ]; then
  result "GPU steps" SKIP "$probe_out"
  exit 0
fi

# run_suite NAME LIMIT RUN_TESTS_ARGS...: tests from the build's introspection data.
run_suite() {
  local name=$1 lim
  lim=$(limit "$2")
  shift 2
  python3 "$root/tests/gpu/run_tests.py" "$build" --budget "$lim" --jobs 8 --log "$work/test-$name.full.log" "$@" \
    >"$work/test-$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    result "tests ($name)" PASS "$(tail -1 "$work/test-$name.log")"
  else
    result "tests ($name)" FAIL "$(tail -1 "$work/test-$name.log")"
    grep -vE '^ *[0-9]+/[0-9]+ .* (OK|SKIP) ' "$work/test-$name.log" | head -60 | sed 's/^/    /' | tee -a "$summary"
  fi
}

# ---------------------------------------------------------------- the cuda backend alone
step gpu && run_suite gpu 120 --suite gpu

# ---------------------------------------------------------------- nvcc programs, native vs ordo
# NVIDIA's libraries: the toolkit's, or the Python wheels' where the toolkit lacks cuBLAS.
cuda_lib=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64
if [ ! -e "$cuda_lib/libcublas.so.13" ]; then
  extra=$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)
  [ -n "$extra" ] && cuda_lib=$cuda_lib:$(dirname "$extra")
fi
driver=$(find "$build/src/guest" -name 'libcuda.so.1' 2>/dev/null | sort | head -1)
# Each program, built static and with -cudart shared. `unsupported` calls APIs
# ordo refuses, so only its ordo run is checked (it must pass).
progs=()
for n in basic basic_ptds seed hostfunc props blas unsupported graphs graphs_ptds graph_memory mapped mempool launch_ex tensor_map vmm funcattr ipc vmm_ipc conditional; do
  for v in _static ""; do
    [ -x "$build/tests/cuda/$n$v" ] && progs+=("$build/tests/cuda/$n$v")
  done
done
# diagnose NAME PROGRAM: after a failed run through ordo, the driver calls
# that led to it (ORDO_DRIVER_TRACE) and, where it crashed, a backtrace.
diagnose() {
  local name=$1 p=$2 dbg
  [ "$(left)" -lt 60 ] && return 0
  start_worker "$name-trace" || return 0
  ORDO_REGION=$region ORDO_DRIVER_TRACE=1 LD_LIBRARY_PATH=$(dirname "$driver"):$cuda_lib timeout 60 "$p" \
    >"$work/$name.trace" 2>&1
  note "    the last driver calls before it failed:"
  grep '^ordo-trace:' "$work/$name.trace" | tail -15 | sed 's/^/      /' | tee -a "$summary"
  grep '^ordo-trace: export table' "$work/$name.trace" | sort | uniq -c | sed 's/^/      /' | tee -a "$summary"
  stop_workers
  if [ "$orc" -ge 128 ] && dbg=$(command -v cuda-gdb || command -v gdb) && start_worker "$name-gdb"; then
    ORDO_REGION=$region LD_LIBRARY_PATH=$(dirname "$driver"):$cuda_lib timeout 90 "$dbg" -batch -ex run -ex bt \
      --args "$p" >"$work/$name.gdb" 2>&1
    note "    backtrace ($dbg):"
    grep -E '^#[0-9]+' "$work/$name.gdb" | head -20 | sed 's/^/      /' | tee -a "$summary"
    stop_workers
  fi
}

# The attributes guests are shown as 0 (features ordo does not implement,
# src/worker/device_attributes.cc) that this device has: props may differ there only.
withheld_attrs() {
  "$build/src/worker/ordo-worker" --device-info "${backend[@]}" 2>/dev/null | sed -n 's/^withheld\.\([0-9]*\)=.*/\1/p'
}
withheld_only() {  # NATIVE ORDO: equal once both drop the withheld attributes' lines
  local pat
  pat="^attr\.($(withheld_attrs | paste -sd'|'))="
  [ "$pat" = '^attr\.()=' ] && pat='^$'
  cmp -s <(grep -Ev "$pat" "$1") <(grep -Ev "$pat" "$2")
}

if ! step programs; then
  :
elif [ ${#progs[@]} -eq 0 ]; then
  result "tests/cuda programs" SKIP "none built under $build/tests/cuda"
elif [ -z "$driver" ]; then
  result "tests/cuda programs" SKIP "no guest libcuda.so.1 under $build/src/guest"
else
  for p in "${progs[@]}"; do
    name=$(basename "$p")
    [ "$(left)" -lt 60 ] && { result "$name" SKIP "out of time"; continue; }
    if [ -n "$rehearse" ]; then
      echo "rehearsal: no native run" >"$work/$name.native.err"
      nrc=0
    else
      LD_LIBRARY_PATH=$cuda_lib timeout 60 "$p" >"$work/$name.native" 2>"$work/$name.native.err"
      nrc=$?
    fi
    if ! start_worker "$name"; then
      result "$name" FAIL "no worker"
      continue
    fi
    # A rehearsal's sim has no twin of cuBLAS's kernels: blas then checks that
    # everything up to its SGEMM's launch works and that the launch fails with 209.
    args=()
    [ -n "$rehearse" ] && [ "${name%_static}" = blas ] && args=(--expect-no-twin)
    ORDO_REGION=$region LD_LIBRARY_PATH=$(dirname "$driver"):$cuda_lib timeout 60 "$p" "${args[@]}" \
      >"$work/$name.ordo" 2>"$work/$name.ordo.err"
    orc=$?
    stop_workers
    if [ $nrc -ne 0 ] && [ "${name%_static}" != unsupported ]; then
      result "$name" FAIL "native run exited $nrc"
      tail -5 "$work/$name.native.err" | sed 's/^/    /' | tee -a "$summary"
    elif [ $orc -ne 0 ]; then
      result "$name" FAIL "through ordo exited $orc (native $nrc)"
      tail -5 "$work/$name.ordo.err" | sed 's/^/    /' | tee -a "$summary"
      tail -5 "$work/worker-$name.log" | sed 's/^/    worker: /' | tee -a "$summary"
      diagnose "$name" "$p"
    elif [ "${name%_static}" = unsupported ]; then
      result "$name" PASS "through ordo: $(paste -sd' ' "$work/$name.ordo" | cut -c1-80)"
    elif [ -n "$rehearse" ]; then
      result "$name" PASS "rehearsal, through ordo only: $(head -1 "$work/$name.ordo" | cut -c1-60)"
    elif [ "${name%_static}" = props ] && ! withheld_only "$work/$name.native" "$work/$name.ordo"; then
      result "$name" FAIL "properties differ from the native run beyond those ordo withholds"
      diff "$work/$name.native" "$work/$name.ordo" | head -10 | sed 's/^/    /' | tee -a "$summary"
    elif [ "${name%_static}" = props ]; then
      result "$name" PASS "same properties as native but the withheld: $(withheld_attrs | paste -sd, | cut -c1-60)"
    elif ! cmp -s "$work/$name.native" "$work/$name.ordo"; then
      result "$name" FAIL "output differs from the native run"
      diff "$work/$name.native" "$work/$name.ordo" | head -10 | sed 's/^/    /' | tee -a "$summary"
    else
      result "$name" PASS "same output natively and through ordo: $(head -1 "$work/$name.ordo" | cut -c1-60)"
    fi
  done
fi

# ---------------------------------------------------------------- benchmarks
bl=$(limit 150)
if ! step bench; then
  :
elif [ "$bl" -lt 45 ]; then
  result bench_cuda SKIP "out of time ($bl s left)"
else
  if ORDO_WORKER=$build/src/worker/ordo-worker timeout "$bl" "$build/bench/bench_cuda" \
      --benchmark_out="$work/bench_cuda.json" --benchmark_out_format=json >"$work/bench.log" 2>&1; then
    result bench_cuda PASS
  elif [ -n "$rehearse" ] && grep -q "no CUDA device" "$work/bench.log"; then
    result bench_cuda SKIP "rehearsal: $(head -1 "$work/bench.log")"
  else
    result bench_cuda FAIL "exit $? after $bl s limit; see below"
    tail -10 "$work/bench.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if [ -s "$work/bench_cuda.json" ]; then
    cp "$work/bench_cuda.json" "${summary%.*}.bench_cuda.json"
    python3 "$root/tests/gpu/summarize_bench.py" "$work/bench_cuda.json" | tee -a "$summary"
  fi
fi

# ---------------------------------------------------------------- the demo on the GPU
if ! step demo; then
  :
elif [ "$(left)" -lt 40 ]; then
  result "ordo-demo on the cuda backend" SKIP "out of time"
elif start_worker demo; then
  if ORDO_REGION=$region timeout "$(limit 60)" "$build/src/guest/ordo-demo" >"$work/demo.log" 2>&1; then
    result "ordo-demo on the cuda backend" PASS
  else
    result "ordo-demo on the cuda backend" FAIL "see below"
    sed 's/^/    /' "$work/demo.log" | tail -20 | tee -a "$summary"
  fi
  grep -E 'PASS|FAIL|MB/s|GB/s' "$work/demo.log" | sed 's/^/    /' | tee -a "$summary"
  stop_workers
else
  result "ordo-demo on the cuda backend" FAIL "no worker"
fi

# ---------------------------------------------------------------- everything else
# Worker processes the tests start pick the cuda backend here (auto). The
# stacked suite is the GPU's stand-in, and the VM tests need QEMU: both are
# CI's, not this machine's.
if ! step rest; then
  :
elif [ "$(left)" -lt 30 ]; then
  result "tests (rest)" SKIP "out of time"
else
  run_suite rest "$(left)" --no-suite gpu --no-suite stacked --exclude vm --exclude vm_doorbell
fi

note "total $((SECONDS - start)) s; $([ $failed -eq 0 ] && echo 'nothing failed' || echo 'FAILURES above')"
exit $failed

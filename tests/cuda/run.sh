#!/usr/bin/env bash
# Runs one nvcc-built CUDA program through ordo: an ordo-worker on the sim
# backend with the programs' kernel twins, the program with ordo's
# libcudart.so.13 first on LD_LIBRARY_PATH.
#
#   run.sh MODE WORKER SHIM_DIR TWINS PROGRAM [ARGS...]
#
# SHIM_DIR: the directories (colon-separated) the program loads ordo's library
# from: libcudart.so.13's (the runtime shim) or libcuda.so.1's (the driver, with
# the real libcudart beside it for -cudart shared programs).
#
# MODE:
#   pass        the program must exit 0
#   ordered     the seed scenario under --chaos: never a violation, over several runs
#   unordered   the seed scenario with ordering off (--unordered, ORDO_UNORDERED=1)
#               and --chaos: must show a violation in at least one run, or the
#               ordered runs prove nothing
#   unsupported the program must pass and each API in $UNSUPPORTED must be named once on stderr
#   real        the real libcudart (no GPU here): must fail cleanly with error 35
#   abi         ld.so loads the shim with no version warning, and nm -D shows the version node
#   noworker    ORDO_REGION names no serving worker: a clear message and error 46/3
#   trace       ORDO_DRIVER_TRACE=1: the program passes and libcuda.so.1 logs each call's result
#   props       every key=value line the program prints (props.cu: cudaGetDeviceProperties) equals
#               the worker's own `ordo-worker --device-info` line for that key
set -uo pipefail
mode=$1 worker=$2 shim=$3 twins=$4 prog=$5
shift 5

region=/dev/shm/ordo-cuda-test-$$-$RANDOM
worker_pid=
log=$(mktemp)
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  rm -f "$region" "$region.doorbell" "$region.ready" "$log"
}
trap cleanup EXIT

start_worker() {
  rm -f "$region.ready"
  "$worker" --region "$region" --size 64M --backend sim --sim-kernels "$twins" --ready-file "$region.ready" \
    --quiet "$@" &
  worker_pid=$!
  for _ in $(seq 100); do
    [ -e "$region.ready" ] && return 0
    kill -0 "$worker_pid" 2>/dev/null || { echo "ordo-worker exited early"; exit 1; }
    sleep 0.05
  done
  echo "ordo-worker did not become ready"
  exit 1
}

# A sanitizer build of the shim inside an uninstrumented nvcc program: the
# sanitizer runtime has to be loaded first.
lib=${shim%%:*}/libcudart.so.13
[ -e "$lib" ] || lib=${shim%%:*}/libcuda.so.1
preload=$(ldd "$lib" | awk '/lib(asan|ubsan|tsan)\.so/ {print $3}' | sort -u | tr '\n' ':')

run_prog() {  # run_prog [ENV=V...] ARGS: runs the program through the shim, output to $log
  env ORDO_REGION="$region" LD_LIBRARY_PATH="$shim" LD_PRELOAD="$preload" "$@" >"$log" 2>&1
}

case $mode in
  pass)
    start_worker
    run_prog timeout 120 "$prog" "$@"
    rc=$?
    cat "$log"
    exit $rc
    ;;
  ordered)
    start_worker --chaos 7
    for i in 1 2 3; do
      run_prog timeout 300 "$prog" "$@"
      rc=$?
      cat "$log"
      [ $rc -eq 0 ] || { echo "ordered run $i: violation or failure (rc $rc)"; exit 1; }
    done
    ;;
  unordered)
    start_worker --chaos 7 --unordered
    for i in $(seq 10); do
      run_prog ORDO_UNORDERED=1 timeout 300 "$prog" "$@"
      rc=$?
      cat "$log"
      if [ $rc -eq 1 ] && grep -q "violations" "$log"; then
        echo "unordered run $i: violation seen, as it must be without ordering"
        exit 0
      fi
      [ $rc -eq 0 ] || { echo "unordered run $i failed for another reason (rc $rc)"; exit 1; }
    done
    echo "no violation in 10 unordered runs: the scenario does not test ordering"
    exit 1
    ;;
  unsupported)
    start_worker
    run_prog timeout 120 "$prog" "$@"
    rc=$?
    cat "$log"
    [ $rc -eq 0 ] || exit 1
    for api in ${UNSUPPORTED:-cudaGraphCreate cudaMallocArray cudaMallocManaged}; do
      n=$(grep -c "^ordo: $api is not supported by the ordo guest library$" "$log")
      [ "$n" -eq 1 ] || { echo "expected one 'not supported' line for $api, got $n"; exit 1; }
    done
    ;;
  real)
    # Whatever libcudart.so.13 the loader finds without ordo's: the real runtime.
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="${REAL_CUDART_DIR:-}" timeout 60 "$prog" "$@" >"$log" 2>&1
    rc=$?
    cat "$log"
    resolved=$(env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="${REAL_CUDART_DIR:-}" ldd "$prog" | grep "libcudart.so.13")
    echo "resolved: $resolved"
    case $resolved in
      *"$shim"*) echo "picked up the shim"; exit 1 ;;
      *"=> /"*) ;;
      *) echo "no real libcudart.so.13 on this machine"; exit 77 ;;
    esac
    if nvidia-smi -L >/dev/null 2>&1; then
      echo "a GPU is present: the real runtime must pass"
      exit $rc
    fi
    [ $rc -eq 3 ] && grep -q "error 35" "$log" || { echo "expected a clean failure with error 35 (rc 3), got rc $rc"; exit 1; }
    ;;
  abi)
    start_worker
    run_prog timeout 60 "$prog" "$@"
    rc=$?
    cat "$log"
    [ $rc -eq 0 ] || exit 1
    if grep -qi "no version information" "$log"; then echo "ld.so version warning"; exit 1; fi
    syms=$(nm -D --defined-only "$shim/libcudart.so.13")
    grep -q " A libcudart.so.13$" <<<"$syms" || { echo "no libcudart.so.13 version node"; exit 1; }
    for sym in cudaMalloc __cudaRegisterFatBinary __cudaLaunchKernel cudaGraphLaunch; do
      grep -q " $sym@@libcudart.so.13$" <<<"$syms" || { echo "$sym not exported with version libcudart.so.13"; exit 1; }
    done
    [ -s "${EXPORTS:-}" ] || { echo "EXPORTS (the real library's export list) not set"; exit 1; }
    missing=$(comm -23 <(sort -u "$EXPORTS") <(awk '{sub(/@.*/, "", $3); print $3}' <<<"$syms" | sort -u) | head)
    [ -z "$missing" ] || { echo "exports missing from the shim: $missing"; exit 1; }
    dyn=$(readelf -d "$shim/libcudart.so.13")
    grep -q "SONAME.*\[libcudart.so.13\]" <<<"$dyn" || { echo "wrong soname"; exit 1; }
    # The program's own version requirement is met by the shim (else ld.so warns or fails).
    grep -q "libcudart.so.13" <<<"$(readelf -V "$prog")" || { echo "program has no libcudart.so.13 version need"; exit 1; }
    ;;
  noworker)
    run_prog timeout 60 "$prog" "$@"
    rc=$?
    cat "$log"
    [ $rc -ne 0 ] || { echo "ran without a worker?"; exit 1; }
    grep -q "ORDO_REGION" "$log" && grep -q "ordo-worker" "$log" || { echo "the error must name ORDO_REGION and ordo-worker"; exit 1; }
    grep -Eq "error (46|3) " "$log" || { echo "expected error 46 or 3"; exit 1; }
    env -u ORDO_REGION LD_LIBRARY_PATH="$shim" LD_PRELOAD="$preload" timeout 60 "$prog" "$@" >"$log" 2>&1
    cat "$log"
    grep -q "error 3 " "$log" || { echo "ORDO_REGION unset: expected cudaErrorInitializationError (3)"; exit 1; }
    ;;
  trace)
    start_worker
    run_prog ORDO_DRIVER_TRACE=1 timeout 120 "$prog" "$@"
    rc=$?
    cat "$log"
    [ $rc -eq 0 ] || exit 1
    for line in "cuDeviceGetCount -> 0 CUDA_SUCCESS" "cuLaunchKernel -> 0 CUDA_SUCCESS" \
                "cuStreamQuery -> 400 CUDA_ERROR_INVALID_HANDLE"; do
      grep -q "^ordo-trace: $line$" "$log" || { echo "no trace line '$line'"; exit 1; }
    done
    ;;
  props)
    start_worker
    run_prog timeout 120 "$prog" "$@"
    rc=$?
    cat "$log"
    [ $rc -eq 0 ] || exit 1
    want=$("$worker" --device-info --backend sim) || { echo "ordo-worker --device-info failed"; exit 1; }
    n=$(grep -c '=' "$log")
    [ "$n" -ge 50 ] || { echo "expected at least 50 properties, got $n"; exit 1; }
    diff=$(comm -23 <(grep '=' "$log" | sort) <(sort <<<"$want"))
    [ -z "$diff" ] || { echo "properties that differ from the worker's device (program's lines):"; echo "$diff"; exit 1; }
    echo "all $n properties match ordo-worker --device-info"
    ;;
  *)
    echo "unknown mode $mode"
    exit 2
    ;;
esac
exit 0

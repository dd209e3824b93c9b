#!/usr/bin/env bash
# Runs one nvcc-built CUDA program through ordo: an ordo-worker on the sim
# backend with the programs' kernel twins, the program with ordo's libcuda.so.1
# first on LD_LIBRARY_PATH and NVIDIA's runtime on top of it.
#
#   run.sh MODE WORKER LIB_PATH TWINS PROGRAM [ARGS...]
#
# LIB_PATH: the directories (colon-separated) the program loads libraries from:
# libcuda.so.1's first, then the toolkit's (libcudart for -cudart shared
# programs, cuBLAS).
#
# MODE:
#   pass        the program must exit 0
#   devices     the program must exit 0 on a worker simulating 4 devices (--sim-devices 4)
#   ordered     the seed scenario under --chaos: never a violation, over several runs
#   unordered   the seed scenario with ordering off (--unordered, ORDO_UNORDERED=1)
#               and --chaos: must show a violation in at least one run, or the
#               ordered runs prove nothing
#   unsupported the program must pass and each API in $UNSUPPORTED must be named once on stderr
#   real        without ordo's libcuda.so.1 (no driver here): NVIDIA's runtime must fail cleanly with error 35
#   abi         libcuda.so.1 has the driver's soname and exports every name in $EXPORTS (the real driver's)
#   noworker    ORDO_REGION names no serving worker: a clear message and error 46/3
#   trace       ORDO_DRIVER_TRACE=1: the program passes and libcuda.so.1 logs each call's result
#   props       every key=value line the program prints (props.cu: cudaGetDeviceProperties) equals
#               the worker's own `ordo-worker --device-info` line for that key
#   library     a case of libraries.cu on a worker simulating $SIM_DEVICES devices (1 by default),
#               under ORDO_DRIVER_TRACE=1: it must exit 0, call nothing ordo leaves unimplemented
#               (no export or private-table slot answering "not supported"), and the worker must
#               name the library kernel it could not run (LIBRARY_KERNEL=0: a case that needs no
#               kernel, which must say it ran instead; EXPECT_LINE: a line the output must have)
#
# WORKER_ARGS: more ordo-worker arguments, e.g. a larger region (--size 512M --sessions 1).
set -uo pipefail
mode=$1 worker=$2 libpath=$3 twins=$4 prog=$5
shift 5
args=("$@")

region=/dev/shm/ordo-cuda-test-$$-$RANDOM
worker_pid=
log=$(mktemp)
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  rm -f "$region" "$region".doorbell* "$region.ready" "$log"
}
trap cleanup EXIT

start_worker() {
  rm -f "$region.ready"
  # shellcheck disable=SC2086  # WORKER_ARGS: several words
  "$worker" --region "$region" --size 64M --backend sim --sim-kernels "$twins" --ready-file "$region.ready" \
    --quiet ${WORKER_ARGS:-} "$@" 2>>"${worker_log:-/dev/stderr}" &
  worker_pid=$!
  for _ in $(seq 100); do
    [ -e "$region.ready" ] && return 0
    kill -0 "$worker_pid" 2>/dev/null || { echo "ordo-worker exited early"; exit 1; }
    sleep 0.05
  done
  echo "ordo-worker did not become ready"
  exit 1
}

# A sanitizer build of libcuda.so.1 inside an uninstrumented nvcc program: the
# sanitizer runtime has to be loaded first.
lib=${libpath%%:*}/libcuda.so.1
preload=$(ldd "$lib" | awk '/lib(asan|ubsan|tsan)\.so/ {print $3}' | sort -u | tr '\n' ':')

run_prog() {  # run_prog [ENV=V...] ARGS: runs the program through ordo, output to $log
  env ORDO_REGION="$region" LD_LIBRARY_PATH="$libpath" LD_PRELOAD="$preload" "$@" >"$log" 2>&1
}

run_passing() {  # run_passing [ENV=V...]: a worker, then the program with ARGS; it must exit 0
  start_worker
  run_prog "$@" timeout 120 "$prog" "${args[@]}"
  local rc=$?
  cat "$log"
  [ $rc -eq 0 ] || exit 1
}

case $mode in
  pass)
    start_worker
    run_prog timeout 120 "$prog" "$@"
    rc=$?
    cat "$log"
    exit $rc
    ;;
  devices)
    start_worker --sim-devices 4
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
    run_passing
    for api in ${UNSUPPORTED:?the APIs the program calls that ordo does not support}; do
      n=$(grep -c "^ordo: $api is not supported by the ordo guest library$" "$log")
      [ "$n" -eq 1 ] || { echo "expected one 'not supported' line for $api, got $n"; exit 1; }
    done
    ;;
  real)
    # No libcuda.so.1 but the system's: on this machine (no GPU, no driver), none.
    if nvidia-smi -L >/dev/null 2>&1; then
      echo "a GPU and its driver are present: this case checks a machine without them"
      exit 77
    fi
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="${libpath#*:}" timeout 60 "$prog" "$@" >"$log" 2>&1
    rc=$?
    cat "$log"
    [ $rc -eq 3 ] && grep -q "error 35" "$log" || { echo "expected a clean failure with error 35 (rc 3), got rc $rc"; exit 1; }
    ;;
  abi)
    dyn=$(readelf -d "$lib")
    grep -q "SONAME.*\[libcuda.so.1\]" <<<"$dyn" || { echo "wrong soname"; exit 1; }
    [ -s "${EXPORTS:-}" ] || { echo "EXPORTS (the real driver's export list) not set"; exit 1; }
    syms=$(nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "W" {sub(/@.*/, "", $3); print $3}' | sort -u)
    missing=$(comm -23 <(sort -u "$EXPORTS") <(cat <<<"$syms") | head)
    [ -z "$missing" ] || { echo "exports missing from libcuda.so.1: $missing"; exit 1; }
    echo "libcuda.so.1 exports all $(sort -u "$EXPORTS" | wc -l) names of the real driver"
    # And a program loads it with no complaint from ld.so.
    run_passing
    if grep -qi "no version information" "$log"; then echo "ld.so version warning"; exit 1; fi
    ;;
  noworker)
    run_prog timeout 60 "$prog" "$@"
    rc=$?
    cat "$log"
    [ $rc -ne 0 ] || { echo "ran without a worker?"; exit 1; }
    grep -q "ORDO_REGION" "$log" && grep -q "ordo-worker" "$log" || { echo "the error must name ORDO_REGION and ordo-worker"; exit 1; }
    grep -Eq "error (46|3) " "$log" || { echo "expected error 46 or 3"; exit 1; }
    env -u ORDO_REGION LD_LIBRARY_PATH="$libpath" LD_PRELOAD="$preload" timeout 60 "$prog" "$@" >"$log" 2>&1
    cat "$log"
    grep -q "error 3 " "$log" || { echo "ORDO_REGION unset: expected cudaErrorInitializationError (3)"; exit 1; }
    ;;
  trace)
    run_passing ORDO_DRIVER_TRACE=1
    for line in "cuDeviceGetCount -> 0 CUDA_SUCCESS" "cuLaunchKernel -> 0 CUDA_SUCCESS" \
                "cuStreamQuery -> 400 CUDA_ERROR_INVALID_HANDLE"; do
      grep -q "^ordo-trace: $line$" "$log" || { echo "no trace line '$line'"; exit 1; }
    done
    ;;
  props)
    run_passing
    want=$("$worker" --device-info --backend sim) || { echo "ordo-worker --device-info failed"; exit 1; }
    n=$(grep -c '=' "$log")
    [ "$n" -ge 50 ] || { echo "expected at least 50 properties, got $n"; exit 1; }
    diff=$(comm -23 <(grep '=' "$log" | sort) <(sort <<<"$want"))
    [ -z "$diff" ] || { echo "properties that differ from the worker's device (program's lines):"; echo "$diff"; exit 1; }
    echo "all $n properties match ordo-worker --device-info"
    ;;
  library)
    worker_log=$(mktemp)
    start_worker --sim-devices "${SIM_DEVICES:-1}"
    run_prog ORDO_DRIVER_TRACE=1 timeout 300 "$prog" "$@"
    rc=$?
    grep -v "^ordo-trace: " "$log"
    missing=$(grep -E "is not supported by the ordo guest library|\(unknown\) -> 801" "$log" | sort | uniq -c)
    kernel=$(grep -o "kernel .* has no host twin" "$worker_log" | head -1)
    rm -f "$worker_log"
    [ $rc -eq 0 ] || { echo "the case failed (rc $rc); its last driver calls:"; grep "^ordo-trace: " "$log" | tail -15; exit 1; }
    [ -z "$missing" ] || { echo "calls ordo does not implement:"; echo "$missing"; exit 1; }
    [ -z "${EXPECT_LINE:-}" ] || grep -q -- "$EXPECT_LINE" "$log" || { echo "no line with '$EXPECT_LINE'"; exit 1; }
    if [ "${LIBRARY_KERNEL:-1}" = 0 ]; then
      grep -q ": ran" "$log" || { echo "the case did not say it ran"; exit 1; }
    else
      [ -n "$kernel" ] || { echo "the worker named no library kernel it could not run"; exit 1; }
      echo "worker: $kernel"
    fi
    ;;
  *)
    echo "unknown mode $mode"
    exit 2
    ;;
esac
exit 0

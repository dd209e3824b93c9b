#!/usr/bin/env bash
# Runs a test binary whose workers run in-process (test_client) on the cuda
# backend over ordo's libcuda.so.1: starts the inner sim worker the backend's
# driver calls reach, then the binary with ORDO_TEST_BACKEND=cuda.
#
#   inprocess.sh TEST_BINARY [ARGS...]
# Environment: ORDO_STACKED_WORKER, ORDO_STACKED_LIBCUDA (as worker.sh).
set -uo pipefail
real=${ORDO_STACKED_WORKER:?the real ordo-worker}
libcuda=${ORDO_STACKED_LIBCUDA:?the directory of ordo libcuda.so.1}
region=/dev/shm/ordo-stacked-inner-$$
inner_pid=
cleanup() {
  [ -n "$inner_pid" ] && kill "$inner_pid" 2>/dev/null && wait "$inner_pid" 2>/dev/null
  rm -f "$region" "$region.ready" "$region.doorbell"
}
trap cleanup EXIT
setpriv --pdeathsig KILL "$real" --region "$region" --size 512M --backend sim --ready-file "$region.ready" \
  --guest-timeout 1000 --quiet &
inner_pid=$!
for _ in $(seq 200); do [ -e "$region.ready" ] && break; sleep 0.025; done
[ -e "$region.ready" ] || { echo "the inner worker did not become ready"; exit 1; }
ORDO_TEST_BACKEND=cuda ORDO_REGION=$region LD_LIBRARY_PATH=$libcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"

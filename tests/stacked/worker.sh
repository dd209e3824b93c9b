#!/usr/bin/env bash
# ORDO_WORKER for the stacked suite: the cuda backend without a GPU. Takes
# ordo-worker's arguments and runs the pair
#
#   outer: ordo-worker --backend cuda, with ordo's libcuda.so.1 first on the
#          loader's path: every driver call of the cuda backend becomes a guest
#          call of ...
#   inner: ordo-worker --backend sim on a region of its own, which runs the
#          kernels (the built-ins' twins are the sim's own kernels; --sim-kernels
#          and --sim-devices go here: the outer's cuda backend sees the inner's devices).
#
# --region, --size, --ready-file, --stats, --unordered and everything else go
# to the outer worker, --backend becomes cuda. --chaos goes to both, so the
# cuda backend's own stream and event use is shuffled too, and so does
# --sessions (one by default; doubled for the inner): each outer session is a
# guest process of the inner.
#
# Environment: ORDO_STACKED_WORKER (the real ordo-worker), ORDO_STACKED_LIBCUDA
# (the directory of ordo's libcuda.so.1).
set -uo pipefail
source "$(dirname "$0")/inner.sh"
# One session unless asked (each outer session is a guest process of the inner).
outer=(--sessions 1) inner=() region= args=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --backend) outer+=(--backend cuda); shift 2 ;;
    --sim-kernels|--sim-devices) inner+=("$1" "$2"); shift 2 ;;
    --chaos) outer+=("$1" "$2"); inner+=("$1" "$2"); shift 2 ;;
    # Twice as many inner sessions: with several, the outer's supervisor is a
    # guest process of the inner too (it checks the cuda backend starts).
    --sessions) outer+=("$1" "$2"); inner+=("$1" "$(($2 > 1 ? 2 * $2 : 1))"); shift 2 ;;
    --region) region=$2; outer+=("$1" "$2"); shift 2 ;;
    *) outer+=("$1"); shift ;;
  esac
done
# --help, --device-info: no pair needed (the inner's device is what the pair shows)
[ -n "$region" ] || exec "$real" "${args[@]}"
printf '%s\n' " ${outer[*]} " | grep -q -- ' --backend ' || outer+=(--backend cuda)

outer_pid=
cleanup() {
  [ -n "$outer_pid" ] && kill "$outer_pid" 2>/dev/null && wait "$outer_pid" 2>/dev/null
  stop_inner
}
trap cleanup EXIT
trap 'exit 143' TERM INT
# Both workers die with this script even if it is killed outright (the test
# harness's PR_SET_PDEATHSIG reaches only this process).
start_inner "$region.inner" "${inner[@]}"
export_inner_env
setpriv --pdeathsig KILL "$real" "${outer[@]}" &
outer_pid=$!
wait "$outer_pid"
rc=$?
outer_pid=
exit $rc

# Sourced by worker.sh and inprocess.sh: the inner worker of the stacked pair
# (ordo-worker --backend sim), which serves the driver calls of whatever runs
# on ordo's libcuda.so.1 after export_inner_env.
# Environment: ORDO_STACKED_WORKER (the real ordo-worker), ORDO_STACKED_LIBCUDA
# (the directory of ordo's libcuda.so.1).
real=${ORDO_STACKED_WORKER:?the real ordo-worker}
libcuda=${ORDO_STACKED_LIBCUDA:?the directory of ordo libcuda.so.1}
inner_pid= inner_region=

# start_inner REGION [ORDO-WORKER ARGS...]: starts it and waits until it serves.
# One session: its one guest process is the outer worker.
# It dies with this script even if the script is killed outright.
start_inner() {
  inner_region=$1
  shift
  setpriv --pdeathsig KILL "$real" --region "$inner_region" --size 512M --sessions 1 --backend sim \
    --ready-file "$inner_region.ready" --guest-timeout 1000 --quiet "$@" 2> >(sed 's/^/[inner] /' >&2) &
  inner_pid=$!
  for _ in $(seq 200); do
    [ -e "$inner_region.ready" ] && return 0
    kill -0 "$inner_pid" 2>/dev/null || { echo "stacked: the inner worker exited at start" >&2; exit 1; }
    sleep 0.025
  done
  echo "stacked: the inner worker did not become ready" >&2
  exit 1
}

stop_inner() {
  [ -n "$inner_pid" ] && kill "$inner_pid" 2>/dev/null && wait "$inner_pid" 2>/dev/null
  [ -n "$inner_region" ] && rm -f "$inner_region" "$inner_region.ready" "$inner_region".doorbell*
}

# Makes what this script runs next a guest of the inner worker, through ordo's
# libcuda.so.1. (An environment, not a wrapper function: a function run in the
# background is a subshell, and its pid would not be the program's.)
export_inner_env() {
  export ORDO_REGION=$inner_region LD_LIBRARY_PATH=$libcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

#!/usr/bin/env bash
# The main job: sets up, builds, starts ordo-worker on the CPU simulator backend
# and runs the ordo-demo guest program against it. Exit status: the demo's.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=debugoptimized
fi
ninja -C build -j"$(nproc)" src/worker/ordo-worker src/guest/ordo-demo

BACKEND=${ORDO_BACKEND:-sim}
REGION=/dev/shm/ordo-demo-$$
READY=$REGION.ready
WORKER_PID=

cleanup() {
  if [ -n "$WORKER_PID" ] && kill -0 "$WORKER_PID" 2>/dev/null; then
    kill -TERM "$WORKER_PID" 2>/dev/null || true
    wait "$WORKER_PID" 2>/dev/null || true
  fi
  rm -f "$REGION" "$REGION".doorbell* "$READY"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -f "$READY"
build/src/worker/ordo-worker --region "$REGION" --size 64M --backend "$BACKEND" --stats --ready-file "$READY" &
WORKER_PID=$!

for _ in $(seq 1 500); do
  [ -e "$READY" ] && break
  if ! kill -0 "$WORKER_PID" 2>/dev/null; then
    wait "$WORKER_PID" || true
    WORKER_PID=
    echo "demo: ordo-worker exited before it was ready" >&2
    exit 1
  fi
  sleep 0.01
done
if [ ! -e "$READY" ]; then
  echo "demo: ordo-worker did not become ready in 5 s" >&2
  exit 1
fi

rc=0
ORDO_REGION=$REGION build/src/guest/ordo-demo || rc=$?

# SIGTERM: the worker drains, prints its counters to stderr and exits.
kill -TERM "$WORKER_PID"
wrc=0
wait "$WORKER_PID" || wrc=$?
WORKER_PID=
if [ "$wrc" -ne 0 ]; then
  echo "demo: ordo-worker exited with status $wrc" >&2
fi
if [ "$rc" -eq 0 ]; then
  echo "demo: PASS"
else
  echo "demo: FAIL (ordo-demo exited with status $rc)" >&2
fi
exit "$rc"

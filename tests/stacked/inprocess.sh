#!/usr/bin/env bash
# Runs a test binary whose workers run in-process (test_client*) on the cuda
# backend over ordo's libcuda.so.1: starts the inner sim worker the backend's
# driver calls reach, then the binary with ORDO_TEST_BACKEND=cuda.
#
#   inprocess.sh TEST_BINARY [ARGS...]
# Environment: ORDO_STACKED_WORKER, ORDO_STACKED_LIBCUDA (as worker.sh).
set -uo pipefail
source "$(dirname "$0")/inner.sh"
trap stop_inner EXIT
start_inner /dev/shm/ordo-stacked-inner-$$
export_inner_env
ORDO_TEST_BACKEND=cuda "$@"

#!/usr/bin/env bash
# Builds the worker fuzzer with clang + libFuzzer + ASan/UBSan and runs it.
#   scripts/fuzz.sh [SECONDS]   (default 60)
# New interesting inputs are merged into tests/fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
cxx=$(command -v clang++-14 || command -v clang++ || true)
probe='extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }'
if [ -z "$cxx" ] || ! echo "$probe" | "$cxx" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "fuzz.sh: clang with libFuzzer is missing: apt-get install clang libclang-rt-14-dev" >&2
  exit 2
fi
mkdir -p build-fuzz
"$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude -Isrc tests/fuzz/fuzz_worker.cc \
  src/worker/worker.cc src/worker/ring_server.cc src/worker/slot_server.cc src/worker/session.cc src/worker/handlers/*.cc \
  src/worker/event_table.cc src/worker/stream_table.cc src/worker/validate.cc src/worker/trace.cc src/worker/doorbell_waiter.cc src/worker/device_attributes.cc \
  src/transport/layout.cc src/transport/region.cc src/transport/status.cc src/transport/doorbell.cc src/transport/ivshmem.cc \
  -luring -pthread -o build-fuzz/fuzz_worker
rm -rf build-fuzz/new && mkdir -p build-fuzz/new
set +e
build-fuzz/fuzz_worker -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=4096 \
  -print_final_stats=1 build-fuzz/new tests/fuzz/corpus > build-fuzz/fuzz.log 2>&1
rc=$?
set -e
grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)|ERROR|SUMMARY|crash-' build-fuzz/fuzz.log || true
if [ "$rc" -ne 0 ]; then
  echo "fuzz.sh: the fuzzer found a problem (exit $rc); the input is saved as build-fuzz/crash-* or ./crash-*:" >&2
  tail -n 60 build-fuzz/fuzz.log >&2
  exit 1
fi
# Keep the committed corpus small: only inputs that add coverage (not in CI,
# where the clone is thrown away).
if [ -z "${CI:-}" ]; then
  build-fuzz/fuzz_worker -merge=1 -max_len=4096 tests/fuzz/corpus build-fuzz/new >/dev/null 2>&1 || true
fi
echo "fuzz.sh: corpus has $(ls tests/fuzz/corpus | wc -l) inputs"

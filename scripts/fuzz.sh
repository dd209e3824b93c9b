#!/usr/bin/env bash
# Builds the fuzzers with clang + libFuzzer + ASan/UBSan and runs them, one
# after the other, within SECONDS: the worker fuzzer (tests/fuzz/fuzz_worker.cc)
# for 3/4 of it, the module-image fuzzer (tests/fuzz/fuzz_module_image.cc) for
# the rest.
#   scripts/fuzz.sh [SECONDS]   (default 60)
# New interesting inputs are merged into tests/fuzz/corpus and
# tests/fuzz/corpus_module_image.
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
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc)
"$cxx" "${flags[@]}" tests/fuzz/fuzz_worker.cc \
  src/worker/worker.cc src/worker/ring_server.cc src/worker/slot_server.cc src/worker/side_thread.cc src/worker/session.cc \
  src/worker/handlers/*.cc \
  src/worker/event_table.cc src/worker/stream_table.cc src/worker/vmm_table.cc src/worker/ipc_table.cc src/worker/validate.cc src/worker/trace.cc \
  src/worker/doorbell_waiter.cc src/worker/device_attributes.cc \
  src/transport/*.cc \
  -luring -pthread -o build-fuzz/fuzz_worker
"$cxx" "${flags[@]}" tests/fuzz/fuzz_module_image.cc src/transport/module_image.cc src/transport/lz4.cc \
  -o build-fuzz/fuzz_module_image

worker_secs=$((secs * 3 / 4))
image_secs=$((secs - worker_secs))
if [ "$secs" -gt 0 ]; then  # 0: each runs until stopped, as libFuzzer's -max_total_time=0
  [ "$worker_secs" -ge 1 ] || worker_secs=1
  [ "$image_secs" -ge 1 ] || image_secs=1
fi
failed=0

# run NAME SECONDS CORPUS MAX_LEN LOG: one fuzzer; its summary lines, or its
# log's tail and failed=1 if it found a problem.
run() {
  local name=$1 t=$2 corpus=$3 max_len=$4 log=$5 rc
  rm -rf "build-fuzz/new_$name" && mkdir -p "build-fuzz/new_$name"
  echo "fuzz.sh: $name, $t s"
  set +e
  "build-fuzz/$name" -max_total_time="$t" -max_len="$max_len" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 "build-fuzz/new_$name" "$corpus" > "$log" 2>&1
  rc=$?
  set -e
  grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added)|ERROR|SUMMARY|crash-' "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz.sh: $name found a problem (exit $rc); the input is saved as build-fuzz/crash-* or ./crash-*:" >&2
    tail -n 60 "$log" >&2
    failed=1
    return
  fi
  # Keep the committed corpus small: only inputs that add coverage (not in CI,
  # where the clone is thrown away).
  if [ -z "${CI:-}" ]; then
    "build-fuzz/$name" -merge=1 -max_len="$max_len" "$corpus" "build-fuzz/new_$name" >/dev/null 2>&1 || true
  fi
  echo "fuzz.sh: $name's corpus has $(ls "$corpus" | wc -l) inputs"
}

run fuzz_worker "$worker_secs" tests/fuzz/corpus 4096 build-fuzz/fuzz.log
run fuzz_module_image "$image_secs" tests/fuzz/corpus_module_image 16384 build-fuzz/fuzz_module_image.log
exit "$failed"

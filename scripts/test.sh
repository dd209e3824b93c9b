#!/usr/bin/env bash
# Sets up, builds and runs all tests: a debugoptimized build in build/, then
# (unless ORDO_SANITIZERS=0) the same tests under ASan+UBSan in build-asan/ and
# under TSan in build-tsan/. Ends with a line "N passed, N failed" counting
# GoogleTest test cases over all runs; exits non-zero if anything failed.
#
# Environment: ORDO_SANITIZERS=0 skips the sanitizer builds; ORDO_JOBS sets the
# build parallelism (default: the number of CPUs).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

JOBS=${ORDO_JOBS:-$(nproc)}
TOTAL_PASSED=0
TOTAL_FAILED=0
SUMMARY=()
TEST_WRAPPER=()  # extra meson test arguments (the TSan ASLR workaround)
OLD_RND_BITS=

restore_sysctl() {
  if [ -n "$OLD_RND_BITS" ]; then
    echo "$OLD_RND_BITS" 2>/dev/null >/proc/sys/vm/mmap_rnd_bits || true
    OLD_RND_BITS=
  fi
}
trap restore_sysctl EXIT

now() { date +%s; }

# Counts test cases in DIR/meson-logs/testlog.json: GoogleTest per-test lines
# ("[       OK ] X" / "[  FAILED  ] X (N ms)"); a meson test that failed with no
# failed test case (a crash, a sanitizer report at exit, a timeout) counts as
# one failure; a passing non-GoogleTest test counts as one pass. Prints "P F".
count_results() {
  python3 - "$1/meson-logs/testlog.json" <<'PY'
import json, re, sys
passed = failed = 0
try:
    lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
except OSError:
    lines = []
ok_re = re.compile(r"^\[       OK \] \S")
fail_re = re.compile(r"^\[  FAILED  \] \S+.* \(\d+ ms\)$")
for line in lines:
    if not line.strip():
        continue
    t = json.loads(line)
    out = t.get("stdout") or ""
    p = sum(1 for l in out.splitlines() if ok_re.match(l))
    f = sum(1 for l in out.splitlines() if fail_re.match(l))
    good = t.get("result") in ("OK", "SKIP", "EXPECTEDFAIL")
    if p == 0 and f == 0 and "[==========]" not in out:
        if t.get("result") == "SKIP":
            continue                        # e.g. the VM test where QEMU is missing
        p, f = (1, 0) if good else (0, 1)   # not a GoogleTest binary, or it died at start
    elif not good and f == 0:
        f = 1                               # crashed, timed out or a sanitizer failed it at exit
    passed += p
    failed += f
print(passed, failed)
PY
}

# run_phase NAME BUILDDIR TIMEOUT_MULTIPLIER MESON_OPTION...
run_phase() {
  local name=$1 dir=$2 mult=$3
  shift 3
  local start rc=0 p=0 f=0
  start=$(now)
  echo
  echo "=== $name: build in $dir ==="
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "$@" >/dev/null || rc=$?
  else
    rm -rf "$dir"
    meson setup "$dir" "$@" || rc=$?
  fi
  if [ "$rc" -eq 0 ]; then
    ninja -C "$dir" -j"$JOBS" || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    echo "=== $name: BUILD FAILED ==="
    f=1
  else
    if [ "$name" = tsan ]; then tsan_workaround "$dir"; fi
    echo "=== $name: test ==="
    rm -f "$dir/meson-logs/testlog.json"
    meson test -C "$dir" --print-errorlogs -v --num-processes 1 --timeout-multiplier "$mult" \
      "${TEST_WRAPPER[@]}" || rc=$?
    if ! read -r p f < <(count_results "$dir"); then p=0; f=1; fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # meson itself failed
    if [ "$name" = tsan ]; then restore_sysctl; TEST_WRAPPER=(); fi
  fi
  local secs=$(($(now) - start))
  TOTAL_PASSED=$((TOTAL_PASSED + p))
  TOTAL_FAILED=$((TOTAL_FAILED + f))
  SUMMARY+=("$(printf '%-6s %4d passed, %d failed  (%dm%02ds, build and tests)' "$name" "$p" "$f" $((secs / 60)) $((secs % 60)))")
  echo "=== $name: $p passed, $f failed in ${secs}s ==="
}

# GCC 12's TSan runtime aborts at start ("unexpected memory mapping") on kernels
# that randomize mmap with more than 28 bits. Probe with a TSan-built binary and,
# if it fails, lower vm.mmap_rnd_bits (root) or run the tests without ASLR (setarch -R).
tsan_starts() {  # [WRAPPER...]: runs a TSan binary a few times (the failure depends on where ASLR lands)
  local i
  for i in 1 2 3; do "$@" "$probe" --help >/dev/null 2>"$log" || return 1; done
}

tsan_workaround() {
  local probe=$1/src/worker/ordo-worker log
  log=$(mktemp)
  if tsan_starts; then rm -f "$log"; return; fi
  echo "tsan: a TSan binary fails at start: $(head -c 300 "$log")"
  local bits
  bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)
  if [ "$(id -u)" -eq 0 ] && [ "$bits" -gt 28 ] && { echo 28 >/proc/sys/vm/mmap_rnd_bits; } 2>/dev/null; then
    OLD_RND_BITS=$bits
    if tsan_starts; then
      echo "tsan: vm.mmap_rnd_bits lowered from $bits to 28 for the TSan run"
      rm -f "$log"
      return
    fi
    restore_sysctl
  fi
  local arch
  arch=$(uname -m)
  if tsan_starts setarch "$arch" -R; then
    echo "tsan: running the TSan tests under setarch $arch -R (no ASLR)"
    TEST_WRAPPER=(--wrapper "setarch $arch -R")
  else
    echo "tsan: no workaround helped; running anyway: $(head -c 300 "$log")"
  fi
  rm -f "$log"
}

T0=$(now)
# Prefix /usr: the package test (tests/packaging) packages build/'s install sets.
run_phase main build 1 -Dbuildtype=debugoptimized -Dprefix=/usr

# libFuzzer over the worker's decoding, with ASan+UBSan (docs/SECURITY.md).
if [ "${ORDO_FUZZ_SECONDS:-60}" != 0 ]; then
  echo
  echo "=== fuzz: ${ORDO_FUZZ_SECONDS:-60} s ==="
  start=$(now)
  if scripts/fuzz.sh "${ORDO_FUZZ_SECONDS:-60}"; then p=1 f=0; else p=0 f=1; fi
  TOTAL_PASSED=$((TOTAL_PASSED + p))
  TOTAL_FAILED=$((TOTAL_FAILED + f))
  SUMMARY+=("$(printf '%-6s %4d passed, %d failed  (%ds)' fuzz "$p" "$f" $(($(now) - start)))")
fi

if [ "${ORDO_SANITIZERS:-1}" != 0 ]; then
  # Warnings are errors in build/ above. The sanitizer builds are there for their
  # runtime checks: their instrumentation makes GCC 12 warn falsely (e.g.
  # -Wmaybe-uninitialized inside <regex> under ASan) or about itself (-Wtsan:
  # TSan does not model std::atomic_thread_fence, which can only add reports,
  # never hide one), so there warnings stay warnings.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_phase asan build-asan 3 -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
      -Dbenchmarks=disabled -Dwerror=false
  TSAN_OPTIONS="halt_on_error=1:suppressions=$PWD/tests/tsan.supp" \
    run_phase tsan build-tsan 3 -Dbuildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false \
      -Dbenchmarks=disabled -Dwerror=false
fi

T=$(($(now) - T0))
echo
echo "=== summary (${T}s in all) ==="
for line in "${SUMMARY[@]}"; do echo "$line"; done
echo "$TOTAL_PASSED passed, $TOTAL_FAILED failed"
[ "$TOTAL_FAILED" -eq 0 ] && [ "$TOTAL_PASSED" -gt 0 ]

#!/usr/bin/env bash
# Packs a build for a GPU machine that has the driver and CUDA but none of
# this project's build dependencies: a copy of BUILD without objects, static
# libraries or meson's private state, its programs stripped, plus the shared
# libraries they need from this machine that a stock CUDA image lacks.
# tests/gpu/run.sh runs such a folder as it is (see its header).
#
#   scripts/gpu-pack.sh BUILD OUT     e.g. scripts/gpu-pack.sh build .gpu/build
set -euo pipefail
build=$1 out=$2
ninja -C "$build" >/dev/null
rm -rf "$out"
mkdir -p "$(dirname "$out")"
cp -a "$build" "$out"
find "$out" -name '*.p' -type d -prune -exec rm -rf {} +
find "$out" -name '*.a' -delete
rm -rf "$out/meson-private" "$out/meson-logs"
elfs=()
while IFS= read -r f; do
  file -b "$f" | grep -q '^ELF 64-bit LSB.*x86-64' && elfs+=("$f")
done < <(find "$out" -type f)
strip --strip-unneeded "${elfs[@]}"
mkdir -p "$out/.runlibs"
for lib in $(ldd "${elfs[@]}" 2>/dev/null | awk '/=> \// {print $3}' | sort -u); do
  case $(basename "$lib") in libbenchmark*|liburing*|libgtest*|libgmock*) cp -L "$lib" "$out/.runlibs/" ;; esac
done
# What was built: the GPU machine's copy of the tree may not say (its .git can be stale).
{ git rev-parse --short HEAD; git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)"; } \
  2>/dev/null | paste -sd' ' >"$out/.commit" || true
du -sh "$out"

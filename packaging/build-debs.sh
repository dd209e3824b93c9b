#!/usr/bin/env bash
# Builds the Debian packages ordo-host and ordo-guest from a meson build
# directory configured with -Dprefix=/usr, as it is (build it first): the
# packages are its install sets (meson install --tags host|guest).
#   packaging/build-debs.sh BUILD_DIR OUT_DIR
# Leaves ordo-host_VERSION_ARCH.deb and ordo-guest_VERSION_ARCH.deb (and the
# .changes and .buildinfo files) in OUT_DIR.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR OUT_DIR" >&2; exit 2; }
build=$(realpath "$1")
src=$(cd "$(dirname "$0")" && pwd)
prefix=$(meson introspect "$build" --buildoptions |
  python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
if [ "$prefix" != /usr ]; then
  echo "build-debs: $build installs into $prefix; packages need /usr (meson configure $build -Dprefix=/usr)" >&2
  exit 2
fi
[ -f "$build/src/guest/cuda/libcuda.so.1" ] ||
  { echo "build-debs: $build has no libcuda.so.1 (it needs the CUDA toolkit, docs/CUDA.md)" >&2; exit 2; }
mkdir -p "$2"
out=$(realpath "$2")
# dpkg-buildpackage writes its results next to the source directory: a
# scratch one in OUT_DIR holding only debian/.
work=$(mktemp -d "$out/source.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$src/debian" "$work/debian"
(cd "$work" && ORDO_BUILD=$build dpkg-buildpackage -b -us -uc)

#!/usr/bin/env bash
# The Debian packages, built from this build directory and checked as a user
# would meet them (README.md, "Install"):
#   packages_test.sh BUILD_DIR
# builds ordo-host and ordo-guest (packaging/build-debs.sh), runs lintian
# (warnings fail; overrides are in packaging/debian), unpacks each into a
# scratch root and checks: the files (tests/packaging/*.contents), no library
# in ordo-host, the units (systemd-analyze verify and security), the guest's
# ld.so.conf.d drop-in (ldconfig -r), the README's example built with
# pkg-config against the guest root and run against the host root's worker.
# Exits 77 when a tool is missing or the build is not packageable.
set -uo pipefail
build=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)

for tool in dpkg-buildpackage:dpkg-dev dh:debhelper lintian:lintian systemd-analyze:systemd pkg-config:pkg-config \
            g++:g++; do
  command -v "${tool%%:*}" >/dev/null ||
    { echo "SKIP: ${tool%%:*} missing (apt-get install ${tool#*:})"; exit 77; }
done
prefix=$(meson introspect "$build" --buildoptions |
  python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
[ "$prefix" = /usr ] || { echo "SKIP: $build installs into $prefix; packages need meson configure -Dprefix=/usr"; exit 77; }
[ -f "$build/src/guest/cuda/libcuda.so.1" ] ||
  { echo "SKIP: no libcuda.so.1 in $build (it needs the CUDA toolkit, docs/CUDA.md)"; exit 77; }

tmp=$(mktemp -d /tmp/ordo-packages.XXXXXX)
worker_pid=
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  rm -rf "$tmp" "/dev/shm/ordo-packages-$$" /dev/shm/ordo-packages-$$.doorbell*
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

version=$(meson introspect "$build" --projectinfo | python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
changelog=$(dpkg-parsechangelog -l "$src/packaging/debian/changelog" -S Version)
[ "$version" = "$changelog" ] || bad "packaging/debian/changelog is at $changelog, meson.build at $version"
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)

t0=$(date +%s)
"$src/packaging/build-debs.sh" "$build" "$tmp/debs" > "$tmp/build-debs.log" 2>&1 ||
  { cat "$tmp/build-debs.log"; echo "FAIL: packaging/build-debs.sh"; exit 1; }
host_deb=$tmp/debs/ordo-host_${changelog}_$arch.deb
guest_deb=$tmp/debs/ordo-guest_${changelog}_$arch.deb
echo "== built $(basename "$host_deb") and $(basename "$guest_deb") in $(( $(date +%s) - t0 )) s"

echo "== lintian"
out=$(lintian --fail-on error,warning "$host_deb" "$guest_deb" 2>&1) || bad "lintian: errors or warnings"
grep -v 'running with root privileges' <<< "$out"

echo "== contents"
for pkg in host guest; do
  deb=$tmp/debs/ordo-${pkg}_${changelog}_$arch.deb
  mkdir -p "$tmp/$pkg"
  dpkg -x "$deb" "$tmp/$pkg"
  # Files and links, not directories, with the architecture's triplet as @MULTIARCH@.
  dpkg-deb --fsys-tarfile "$deb" | tar -t | grep -v '/$' | sed "s|^\./|/|; s|/$multiarch/|/@MULTIARCH@/|" | sort \
    > "$tmp/$pkg.contents"
  diff -u "$here/ordo-$pkg.contents" "$tmp/$pkg.contents" ||
    bad "ordo-$pkg's files differ from tests/packaging/ordo-$pkg.contents (above: - expected, + packaged)"
done
# Whatever else changes: a CUDA stand-in on a GPU host's loader path hides NVIDIA's driver.
libs=$(cd "$tmp/host" && find . -name 'lib*.so*' -o -path '*/ld.so.conf.d/*')
[ -z "$libs" ] || bad "ordo-host installs libraries or loader paths: $libs"

echo "== systemd units"
# A root where systemd-analyze finds the host package, the targets units
# depend on and the programs the units run from other packages.
cp /lib/systemd/system/*.target "$tmp/host/lib/systemd/system/"
mkdir -p "$tmp/host/bin" && cp -L /bin/touch "$tmp/host/bin/touch"
for unit in ordo-worker@ ordo-ivshmem-server@; do
  out=$(systemd-analyze verify --root="$tmp/host" --man=no "${unit}vm1.service" 2>&1)
  rc=$?
  # Unknown or malformed settings are only warnings to systemd: any output fails.
  if [ $rc -eq 0 ] && [ -z "$out" ]; then
    echo "${unit}vm1.service: systemd-analyze verify passes"
  else
    bad "systemd-analyze verify ${unit}vm1.service (rc $rc): $out"
  fi
  # Exposure 0-100 (systemd-analyze prints it as 0.0-10.0); both units are at 1.6-1.8.
  if systemd-analyze security --offline=yes --root="$tmp/host" --threshold=25 "${unit}vm1.service" \
       > "$tmp/security.log" 2>&1; then
    echo "${unit}vm1.service: exposure $(tail -n 1 "$tmp/security.log" | grep -o '[0-9]*\.[0-9]')"
  else
    tail -n 30 "$tmp/security.log"
    bad "${unit}vm1.service: exposure above 2.5 (systemd-analyze security)"
  fi
done

echo "== guest loader path"
# As in a guest's /etc: ldconfig must find libcuda.so.1 and libnvidia-ml.so.1
# through the package's drop-in.
echo 'include /etc/ld.so.conf.d/*.conf' > "$tmp/guest/etc/ld.so.conf"
ldconfig=(/sbin/ldconfig)
[ "$(id -u)" -eq 0 ] || ldconfig=(unshare -r /sbin/ldconfig)  # -r chroots
"${ldconfig[@]}" -r "$tmp/guest" || bad "${ldconfig[*]} -r failed in the guest root"
for lib in libcuda.so.1 libnvidia-ml.so.1; do
  found=$(/sbin/ldconfig -C "$tmp/guest/etc/ld.so.cache" -p | awk -v l="$lib" '$1 == l {print $NF}')
  [ "$found" = "/usr/lib/$multiarch/ordo/$lib" ] || bad "ldconfig in the guest root resolves $lib to '$found'"
  echo "$lib => $found"
done
rm "$tmp/guest/etc/ld.so.conf" "$tmp/guest/etc/ld.so.cache"

echo "== README example against the packages"
mkdir "$tmp/example"
# The README's "Install" section: its C++ block and its g++ command line.
awk '/^## Install/ {on = 1; next} on && /^## / {exit} on' "$src/README.md" > "$tmp/install.md"
awk '/^```cpp/ {on = 1; next} on && /^```/ {exit} on' "$tmp/install.md" > "$tmp/example/vec_add.cc"
compile=$(grep -m 1 '^g++ .*pkg-config' "$tmp/install.md")
[ -s "$tmp/example/vec_add.cc" ] && [ -n "$compile" ] || bad "README.md's Install section has no C++ example or g++ line"
export PKG_CONFIG_LIBDIR=$tmp/guest/usr/lib/$multiarch/pkgconfig PKG_CONFIG_SYSROOT_DIR=$tmp/guest
# Keep -I/usr/include and -L/usr/lib/...: under the sysroot they are the guest root's.
export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
flags=$(pkg-config --cflags --libs ordo-guest) || bad "pkg-config --cflags --libs ordo-guest"
echo "pkg-config: $flags"
[[ "$flags" == *"-I$tmp/guest/usr/include"* && "$flags" == *"-L$tmp/guest/usr/lib/$multiarch"* ]] ||
  bad "ordo-guest.pc does not point into the package's include and library directories"
echo "$compile"
(cd "$tmp/example" && eval "$compile") || bad "the README's example does not build against ordo-guest"
# Every installed header stands alone (an include the package lacks fails here).
for h in "$tmp"/guest/usr/include/ordo/*.h; do echo "#include \"ordo/$(basename "$h")\""; done > "$tmp/headers.cc"
g++ -std=c++20 -fsyntax-only $(pkg-config --cflags ordo-guest) "$tmp/headers.cc" || bad "the installed headers do not compile"

region=/dev/shm/ordo-packages-$$
"$tmp/host/usr/bin/ordo-worker" --region "$region" --size 16M --backend sim --quiet --ready-file "$tmp/ready" &
worker_pid=$!
for _ in $(seq 100); do [ -e "$tmp/ready" ] && break; sleep 0.05; done
if [ -x "$tmp/example/vec_add" ]; then
  ORDO_REGION=$region "$tmp/example/vec_add" || bad "the README's example failed against the host package's worker"
fi

if [ $fail = 0 ]; then echo "packages_test: PASS"; else echo "packages_test: FAIL"; fi
exit $fail

#!/usr/bin/env bash
# The libvirt domains in docs/GUEST.md ("Installed: a VM under libvirt") are
# valid (virt-xml-validate) and use the region and socket that the systemd
# units serve for VM vm1, as do the QEMU command lines there.
# Exits 77 when virt-xml-validate is missing.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v virt-xml-validate >/dev/null ||
  { echo "SKIP: virt-xml-validate missing (apt-get install libvirt-clients)"; exit 77; }

tmp=$(mktemp -d /tmp/ordo-libvirt.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# What the units use for an instance: the value after OPTION in ExecStart=, %i as vm1.
unit_arg() {  # UNIT OPTION
  sed -n "s/^ExecStart=.* $2 \([^ ]*\).*/\1/p" "$src/packaging/systemd/$1.in" | sed 's/%i/vm1/g'
}
region=$(unit_arg ordo-worker@.service --region)
socket=$(unit_arg ordo-ivshmem-server@.service --socket)
[ -n "$region" ] && [ -n "$socket" ] || bad "no --region in ordo-worker@.service or no --socket in ordo-ivshmem-server@.service"
[ "$(unit_arg ordo-ivshmem-server@.service --region)" = "$region" ] ||
  bad "ordo-ivshmem-server@.service shares another region than ordo-worker@.service serves"
size=$(sed -n 's/^ORDO_SIZE=\([0-9]*\)M$/\1/p' "$src/packaging/vm.env")
echo "units for vm1: region $region, socket $socket; vm.env: ${size:-?} MiB"

awk '/^## Installed: a VM under libvirt/ {on = 1; next} on && /^## / {exit} on' "$src/docs/GUEST.md" > "$tmp/section.md"
awk -v dir="$tmp" '/^```xml/ {n++; on = 1; next} on && /^```/ {on = 0} on {print > (dir "/domain" n ".xml")}' "$tmp/section.md"
domains=("$tmp"/domain*.xml)
[ -e "${domains[0]}" ] || { echo "FAIL: no xml blocks in docs/GUEST.md's libvirt section"; exit 1; }

models=
for xml in "${domains[@]}"; do
  virt-xml-validate "$xml" domain || bad "$(basename "$xml") is not a valid domain"
  # model name server-path size-in-MiB, one line per <shmem>
  read -r model name path mib < <(python3 - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).find("devices/shmem")
if s is None:
    print("none - - -")
else:
    size = s.find("size")
    mib = "-" if size is None else int(size.text) * {"M": 1, "MiB": 1, "G": 1024, "GiB": 1024}[size.get("unit", "M")]
    server = s.find("server")
    print(s.find("model").get("type"), s.get("name"), "-" if server is None else server.get("path"), mib)
PY
)
  echo "$(basename "$xml"): $model, name $name, server $path, size $mib MiB"
  models+=" $model"
  [ "$name" = "$(basename "$region")" ] || bad "$(basename "$xml"): shmem name $name, but the worker serves $region"
  case $model in
    ivshmem-plain) [ "$mib" = "$size" ] || bad "$(basename "$xml"): size $mib MiB, vm.env's ORDO_SIZE is ${size}M" ;;
    ivshmem-doorbell) [ "$path" = "$socket" ] || bad "$(basename "$xml"): server $path, the server unit listens on $socket" ;;
    *) bad "$(basename "$xml"): no ivshmem <shmem> device" ;;
  esac
done
[ "$(echo "$models" | tr ' ' '\n' | sort | xargs)" = "ivshmem-doorbell ivshmem-plain" ] ||
  bad "expected one ivshmem-plain and one ivshmem-doorbell domain, found:$models"
grep -q "mem-path=$region,size=${size}M .*ivshmem-plain" "$tmp/section.md" ||
  bad "no QEMU ivshmem-plain line with mem-path=$region,size=${size}M"
grep -q "socket,path=$socket,.*ivshmem-doorbell" "$tmp/section.md" || bad "no QEMU ivshmem-doorbell line with path=$socket"

if [ $fail = 0 ]; then echo "libvirt_xml_test: PASS"; else echo "libvirt_xml_test: FAIL"; fi
exit $fail

#!/usr/bin/env bash
# ivshmem-doorbell mode against plain mode, in real QEMU guests (TCG).
#   vm_doorbell_test.sh ORDO_WORKER ORDO_IVSHMEM_SERVER ORDO_VM_GUEST [BUILD_DIR TWINS CUDA_PROGRAM...]
# Worker D joins an ordo-ivshmem-server and sleeps up to 3 s when idle; VM D has
# an ivshmem-doorbell device on that server. Worker P serves VM P's
# ivshmem-plain device and polls every 20 ms when idle. Both guests run the quick
# checks and 20 sync calls after 50 ms of idling each, one guest after the other. D passes only if its
# worker was woken by the guest's doorbell for those calls (with a 3 s sleep,
# a missed ring would cost seconds per call and show no doorbell wake-ups).
# Also prints each idle worker's CPU use. With the CUDA arguments, VM D then runs
# unmodified programs built with plain nvcc (static cudart) through ordo's
# libcuda.so.1 (worker D loads their kernel twins), all at once, each a session
# of its own (worker D serves two): CUDA programs in a real
# guest, with the guest set installed as the ordo-guest package installs it
# (BUILD_DIR's meson install --tags guest, the ld.so.conf.d drop-in, ldconfig in
# the guest) and no LD_LIBRARY_PATH. Exits 77 when QEMU etc. are missing.
set -uo pipefail
worker=$1 server=$2 guest=$3
shift 3
source "$(dirname "$0")/common.sh"
cuda_worker_args=()
cuda_progs=()
libcuda_path=
if [ $# -ge 3 ]; then
  build=$1 twins=$2
  shift 2
  cuda_worker_args=(--sim-kernels "$twins")
  # What ordo-guest holds and installs (packaging/debian/rules), and a
  # Debian guest's ld.so.conf and ldconfig.
  meson install -C "$build" --no-rebuild --quiet --strip --tags guest --destdir "$tmp/root" ||
    { echo "FAIL: meson install --tags guest"; exit 1; }
  mkdir -p "$tmp/root/etc/ld.so.conf.d" "$tmp/root/sbin"
  cp "$build/src/guest/cuda/ordo.conf" "$tmp/root/etc/ld.so.conf.d/ordo.conf"
  echo 'include /etc/ld.so.conf.d/*.conf' > "$tmp/root/etc/ld.so.conf"
  cp /sbin/ldconfig "$tmp/root/sbin/ldconfig"  # static
  libcuda_path=$(cat "$build/src/guest/cuda/ordo.conf")/libcuda.so.1
  [ -f "$tmp/root/$libcuda_path" ] || { echo "FAIL: meson install --tags guest installed no $libcuda_path"; exit 1; }
  stage_libs "$tmp/root/$libcuda_path"
  # libcuda.so.1 dlopens libzstd for compressed fatbin entries (ordo-guest recommends libzstd1).
  zstd=$(ldconfig -p | awk '/libzstd\.so\.1 / {print $NF; exit}')
  [ -n "$zstd" ] && mkdir -p "$tmp/root/$(dirname "$zstd")" && cp -L "$zstd" "$tmp/root/$zstd"
  {
    echo '#!/bin/sh'
    echo 'grep -q -- --cuda /proc/cmdline || exit 0'
    echo '/sbin/ldconfig'
    echo 'echo "ordo-vm: ldconfig: $(/sbin/ldconfig -p | grep "libcuda\.so\.1 ")"'
    # All at once: each is a guest process, a session of its own on worker D.
    for prog in "$@"; do
      name=$(basename "$prog")
      stage_program "$prog" "/cuda/$name"
      arg=; [ "${name%_static}" = seed ] && arg=10
      echo "echo \"ordo-vm: cuda program $name\""
      echo "(ORDO_REGION=ivshmem /cuda/$name $arg > /out.$name 2>&1; echo \$? > /rc.$name) &"
      cuda_progs+=("$name")
    done
    echo "wait"
    for name in "${cuda_progs[@]}"; do
      echo "sed 's/^/ordo-vm:   /' /out.$name"
      echo "echo \"ordo-vm: cuda $name exit \$(cat /rc.$name)\""
    done
  } > "$tmp/root/extra.sh"
  chmod +x "$tmp/root/extra.sh"
fi
make_initrd

sock=$tmp/ivshmem.sock
region_d=/dev/shm/ordo-vm-$$-d
"$server" --socket "$sock" --region "$region_d" --size 16M --verbose 2> "$tmp/server.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "FAIL: ordo-ivshmem-server did not start"; cat "$tmp/server.log"; exit 1; }

# Two sessions: the CUDA programs run in the guest at once, a worker process each.
start_worker d --ivshmem-server "$sock" --max-sleep 3000 --sessions 2 "${cuda_worker_args[@]}"
start_worker p
grep -q 'ivshmem peer' "$tmp/d.worker.log" || { echo "FAIL: worker D did not join the server"; cat "$tmp/d.worker.log"; exit 1; }

cpu_ticks() {  # user + system of a worker and its session processes, in clock ticks
  local p t=0
  for p in "$1" $(pgrep -P "$1"); do t=$(( t + $(awk '{print $14 + $15}' "/proc/$p/stat") )); done
  echo $t
}
hz=$(getconf CLK_TCK)
d0=$(cpu_ticks "$worker_d") p0=$(cpu_ticks "$worker_p")
sleep 5
d1=$(cpu_ticks "$worker_d") p1=$(cpu_ticks "$worker_p")
echo "== idle CPU over 5 s: doorbell worker $(( (d1 - d0) * 1000 / hz / 5 )) ms/s, plain worker $(( (p1 - p0) * 1000 / hz / 5 )) ms/s"

# One at a time: two TCG guests and their workers on 2 cores would measure each other.
boot d "--quick,--idle,20,--cuda" -chardev socket,path="$sock",id=ivs -device ivshmem-doorbell,chardev=ivs,vectors=1
rc_d=$?
boot p "--quick,--idle,20" $(plain "$region_p")
rc_p=$?
for n in d p; do
  echo "== VM ${n^^}"
  grep -a 'ordo-vm:' "$tmp/$n.vm.log" | tr -d '\r'
done
for n in d p; do kill -TERM "$(eval echo \$worker_$n)" 2>/dev/null; done
wait "$worker_d" "$worker_p" 2>/dev/null

fail=0
grep -aq 'ordo-vm: RESULT PASS' "$tmp/d.vm.log" || { echo "FAIL: VM D did not pass (qemu rc $rc_d)"; tail -n 30 "$tmp/d.vm.log"; fail=1; }
grep -aq 'ordo-vm: RESULT PASS' "$tmp/p.vm.log" || { echo "FAIL: VM P did not pass (qemu rc $rc_p)"; tail -n 30 "$tmp/p.vm.log"; fail=1; }
if [ -n "$libcuda_path" ]; then
  grep -aq "ordo-vm: ldconfig: .*libcuda\.so\.1 .*=> $libcuda_path" "$tmp/d.vm.log" ||
    { echo "FAIL: ldconfig in VM D did not put $libcuda_path on the loader's path"; fail=1; }
fi
for name in "${cuda_progs[@]}"; do
  grep -aq "ordo-vm: cuda $name exit 0" "$tmp/d.vm.log" ||
    { echo "FAIL: CUDA program $name did not pass in VM D"; fail=1; }
done
# Summed over the worker's session processes (each prints its counters at exit).
wakeups() { sed -n 's/^{.*"doorbell_wakeups":\([0-9]*\).*/\1/p' "$tmp/$1.worker.log" | awk '{s += $1} END {print s}'; }
wd=$(wakeups d) wp=$(wakeups p)
echo "== doorbell wake-ups: worker D ${wd:-?}, worker P ${wp:-?}"
[ "${wd:-0}" -ge 20 ] || { echo "FAIL: worker D was woken by a doorbell ${wd:-0} times, expected >= 20 (one per idle call)"; fail=1; }
if [ $fail = 0 ]; then echo "vm_doorbell_test: PASS"; else echo "vm_doorbell_test: FAIL"; fi
exit $fail

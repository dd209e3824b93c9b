#!/usr/bin/env bash
# End-to-end in real QEMU guests over ivshmem (TCG; KVM is not needed).
#   vm_test.sh ORDO_WORKER ORDO_VM_GUEST
# VM A runs the ordering scenarios, the model check and two measurements
# against its worker. At the same time VM B, on its own region and worker,
# writes garbage into its region and dies without detaching. A must pass,
# B's worker must survive, reject B's input and reclaim the dead session, and a
# third guest booted on B's region must then pass a quick check.
# Exits 77 (skipped) when QEMU, a kernel or busybox is missing.
set -uo pipefail
worker=$1 guest=$2
src=$(cd "$(dirname "$0")" && pwd)
kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
for need in qemu-system-x86_64 cpio gzip; do
  command -v "$need" >/dev/null || { echo "SKIP: $need missing (apt-get install qemu-system-x86 cpio)"; exit 77; }
done
[ -n "$kernel" ] || { echo "SKIP: no kernel in /boot (apt-get install linux-image-amd64)"; exit 77; }
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static || [ -x /bin/busybox ] ||
  { echo "SKIP: no static busybox (apt-get install busybox-static)"; exit 77; }

tmp=$(mktemp -d /tmp/ordo-vm.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp" /dev/shm/ordo-vm-$$-*
}
trap cleanup EXIT

mkdir -p "$tmp/root/bin" "$tmp/root/proc" "$tmp/root/sys" "$tmp/root/dev"
cp /bin/busybox "$tmp/root/bin/busybox"
cp "$src/init" "$tmp/root/init" && chmod +x "$tmp/root/init"
cp "$guest" "$tmp/root/ordo-vm-guest"
(cd "$tmp/root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$tmp/initrd.gz")

start_worker() {  # NAME: sets region_NAME and worker_NAME; log in $tmp/NAME.worker.log
  local region=/dev/shm/ordo-vm-$$-$1
  "$worker" --region "$region" --size 16M --stats --guest-timeout 2000 --ready-file "$tmp/$1.ready" \
    > /dev/null 2> "$tmp/$1.worker.log" &
  pids+=($!)
  eval "worker_$1=$! region_$1=$region"
  for _ in $(seq 200); do [ -e "$tmp/$1.ready" ] && break; sleep 0.05; done
  [ -e "$tmp/$1.ready" ] || { echo "FAIL: worker $1 did not start"; cat "$tmp/$1.worker.log"; exit 1; }
}

boot() {  # NAME REGION ARGS -> serial log in $tmp/NAME.vm.log
  timeout 600 qemu-system-x86_64 -nographic -no-reboot -m 256M -smp 2 -accel tcg,thread=multi -nic none \
    -kernel "$kernel" -initrd "$tmp/initrd.gz" \
    -append "console=ttyS0 panic=-1 quiet ordo.args=$3" \
    -object memory-backend-file,id=shm0,share=on,mem-path="$2",size=16M \
    -device ivshmem-plain,memdev=shm0 </dev/null > "$tmp/$1.vm.log" 2>&1
}

start_worker a
start_worker b
t0=$(date +%s)
boot a "$region_a" "" &
vm_a=$!
boot b "$region_b" "--hostile" &
vm_b=$!
wait $vm_a; rc_a=$?
wait $vm_b
echo "== VM A (checks), $(( $(date +%s) - t0 )) s"
grep -a 'ordo-vm:' "$tmp/a.vm.log" | tr -d '\r'
echo "== VM B (hostile)"
grep -a 'ordo-vm:' "$tmp/b.vm.log" | tr -d '\r'

fail=0
grep -aq 'ordo-vm: RESULT PASS' "$tmp/a.vm.log" || { echo "FAIL: VM A did not pass (qemu rc $rc_a)"; tail -n 30 "$tmp/a.vm.log"; fail=1; }
grep -aq 'hostile guest wrote' "$tmp/b.vm.log" || { echo "FAIL: VM B did not run its hostile program"; tail -n 30 "$tmp/b.vm.log"; fail=1; }
kill -0 "$worker_b" 2>/dev/null || { echo "FAIL: worker B died on hostile input"; fail=1; }
grep -q 'rejected' "$tmp/b.worker.log" || { echo "FAIL: worker B rejected nothing"; fail=1; }
# B's dead session is reclaimed once its heartbeat has been silent for 2 s.
for _ in $(seq 100); do grep -q 'stopped its heartbeat\|detached' "$tmp/b.worker.log" && break; sleep 0.1; done
grep -q 'stopped its heartbeat\|detached' "$tmp/b.worker.log" || { echo "FAIL: worker B never reclaimed the dead guest"; fail=1; }
echo "== worker B: $(grep -c rejected "$tmp/b.worker.log") rejection lines; $(grep -a 'stopped its heartbeat\|detached' "$tmp/b.worker.log" | head -n 1)"

echo "== VM C on B's region after the crash (quick checks)"
boot c "$region_b" "--quick"
grep -a 'ordo-vm:' "$tmp/c.vm.log" | tr -d '\r'
grep -aq 'ordo-vm: RESULT PASS' "$tmp/c.vm.log" || { echo "FAIL: VM C did not pass on the recovered region"; tail -n 30 "$tmp/c.vm.log"; fail=1; }
grep -q 'rejected' "$tmp/a.worker.log" && { echo "FAIL: worker A saw bad input: B leaked into A"; fail=1; }

for n in a b; do
  kill -TERM "$(eval echo \$worker_$n)" 2>/dev/null
done
wait 2>/dev/null
echo "== worker A counters"; grep '^{' "$tmp/a.worker.log" | tail -n 1
if [ $fail = 0 ]; then echo "vm_test: PASS"; else echo "vm_test: FAIL"; fi
exit $fail

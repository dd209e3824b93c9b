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
source "$(dirname "$0")/common.sh"
make_initrd

start_worker a
start_worker b
t0=$(date +%s)
boot a "" $(plain "$region_a") &
vm_a=$!
boot b "--hostile" $(plain "$region_b") &
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
boot c "--quick" $(plain "$region_b")
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

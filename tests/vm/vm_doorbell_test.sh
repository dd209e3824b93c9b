#!/usr/bin/env bash
# ivshmem-doorbell mode against plain mode, in real QEMU guests (TCG).
#   vm_doorbell_test.sh ORDO_WORKER ORDO_IVSHMEM_SERVER ORDO_VM_GUEST
# Worker D joins an ordo-ivshmem-server and sleeps up to 3 s when idle; VM D has
# an ivshmem-doorbell device on that server. Worker P serves VM P's
# ivshmem-plain device and polls every 20 ms when idle. Both guests run the quick
# checks and 20 sync calls after 50 ms of idling each, one guest after the other. D passes only if its
# worker was woken by the guest's doorbell for those calls (with a 3 s sleep,
# a missed ring would cost seconds per call and show no doorbell wake-ups).
# Also prints each idle worker's CPU use. Exits 77 when QEMU etc. are missing.
set -uo pipefail
worker=$1 server=$2 guest=$3
source "$(dirname "$0")/common.sh"

sock=$tmp/ivshmem.sock
region_d=/dev/shm/ordo-vm-$$-d
"$server" --socket "$sock" --region "$region_d" --size 16M --verbose 2> "$tmp/server.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "FAIL: ordo-ivshmem-server did not start"; cat "$tmp/server.log"; exit 1; }

start_worker d --ivshmem-server "$sock" --max-sleep 3000
start_worker p
grep -q 'ivshmem peer' "$tmp/d.worker.log" || { echo "FAIL: worker D did not join the server"; cat "$tmp/d.worker.log"; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system, in clock ticks
hz=$(getconf CLK_TCK)
d0=$(cpu_ticks "$worker_d") p0=$(cpu_ticks "$worker_p")
sleep 5
d1=$(cpu_ticks "$worker_d") p1=$(cpu_ticks "$worker_p")
echo "== idle CPU over 5 s: doorbell worker $(( (d1 - d0) * 1000 / hz / 5 )) ms/s, plain worker $(( (p1 - p0) * 1000 / hz / 5 )) ms/s"

# One at a time: two TCG guests and their workers on 2 cores would measure each other.
boot d "--quick,--idle,20" -chardev socket,path="$sock",id=ivs -device ivshmem-doorbell,chardev=ivs,vectors=1
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
wakeups() { grep '^{' "$tmp/$1.worker.log" | tail -n 1 | sed -n 's/.*"doorbell_wakeups":\([0-9]*\).*/\1/p'; }
wd=$(wakeups d) wp=$(wakeups p)
echo "== doorbell wake-ups: worker D ${wd:-?}, worker P ${wp:-?}"
[ "${wd:-0}" -ge 20 ] || { echo "FAIL: worker D was woken by a doorbell ${wd:-0} times, expected >= 20 (one per idle call)"; fail=1; }
if [ $fail = 0 ]; then echo "vm_doorbell_test: PASS"; else echo "vm_doorbell_test: FAIL"; fi
exit $fail

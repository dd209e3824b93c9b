# Shared by the VM tests: prerequisites (exit 77 when missing), a scratch dir
# cleaned at exit, the initramfs with $guest as /ordo-vm-guest, and helpers to
# start workers and boot guests. Expects $worker and $guest to be set.
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

stage_libs() {  # ELF: the libraries ldd finds for it, at the same paths in the guest
  local lib
  for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
    mkdir -p "$tmp/root/$(dirname "$lib")"
    cp -L "$lib" "$tmp/root/$lib"
  done
}

stage_program() {  # SRC DEST: a dynamically linked program and its libraries
  mkdir -p "$tmp/root/$(dirname "$2")"
  cp "$1" "$tmp/root/$2"
  stage_libs "$1"
}

# After staging: the init runs /ordo-vm-guest, then /extra.sh if there is one.
make_initrd() {
  (cd "$tmp/root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$tmp/initrd.gz")
}

start_worker() {  # NAME [WORKER-ARGS...]: sets region_NAME and worker_NAME; log in $tmp/NAME.worker.log
  local name=$1 region=/dev/shm/ordo-vm-$$-$1
  shift
  "$worker" --region "$region" --size 16M --stats --guest-timeout 2000 --ready-file "$tmp/$name.ready" "$@" \
    > /dev/null 2> "$tmp/$name.worker.log" &
  pids+=($!)
  eval "worker_$name=$! region_$name=$region"
  for _ in $(seq 200); do [ -e "$tmp/$name.ready" ] && break; sleep 0.05; done
  [ -e "$tmp/$name.ready" ] || { echo "FAIL: worker $name did not start"; cat "$tmp/$name.worker.log"; exit 1; }
}

boot() {  # NAME GUEST-ARGS QEMU-DEVICE-ARGS... -> serial log in $tmp/NAME.vm.log
  local name=$1 args=$2
  shift 2
  timeout 600 qemu-system-x86_64 -nographic -no-reboot -m 256M -smp 2 -accel tcg,thread=multi -nic none \
    -kernel "$kernel" -initrd "$tmp/initrd.gz" \
    -append "console=ttyS0 panic=-1 quiet ordo.args=$args" "$@" </dev/null > "$tmp/$name.vm.log" 2>&1
}

plain() {  # REGION: the QEMU arguments of an ivshmem-plain device on it
  echo "-object memory-backend-file,id=shm0,share=on,mem-path=$1,size=16M -device ivshmem-plain,memdev=shm0"
}


#include "guest/memory.h"
#include "transport/op_args.h"

namespace ordo::guest {

Status Memory::malloc(uint64_t* device_addr, uint64_t size) {
  ThreadState& t = threads_.current();
  if (!device_addr) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::Malloc>({.size = size, .device = t.device});
  return threads_.finish_own(t, threads_.call(e, device_addr));
}

Status Memory::free(uint64_t device_addr) {
  ThreadState& t = threads_.current();
  // cudaFree synchronizes: nothing issued before, on any device (a peer's
  // kernels may use the memory), may still use it.
  if (Status s = waits_.synchronize_all(t); !ok(s)) return s;
  const Entry e = make_entry<Op::Free>({.addr = device_addr});
  return threads_.finish(t, threads_.call(e));
}

Status Memory::malloc_host(void** ptr, uint64_t size) {
  ThreadState& t = threads_.current();
  if (!ptr) return threads_.finish_own(t, Status::kInvalidValue);
  void* p = alloc_host(size ? size : 1);
  if (!p) return threads_.finish_own(t, Status::kMemoryAllocation);
  *ptr = p;
  return threads_.finish_own(t, Status::kSuccess);
}

void* Memory::alloc_host(uint64_t size) {
  void* p = heap_.alloc(size);
  if (!p && pool_.reclaim(true)) p = heap_.alloc(size);  // blocks of finished copies, waited for
  return p;
}

Status Memory::free_host(void* ptr) {
  ThreadState& t = threads_.current();
  if (!ptr) return threads_.finish(t, Status::kSuccess);
  if (!heap_.contains(ptr, 1)) return threads_.finish(t, Status::kInvalidValue);
  // Any device's copies may still read or write it.
  if (Status s = waits_.synchronize_all(t); !ok(s)) return s;
  heap_.free(ptr);
  return threads_.finish(t, Status::kSuccess);
}

Status Memory::vmm_reserve(uint64_t size, uint64_t alignment, uint64_t hint, uint64_t* addr) {
  ThreadState& t = threads_.current();
  if (!addr) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::VmmReserve>({.size = size, .alignment = alignment, .hint = hint});
  return threads_.finish_own(t, threads_.call(e, addr));
}

Status Memory::vmm_address_free(uint64_t addr, uint64_t size) {
  ThreadState& t = threads_.current();
  return threads_.finish_own(t, threads_.call(make_entry<Op::VmmAddressFree>({.addr = addr, .size = size})));
}

Status Memory::vmm_create(uint32_t device, uint64_t size, uint64_t* handle) {
  ThreadState& t = threads_.current();
  if (!handle) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::VmmCreate>({.size = size, .device = device});
  return threads_.finish_own(t, threads_.call(e, handle));
}

Status Memory::vmm_release(uint64_t handle) {
  ThreadState& t = threads_.current();
  return threads_.finish_own(t, threads_.call(make_entry<Op::VmmRelease>({.handle = handle})));
}

Status Memory::vmm_map(uint64_t addr, uint64_t size, uint64_t handle) {
  ThreadState& t = threads_.current();
  const Entry e = make_entry<Op::VmmMap>({.addr = addr, .size = size, .handle = handle});
  return threads_.finish_own(t, threads_.call(e));
}

Status Memory::vmm_unmap(uint64_t addr, uint64_t size) {
  ThreadState& t = threads_.current();
  // As cudaFree: work issued before, on any device (access may have been
  // granted to several), may still use the memory.
  if (Status s = waits_.synchronize_all(t); !ok(s)) return s;
  return threads_.finish(t, threads_.call(make_entry<Op::VmmUnmap>({.addr = addr, .size = size})));
}

Status Memory::vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access) {
  ThreadState& t = threads_.current();
  const Entry e = make_entry<Op::VmmSetAccess>({.addr = addr, .size = size, .devices = devices, .access = access});
  return threads_.finish_own(t, threads_.call(e));
}

Status Memory::ipc_export(uint64_t device_addr, Client::IpcToken* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kMemory), .handle = device_addr});
  return threads_.finish_own(t, threads_.call(e, &out->word, &out->secret));
}

Status Memory::ipc_open(const Client::IpcToken& tok, uint64_t* device_addr, uint64_t* size, uint32_t* device) {
  ThreadState& t = threads_.current();
  if (!device_addr || !size || !device) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::IpcOpenMem>({.token = tok.word, .secret = tok.secret, .device = t.device});
  uint64_t r1 = 0;
  const Status s = threads_.call(e, device_addr, &r1);
  if (ok(s)) {
    const SizeAndDevice x = SizeAndDevice::of(r1);
    *size = x.size;
    *device = x.device;
  }
  return threads_.finish_own(t, s);
}

Status Memory::ipc_export_vmm(uint64_t handle, Client::IpcToken* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kVmm), .handle = handle});
  return threads_.finish_own(t, threads_.call(e, &out->word, &out->secret));
}

Status Memory::ipc_open_vmm(const Client::IpcToken& tok, uint64_t* handle, uint64_t* size, uint32_t* device) {
  ThreadState& t = threads_.current();
  if (!handle || !size || !device) return threads_.finish_own(t, Status::kInvalidValue);
  uint64_t r1 = 0;
  const Status s = threads_.call(make_entry<Op::IpcOpenVmm>({.token = tok.word, .secret = tok.secret}), handle, &r1);
  if (ok(s)) {
    const SizeAndDevice x = SizeAndDevice::of(r1);
    *size = x.size;
    *device = x.device;
  }
  return threads_.finish_own(t, s);
}

Status Memory::ipc_close(uint64_t device_addr) {
  ThreadState& t = threads_.current();
  // As cudaFree: work issued before may still use the memory.
  if (Status s = waits_.synchronize_all(t); !ok(s)) return s;
  return threads_.finish(t, threads_.call(make_entry<Op::IpcCloseMem>({.addr = device_addr})));
}

}  // namespace ordo::guest

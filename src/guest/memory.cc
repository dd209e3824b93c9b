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

}  // namespace ordo::guest

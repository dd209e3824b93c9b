// Virtual memory management: each request is held to the session's VmmTable
// (ranges it reserved, handles it created, what it mapped) before the backend
// sees it, so a guest that forges an address or a handle gets CUDA's error and
// nothing of another session's, or of the worker's, is touched. All run on
// lane 0, one at a time; copies and memsets on other lanes read the table
// under read_memory().
#include "../worker.h"

namespace ordo {

void Worker::op_VmmReserve(const SlotCall& c) {
  const auto a = decode<Op::VmmReserve>(c.e.arg);
  if (!backend_.supports_vmm()) return reply(c, Status::kNotSupported);
  uint64_t addr = 0;
  Status st = backend_.vmm_reserve(a.size, a.alignment, a.hint, &addr);
  if (ok(st)) {
    const auto lock = write_memory();
    st = vmm_.add_reservation(addr, a.size);
    if (!ok(st)) {  // the backend handed out a range twice: refuse it rather than share it
      backend_.vmm_address_free(addr, a.size);
      st = Status::kMemoryAllocation;
    }
  }
  reply(c, st, addr);
}

void Worker::op_VmmAddressFree(const SlotCall& c) {
  const auto a = decode<Op::VmmAddressFree>(c.e.arg);
  {
    const auto lock = write_memory();
    if (Status st = vmm_.remove_reservation(a.addr, a.size); !ok(st)) return reply(c, st);
  }
  reply(c, backend_.vmm_address_free(a.addr, a.size));
}

void Worker::op_VmmCreate(const SlotCall& c) {
  const auto a = decode<Op::VmmCreate>(c.e.arg);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);  // check_entry knows only kMaxDevices
  if (!backend_.supports_vmm()) return reply(c, Status::kNotSupported);
  uint64_t backend_handle = 0;
  const Status st = backend_.vmm_create(uint32_t(a.device), a.size, &backend_handle);
  if (!ok(st)) return reply(c, st);
  const auto lock = write_memory();
  const uint64_t h = vmm_.add_physical({.backend_handle = backend_handle, .device = uint32_t(a.device), .size = a.size});
  reply(c, Status::kSuccess, h);
}

void Worker::op_VmmRelease(const SlotCall& c) {
  const auto a = decode<Op::VmmRelease>(c.e.arg);
  bool gone = false;
  uint64_t backend_handle = 0;
  {
    const auto lock = write_memory();
    if (Status st = vmm_.release(a.handle, &gone, &backend_handle); !ok(st)) return reply(c, st);
  }
  // Still mapped: the memory goes with its last mapping (op_VmmUnmap).
  reply(c, gone && !ipc_vmm_kept(backend_handle) ? backend_.vmm_release(backend_handle) : Status::kSuccess);
}

void Worker::op_VmmMap(const SlotCall& c) {
  const auto a = decode<Op::VmmMap>(c.e.arg);
  const auto lock = write_memory();
  if (Status st = vmm_.check_map(a.addr, a.size, a.handle); !ok(st)) return reply(c, st);
  const VmmTable::Physical& p = *vmm_.physical(a.handle);
  if (Status st = backend_.vmm_map(a.addr, a.size, p.backend_handle, p.device); !ok(st)) return reply(c, st);
  vmm_.add_mapping(a.addr, a.size, a.handle);
  reply(c, Status::kSuccess);
}

void Worker::op_VmmUnmap(const SlotCall& c) {
  const auto a = decode<Op::VmmUnmap>(c.e.arg);
  std::vector<uint64_t> gone;
  {
    // Out of the table first: no copy checked after this may use the range.
    const auto lock = write_memory();
    if (Status st = vmm_.check_cover(a.addr, a.size); !ok(st)) return reply(c, st);
    vmm_.remove_mappings(a.addr, a.size, &gone);
  }
  // On lane 0, unlike Free's on the side thread: a later map of the range
  // must find it unmapped. The guest waited for all its work first, so the
  // driver's own wait is for nothing of this session's a correct program
  // still runs; the sim never waits, and what a guest let run on writes scratch.
  Status st = backend_.vmm_unmap(a.addr, a.size);
  for (uint64_t h : gone)
    if (!ipc_vmm_kept(h))
      if (Status r = backend_.vmm_release(h); ok(st)) st = r;
  reply(c, st);
}

void Worker::op_VmmSetAccess(const SlotCall& c) {
  const auto a = decode<Op::VmmSetAccess>(c.e.arg);
  if (a.devices >> devices_) return reply(c, Status::kInvalidDevice);
  {
    const auto lock = read_memory();  // only lane 0 changes vmm_: the answer holds after the lock
    if (Status st = vmm_.check_cover(a.addr, a.size); !ok(st)) return reply(c, st);
  }
  // cuMemSetAccess may wait for the device: not under the lock other lanes' copies take.
  if (Status st = backend_.vmm_set_access(a.addr, a.size, a.devices, a.access); !ok(st)) return reply(c, st);
  const auto lock = write_memory();
  vmm_.set_access(a.addr, a.size, a.devices, a.access);
  reply(c, Status::kSuccess);
}

}  // namespace ordo

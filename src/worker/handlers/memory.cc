// Device memory: the guest's allocations (and its modules' variables) are the
// only device ranges its copies and memsets may touch; host operands are the
// ring's staging area or the pinned heap, both inside the region.
#include "../validate.h"
#include "../worker.h"

namespace ordo {

// Callers hold read_memory() until the backend has the call: a Free on lane 0
// then comes before the check or after the work was queued, as with one lane.
Status Worker::check_device_range(uint64_t addr, uint64_t size) const {
  if (auto it = allocations_.upper_bound(addr); it != allocations_.begin()) {
    --it;
    if (range_ok(addr - it->first, size, it->second)) return Status::kSuccess;
  }
  if (auto it = globals_.upper_bound(addr); it != globals_.begin()) {
    --it;
    if (range_ok(addr - it->first, size, it->second.first)) return Status::kSuccess;
  }
  if (vmm_.accessible(addr, size)) return Status::kSuccess;
  if (auto it = ipc_imports_.upper_bound(addr); it != ipc_imports_.begin()) {
    --it;
    if (range_ok(addr - it->first, size, it->second.size)) return Status::kSuccess;
  }
  return Status::kInvalidDevicePointer;
}

Status Worker::resolve(MemKind kind, uint32_t ring, uint64_t addr, uint64_t size, MemOperand* out) {
  switch (kind) {
    case MemKind::Device:
      out->device = true;
      out->addr = addr;
      return check_device_range(addr, size);
    case MemKind::Staging:  // bounds already checked by check_entry
      out->device = false;
      out->addr = reinterpret_cast<uintptr_t>(region_.staging(ring) + addr);
      return Status::kSuccess;
    case MemKind::Pinned:
      out->device = false;
      out->addr = reinterpret_cast<uintptr_t>(region_.heap() + addr);
      return Status::kSuccess;
  }
  return Status::kInvalidValue;
}

Status Worker::op_Memcpy(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  if (faulted()) return Status::kSuccess;  // after a kernel fault no device work runs (Launch)
  const auto a = decode<Op::Memcpy>(c.e.arg);
  const auto lock = read_memory();
  MemOperand dst, src;
  if (Status s = resolve(dst_kind(c.e.flags), c.ring, a.dst, a.size, &dst); !ok(s)) return s;
  if (Status s = resolve(src_kind(c.e.flags), c.ring, a.src, a.size, &src); !ok(s)) return s;
  return backend_.memcpy(c.e.stream, dst, src, a.size, c.tag);
}

Status Worker::op_Memset(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  if (faulted()) return Status::kSuccess;
  const auto a = decode<Op::Memset>(c.e.arg);
  const auto lock = read_memory();
  if (Status s = check_device_range(a.dst, a.size); !ok(s)) return s;
  return backend_.memset(c.e.stream, a.dst, uint8_t(a.value), a.size, c.tag);
}

void Worker::op_Malloc(const SlotCall& c) {
  const auto a = decode<Op::Malloc>(c.e.arg);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  uint64_t addr = 0;
  const Status st = backend_.malloc(uint32_t(a.device), a.size, &addr);
  if (ok(st)) {
    const auto lock = write_memory();
    allocations_[addr] = a.size;
    counters_.allocations.store(allocations_.size(), std::memory_order_relaxed);
  }
  reply(c, st, addr);
}

void Worker::op_Free(const SlotCall& c) {
  const auto a = decode<Op::Free>(c.e.arg);
  if (a.addr == 0) return reply(c, Status::kSuccess);  // cudaFree(nullptr)
  {
    const auto lock = write_memory();
    auto it = allocations_.find(a.addr);
    if (it == allocations_.end()) return reply(c, Status::kInvalidDevicePointer);
    allocations_.erase(it);
    counters_.allocations.store(allocations_.size(), std::memory_order_relaxed);
    // Exported: processes that opened it keep what they have, as CUDA leaves
    // it (undefined), but nobody opens it again.
    if (auto e = ipc_exported_mem_.find(a.addr); e != ipc_exported_mem_.end()) {
      opt_.ipc->revoke(e->second, opt_.partition);
      ipc_exported_mem_.erase(e);
    }
  }
  // cudaFree waits for the device: off the dispatch threads, as a module load,
  // so that it holds none of their rings. The range is out of the table
  // already, so no later copy or memset can use it meanwhile.
  side_.post([this, addr = a.addr, done = deferred_result(c.slot, c.seq)] { done(backend_.free(addr), 0); });
}

void Worker::op_PeerAccess(const SlotCall& c) {
  const auto a = decode<Op::PeerAccess>(c.e.arg);
  const uint64_t dev = a.device, peer = a.peer;
  if (dev >= devices_ || peer >= devices_ || dev == peer) return reply(c, Status::kInvalidDevice);
  const bool can = backend_.can_access_peer(uint32_t(dev), uint32_t(peer));
  const uint32_t bit = 1u << peer;
  switch (PeerCmd(a.cmd)) {
    case PeerCmd::kQuery:
      return reply(c, Status::kSuccess, can);
    case PeerCmd::kEnable: {
      if (!can) return reply(c, Status::kPeerAccessUnsupported);
      if (peers_[dev] & bit) return reply(c, Status::kPeerAccessAlreadyEnabled);
      const Status st = backend_.set_peer_access(uint32_t(dev), uint32_t(peer), true);
      if (ok(st)) peers_[dev] |= bit;
      return reply(c, st);
    }
    case PeerCmd::kDisable: {
      if (!(peers_[dev] & bit)) return reply(c, Status::kPeerAccessNotEnabled);
      const Status st = backend_.set_peer_access(uint32_t(dev), uint32_t(peer), false);
      if (ok(st)) peers_[dev] &= ~bit;
      return reply(c, st);
    }
  }
  reply(c, Status::kInvalidValue);  // check_entry: unreachable
}

}  // namespace ordo

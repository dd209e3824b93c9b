// Device memory: the guest's allocations (and its modules' variables) are the
// only device ranges its copies and memsets may touch; host operands are the
// ring's staging area or the pinned heap, both inside the region.
#include "../validate.h"
#include "../worker.h"

namespace ordo {

Status Worker::check_device_range(uint64_t addr, uint64_t size) const {
  if (auto it = allocations_.upper_bound(addr); it != allocations_.begin()) {
    --it;
    if (range_ok(addr - it->first, size, it->second)) return Status::kSuccess;
  }
  if (auto it = globals_.upper_bound(addr); it != globals_.begin()) {
    --it;
    if (range_ok(addr - it->first, size, it->second.first)) return Status::kSuccess;
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
  const Entry& e = c.e;
  MemOperand dst, src;
  if (Status s = resolve(dst_kind(e.flags), c.ring, e.arg[0], e.arg[2], &dst); !ok(s)) return s;
  if (Status s = resolve(src_kind(e.flags), c.ring, e.arg[1], e.arg[2], &src); !ok(s)) return s;
  return backend_.memcpy(e.stream, dst, src, e.arg[2], c.tag);
}

Status Worker::op_Memset(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  if (faulted()) return Status::kSuccess;
  if (Status s = check_device_range(c.e.arg[0], c.e.arg[2]); !ok(s)) return s;
  return backend_.memset(c.e.stream, c.e.arg[0], uint8_t(c.e.arg[1]), c.e.arg[2], c.tag);
}

void Worker::op_Malloc(const SlotCall& c) {
  if (c.e.arg[1] >= devices_) return reply(c, Status::kInvalidDevice);
  uint64_t addr = 0;
  const Status st = backend_.malloc(uint32_t(c.e.arg[1]), c.e.arg[0], &addr);
  if (ok(st)) {
    allocations_[addr] = c.e.arg[0];
    counters_.allocations.store(allocations_.size(), std::memory_order_relaxed);
  }
  reply(c, st, addr);
}

void Worker::op_Free(const SlotCall& c) {
  if (c.e.arg[0] == 0) return reply(c, Status::kSuccess);  // cudaFree(nullptr)
  auto it = allocations_.find(c.e.arg[0]);
  if (it == allocations_.end()) return reply(c, Status::kInvalidDevicePointer);
  allocations_.erase(it);
  counters_.allocations.store(allocations_.size(), std::memory_order_relaxed);
  reply(c, backend_.free(c.e.arg[0]));
}

void Worker::op_PeerAccess(const SlotCall& c) {
  const uint64_t dev = c.e.arg[0], peer = c.e.arg[1];
  if (dev >= devices_ || peer >= devices_ || dev == peer) return reply(c, Status::kInvalidDevice);
  const bool can = backend_.can_access_peer(uint32_t(dev), uint32_t(peer));
  const uint32_t bit = 1u << peer;
  switch (PeerCmd(c.e.arg[2])) {
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

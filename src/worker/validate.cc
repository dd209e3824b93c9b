#include "validate.h"

namespace ordo {
namespace {

Status bad(std::string* why, std::string msg, Status s = Status::kInvalidValue) {
  if (why) *why = std::move(msg);
  return s;
}

Status check_host_range(MemKind kind, uint64_t off, uint64_t size, const Layout& l, std::string* why,
                        const char* what) {
  switch (kind) {
    case MemKind::Device:
      return Status::kSuccess;  // checked against the allocation table by the worker
    case MemKind::Staging:
      if (!range_ok(off, size, l.staging_per_ring))
        return bad(why, std::string(what) + " range outside the stream's staging window");
      return Status::kSuccess;
    case MemKind::Pinned:
      if (!range_ok(off, size, l.heap_size)) return bad(why, std::string(what) + " range outside the pinned heap");
      return Status::kSuccess;
  }
  return bad(why, std::string(what) + " memory kind unknown");
}

}  // namespace

Status check_entry(const Entry& e, Path path, const Layout& l, std::string* why) {
  if (!valid_op(e.op)) return bad(why, "unknown op " + std::to_string(e.op), Status::kNotSupported);
  const Op op = static_cast<Op>(e.op);
  if (info(op).path != path)
    return bad(why, std::string(info(op).name) + (path == Path::Ring ? " is not a stream op" : " is not a sync op"));
  if (e.edge_count > kMaxEdges) return bad(why, "edge count " + std::to_string(e.edge_count) + " > " + std::to_string(kMaxEdges));
  for (unsigned i = 0; i < e.edge_count; ++i)
    if (e.edges[i].ring >= l.ring_count) return bad(why, "edge to ring " + std::to_string(e.edges[i].ring) + " that does not exist");
  if (path == Path::Ring && e.thread >= l.slot_count) return bad(why, "thread slot out of range");

  switch (op) {
    case Op::Launch: {
      const uint64_t size = e.arg[5] & 0xffffffffu;
      if (!range_ok(e.arg[4], size, l.staging_per_ring)) return bad(why, "kernel arguments outside the staging window");
      const uint32_t dims[6] = {uint32_t(e.arg[1]), uint32_t(e.arg[1] >> 32), uint32_t(e.arg[2]),
                                uint32_t(e.arg[2] >> 32), uint32_t(e.arg[3]), uint32_t(e.arg[3] >> 32)};
      for (uint32_t d : dims)
        if (d == 0) return bad(why, "zero grid or block dimension", Status::kInvalidConfiguration);
      return Status::kSuccess;
    }
    case Op::Memcpy: {
      const auto dk = dst_kind(e.flags), sk = src_kind(e.flags);
      if (e.flags >> 4) return bad(why, "unknown memcpy flags");
      if (Status s = check_host_range(dk, e.arg[0], e.arg[2], l, why, "memcpy destination"); !ok(s)) return s;
      return check_host_range(sk, e.arg[1], e.arg[2], l, why, "memcpy source");
    }
    case Op::Memset:
      if (e.arg[1] > 0xff) return bad(why, "memset value is not a byte");
      return Status::kSuccess;
    case Op::HostFunc:
      if (e.arg[0] % alignof(HostFuncWords) || !range_ok(e.arg[0], sizeof(HostFuncWords), l.heap_size))
        return bad(why, "host function words outside the pinned heap or misaligned");
      return Status::kSuccess;
    case Op::StreamCreate:
      if (e.arg[0] & ~(kStreamNonBlocking | kStreamLegacy)) return bad(why, "unknown stream flags");
      if ((e.arg[0] & kStreamLegacy) && (e.arg[0] & kStreamNonBlocking))
        return bad(why, "a legacy stream is not a non-blocking stream");
      if (e.arg[2] >= kMaxDevices) return bad(why, "device " + std::to_string(e.arg[2]) + " out of range", Status::kInvalidDevice);
      return Status::kSuccess;
    case Op::PeerAccess:
      if (e.arg[2] > uint64_t(PeerCmd::kDisable)) return bad(why, "unknown peer access command");
      return Status::kSuccess;
    case Op::ModuleLoad:
      if (e.arg[1] == 0) return bad(why, "empty module image");
      if (e.arg[1] > kMaxModuleImage)
        return bad(why, "module image of " + std::to_string(e.arg[1]) + " bytes is larger than the limit of " +
                            std::to_string(kMaxModuleImage));
      if (!range_ok(e.arg[0], e.arg[1], l.heap_size)) return bad(why, "module image outside the pinned heap");
      return Status::kSuccess;
    case Op::ModuleGlobal:
      if (e.arg[1] > kMaxModuleImage) return bad(why, "device variable larger than any module image");
      [[fallthrough]];
    case Op::ModuleUnload:
    case Op::KernelLookup:
      if (e.arg[0] > UINT32_MAX) return bad(why, "module id out of range", Status::kInvalidResourceHandle);
      return Status::kSuccess;
    case Op::DeviceAttributes:
      if (e.arg[1] >= kDeviceAttributeCount || e.arg[1] % kDeviceAttributesPerCall)
        return bad(why, "device attributes from " + std::to_string(e.arg[1]) + ": not a page start below " +
                            std::to_string(kDeviceAttributeCount));
      [[fallthrough]];
    case Op::DeviceInfo:
      // The worker checks the index against its device count.
      if (e.arg[0] >= kMaxDevices) return bad(why, "device " + std::to_string(e.arg[0]) + " out of range", Status::kInvalidDevice);
      return Status::kSuccess;
    // No argument the worker must check before it uses it here: handles,
    // addresses and sizes are checked where they are used.
    case Op::Nop:
    case Op::StreamDestroy:
    case Op::Fence:
    case Op::EventRecord:
    case Op::StreamWaitEvent:
    case Op::Null:
    case Op::Malloc:
    case Op::Free:
    case Op::EventCreate:
    case Op::EventDestroy:
    case Op::EventSynchronize:
    case Op::StreamSynchronize:
    case Op::EventQuery:
    case Op::EventElapsed:
      return Status::kSuccess;
    case Op::kCount:
      break;  // valid_op above
  }
  return Status::kNotSupported;
}

}  // namespace ordo

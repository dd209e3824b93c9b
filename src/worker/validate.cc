#include "validate.h"

#include "transport/graph_steps.h"
#include "transport/op_args.h"

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

// Each op's check of its arguments: what the worker must know before it uses
// them. Handles, device addresses and sizes of device memory are checked where
// they are used, against the session's tables. Every op has one (a new op does
// not compile until it says what it checks).
template <Op op>
Status check(const Args<op>&, const Entry&, const Layout&, std::string*) = delete;
#define ORDO_NOTHING_TO_CHECK(name)                                                         \
  template <>                                                                               \
  Status check<Op::name>(const Args<Op::name>&, const Entry&, const Layout&, std::string*) { \
    return Status::kSuccess;                                                                \
  }
ORDO_NOTHING_TO_CHECK(Nop)
ORDO_NOTHING_TO_CHECK(StreamDestroy)
ORDO_NOTHING_TO_CHECK(Fence)
ORDO_NOTHING_TO_CHECK(EventRecord)
ORDO_NOTHING_TO_CHECK(StreamWaitEvent)
ORDO_NOTHING_TO_CHECK(Null)
ORDO_NOTHING_TO_CHECK(Malloc)
ORDO_NOTHING_TO_CHECK(Free)
ORDO_NOTHING_TO_CHECK(EventCreate)
ORDO_NOTHING_TO_CHECK(EventDestroy)
ORDO_NOTHING_TO_CHECK(EventSynchronize)
ORDO_NOTHING_TO_CHECK(StreamSynchronize)
ORDO_NOTHING_TO_CHECK(EventQuery)
ORDO_NOTHING_TO_CHECK(EventElapsed)
// Tokens, secrets and addresses are held to the region's IPC table and the
// session's imports by the worker (handlers/ipc.cc).
ORDO_NOTHING_TO_CHECK(IpcOpenMem)
ORDO_NOTHING_TO_CHECK(IpcCloseMem)
ORDO_NOTHING_TO_CHECK(IpcOpenEvent)
ORDO_NOTHING_TO_CHECK(IpcOpenVmm)
#undef ORDO_NOTHING_TO_CHECK

template <>
Status check<Op::Launch>(const Args<Op::Launch>& a, const Entry& e, const Layout& l, std::string* why) {
  if (!range_ok(a.params, a.params_size, l.staging_per_ring)) return bad(why, "kernel arguments outside the staging window");
  for (uint32_t d : {a.grid.x, a.grid.y, a.grid.z, a.block.x, a.block.y, a.block.z})
    if (d == 0) return bad(why, "zero grid or block dimension", Status::kInvalidConfiguration);
  LaunchShape shape;
  if (!LaunchShape::decode(e.flags, &shape)) return bad(why, "unknown launch flags");
  if (Status s = check_cluster(a.grid, shape.cluster); !ok(s))
    return bad(why, "cluster dimensions do not divide the grid or exceed 16 blocks", s);
  return Status::kSuccess;
}

template <>
Status check<Op::Memcpy>(const Args<Op::Memcpy>& a, const Entry& e, const Layout& l, std::string* why) {
  if (e.flags >> 4) return bad(why, "unknown memcpy flags");
  if (Status s = check_host_range(dst_kind(e.flags), a.dst, a.size, l, why, "memcpy destination"); !ok(s)) return s;
  return check_host_range(src_kind(e.flags), a.src, a.size, l, why, "memcpy source");
}

template <>
Status check<Op::Memset>(const Args<Op::Memset>& a, const Entry&, const Layout&, std::string* why) {
  if (a.value > 0xff) return bad(why, "memset value is not a byte");
  return Status::kSuccess;
}

template <>
Status check<Op::HostFunc>(const Args<Op::HostFunc>& a, const Entry&, const Layout& l, std::string* why) {
  if (a.words % alignof(HostFuncWords) || !range_ok(a.words, sizeof(HostFuncWords), l.heap_size))
    return bad(why, "host function words outside the pinned heap or misaligned");
  return Status::kSuccess;
}

template <>
Status check<Op::StreamCreate>(const Args<Op::StreamCreate>& a, const Entry&, const Layout&, std::string* why) {
  if (a.flags & ~(kStreamNonBlocking | kStreamLegacy)) return bad(why, "unknown stream flags");
  if ((a.flags & kStreamLegacy) && (a.flags & kStreamNonBlocking))
    return bad(why, "a legacy stream is not a non-blocking stream");
  if (a.device >= kMaxDevices) return bad(why, "device " + std::to_string(a.device) + " out of range", Status::kInvalidDevice);
  return Status::kSuccess;
}

template <>
Status check<Op::PeerAccess>(const Args<Op::PeerAccess>& a, const Entry&, const Layout&, std::string* why) {
  if (a.cmd > uint64_t(PeerCmd::kDisable)) return bad(why, "unknown peer access command");
  return Status::kSuccess;
}

// A module image, or a piece of one at offset `at` of the image: non-empty,
// inside the pinned heap, and the image no larger than kMaxModuleImage. Whether
// `at` follows the pieces sent before is the worker's to check (op_ModuleChunk).
Status check_module_piece(uint64_t image, uint64_t size, uint64_t at, const Layout& l, std::string* why) {
  if (size == 0) return bad(why, "empty module image");
  if (size > kMaxModuleImage || at > kMaxModuleImage - size)
    return bad(why, "module image of " + std::to_string(size) + " bytes at " + std::to_string(at) +
                        " is larger than the limit of " + std::to_string(kMaxModuleImage));
  if (!range_ok(image, size, l.heap_size)) return bad(why, "module image outside the pinned heap");
  return Status::kSuccess;
}

template <>
Status check<Op::ModuleLoad>(const Args<Op::ModuleLoad>& a, const Entry&, const Layout& l, std::string* why) {
  return check_module_piece(a.image, a.size, a.sent, l, why);
}

template <>
Status check<Op::ModuleChunk>(const Args<Op::ModuleChunk>& a, const Entry&, const Layout& l, std::string* why) {
  return check_module_piece(a.image, a.size, a.at, l, why);
}

Status check_module_id(uint64_t module, std::string* why) {
  if (module > UINT32_MAX) return bad(why, "module id out of range", Status::kInvalidResourceHandle);
  return Status::kSuccess;
}

template <>
Status check<Op::ModuleGlobal>(const Args<Op::ModuleGlobal>& a, const Entry&, const Layout&, std::string* why) {
  if (a.size > kMaxModuleImage) return bad(why, "device variable larger than any module image");
  return check_module_id(a.module, why);
}

template <>
Status check<Op::ModuleUnload>(const Args<Op::ModuleUnload>& a, const Entry&, const Layout&, std::string* why) {
  return check_module_id(a.module, why);
}

template <>
Status check<Op::GraphCreate>(const Args<Op::GraphCreate>& a, const Entry&, const Layout& l, std::string* why) {
  if (a.size == 0 || a.size > kMaxGraphBytes)
    return bad(why, "graph steps of " + std::to_string(a.size) + " bytes: empty or over the limit of " +
                        std::to_string(kMaxGraphBytes));
  if (!range_ok(a.steps, a.size, l.heap_size)) return bad(why, "graph steps outside the pinned heap");
  return Status::kSuccess;
}

Status check_graph_id(uint64_t graph, std::string* why) {
  if (graph == 0 || graph > UINT32_MAX) return bad(why, "graph id out of range", Status::kInvalidResourceHandle);
  return Status::kSuccess;
}

template <>
Status check<Op::GraphLaunch>(const Args<Op::GraphLaunch>& a, const Entry&, const Layout&, std::string* why) {
  return check_graph_id(a.graph, why);
}

template <>
Status check<Op::GraphDestroy>(const Args<Op::GraphDestroy>& a, const Entry&, const Layout&, std::string* why) {
  return check_graph_id(a.graph, why);
}

template <>
Status check<Op::KernelLookup>(const Args<Op::KernelLookup>& a, const Entry&, const Layout&, std::string* why) {
  return check_module_id(a.module, why);
}

// The worker checks the index against its device count.
Status check_device(uint64_t device, std::string* why) {
  if (device >= kMaxDevices) return bad(why, "device " + std::to_string(device) + " out of range", Status::kInvalidDevice);
  return Status::kSuccess;
}

template <>
Status check<Op::DeviceAttributes>(const Args<Op::DeviceAttributes>& a, const Entry&, const Layout&, std::string* why) {
  if (a.first >= kDeviceAttributeCount || a.first % kDeviceAttributesPerCall)
    return bad(why, "device attributes from " + std::to_string(a.first) + ": not a page start below " +
                        std::to_string(kDeviceAttributeCount));
  return check_device(a.device, why);
}

template <>
Status check<Op::DeviceInfo>(const Args<Op::DeviceInfo>& a, const Entry&, const Layout&, std::string* why) {
  return check_device(a.device, why);
}

template <>
Status check<Op::KernelAttributes>(const Args<Op::KernelAttributes>& a, const Entry&, const Layout&, std::string* why) {
  if (a.kernel > UINT32_MAX) return bad(why, "kernel id " + std::to_string(a.kernel) + " out of range", Status::kInvalidResourceHandle);
  return check_device(a.device, why);
}

template <>
Status check<Op::KernelOccupancy>(const Args<Op::KernelOccupancy>& a, const Entry&, const Layout&, std::string* why) {
  if (a.kernel > UINT32_MAX) return bad(why, "kernel id " + std::to_string(a.kernel) + " out of range", Status::kInvalidResourceHandle);
  LaunchShape shape;
  if (a.threads == 0 || a.threads > 1024 || a.smem > UINT32_MAX || a.mode & ~kOccupancyModeBits ||
      !LaunchShape::decode(uint32_t(std::min<uint64_t>(a.shape, UINT32_MAX)), &shape) || shape.cooperative)
    return bad(why, "occupancy query out of range (threads " + std::to_string(a.threads) + ", shared memory " +
                        std::to_string(a.smem) + ", shape " + std::to_string(a.shape) + ", mode " + std::to_string(a.mode) + ")");
  return check_device(a.device, why);
}

template <>
Status check<Op::TensorMapEncode>(const Args<Op::TensorMapEncode>& a, const Entry&, const Layout&, std::string* why) {
  return check_device(a.device, why);
}


// Virtual memory: sizes, addresses and alignments in whole granules (checked
// again against the session's tables by the worker: VmmTable).
Status check_granules(uint64_t addr, uint64_t size, std::string* why, const char* what) {
  if (size == 0 || size % kVmmGranularity || addr % kVmmGranularity)
    return bad(why, std::string(what) + " of " + std::to_string(size) + " bytes at " + std::to_string(addr) +
                        " is not in whole granules of " + std::to_string(kVmmGranularity) + " bytes");
  return Status::kSuccess;
}

template <>
Status check<Op::VmmReserve>(const Args<Op::VmmReserve>& a, const Entry&, const Layout&, std::string* why) {
  if (a.alignment & (a.alignment - 1)) return bad(why, "reservation alignment is not a power of two");
  if (a.alignment > kVmmMaxAlignment)
    return bad(why, "reservation alignment " + std::to_string(a.alignment) + " is past " + std::to_string(kVmmMaxAlignment));
  return check_granules(a.hint, a.size, why, "reservation");
}

template <>
Status check<Op::VmmAddressFree>(const Args<Op::VmmAddressFree>& a, const Entry&, const Layout&, std::string* why) {
  return check_granules(a.addr, a.size, why, "freed reservation");
}

template <>
Status check<Op::GraphCondHandle>(const Args<Op::GraphCondHandle>& a, const Entry&, const Layout&, std::string* why) {
  return check_device(a.device, why);
}

template <>
Status check<Op::VmmCreate>(const Args<Op::VmmCreate>& a, const Entry&, const Layout&, std::string* why) {
  if (Status s = check_granules(0, a.size, why, "physical allocation"); !ok(s)) return s;
  return check_device(a.device, why);
}

template <>
Status check<Op::VmmRelease>(const Args<Op::VmmRelease>&, const Entry&, const Layout&, std::string*) {
  return Status::kSuccess;  // the handle is checked against the session's table
}

template <>
Status check<Op::VmmMap>(const Args<Op::VmmMap>& a, const Entry&, const Layout&, std::string* why) {
  return check_granules(a.addr, a.size, why, "mapping");
}

template <>
Status check<Op::VmmUnmap>(const Args<Op::VmmUnmap>& a, const Entry&, const Layout&, std::string* why) {
  return check_granules(a.addr, a.size, why, "unmapped range");
}

template <>
Status check<Op::VmmSetAccess>(const Args<Op::VmmSetAccess>& a, const Entry&, const Layout&, std::string* why) {
  if (Status s = check_granules(a.addr, a.size, why, "access range"); !ok(s)) return s;
  if (a.devices >> kMaxDevices) return bad(why, "access set for a device past kMaxDevices", Status::kInvalidDevice);
  for (uint32_t d = 0; d < kMaxDevices; ++d) {
    const uint64_t f = vmm_access_of(a.access, d);
    if (!(a.devices >> d & 1) ? f != 0 : f == 2)
      return bad(why, "access flags " + std::to_string(f) + " for device " + std::to_string(d));
  }
  return Status::kSuccess;
}

template <>
Status check<Op::IpcExport>(const Args<Op::IpcExport>& a, const Entry&, const Layout&, std::string* why) {
  if (a.kind > uint64_t(IpcKind::kVmm)) return bad(why, "IPC export of unknown kind " + std::to_string(a.kind));
  return Status::kSuccess;
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
#define ORDO_OP(name, path, order, args) \
  case Op::name:                         \
    return check<Op::name>(decode<Op::name>(e.arg), e, l, why);
#include "ordo/ops.def"
#undef ORDO_OP
    case Op::kCount:
      break;  // valid_op above
  }
  return Status::kNotSupported;
}

}  // namespace ordo

// Each op's arguments by name. An entry (or a slot request) carries them as
// six raw words; the guest writes them only through encode() and the worker
// reads them only through decode(), so the two sides cannot disagree on which
// word holds what. The worker's check of each op's Args is validate.cc's.
// Every op of ops.def has an Args (asserted at the end): a new op does not
// compile until it says what it carries.
#pragma once

#include <cstdint>
#include <iterator>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ordo/device_info.h"
#include "ordo/layout.h"
#include "ordo/ops.h"

namespace ordo {

template <Op>
struct Args;

using Words = uint64_t[6];

// Plain ops: each named field is one word, in the order listed. Fields stay
// 64 bits wide on purpose: the worker checks what the guest wrote, not what
// a narrowing cast left of it.
#define ORDO_ARGS(...)                                                  \
  auto fields() { return std::tie(__VA_ARGS__); }                       \
  auto fields() const { return std::tie(__VA_ARGS__); }

#define ORDO_NO_ARGS \
  auto fields() const { return std::tie(); }

template <> struct Args<Op::Nop> { ORDO_NO_ARGS };
template <> struct Args<Op::StreamCreate> {
  uint64_t flags;     // kStreamNonBlocking, or kStreamLegacy: device's legacy stream, whose id is `device`
  int64_t priority;
  uint64_t device;
  ORDO_ARGS(flags, priority, device)
};
template <> struct Args<Op::StreamDestroy> { ORDO_NO_ARGS };
template <> struct Args<Op::Fence> { ORDO_NO_ARGS };
template <> struct Args<Op::Memcpy> {
  uint64_t dst, src, size;  // each an address of the MemKind the entry's flags give it
  ORDO_ARGS(dst, src, size)
};
template <> struct Args<Op::Memset> {
  uint64_t dst, value, size;
  ORDO_ARGS(dst, value, size)
};
template <> struct Args<Op::EventRecord> {
  uint64_t event, number;  // the record's number: 1, 2, ... per event
  uint64_t replaced_waits;  // waits issued on the record it replaces
  ORDO_ARGS(event, number, replaced_waits)
};
template <> struct Args<Op::StreamWaitEvent> {
  uint64_t event, number;  // the record waited for (0: never recorded, a no-op)
  ORDO_ARGS(event, number)
};
template <> struct Args<Op::HostFunc> {
  uint64_t words;  // pinned-heap offset of a HostFuncWords
  uint64_t ticket;
  ORDO_ARGS(words, ticket)
};
template <> struct Args<Op::Null> { ORDO_NO_ARGS };
template <> struct Args<Op::KernelAttributes> {
  uint64_t kernel, device;
  ORDO_ARGS(kernel, device)
};
template <> struct Args<Op::KernelOccupancy> {
  uint64_t kernel, device, threads, smem, shape, mode;
  ORDO_ARGS(kernel, device, threads, smem, shape, mode)
};
template <> struct Args<Op::TensorMapEncode> {
  uint64_t device;  // whose context the driver encodes in
  ORDO_ARGS(device)
};
template <> struct Args<Op::Malloc> {
  uint64_t size, device;
  ORDO_ARGS(size, device)
};
template <> struct Args<Op::Free> {
  uint64_t addr;
  ORDO_ARGS(addr)
};
template <> struct Args<Op::VmmReserve> {
  uint64_t size, alignment, hint;
  ORDO_ARGS(size, alignment, hint)
};
template <> struct Args<Op::VmmAddressFree> {
  uint64_t addr, size;
  ORDO_ARGS(addr, size)
};
template <> struct Args<Op::VmmCreate> {
  uint64_t size, device;
  ORDO_ARGS(size, device)
};
template <> struct Args<Op::VmmRelease> {
  uint64_t handle;
  ORDO_ARGS(handle)
};
template <> struct Args<Op::VmmMap> {
  uint64_t addr, size, handle;
  ORDO_ARGS(addr, size, handle)
};
template <> struct Args<Op::VmmUnmap> {
  uint64_t addr, size;
  ORDO_ARGS(addr, size)
};
template <> struct Args<Op::VmmSetAccess> {
  uint64_t addr, size;
  uint64_t devices;  // bit d: device d's access is set
  uint64_t access;   // bits 2d..2d+1: device d's VmmAccess
  ORDO_ARGS(addr, size, devices, access)
};
template <> struct Args<Op::IpcExport> {
  uint64_t kind;    // IpcKind
  uint64_t handle;  // kIpcMemory: a device address; kIpcEvent: an event handle
  ORDO_ARGS(kind, handle)
};
template <> struct Args<Op::IpcOpenMem> {
  uint64_t token, secret, device;
  ORDO_ARGS(token, secret, device)
};
template <> struct Args<Op::IpcCloseMem> {
  uint64_t addr;
  ORDO_ARGS(addr)
};
template <> struct Args<Op::IpcOpenEvent> {
  uint64_t token, secret;
  ORDO_ARGS(token, secret)
};
template <> struct Args<Op::IpcOpenVmm> {
  uint64_t token, secret;
  ORDO_ARGS(token, secret)
};
// IpcOpenMem's and IpcOpenVmm's result1: the memory's size and its device, in one word.
struct SizeAndDevice {
  uint64_t size;
  uint32_t device;
  static constexpr uint64_t kSizeMask = (uint64_t{1} << 56) - 1;
  uint64_t word() const { return (size & kSizeMask) | uint64_t(device) << 56; }
  static SizeAndDevice of(uint64_t w) { return {w & kSizeMask, uint32_t(w >> 56)}; }
};
template <> struct Args<Op::KernelLookup> {
  uint64_t module;  // 0: kernels the backend knows by name; the name is in the payload
  ORDO_ARGS(module)
};
template <> struct Args<Op::EventCreate> {
  uint64_t flags, device;
  ORDO_ARGS(flags, device)
};
template <> struct Args<Op::EventDestroy> {
  uint64_t event, number;  // its last record
  uint64_t waits;          // waits issued on that record
  ORDO_ARGS(event, number, waits)
};
template <> struct Args<Op::EventSynchronize> {
  uint64_t event, number;  // the record the caller saw
  ORDO_ARGS(event, number)
};
template <> struct Args<Op::StreamSynchronize> {
  uint64_t stream;
  ORDO_ARGS(stream)
};
template <> struct Args<Op::EventQuery> {
  uint64_t event, number;
  ORDO_ARGS(event, number)
};
template <> struct Args<Op::EventElapsed> {
  uint64_t start, end, start_number, end_number;
  ORDO_ARGS(start, end, start_number, end_number)
};
template <> struct Args<Op::ModuleLoad> {
  uint64_t image, size;  // pinned-heap offset and size of a fatbin, cubin or PTX, or of its last piece
  uint64_t sent;         // bytes of the image sent before by ModuleChunk; 0: all of it is here
  ORDO_ARGS(image, size, sent)
};
template <> struct Args<Op::ModuleChunk> {
  uint64_t image, size;  // pinned-heap offset and size of one piece of an image
  uint64_t at;           // the piece's offset in the image
  ORDO_ARGS(image, size, at)
};
template <> struct Args<Op::ModuleGlobal> {
  uint64_t module, size, device;  // size: the variable's, from the module's symbol table
  ORDO_ARGS(module, size, device)
};
template <> struct Args<Op::GraphCreate> {
  uint64_t steps, size;  // pinned-heap offset and size of a graph's steps
  ORDO_ARGS(steps, size)
};
template <> struct Args<Op::GraphLaunch> {
  uint64_t graph;
  ORDO_ARGS(graph)
};
template <> struct Args<Op::GraphDestroy> {
  uint64_t graph, launches;  // launches: the GraphLaunch entries of it issued
  ORDO_ARGS(graph, launches)
};
template <> struct Args<Op::GraphCondHandle> {
  uint64_t device;
  ORDO_ARGS(device)
};
template <> struct Args<Op::ModuleUnload> {
  uint64_t module;
  ORDO_ARGS(module)
};
template <> struct Args<Op::DeviceInfo> {
  uint64_t device;
  ORDO_ARGS(device)
};
template <> struct Args<Op::DeviceAttributes> {
  uint64_t device, first;  // first: a multiple of kDeviceAttributesPerCall
  ORDO_ARGS(device, first)
};
template <> struct Args<Op::PeerAccess> {
  uint64_t device, peer, cmd;  // cmd: a PeerCmd
  ORDO_ARGS(device, peer, cmd)
};

// A launch packs two 32-bit values a word, so that it fits the entry's first line.
template <>
struct Args<Op::Launch> {
  uint32_t kernel;
  Dim3 grid, block;
  uint64_t params;  // staging offset of the packed argument bytes
  uint32_t params_size, shared_mem;

  void encode(Words& w) const {
    w[0] = kernel;
    w[1] = grid.x | uint64_t(grid.y) << 32;
    w[2] = grid.z | uint64_t(block.x) << 32;
    w[3] = block.y | uint64_t(block.z) << 32;
    w[4] = params;
    w[5] = params_size | uint64_t(shared_mem) << 32;
  }
  static Args decode(const Words& w) {
    return {uint32_t(w[0]),
            {uint32_t(w[1]), uint32_t(w[1] >> 32), uint32_t(w[2])},
            {uint32_t(w[2] >> 32), uint32_t(w[3]), uint32_t(w[3] >> 32)},
            w[4],
            uint32_t(w[5]),
            uint32_t(w[5] >> 32)};
  }
};

#undef ORDO_ARGS
#undef ORDO_NO_ARGS

namespace detail {
template <class A>
concept PackedArgs = requires(const A& a, Words& w) { a.encode(w); };
}  // namespace detail

// Writes `a` into the words of an entry or a slot request (the rest stay as they are).
template <Op op>
void encode(const Args<op>& a, Words& w) {
  if constexpr (detail::PackedArgs<Args<op>>) {
    a.encode(w);
  } else {
    std::apply([&w](const auto&... f) {
      size_t i = 0;
      ((w[i++] = uint64_t(f)), ...);
    }, a.fields());
  }
}

template <Op op>
Args<op> decode(const Words& w) {
  if constexpr (detail::PackedArgs<Args<op>>) {
    return Args<op>::decode(w);
  } else {
    Args<op> a{};
    std::apply([&w](auto&... f) {
      size_t i = 0;
      ((f = static_cast<std::remove_reference_t<decltype(f)>>(w[i++])), ...);
    }, a.fields());
    return a;
  }
}

// A call of `op` carrying `a`: how the guest builds every entry and request.
template <Op op>
Entry make_entry(const Args<op>& a, uint16_t flags = 0) {
  Entry e{};
  e.op = uint16_t(op);
  e.flags = flags;
  encode(a, e.arg);
  return e;
}

namespace detail {
template <class A>
concept FieldArgs = requires(const A& a) { a.fields(); };
template <Op op>
constexpr bool declared() {
  if constexpr (PackedArgs<Args<op>>) return true;
  else if constexpr (FieldArgs<Args<op>>)
    return std::tuple_size_v<decltype(std::declval<const Args<op>&>().fields())> <= std::size(Words{});
  else return false;
}
}  // namespace detail

#define ORDO_OP(name, path, order, args) \
  static_assert(detail::declared<Op::name>(), "ops.def's " #name " needs an Args<Op::" #name "> of at most 6 words");
#include "ordo/ops.def"
#undef ORDO_OP

}  // namespace ordo

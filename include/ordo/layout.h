// The shared region, byte for byte. Everything here lives in memory that the
// guest can write at any time, so it holds offsets, never pointers, and every
// field says which side writes it. The worker computes the layout itself
// (Layout below) and never reads it back from the header.
//
//   0              RegionHeader                         4 KiB
//   rings_off      RingControl[ring_count]              128 B each
//   entries_off    Entry[ring_count][ring_capacity]     128 B each
//   slots_off      ReplySlot[slot_count]                768 B each
//   staging_off    staging window[ring_count]           staging_per_ring bytes each
//   heap_off       pinned heap (cudaMallocHost)         the rest, guest-managed
#pragma once

#include <immintrin.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ordo/limits.h"

namespace ordo {

inline constexpr size_t kCacheLine = 64;
inline constexpr uint64_t kMagic = 0x314745524f44524fULL;  // "ORDOREG1"
inline constexpr uint32_t kLayoutVersion = 15;
inline constexpr uint32_t kMaxRings = 256;
inline constexpr uint32_t kMaxSlots = 256;
inline constexpr uint32_t kMaxEdges = 4;
inline constexpr uint32_t kLegacyRing = 0;  // the legacy default stream, open from the start
inline constexpr uint32_t kNoSlot = 0xffffffffu;

// PeerAccess arg2.
enum class PeerCmd : uint8_t { kQuery = 0, kEnable = 1, kDisable = 2 };

// Where a memory operand lives. Kept in Entry::flags: dst in bits 0-1, src in bits 2-3.
enum class MemKind : uint8_t {
  Device = 0,   // a device address handed out by Malloc
  Staging = 1,  // an offset into this ring's staging window
  Pinned = 2,   // an offset into the pinned heap
};
constexpr uint16_t mem_flags(MemKind dst, MemKind src) {
  return static_cast<uint16_t>(static_cast<unsigned>(dst) | static_cast<unsigned>(src) << 2);
}
constexpr MemKind dst_kind(uint16_t flags) { return static_cast<MemKind>(flags & 3); }
constexpr MemKind src_kind(uint16_t flags) { return static_cast<MemKind>((flags >> 2) & 3); }

// "Ring `ring` has dispatched at least `pos` entries": the entry carrying the
// edge is dispatched only after that. Positions count entries since the region
// was created and never wrap (64 bits).
struct Edge {
  uint32_t ring;
  uint32_t reserved;
  uint64_t pos;
};

// One call. Written by one guest thread, read once (copied out) by the worker.
// The call fills the first line and the edges the second: an entry without
// edges (most of them) is one line to write and one to move to the worker.
struct alignas(kCacheLine) Entry {
  uint16_t op;          // ordo::Op
  uint16_t flags;       // op-specific (MemKind pairs for Memcpy)
  uint8_t edge_count;   // <= kMaxEdges
  uint8_t lap;          // ring entries: entry_lap() of its position once published (publish_entry)
  uint8_t reserved0[2];
  uint32_t thread;      // reply slot of the issuing thread: where async errors go
  uint32_t stream;      // ring entries: the stream (< kMaxStreams) the call belongs to
  uint64_t arg[6];      // see ops.def
  Edge edges[kMaxEdges];  // in a ring, only edge_count of them are written
};
static_assert(sizeof(Entry) == 128 && offsetof(Entry, edges) == kCacheLine);

// The ring protocol over these bytes (laps, publishing, both ends):
// src/transport/ring.h.

// Control block of one SPSC ring, an index per cache line. The guest caches
// `head` in private memory; the worker keeps its own head and never reads one
// back from here, so a hostile guest cannot make the worker trust a forged one.
struct RingControl {
  alignas(kCacheLine) std::atomic<uint64_t> head;       // worker: entries dispatched
  alignas(kCacheLine) std::atomic<uint64_t> completed;  // worker: entries known complete (advances at fences)
};
static_assert(sizeof(RingControl) == 2 * kCacheLine);

inline constexpr size_t kSlotPayload = 512;
// Device attributes by CUdevice_attribute number, as the host driver reports
// them (cuDeviceGetAttribute), fetched a reply payload at a time (Op::DeviceAttributes).
inline constexpr uint32_t kDeviceAttributeCount = 256;
inline constexpr uint32_t kDeviceAttributesPerCall = 128;
static_assert(kDeviceAttributesPerCall * sizeof(int32_t) <= kSlotPayload && kDeviceAttributeCount % kDeviceAttributesPerCall == 0);

// A kernel's attributes by CUfunction_attribute number (cuFuncGetAttribute),
// all in one reply payload (Op::KernelAttributes).
inline constexpr uint32_t kKernelAttributeCount = 16;
// The numbers a backend without cuda.h fills in (libcuda.so.1 checks them against cuda.h).
inline constexpr uint32_t kKernelMaxThreadsPerBlock = 0, kKernelSharedSizeBytes = 1, kKernelLocalSizeBytes = 3,
                          kKernelNumRegs = 4, kKernelPtxVersion = 5, kKernelBinaryVersion = 6,
                          kKernelMaxDynamicSharedSizeBytes = 8, kKernelPreferredSharedMemoryCarveout = 9;
static_assert(kKernelAttributeCount * sizeof(int32_t) <= kSlotPayload);

// Op::KernelOccupancy's arg5: what is asked, and what the program allowed
// the kernel (cuFuncSetAttribute) that the answer depends on.
inline constexpr uint64_t kOccupancyClusters = 1;     // cuOccupancyMaxActiveClusters, else blocks per multiprocessor
inline constexpr uint64_t kOccupancyNonPortable = 2;  // clusters past 8 blocks allowed
inline constexpr uint64_t kOccupancyModeBits = 3;

// A sync call's request: seq and the call share one cache line, so a request
// without edges reaches the worker in one line transfer. Slot requests name no
// stream (their handles are in arg) and their thread is the slot itself.
struct SlotRequest {
  std::atomic<uint64_t> seq;  // bumped (release) after the rest of the request is written
  uint16_t op;
  uint16_t flags;
  uint8_t edge_count;  // <= kMaxEdges; the edges are on the next line
  uint8_t reserved[3];
  uint64_t arg[6];
};
static_assert(sizeof(SlotRequest) == kCacheLine);

// A guest thread's mailbox for synchronous calls and its async-error channel.
struct ReplySlot {
  alignas(kCacheLine) SlotRequest request;                // guest
  alignas(kCacheLine) Edge edges[kMaxEdges];              // guest: read only when request.edge_count > 0
  alignas(kCacheLine) std::atomic<uint64_t> reply_seq;    // worker: == request.seq when answered
  int32_t status;                                         // worker
  std::atomic<uint32_t> watched;                          // worker: 1 while it polls request.seq itself
  uint64_t result[2];                                     // worker
  alignas(kCacheLine) std::atomic<uint64_t> error_seq;    // worker: bumped per async error
  int32_t error;                                          // worker: the latest async error
  uint32_t error_op;                                      // worker: the op that failed
  uint64_t error_pos;                                     // worker: its ring position
  uint32_t error_ring;
  alignas(kCacheLine) char payload[kSlotPayload];         // guest: kernel names etc.
};
static_assert(sizeof(ReplySlot) == 768);

// Both ends of a reply slot (write a request, take it, answer it):
// src/transport/reply_slot.h.

// A host function's handshake (HostFunc), in the pinned heap: the worker says
// the stream reached it, the guest's runner thread runs the function and says
// it is done, and only then does the stream go on. Tickets only grow.
struct HostFuncWords {
  std::atomic<uint64_t> reached;  // worker
  std::atomic<uint64_t> done;     // guest
};
static_assert(sizeof(HostFuncWords) == 16);

// Offsets and sizes. Written once by the worker when it creates the region.
struct Layout {
  uint64_t region_size;
  uint32_t ring_count;
  uint32_t ring_capacity;  // power of two
  uint32_t slot_count;
  uint32_t reserved;
  uint64_t staging_per_ring;
  uint64_t rings_off;
  uint64_t entries_off;
  uint64_t slots_off;
  uint64_t staging_off;
  uint64_t heap_off;
  uint64_t heap_size;
};

struct RegionHeader {
  // Line 0-1: immutable after creation (worker).
  alignas(kCacheLine) uint64_t magic;
  uint32_t version;
  uint32_t header_size;
  uint64_t session;          // random per worker start: a changed id means a new worker
  // The region is `partitions` equal parts, one guest process (session) each,
  // each served by a worker process of its own; this header begins part
  // `partition`, and `layout` describes that part alone (region_size = its size).
  uint32_t partition;
  uint32_t partitions;
  Layout layout;
  // Worker-written liveness and sleep state.
  alignas(kCacheLine) std::atomic<uint64_t> heartbeat_ns;  // CLOCK_MONOTONIC of the host, advanced while serving
  std::atomic<uint32_t> worker_sleeping;                   // 1: ring the doorbell after publishing
  std::atomic<uint32_t> worker_state;                      // WorkerState
  std::atomic<uint64_t> attached_session;                  // the guest session being served; 0: none
  std::atomic<uint32_t> ivshmem_peer;                      // ivshmem-server peer id + 1 to ring in a VM; 0: none
  std::atomic<int32_t> sticky_error;                       // a kernel fault ended the session's context (Status)
  std::atomic<uint32_t> device_count;                      // devices the session sees (<= kMaxDevices); set before attaching
  // The worker's address of this part, where its kernels can reach the part's
  // bytes (mapped pinned memory under unified addressing); 0: they cannot. A
  // guest that maps the part at this address gets pinned pointers that are
  // also device pointers, as natively. Set before attaching.
  std::atomic<uint64_t> mapped_base;
  // Guest-written.
  alignas(kCacheLine) std::atomic<uint64_t> slot_posted[kMaxSlots / 64];  // bit s: slot s has a new request
  std::atomic<uint64_t> guest_session;                      // the attached guest's random id; 0 on detach
  std::atomic<uint64_t> guest_beat;                         // bumped every 100 ms while the guest lives
  alignas(kCacheLine) std::atomic<uint64_t> ring_open[kMaxRings / 64];  // bitmap of rings in use
};
static_assert(sizeof(RegionHeader) <= 4096);

// Posts slot `s`'s request once request.seq is stored, unless the slot is
// watched: the worker serves the slots whose bits it takes (and the watched
// ones) instead of reading every slot's request.seq.
inline void post_slot(RegionHeader* h, uint32_t s) {
  h->slot_posted[(s / 64) % (kMaxSlots / 64)].fetch_or(uint64_t{1} << (s % 64), std::memory_order_seq_cst);
}
inline constexpr uint64_t kHeaderSize = 4096;

// kIdle: a part of the region whose worker starts its backend when a guest
// claims the part (ARCHITECTURE.md, "Sessions").
enum class WorkerState : uint32_t { kStarting = 0, kServing = 1, kStopped = 2, kIdle = 3 };

inline constexpr uint32_t kMaxPartitions = 64;

// Region geometry chosen for a region of `size` bytes (a power of two, >= 1 MiB).
// Returns false with no change to `out` when the size cannot hold a useful layout.
bool plan_layout(uint64_t size, uint32_t ring_count, uint32_t ring_capacity, uint32_t slot_count,
                 uint64_t staging_per_ring, Layout* out);
bool plan_default_layout(uint64_t size, Layout* out);

}  // namespace ordo

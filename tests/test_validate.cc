// What a hostile guest can put in shared memory, and what the worker does with it.
//
// Part 1: check_entry and range_ok, the pure checks on an entry copied out of
// the region (table-driven, plus a randomized property check).
// Part 2: a real worker (InProcessWorker) and a real Client, with raw entries
// written straight into rings and reply slots the client does not use. Every bad
// input must come back as an error on the reply slot named in the entry, the
// ring must go on with the next entry, and the worker must keep serving the
// well-behaved client.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "guest/testing.h"
#include "harness.h"
#include "ordo/doorbell.h"
#include "ordo/layout.h"
#include "ordo/ops.h"
#include "ordo/sim.h"
#include "worker/validate.h"
#include "transport/graph_steps.h"
#include "transport/op_args.h"
#include "transport/reply_slot.h"
#include "transport/ring.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;

// ============================================================== part 1: pure checks

static_assert(range_ok(0, 0, 0));
static_assert(!range_ok(0, 1, 0));
static_assert(range_ok(UINT64_MAX, 0, UINT64_MAX));
static_assert(!range_ok(UINT64_MAX, 1, UINT64_MAX));

TEST(RangeOk, EdgeCases) {
  struct C {
    uint64_t off, size, limit;
    bool ok;
  };
  const C cases[] = {
      {0, 0, 0, true},
      {0, 1, 0, false},
      {1, 0, 0, false},  // an empty range past the end is still past the end
      {1, 0, 1, true},   // an empty range at the end is fine
      {2, 0, 1, false},
      {0, 16, 16, true},
      {0, 17, 16, false},
      {8, 8, 16, true},
      {9, 8, 16, false},
      {16, 0, 16, true},
      {16, 1, 16, false},
      {15, 1, 16, true},
      {0, UINT64_MAX, UINT64_MAX, true},
      {1, UINT64_MAX, UINT64_MAX, false},
      {UINT64_MAX, 1, UINT64_MAX, false},
      {UINT64_MAX, UINT64_MAX, UINT64_MAX, false},
      // The sums wrap around: off + size would look small.
      {UINT64_MAX - 7, 16, 4096, false},
      {16, UINT64_MAX - 7, 4096, false},
      {UINT64_MAX, 2, 4096, false},
      {4096, UINT64_MAX, 4096, false},
      {2048, 2048, 4096, true},
      {2048, 2049, 4096, false},
  };
  for (const C& c : cases)
    EXPECT_EQ(range_ok(c.off, c.size, c.limit), c.ok) << c.off << " + " << c.size << " within " << c.limit;
}

TEST(RangeOk, AgreesWithWideArithmetic) {
  std::mt19937_64 rng(7);
  auto pick = [&]() -> uint64_t {
    switch (rng() % 4) {
      case 0: return rng() % 64;
      case 1: return UINT64_MAX - rng() % 64;
      case 2: return rng() >> (rng() % 64);
      default: return 4096 + rng() % 64 - 32;
    }
  };
  for (int i = 0; i < 200000; ++i) {
    const uint64_t off = pick(), size = pick(), limit = pick();
    const unsigned __int128 end = (unsigned __int128)off + size;
    ASSERT_EQ(range_ok(off, size, limit), end <= limit) << off << " " << size << " " << limit;
  }
}

Layout test_layout() {
  Layout l{};
  EXPECT_TRUE(plan_default_layout(16u << 20, &l));
  return l;
}

Entry entry(Op op, uint32_t thread = 0) {
  Entry e{};
  e.op = uint16_t(op);
  e.thread = thread;
  return e;
}

// A Launch that passes: 1x1x1 grid and block, 16 argument bytes at offset 0.
Entry good_launch() {
  Entry e = entry(Op::Launch);
  e.arg[0] = 0;
  e.arg[1] = 1 | uint64_t{1} << 32;
  e.arg[2] = 1 | uint64_t{1} << 32;
  e.arg[3] = 1 | uint64_t{1} << 32;
  e.arg[4] = 0;
  e.arg[5] = 16;
  return e;
}

Entry memcpy_entry(MemKind dst, uint64_t d, MemKind src, uint64_t s, uint64_t size) {
  Entry e = entry(Op::Memcpy);
  e.flags = mem_flags(dst, src);
  e.arg[0] = d;
  e.arg[1] = s;
  e.arg[2] = size;
  return e;
}

Path other(Path p) { return p == Path::Ring ? Path::Slot : Path::Ring; }

// One good entry of every op; for ops with arguments, several.
Entry module_load_entry(uint64_t off, uint64_t size, uint64_t sent = 0) {
  Entry e = entry(Op::ModuleLoad);
  e.arg[0] = off;
  e.arg[1] = size;
  e.arg[2] = sent;
  return e;
}

// A piece of a module image too large for one heap block, at `at` of the image.
Entry module_chunk_entry(uint64_t off, uint64_t size, uint64_t at) {
  Entry e = entry(Op::ModuleChunk);
  e.arg[0] = off;
  e.arg[1] = size;
  e.arg[2] = at;
  return e;
}

// A lookup of kernel ordo_noop (the payload the caller writes) in `module`.
Entry lookup_entry(uint64_t module) {
  Entry e = entry(Op::KernelLookup);
  e.arg[0] = module;
  return e;
}

// An entry of graph op `op` with its first word `a0` (a heap offset or a graph id) and second `a1`.
Entry graph_entry(Op op, uint64_t a0, uint64_t a1 = 0) {
  Entry e = entry(op);
  e.arg[0] = a0;
  e.arg[1] = a1;
  return e;
}

// An occupancy query: 128 threads, 4 KiB of dynamic shared memory, pairs of blocks.
Entry occupancy_entry() {
  Entry e = entry(Op::KernelOccupancy);
  e.arg[2] = 128;
  e.arg[3] = 4096;
  e.arg[4] = LaunchShape{{2, 1, 1}, false}.flags();
  e.arg[5] = kOccupancyClusters;
  return e;
}

// A virtual memory request: op's words as given.
Entry vmm_entry(Op op, std::initializer_list<uint64_t> args) {
  Entry e = entry(op);
  size_t i = 0;
  for (uint64_t a : args) e.arg[i++] = a;
  return e;
}
constexpr uint64_t kG = kVmmGranularity;

// One good entry of each VMM op (all in whole granules).
Entry good_vmm(Op op) {
  switch (op) {
    case Op::VmmReserve: return vmm_entry(op, {4 * kG, 0, 0});
    case Op::VmmAddressFree: return vmm_entry(op, {kG, kG});
    case Op::VmmCreate: return vmm_entry(op, {kG, 0});
    case Op::VmmMap: return vmm_entry(op, {kG, kG, 1});
    case Op::VmmUnmap: return vmm_entry(op, {kG, kG});
    case Op::VmmSetAccess: return vmm_entry(op, {kG, kG, 1, 3});
    default: return entry(op);
  }
}

std::vector<std::pair<std::string, Entry>> good_entries(const Layout& l) {
  std::vector<std::pair<std::string, Entry>> v;
  for (size_t i = 0; i < kOpCount; ++i)
    v.push_back({std::string(kOps[i].name), Op(i) == Op::Launch         ? good_launch()
                                            : Op(i) == Op::ModuleLoad   ? module_load_entry(0, 1)
                                            : Op(i) == Op::ModuleChunk  ? module_chunk_entry(0, 1, 0)
                                            : Op(i) == Op::GraphCreate  ? graph_entry(Op::GraphCreate, 0, 8)
                                            : Op(i) == Op::GraphLaunch  ? graph_entry(Op::GraphLaunch, 1)
                                            : Op(i) == Op::GraphDestroy ? graph_entry(Op::GraphDestroy, 1)
                                            : Op(i) == Op::KernelOccupancy ? occupancy_entry()
                                                                        : good_vmm(Op(i))});
  auto add = [&](std::string n, const Entry& e) { v.push_back({std::move(n), e}); };
  Entry e;
  // Module image pieces: any offset in the image, up to kMaxModuleImage in all.
  add("reservation of 1 TiB aligned to 2^40 with a hint", vmm_entry(Op::VmmReserve, {uint64_t{1} << 40, uint64_t{1} << 40, 64 * kG}));
  add("physical memory on the last device", vmm_entry(Op::VmmCreate, {kG, kMaxDevices - 1}));
  add("release of any handle (the worker's table decides)", vmm_entry(Op::VmmRelease, {UINT64_MAX}));
  add("mapping of any handle (the worker's table decides)", vmm_entry(Op::VmmMap, {kG, 2 * kG, UINT64_MAX}));
  add("access of every device: read-write, read and none",
      vmm_entry(Op::VmmSetAccess, {kG, kG, 0xffffffff, 0x3333333333333333 | 0x4444444444444444}));
  // Interprocess memory and events: tokens, secrets, addresses and devices are
  // the worker's to hold to the region's table and the session's imports.
  add("IPC export of memory at any address", vmm_entry(Op::IpcExport, {uint64_t(IpcKind::kMemory), UINT64_MAX}));
  add("IPC export of any event handle", vmm_entry(Op::IpcExport, {uint64_t(IpcKind::kEvent), UINT64_MAX}));
  add("IPC export of memory at address 0", vmm_entry(Op::IpcExport, {uint64_t(IpcKind::kMemory), 0}));
  add("IPC open of memory: any token, secret and device (the worker's to check)",
      vmm_entry(Op::IpcOpenMem, {UINT64_MAX, UINT64_MAX, UINT64_MAX}));
  add("IPC open of memory: the zero token", vmm_entry(Op::IpcOpenMem, {0, 0, 0}));
  add("IPC open of memory on device kMaxDevices (the worker's count decides)",
      vmm_entry(Op::IpcOpenMem, {uint64_t{2} << 32 | 5, 42, kMaxDevices}));
  add("IPC close of any address (the session's imports decide)", vmm_entry(Op::IpcCloseMem, {UINT64_MAX}));
  add("IPC open of an event: any token and secret", vmm_entry(Op::IpcOpenEvent, {UINT64_MAX, UINT64_MAX}));
  e = vmm_entry(Op::IpcOpenEvent, {uint64_t{4} << 32 | 7, 1});
  e.edge_count = 1;
  e.edges[0] = {l.ring_count - 1, 0, UINT64_MAX};
  add("IPC open of an event after an edge", e);
  add("module chunk filling the heap", module_chunk_entry(0, l.heap_size, 0));
  add("module chunk ending at kMaxModuleImage", module_chunk_entry(8, 16, kMaxModuleImage - 16));
  add("module load ending at kMaxModuleImage", module_load_entry(l.heap_size - 16, 16, kMaxModuleImage - 16));
  add("launch", good_launch());
  e = good_launch();
  e.arg[4] = l.staging_per_ring - 16;
  add("launch args at end of staging", e);
  e = good_launch();
  e.arg[4] = l.staging_per_ring;
  e.arg[5] = 0;
  add("launch no args at end of staging", e);
  e = good_launch();
  e.arg[5] = 16 | uint64_t{0xffffffff} << 32;
  add("launch with shared memory (high half of arg5 is not the argument size)", e);
  e = good_launch();
  e.arg[0] = 0xffffffffffffffff;
  add("launch unknown kernel (the backend's to reject)", e);
  e = good_launch();
  e.arg[1] = e.arg[2] = e.arg[3] = 0xffffffffffffffff;
  add("launch huge dims (the backend's to reject)", e);
  add("graph steps: the heap's last bytes", graph_entry(Op::GraphCreate, l.heap_size - 8, 8));
  add("graph steps: kMaxGraphBytes", graph_entry(Op::GraphCreate, 0, std::min(l.heap_size, kMaxGraphBytes)));
  add("graph launch of the largest id", graph_entry(Op::GraphLaunch, UINT32_MAX));
  add("graph destroy after any number of launches", graph_entry(Op::GraphDestroy, 7, UINT64_MAX));
  add("module image: the whole heap", module_load_entry(0, std::min(l.heap_size, kMaxModuleImage)));
  add("module image: the heap's last byte", module_load_entry(l.heap_size - 1, 1));
  e = entry(Op::KernelLookup);
  e.arg[0] = UINT32_MAX;
  add("kernel lookup in any 32-bit module id (the worker's table decides)", e);
  add("memcpy device<-device any address",
      memcpy_entry(MemKind::Device, 0xdead, MemKind::Device, UINT64_MAX, UINT64_MAX));
  add("memcpy device<-staging whole window",
      memcpy_entry(MemKind::Device, 0, MemKind::Staging, 0, l.staging_per_ring));
  add("memcpy staging<-device last byte",
      memcpy_entry(MemKind::Staging, l.staging_per_ring - 1, MemKind::Device, 0, 1));
  add("memcpy pinned<-device whole heap", memcpy_entry(MemKind::Pinned, 0, MemKind::Device, 0, l.heap_size));
  add("memcpy device<-pinned last byte", memcpy_entry(MemKind::Device, 0, MemKind::Pinned, l.heap_size - 1, 1));
  add("memcpy staging<-pinned", memcpy_entry(MemKind::Staging, 64, MemKind::Pinned, 128, 256));
  add("memcpy pinned<-staging", memcpy_entry(MemKind::Pinned, 64, MemKind::Staging, 128, 256));
  add("memcpy zero bytes at end of staging",
      memcpy_entry(MemKind::Staging, l.staging_per_ring, MemKind::Pinned, l.heap_size, 0));
  e = entry(Op::Memset);
  e.arg[0] = 0x1234;
  e.arg[1] = 0xff;
  e.arg[2] = UINT64_MAX;
  add("memset 0xff", e);
  e = entry(Op::StreamCreate);
  e.arg[0] = kStreamNonBlocking;
  e.arg[1] = uint64_t(int64_t{-5});
  add("stream create non-blocking", e);
  e = entry(Op::Nop);
  e.edge_count = kMaxEdges;
  for (uint32_t i = 0; i < kMaxEdges; ++i) e.edges[i] = {l.ring_count - 1 - i, 0, UINT64_MAX};
  add("nop with kMaxEdges edges to the last rings", e);
  e = entry(Op::Nop);
  e.edge_count = 2;
  e.edges[2] = {UINT32_MAX, 0, 0};  // beyond edge_count: never looked at
  e.edges[3] = {l.ring_count, 0, 0};
  add("nop with junk beyond edge_count", e);
  e = entry(Op::Fence, l.slot_count - 1);
  add("fence from the last slot", e);
  e = entry(Op::EventRecord);
  e.arg[0] = UINT64_MAX;  // handles are the worker's to check
  e.reserved0[0] = 0xff;
  e.stream = 0xffffffff;  // streams are the worker's to check at dispatch
  e.edges[0].reserved = 0xffffffff;
  add("event record with junk in reserved fields", e);
  return v;
}

TEST(CheckEntry, GoodEntriesOfEveryOpPass) {
  const Layout l = test_layout();
  for (auto& [name, e] : good_entries(l)) {
    const Path path = info(Op(e.op)).path;
    std::string why = "untouched";
    EXPECT_EQ(check_entry(e, path, l, &why), Status::kSuccess) << name << ": " << why;
    EXPECT_EQ(why, "untouched") << name;
    EXPECT_EQ(check_entry(e, path, l, nullptr), Status::kSuccess) << name;
  }
}

TEST(CheckEntry, EveryOpOnTheWrongPathIsRejected) {
  const Layout l = test_layout();
  for (size_t i = 0; i < kOpCount; ++i) {
    const Entry e = entry(Op(i));
    std::string why;
    EXPECT_EQ(check_entry(e, other(kOps[i].path), l, &why), Status::kInvalidValue) << kOps[i].name;
    EXPECT_NE(why.find(kOps[i].name), std::string::npos) << why;
  }
}

TEST(CheckEntry, SlotPathIgnoresTheThreadField) {
  // A slot request's thread is the slot it sits in; the field is not used.
  const Layout l = test_layout();
  Entry e = entry(Op::Null, kNoSlot);
  EXPECT_EQ(check_entry(e, Path::Slot, l, nullptr), Status::kSuccess);
}

struct BadCase {
  std::string name;
  Entry e;
  Path path;
  Status want;
};

std::vector<BadCase> bad_entries(const Layout& l) {
  std::vector<BadCase> v;
  auto add = [&](std::string n, const Entry& e, Path p, Status s = Status::kInvalidValue) {
    v.push_back({std::move(n), e, p, s});
  };
  Entry e;
  // Unknown ops.
  for (uint16_t op : {uint16_t(kOpCount), uint16_t(kOpCount + 1), uint16_t(0x7fff), uint16_t(0xffff)}) {
    e = Entry{};
    e.op = op;
    add("unknown op " + std::to_string(op) + " on a ring", e, Path::Ring, Status::kNotSupported);
    add("unknown op " + std::to_string(op) + " in a slot", e, Path::Slot, Status::kNotSupported);
  }
  // Wrong path.
  add("slot op Malloc on a ring", entry(Op::Malloc), Path::Ring);
  add("slot op Free on a ring", entry(Op::Free), Path::Ring);
  add("slot op Null on a ring", entry(Op::Null), Path::Ring);
  add("ring op Memcpy in a slot", entry(Op::Memcpy), Path::Slot);
  add("ring op StreamCreate in a slot", entry(Op::StreamCreate), Path::Slot);
  add("ring op Nop in a slot", entry(Op::Nop), Path::Slot);
  // Edges.
  for (uint8_t n : {uint8_t(kMaxEdges + 1), uint8_t(16), uint8_t(255)}) {
    e = entry(Op::Nop);
    e.edge_count = n;
    add("edge count " + std::to_string(n) + " on a ring", e, Path::Ring);
    e.op = uint16_t(Op::EventQuery);
    add("edge count " + std::to_string(n) + " in a slot", e, Path::Slot);
  }
  for (uint32_t ring : {l.ring_count, l.ring_count + 1, kMaxRings, UINT32_MAX}) {
    for (uint8_t idx : {uint8_t(0), uint8_t(kMaxEdges - 1)}) {
      e = entry(Op::Memset);
      e.edge_count = idx + 1;
      e.edges[idx] = {ring, 0, 0};
      add("edge " + std::to_string(idx) + " to ring " + std::to_string(ring), e, Path::Ring);
      e.op = uint16_t(Op::EventSynchronize);
      add("slot edge " + std::to_string(idx) + " to ring " + std::to_string(ring), e, Path::Slot);
    }
  }
  // The thread slot of a ring entry.
  for (uint32_t t : {l.slot_count, l.slot_count + 1, kMaxSlots, kNoSlot}) {
    add("thread slot " + std::to_string(t), entry(Op::Nop, t), Path::Ring);
    add("thread slot " + std::to_string(t) + " on memset", entry(Op::Memset, t), Path::Ring);
  }
  // Module images: non-empty, capped, inside the pinned heap.
  {
    const uint64_t h = l.heap_size;
    for (auto [off, size] : {std::pair{uint64_t{0}, uint64_t{0}}, {h, uint64_t{1}}, {h - 8, uint64_t{16}},
                             {uint64_t{1}, h}, {UINT64_MAX - 7, uint64_t{16}}, {UINT64_MAX, uint64_t{1}},
                             {uint64_t{0}, kMaxModuleImage + 1}, {uint64_t{0}, UINT64_MAX}})
      add("module image at " + std::to_string(off) + " size " + std::to_string(size), module_load_entry(off, size),
          Path::Slot);
    for (Op op : {Op::ModuleUnload, Op::KernelLookup}) {
      e = entry(op);
      e.arg[0] = uint64_t{1} << 32;
      add(std::string(info(op).name) + " with a module id past 32 bits", e, Path::Slot, Status::kInvalidResourceHandle);
    }
    for (Op op : {Op::DeviceInfo, Op::DeviceAttributes}) {
      e = entry(op);
      e.arg[0] = kMaxDevices;
      add(std::string(info(op).name) + " of device kMaxDevices", e, Path::Slot, Status::kInvalidDevice);
    }
    add("slot op ModuleLoad on a ring", module_load_entry(0, 1), Path::Ring);
    // Pieces of an image: the same checks, and the image up to kMaxModuleImage in all.
    for (auto [off, size, at] : {std::tuple{uint64_t{0}, uint64_t{0}, uint64_t{0}}, {h, uint64_t{1}, uint64_t{0}},
                                 {h - 8, uint64_t{16}, uint64_t{64}}, {UINT64_MAX - 7, uint64_t{16}, uint64_t{64}},
                                 {uint64_t{0}, uint64_t{16}, kMaxModuleImage - 15},
                                 {uint64_t{0}, uint64_t{16}, kMaxModuleImage}, {uint64_t{0}, uint64_t{16}, UINT64_MAX - 7},
                                 {uint64_t{0}, uint64_t{1}, UINT64_MAX}, {uint64_t{0}, kMaxModuleImage + 1, uint64_t{0}}}) {
      const std::string where = " at " + std::to_string(off) + " size " + std::to_string(size) + " image offset " +
                                std::to_string(at);
      add("module chunk" + where, module_chunk_entry(off, size, at), Path::Slot);
      if (at) add("module load's last piece" + where, module_load_entry(off, size, at), Path::Slot);
    }
    add("slot op ModuleChunk on a ring", module_chunk_entry(0, 1, 0), Path::Ring);
    // Graph steps: non-empty, capped, inside the heap; graph ids nonzero 32-bit.
    for (auto [off, size] : {std::pair{uint64_t{0}, uint64_t{0}}, {h, uint64_t{8}}, {h - 8, uint64_t{16}},
                             {UINT64_MAX - 7, uint64_t{16}}, {uint64_t{0}, kMaxGraphBytes + 1}, {uint64_t{8}, UINT64_MAX}})
      add("graph steps at " + std::to_string(off) + " size " + std::to_string(size),
          graph_entry(Op::GraphCreate, off, size), Path::Slot);
    for (uint64_t id : {uint64_t{0}, uint64_t{1} << 32, UINT64_MAX}) {
      add("graph launch of id " + std::to_string(id), graph_entry(Op::GraphLaunch, id), Path::Ring,
          Status::kInvalidResourceHandle);
      add("graph destroy of id " + std::to_string(id), graph_entry(Op::GraphDestroy, id), Path::Slot,
          Status::kInvalidResourceHandle);
    }
    add("slot op GraphCreate on a ring", graph_entry(Op::GraphCreate, 0, 8), Path::Ring);
    add("ring op GraphLaunch in a slot", graph_entry(Op::GraphLaunch, 1), Path::Slot);
  }
  // Launch: argument bytes inside this ring's staging window.
  const uint64_t w = l.staging_per_ring;
  struct R {
    uint64_t off, size;
  };
  for (R r : {R{w, 1}, R{w - 8, 16}, R{0, w + 1}, R{w + 1, 0}, R{UINT64_MAX - 7, 16}, R{UINT64_MAX, 0},
              R{UINT64_MAX, 1}, R{8, 0xffffffff}, R{uint64_t{1} << 63, 16}}) {
    e = good_launch();
    e.arg[4] = r.off;
    e.arg[5] = r.size;
    add("launch args at " + std::to_string(r.off) + " size " + std::to_string(r.size), e, Path::Ring);
  }
  // Launch: every grid and block dimension must be nonzero.
  for (int d = 0; d < 6; ++d) {
    e = good_launch();
    e.arg[1 + d / 2] &= d % 2 ? 0x00000000ffffffffull : 0xffffffff00000000ull;
    add("launch zero dimension " + std::to_string(d), e, Path::Ring, Status::kInvalidConfiguration);
  }
  e = good_launch();
  e.arg[1] = e.arg[2] = e.arg[3] = 0;
  add("launch all dimensions zero", e, Path::Ring, Status::kInvalidConfiguration);
  // Memcpy: staging and pinned ranges inside their windows, without overflow.
  const uint64_t h = l.heap_size;
  add("memcpy staging dst past window", memcpy_entry(MemKind::Staging, w - 4, MemKind::Device, 0, 8), Path::Ring);
  add("memcpy staging src past window", memcpy_entry(MemKind::Device, 0, MemKind::Staging, w, 1), Path::Ring);
  add("memcpy staging dst larger than window", memcpy_entry(MemKind::Staging, 0, MemKind::Device, 0, w + 1),
      Path::Ring);
  add("memcpy staging src offset wraps", memcpy_entry(MemKind::Device, 0, MemKind::Staging, UINT64_MAX - 7, 16),
      Path::Ring);
  add("memcpy staging size wraps", memcpy_entry(MemKind::Staging, 8, MemKind::Device, 0, UINT64_MAX), Path::Ring);
  add("memcpy staging empty past end", memcpy_entry(MemKind::Staging, w + 1, MemKind::Device, 0, 0), Path::Ring);
  add("memcpy pinned src past heap", memcpy_entry(MemKind::Device, 0, MemKind::Pinned, h, 1), Path::Ring);
  add("memcpy pinned dst past heap", memcpy_entry(MemKind::Pinned, h - 1, MemKind::Device, 0, 2), Path::Ring);
  add("memcpy pinned dst offset wraps", memcpy_entry(MemKind::Pinned, UINT64_MAX, MemKind::Device, 0, 2),
      Path::Ring);
  add("memcpy pinned src size wraps", memcpy_entry(MemKind::Device, 0, MemKind::Pinned, 16, UINT64_MAX - 8),
      Path::Ring);
  add("memcpy pinned->staging, staging bad", memcpy_entry(MemKind::Staging, w, MemKind::Pinned, 0, 16), Path::Ring);
  add("memcpy staging->pinned, pinned bad", memcpy_entry(MemKind::Pinned, h, MemKind::Staging, 0, 16), Path::Ring);
  // The size applies to both sides: a size that fits the heap but not the staging window.
  if (h > w)
    add("memcpy pinned->staging size fits only the heap", memcpy_entry(MemKind::Staging, 0, MemKind::Pinned, 0, w + 1),
        Path::Ring);
  // Memcpy: memory kinds and flag bits.
  for (uint16_t f : {uint16_t(3), uint16_t(3 << 2), uint16_t(3 | 3 << 2), uint16_t(3 | 1 << 2)}) {
    e = memcpy_entry(MemKind::Device, 0, MemKind::Device, 0, 8);
    e.flags = f;
    add("memcpy memory kind 3 in flags " + std::to_string(f), e, Path::Ring);
  }
  for (uint16_t f : {uint16_t(1 << 4), uint16_t(1 << 8), uint16_t(0x8000), uint16_t(0xfff0), uint16_t(0xffff)}) {
    e = memcpy_entry(MemKind::Device, 0, MemKind::Device, 0, 8);
    e.flags |= f;
    add("memcpy unknown flag bits " + std::to_string(f), e, Path::Ring);
  }
  // Memset: the value is a byte.
  for (uint64_t val : {uint64_t{0x100}, uint64_t{0x1ff}, uint64_t{1} << 32, UINT64_MAX}) {
    e = entry(Op::Memset);
    e.arg[1] = val;
    add("memset value " + std::to_string(val), e, Path::Ring);
  }
  // StreamCreate: only known flags (a legacy stream is not non-blocking), a device in range.
  for (uint64_t fl : {uint64_t{3}, uint64_t{4}, uint64_t{1} << 63, UINT64_MAX}) {
    e = entry(Op::StreamCreate);
    e.arg[0] = fl;
    add("stream create flags " + std::to_string(fl), e, Path::Ring);
  }
  for (uint64_t d : {uint64_t{kMaxDevices}, uint64_t{1} << 32, UINT64_MAX}) {
    e = entry(Op::StreamCreate);
    e.arg[2] = d;
    add("stream create on device " + std::to_string(d), e, Path::Ring, Status::kInvalidDevice);
  }
  e = entry(Op::PeerAccess);
  e.arg[2] = 3;
  add("peer access command 3", e, Path::Slot);
  // Occupancy queries: threads, shared memory, shape and mode bits in range.
  for (uint64_t threads : {uint64_t{0}, uint64_t{1025}, UINT64_MAX}) {
    e = occupancy_entry();
    e.arg[2] = threads;
    add("occupancy of " + std::to_string(threads) + " threads", e, Path::Slot);
  }
  e = occupancy_entry();
  e.arg[3] = uint64_t{1} << 32;
  add("occupancy with 4 GiB of shared memory", e, Path::Slot);
  for (uint64_t shape : {uint64_t{1} << 12, uint64_t{1} << 13, uint64_t{1} << 32}) {
    e = occupancy_entry();
    e.arg[4] = shape;
    add("occupancy of shape " + std::to_string(shape), e, Path::Slot);
  }
  e = occupancy_entry();
  e.arg[5] = 4;
  add("occupancy mode 4", e, Path::Slot);
  e = occupancy_entry();
  e.arg[1] = kMaxDevices;
  add("occupancy on device kMaxDevices", e, Path::Slot, Status::kInvalidDevice);
  e = occupancy_entry();
  e.arg[0] = uint64_t{1} << 32;
  add("occupancy of kernel 2^32", e, Path::Slot, Status::kInvalidResourceHandle);
  // Virtual memory: whole granules, alignment a power of two, known access for named devices only.
  for (Op op : {Op::VmmReserve, Op::VmmAddressFree, Op::VmmCreate, Op::VmmMap, Op::VmmUnmap, Op::VmmSetAccess}) {
    for (uint64_t size : {uint64_t{0}, kG - 1, kG + 4096, UINT64_MAX}) {
      e = good_vmm(op);
      e.arg[op == Op::VmmReserve || op == Op::VmmCreate ? 0 : 1] = size;
      add(std::string(info(op).name) + " of " + std::to_string(size) + " bytes", e, Path::Slot);
    }
    if (op == Op::VmmCreate) continue;  // no address
    e = good_vmm(op);
    e.arg[op == Op::VmmReserve ? 2 : 0] = kG + 4096;
    add(std::string(info(op).name) + " at an address inside a granule", e, Path::Slot);
  }
  e = good_vmm(Op::VmmReserve);
  e.arg[1] = 3 * kG;
  add("reservation aligned to 3 granules", e, Path::Slot);
  e = good_vmm(Op::VmmCreate);
  e.arg[1] = kMaxDevices;
  add("physical memory on device kMaxDevices", e, Path::Slot, Status::kInvalidDevice);
  e = good_vmm(Op::VmmSetAccess);
  e.arg[2] = uint64_t{1} << kMaxDevices;
  add("access for device kMaxDevices", e, Path::Slot, Status::kInvalidDevice);
  e = good_vmm(Op::VmmSetAccess);
  e.arg[3] = 2;
  add("access flags 2", e, Path::Slot);
  e = good_vmm(Op::VmmSetAccess);
  e.arg[3] = 3 | 3 << 2;
  add("access for a device not named", e, Path::Slot);
  // Interprocess memory and events: a known kind; slot ops, edges (at most kMaxEdges) to rings that exist.
  for (uint64_t kind : {uint64_t{7}, uint64_t{1} << 32, UINT64_MAX}) {
    add("IPC export of kind " + std::to_string(kind), vmm_entry(Op::IpcExport, {kind, 0}), Path::Slot);
    add("IPC export of kind " + std::to_string(kind) + " on a ring", vmm_entry(Op::IpcExport, {kind, 0}), Path::Ring);
  }
  for (Op op : {Op::IpcExport, Op::IpcOpenMem, Op::IpcCloseMem, Op::IpcOpenEvent}) {
    const std::string name(info(op).name);
    add(name + " on a ring", vmm_entry(op, {}), Path::Ring);
    e = vmm_entry(op, {});
    e.edge_count = kMaxEdges + 1;
    add(name + " with " + std::to_string(kMaxEdges + 1) + " edges", e, Path::Slot);
    e = vmm_entry(op, {});
    e.edge_count = 1;
    e.edges[0] = {l.ring_count, 0, 0};
    add(name + " with an edge to ring " + std::to_string(l.ring_count), e, Path::Slot);
  }
  e = entry(Op::KernelAttributes);
  e.arg[0] = uint64_t{1} << 32;
  add("attributes of kernel 2^32", e, Path::Slot, Status::kInvalidResourceHandle);
  e = entry(Op::KernelAttributes);
  e.arg[1] = kMaxDevices;
  add("attributes on device kMaxDevices", e, Path::Slot, Status::kInvalidDevice);
  return v;
}

TEST(CheckEntry, BadEntriesAreRejectedWithTheirStatus) {
  const Layout l = test_layout();
  const auto cases = bad_entries(l);
  ASSERT_GT(cases.size(), 80u);
  for (const BadCase& c : cases) {
    std::string why;
    EXPECT_EQ(check_entry(c.e, c.path, l, &why), c.want) << c.name << " (why: " << why << ")";
    EXPECT_FALSE(why.empty()) << c.name << ": a rejection says why";
    EXPECT_EQ(check_entry(c.e, c.path, l, nullptr), c.want) << c.name << " with why == nullptr";
  }
}

TEST(CheckEntry, StagingChecksUseTheWorkersLayout) {
  // A smaller staging window in the layout the worker computed shrinks what passes.
  Layout l = test_layout();
  Entry e = memcpy_entry(MemKind::Device, 0, MemKind::Staging, 4096, 4096);
  EXPECT_EQ(check_entry(e, Path::Ring, l, nullptr), Status::kSuccess);
  l.staging_per_ring = 4096;
  EXPECT_EQ(check_entry(e, Path::Ring, l, nullptr), Status::kInvalidValue);
  l.heap_size = 0;
  Entry p = memcpy_entry(MemKind::Pinned, 0, MemKind::Device, 0, 1);
  EXPECT_EQ(check_entry(p, Path::Ring, l, nullptr), Status::kInvalidValue);
  p.arg[2] = 0;
  EXPECT_EQ(check_entry(p, Path::Ring, l, nullptr), Status::kSuccess);
}

// A launch's flags carry its cluster and cooperative shape: what a real launch
// could ask for passes, unknown bits and clusters that do not tile the grid
// get CUDA's error and a reason.
TEST(CheckEntry, LaunchShapeFlags) {
  const Layout l = test_layout();
  auto launch = [](Dim3 grid, uint16_t flags) {
    Entry e = good_launch();
    e.arg[1] = grid.x | uint64_t{grid.y} << 32;
    e.arg[2] = grid.z | uint64_t{1} << 32;
    e.flags = flags;
    return e;
  };
  auto shape = [](Dim3 cluster, bool cooperative) { return LaunchShape{cluster, cooperative}.flags(); };
  std::string why;
  EXPECT_EQ(check_entry(launch({1, 1, 1}, shape({1, 1, 1}, true)), Path::Ring, l, &why), Status::kSuccess) << why;
  EXPECT_EQ(check_entry(launch({4, 4, 1}, shape({4, 4, 1}, false)), Path::Ring, l, &why), Status::kSuccess) << why;
  EXPECT_EQ(check_entry(launch({6, 2, 8}, shape({3, 1, 2}, true)), Path::Ring, l, &why), Status::kSuccess) << why;
  struct Case {
    const char* what;
    Entry e;
    Status status;
  } cases[] = {
      {"an unknown flag bit", launch({1, 1, 1}, 1u << 13), Status::kInvalidValue},
      {"every bit", launch({16, 16, 16}, 0xffff), Status::kInvalidValue},
      {"a cluster wider than the grid", launch({1, 1, 1}, shape({2, 1, 1}, false)), Status::kInvalidClusterSize},
      {"a cluster that does not divide the grid", launch({6, 1, 1}, shape({4, 1, 1}, false)),
       Status::kInvalidClusterSize},
      {"a cluster of more than 16 blocks", launch({4, 4, 2}, shape({4, 4, 2}, false)), Status::kInvalidClusterSize},
  };
  for (const Case& c : cases) {
    why.clear();
    EXPECT_EQ(check_entry(c.e, Path::Ring, l, &why), c.status) << c.what;
    EXPECT_FALSE(why.empty()) << c.what;
  }
}

// Whatever the bytes, an accepted entry has the properties the worker relies on
// without further checks.
TEST(CheckEntry, RandomEntriesThatPassAreSafeToUse) {
  const Layout l = test_layout();
  std::mt19937_64 rng(12345);
  uint64_t passed = 0;
  auto small_or_random = [&](uint64_t limit) -> uint64_t {
    switch (rng() % 4) {
      case 0: return rng();
      case 1: return rng() % (limit + 2);
      case 2: return limit - rng() % 4;
      default: return UINT64_MAX - rng() % 4;
    }
  };
  for (int i = 0; i < 100000; ++i) {
    Entry e;
    auto* words = reinterpret_cast<uint64_t*>(&e);
    for (size_t k = 0; k < sizeof(Entry) / 8; ++k) words[k] = rng();
    // Bias towards the interesting corners so that many entries pass.
    e.op = uint16_t(rng() % (kOpCount + 2));
    if (rng() % 2) e.edge_count = uint8_t(rng() % (kMaxEdges + 2));
    for (auto& edge : e.edges)
      if (rng() % 2) edge.ring = uint32_t(rng() % (l.ring_count + 1));
    if (rng() % 2) e.thread = uint32_t(rng() % (l.slot_count + 1));
    if (rng() % 2) e.flags = uint16_t(rng() % 20);
    for (auto& a : e.arg)
      if (rng() % 2) a = small_or_random(rng() % 2 ? l.staging_per_ring : l.heap_size);
    if (rng() % 2) {
      for (int k = 1; k <= 3; ++k) e.arg[k] = (rng() % 3) | (rng() % 3) << 32;
      e.arg[5] &= 0xffffffff0000ffffull;
    }
    const Path path = rng() % 2 ? Path::Ring : Path::Slot;
    if (check_entry(e, path, l, nullptr) != Status::kSuccess) continue;
    ++passed;
    ASSERT_TRUE(valid_op(e.op));
    const Op op = Op(e.op);
    ASSERT_EQ(info(op).path, path);
    ASSERT_LE(e.edge_count, kMaxEdges);
    for (unsigned k = 0; k < e.edge_count; ++k) ASSERT_LT(e.edges[k].ring, l.ring_count);
    if (path == Path::Ring) {
      ASSERT_LT(e.thread, l.slot_count);
    }
    if (op == Op::Launch) {
      LaunchShape shape;
      ASSERT_TRUE(LaunchShape::decode(e.flags, &shape));
      const auto a = decode<Op::Launch>(e.arg);
      ASSERT_EQ(check_cluster(a.grid, shape.cluster), Status::kSuccess);
      const uint64_t size = e.arg[5] & 0xffffffff;
      ASSERT_LE(e.arg[4], l.staging_per_ring);
      ASSERT_LE(e.arg[4] + size, l.staging_per_ring);
      for (int k = 1; k <= 3; ++k) {
        ASSERT_NE(uint32_t(e.arg[k]), 0u);
        ASSERT_NE(uint32_t(e.arg[k] >> 32), 0u);
      }
    }
    if (op == Op::Memcpy) {
      ASSERT_EQ(e.flags >> 4, 0);
      for (auto [kind, off] : {std::pair{dst_kind(e.flags), e.arg[0]}, std::pair{src_kind(e.flags), e.arg[1]}}) {
        ASSERT_NE(int(kind), 3);
        const uint64_t lim = kind == MemKind::Staging ? l.staging_per_ring
                             : kind == MemKind::Pinned ? l.heap_size
                                                       : UINT64_MAX;
        if (kind == MemKind::Device) continue;
        ASSERT_LE(off, lim);
        ASSERT_LE(e.arg[2], lim - off);
      }
    }
    if (op == Op::Memset) {
      ASSERT_LE(e.arg[1], 0xffu);
    }
    if (op == Op::ModuleLoad || op == Op::ModuleChunk) {  // a piece in the heap, its image within the cap
      ASSERT_GT(e.arg[1], 0u);
      ASSERT_LE(e.arg[0], l.heap_size);
      ASSERT_LE(e.arg[1], l.heap_size - e.arg[0]);
      ASSERT_LE(e.arg[2], kMaxModuleImage - e.arg[1]);
    }
    if (op == Op::GraphCreate) {
      ASSERT_GT(e.arg[1], 0u);
      ASSERT_LE(e.arg[1], kMaxGraphBytes);
      ASSERT_LE(e.arg[0], l.heap_size);
      ASSERT_LE(e.arg[1], l.heap_size - e.arg[0]);
    }
    if (op == Op::GraphLaunch || op == Op::GraphDestroy) {
      ASSERT_GT(e.arg[0], 0u);
      ASSERT_LE(e.arg[0], UINT32_MAX);
    }
    if (op == Op::StreamCreate) {
      ASSERT_EQ(e.arg[0] & ~(kStreamNonBlocking | kStreamLegacy), 0u);
      ASSERT_LT(e.arg[2], kMaxDevices);
    }
  }
  EXPECT_GT(passed, 1000u) << "the generator should reach the accepting paths";
}

// ============================================================== part 2: a hostile guest

// Polls `pred` until it holds or `timeout` passes.
template <class F>
bool eventually(F pred, std::chrono::milliseconds timeout = 3000ms) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(50us);
  }
  return true;
}

struct AsyncError {
  Status status;
  uint32_t op;
  uint64_t pos;
  uint32_t ring;
};

// A raw guest next to a well-behaved Client on one worker. The raw side uses
// rings at the top of the ring range (the client allocates rings from the
// bottom) and the last reply slot (the client hands out slots from 0).
class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = w_.attach();
    L_ = w_.region().layout();
    S_ = L_.slot_count - 1;
    R_ = L_.ring_count - 1;
    bell_ = std::make_unique<DoorbellRinger>(doorbell_path(w_.region_path()));
    tails_.assign(L_.ring_count, 0);
    unpublished_.assign(L_.ring_count, {});
    error_seen_ = slot().error_seq.load(std::memory_order_acquire);
    slot_seq_ = slot().request.seq.load(std::memory_order_relaxed);
    ASSERT_EQ(c_->malloc(&dev_, kDevBytes), Status::kSuccess);
    ASSERT_EQ(c_->memset_async(dev_, 0, kDevBytes, kLegacyStream), Status::kSuccess);
    ASSERT_EQ(c_->device_synchronize(), Status::kSuccess);
  }

  void TearDown() override {
    // Whatever happened, the worker still serves the well-behaved client.
    if (c_) {
      EXPECT_EQ(c_->null_call(), Status::kSuccess);
      client_round_trip();
    }
  }

  Region& region() { return w_.region(); }
  ReplySlot& slot() { return region().slot(S_); }

  void ring_bell() { bell_->ring(); }

  // Marks ring r open for the worker (the guest library does this in stream_create).
  static uint32_t raw_stream(uint32_t r) { return kMaxStreams - 1 - r; }
  void open_ring(uint32_t r) {
    region().header()->ring_open[r / 64].fetch_or(uint64_t{1} << (r % 64), std::memory_order_release);
  }
  // Opens ring r and creates its stream (non-blocking: the legacy stream never waits for it).
  void create_ring(uint32_t r) {
    open_ring(r);
    Entry e = entry(Op::StreamCreate, S_);
    e.arg[0] = kStreamNonBlocking;
    push(r, e);
  }

  // Writes one entry at the raw tail of ring r, to be published by publish(r). Returns its position.
  // Entries name slot S_ (where their errors go) unless keep_thread is set:
  // never the client's own slots.
  // Entries on ring r > 0 name stream kMaxStreams - 1 - r unless they name one
  // (the client's own streams count up from 1).
  uint64_t write(uint32_t r, const Entry& in, bool keep_thread = false) {
    Entry e = in;
    if (!keep_thread) e.thread = S_;
    if (r != kLegacyRing && e.stream == 0) e.stream = raw_stream(r);
    const uint64_t pos = tails_[r]++;
    unpublished_[r].push_back({pos, e});
    return pos;
  }
  void publish(uint32_t r) {
    for (auto& [pos, e] : unpublished_[r]) publish_entry(&region().entries(r)[pos & (L_.ring_capacity - 1)], e, pos, L_.ring_capacity);
    unpublished_[r].clear();
    ring_bell();
  }
  // How far ring r is published, as the worker can tell: its head, then every
  // slot that shows its position's lap.
  uint64_t published_end(uint32_t r) {
    uint64_t pos = region().ring(r).head.load(std::memory_order_acquire);
    while (pos - region().ring(r).head.load() < L_.ring_capacity &&
           word_lap(entry_word(&region().entries(r)[pos & (L_.ring_capacity - 1)]).load()) ==
               entry_lap(pos, L_.ring_capacity))
      ++pos;
    return pos;
  }
  uint64_t push(uint32_t r, const Entry& e) {
    const uint64_t pos = write(r, e);
    publish(r);
    return pos;
  }

  // Waits until ring r has dispatched everything pushed (head == our tail).
  bool drained(uint32_t r) {
    return eventually([&] { return region().ring(r).head.load(std::memory_order_acquire) >= tails_[r]; });
  }
  // Pushes a fence and waits until everything before it completed on the device.
  bool synced(uint32_t r) {
    const uint64_t fence = push(r, entry(Op::Fence));
    return eventually([&] { return region().ring(r).completed.load(std::memory_order_acquire) > fence; });
  }

  // The next async error on slot S_ (nullopt after a timeout).
  std::optional<AsyncError> next_error(std::chrono::milliseconds timeout = 3000ms) {
    if (!eventually([&] { return slot().error_seq.load(std::memory_order_acquire) != error_seen_; }, timeout))
      return std::nullopt;
    error_seen_ = slot().error_seq.load(std::memory_order_acquire);
    ReplySlot& s = slot();
    return AsyncError{Status(s.error), s.error_op, s.error_pos, s.error_ring};
  }
  bool no_new_error() { return slot().error_seq.load(std::memory_order_acquire) == error_seen_; }

  // Memset of the client's device buffer to a fresh marker on ring r, then a
  // fence; waits for the fence and checks the bytes through the client.
  void expect_ring_continues(uint32_t r) {
    const uint8_t m = ++marker_;
    Entry set = entry(Op::Memset, S_);
    set.arg[0] = dev_;
    set.arg[1] = m;
    set.arg[2] = kDevBytes;
    push(r, set);
    const uint64_t fence = push(r, entry(Op::Fence, S_));
    ASSERT_TRUE(eventually([&] { return region().ring(r).completed.load(std::memory_order_acquire) > fence; }))
        << "ring " << r << " stopped: head " << region().ring(r).head.load() << " tail " << tails_[r];
    std::vector<uint8_t> out(kDevBytes);
    ASSERT_EQ(c_->memcpy_d2h(out.data(), dev_, kDevBytes), Status::kSuccess);
    ASSERT_EQ(std::count(out.begin(), out.end(), m), ptrdiff_t(kDevBytes))
        << "the memset after the bad entry did not run";
    EXPECT_TRUE(no_new_error()) << "good entries must not report errors";
  }

  // Pushes `bad` on ring r, expects exactly one error `want` for it on slot S_,
  // and that the ring then goes on.
  void expect_rejected(uint32_t r, const Entry& in, Status want, const std::string& what) {
    Entry bad = in;
    SCOPED_TRACE(what);
    bad.thread = S_;
    const uint64_t pos = push(r, bad);
    auto err = next_error();
    ASSERT_TRUE(err) << "no error reported";
    EXPECT_EQ(err->status, want) << "got " << int(err->status);
    EXPECT_EQ(err->op, bad.op);
    EXPECT_EQ(err->pos, pos);
    EXPECT_EQ(err->ring, r);
    expect_ring_continues(r);
  }

  // A synchronous request written straight into slot S_.
  Status slot_call(const Entry& e, uint64_t* r0 = nullptr, const void* payload = nullptr, size_t n = 0) {
    ReplySlot& s = slot();
    if (payload) std::memcpy(s.payload, payload, n);
    const uint64_t seq = ++slot_seq_;
    write_request(s, e, seq);
    post_slot(region().header(), S_);
    ring_bell();
    if (!eventually([&] { return s.reply_seq.load(std::memory_order_acquire) == seq; })) {
      ADD_FAILURE() << "no reply to slot request " << seq;
      return Status::kDevicesUnavailable;
    }
    if (r0) *r0 = s.result[0];
    return Status(s.status);
  }

  void client_round_trip() {
    uint64_t d = 0;
    ASSERT_EQ(c_->malloc(&d, 4096), Status::kSuccess);
    std::vector<uint8_t> in(4096), out(4096);
    for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i * 7 + 3);
    ASSERT_EQ(c_->memcpy_h2d(d, in.data(), in.size()), Status::kSuccess);
    ASSERT_EQ(c_->memcpy_d2h(out.data(), d, out.size()), Status::kSuccess);
    EXPECT_EQ(in, out);
    EXPECT_EQ(c_->free(d), Status::kSuccess);
  }

  static constexpr uint64_t kDevBytes = 4096;
  InProcessWorker w_;
  std::unique_ptr<Client> c_;
  Layout L_{};
  uint32_t S_ = 0, R_ = 0;
  std::unique_ptr<DoorbellRinger> bell_;
  std::vector<uint64_t> tails_;
  std::vector<std::vector<std::pair<uint64_t, Entry>>> unpublished_;
  uint64_t error_seen_ = 0, slot_seq_ = 0;
  uint64_t dev_ = 0;
  uint8_t marker_ = 0;
};

Entry memset_entry(uint64_t addr, uint8_t value, uint64_t size) {
  Entry e = entry(Op::Memset);
  e.arg[0] = addr;
  e.arg[1] = value;
  e.arg[2] = size;
  return e;
}

TEST_F(Hostile, RawEntriesOnADedicatedRingWork) {
  create_ring(R_);
  expect_ring_continues(R_);
  expect_ring_continues(R_);
  // A raw launch with its arguments in the ring's staging window.
  const uint32_t fill = kernel(*c_, "ordo_fill_u32");
  sim::FillU32Args a{dev_, kDevBytes / 4, 0x01010101u * 0x5au, 0};
  std::memcpy(region().staging(R_) + 64, &a, sizeof a);
  Entry l = good_launch();
  l.thread = S_;
  l.arg[0] = fill;
  l.arg[4] = 64;
  l.arg[5] = sizeof a;
  push(R_, l);
  const uint64_t f = push(R_, entry(Op::Fence, S_));
  ASSERT_TRUE(eventually([&] { return region().ring(R_).completed.load() > f; }));
  std::vector<uint8_t> out(kDevBytes);
  ASSERT_EQ(c_->memcpy_d2h(out.data(), dev_, kDevBytes), Status::kSuccess);
  EXPECT_EQ(std::count(out.begin(), out.end(), 0x5a), ptrdiff_t(kDevBytes));
  EXPECT_TRUE(no_new_error());
}

TEST_F(Hostile, UnknownOp) {
  create_ring(R_);
  for (uint16_t op : {uint16_t(kOpCount), uint16_t(0x1234), uint16_t(0xffff)}) {
    Entry e{};
    e.op = op;
    expect_rejected(R_, e, Status::kNotSupported, "op " + std::to_string(op));
  }
}

TEST_F(Hostile, SlotOpOnARingIsNotExecuted) {
  create_ring(R_);
  Entry m = entry(Op::Malloc);
  m.arg[0] = 4096;
  expect_rejected(R_, m, Status::kInvalidValue, "malloc on a ring");
  Entry f = entry(Op::Free);
  f.arg[0] = dev_;
  expect_rejected(R_, f, Status::kInvalidValue, "free on a ring");
  expect_ring_continues(R_);  // dev_ is still allocated
}

TEST_F(Hostile, MalformedEntriesOnARing) {
  create_ring(R_);
  Entry e = entry(Op::Nop);
  e.edge_count = 200;
  expect_rejected(R_, e, Status::kInvalidValue, "200 edges");
  e = memset_entry(dev_, 0xee, kDevBytes);
  e.arg[1] = 0x1ee;
  expect_rejected(R_, e, Status::kInvalidValue, "memset value not a byte");
  e = memcpy_entry(MemKind::Device, dev_, MemKind::Staging, L_.staging_per_ring - 8, 16);
  expect_rejected(R_, e, Status::kInvalidValue, "staging source past the window");
  e = memcpy_entry(MemKind::Pinned, UINT64_MAX - 3, MemKind::Device, dev_, 16);
  expect_rejected(R_, e, Status::kInvalidValue, "pinned destination wraps");
  e = memcpy_entry(MemKind::Device, dev_, MemKind::Device, dev_, 16);
  e.flags = 3;
  expect_rejected(R_, e, Status::kInvalidValue, "memory kind 3");
  e.flags = 1 << 7;
  expect_rejected(R_, e, Status::kInvalidValue, "unknown memcpy flag");
  e = good_launch();
  e.arg[4] = L_.staging_per_ring - 4;
  expect_rejected(R_, e, Status::kInvalidValue, "launch args past the window");
  e = good_launch();
  e.arg[3] = 1;  // block z == 0
  expect_rejected(R_, e, Status::kInvalidConfiguration, "zero block dimension");
  e = entry(Op::StreamCreate);
  e.arg[0] = 6;
  expect_rejected(R_, e, Status::kInvalidValue, "unknown stream flags");
}

TEST_F(Hostile, BadThreadSlotIsCountedButReportedNowhere) {
  create_ring(R_);
  ASSERT_TRUE(drained(R_));
  const uint64_t errors = w_.worker().stats().errors;
  std::vector<uint64_t> seqs(L_.slot_count);
  for (uint32_t s = 0; s < L_.slot_count; ++s) seqs[s] = region().slot(s).error_seq.load();
  Entry e = memset_entry(0xdead, 0, 1);  // also a bad pointer
  e.thread = L_.slot_count;
  write(R_, e, true);
  e.thread = kNoSlot;
  write(R_, e, true);
  publish(R_);
  ASSERT_TRUE(drained(R_));
  ASSERT_TRUE(eventually([&] { return w_.worker().stats().errors >= errors + 2; }));
  for (uint32_t s = 0; s < L_.slot_count; ++s) EXPECT_EQ(region().slot(s).error_seq.load(), seqs[s]) << s;
  expect_ring_continues(R_);
}

TEST_F(Hostile, DevicePointerNeverAllocated) {
  create_ring(R_);
  for (uint64_t addr : {uint64_t{0}, uint64_t{0x1000}, dev_ - 1, dev_ - 4096, dev_ + (uint64_t{1} << 32),
                        UINT64_MAX, uint64_t(reinterpret_cast<uintptr_t>(region().heap()))}) {
    const std::string a = std::to_string(addr);
    expect_rejected(R_, memset_entry(addr, 1, 8), Status::kInvalidDevicePointer, "memset " + a);
    expect_rejected(R_, memcpy_entry(MemKind::Device, addr, MemKind::Staging, 0, 8), Status::kInvalidDevicePointer,
                    "memcpy to " + a);
    expect_rejected(R_, memcpy_entry(MemKind::Staging, 0, MemKind::Device, addr, 8), Status::kInvalidDevicePointer,
                    "memcpy from " + a);
    expect_rejected(R_, memcpy_entry(MemKind::Device, dev_, MemKind::Device, addr, 8),
                    Status::kInvalidDevicePointer, "memcpy d2d from " + a);
  }
}

TEST_F(Hostile, RangeStraddlingTheEndOfAnAllocation) {
  create_ring(R_);
  uint64_t next = 0;  // a second allocation right after dev_ (with a gap in the sim)
  ASSERT_EQ(c_->malloc(&next, 4096), Status::kSuccess);
  const uint64_t end = dev_ + kDevBytes;
  struct C {
    uint64_t addr, size;
  };
  for (C c : {C{end - 8, 16}, C{dev_, kDevBytes + 1}, C{end, 1}, C{end + 1, 0}, C{dev_ + 8, UINT64_MAX},
              C{dev_, UINT64_MAX}, C{dev_ + 1, UINT64_MAX - 1}, C{end, next - end + 1}}) {
    const std::string what = "+" + std::to_string(c.addr - dev_) + " size " + std::to_string(c.size);
    expect_rejected(R_, memset_entry(c.addr, 9, c.size), Status::kInvalidDevicePointer, "memset " + what);
    expect_rejected(R_, memcpy_entry(MemKind::Device, c.addr, MemKind::Device, next, c.size),
                    Status::kInvalidDevicePointer, "memcpy to " + what);
    expect_rejected(R_, memcpy_entry(MemKind::Device, next, MemKind::Device, c.addr, c.size),
                    Status::kInvalidDevicePointer, "memcpy from " + what);
  }
  // Exactly up to the end is fine, and so is an empty range at the end.
  push(R_, memset_entry(end - 8, 0x77, 8));
  push(R_, memset_entry(end, 0x77, 0));
  ASSERT_TRUE(synced(R_));  // R_ is non-blocking: the client's copy does not wait for it
  uint8_t tail[8] = {};
  ASSERT_EQ(c_->memcpy_d2h(tail, end - 8, 8), Status::kSuccess);
  for (uint8_t b : tail) EXPECT_EQ(b, 0x77);
  EXPECT_TRUE(no_new_error());
  EXPECT_EQ(c_->free(next), Status::kSuccess);
}

TEST_F(Hostile, FreedPointer) {
  create_ring(R_);
  uint64_t d = 0;
  ASSERT_EQ(c_->malloc(&d, 8192), Status::kSuccess);
  push(R_, memset_entry(d, 1, 8192));  // fine while it lives
  ASSERT_TRUE(synced(R_));  // the client's free waits for its own streams, not for this raw one
  EXPECT_TRUE(no_new_error());
  ASSERT_EQ(c_->free(d), Status::kSuccess);
  expect_rejected(R_, memset_entry(d, 1, 8192), Status::kInvalidDevicePointer, "memset after free");
  expect_rejected(R_, memset_entry(d + 100, 1, 1), Status::kInvalidDevicePointer, "interior after free");
  expect_rejected(R_, memcpy_entry(MemKind::Staging, 0, MemKind::Device, d, 16), Status::kInvalidDevicePointer,
                  "memcpy from freed");
  // A second free of the same address through a raw slot request.
  Entry f = entry(Op::Free);
  f.arg[0] = d;
  EXPECT_EQ(slot_call(f), Status::kInvalidDevicePointer);
}

TEST_F(Hostile, EventHandlesNeverIssuedOrDestroyed) {
  create_ring(R_);
  for (uint64_t h : {uint64_t{0}, uint64_t{12345}, uint64_t{1} << 32, uint64_t{1} << 32 | 65535, UINT64_MAX}) {
    Entry e = entry(Op::EventRecord);
    e.arg[0] = h;
    expect_rejected(R_, e, Status::kInvalidResourceHandle, "record never issued " + std::to_string(h));
    e.op = uint16_t(Op::StreamWaitEvent);
    expect_rejected(R_, e, Status::kInvalidResourceHandle, "wait never issued " + std::to_string(h));
  }
  Event ev;
  ASSERT_EQ(c_->event_create(&ev), Status::kSuccess);
  Entry rec = entry(Op::EventRecord, S_);
  rec.arg[0] = ev.handle;
  push(R_, rec);  // a live handle works on a raw ring too
  ASSERT_TRUE(drained(R_));
  EXPECT_TRUE(no_new_error());
  // A handle with the right index but another generation.
  Entry wrong_gen = rec;
  wrong_gen.arg[0] = ev.handle + (uint64_t{1} << 32);
  expect_rejected(R_, wrong_gen, Status::kInvalidResourceHandle, "wrong generation");
  ASSERT_EQ(c_->event_destroy(ev), Status::kSuccess);
  expect_rejected(R_, rec, Status::kInvalidResourceHandle, "record destroyed");
  Entry wait = rec;
  wait.op = uint16_t(Op::StreamWaitEvent);
  expect_rejected(R_, wait, Status::kInvalidResourceHandle, "wait destroyed");
  // The index is reused with a new generation: the stale handle stays dead.
  Event again;
  ASSERT_EQ(c_->event_create(&again), Status::kSuccess);
  ASSERT_EQ(uint32_t(again.handle), uint32_t(ev.handle)) << "expected the index to be reused";
  ASSERT_NE(again.handle, ev.handle);
  expect_rejected(R_, rec, Status::kInvalidResourceHandle, "stale generation after reuse");
  Entry rec2 = rec;
  rec2.arg[0] = again.handle;
  push(R_, rec2);
  ASSERT_TRUE(drained(R_));
  EXPECT_TRUE(no_new_error());
  // Slot requests with stale and never-issued handles.
  for (Op op : {Op::EventQuery, Op::EventSynchronize, Op::EventDestroy}) {
    Entry q = entry(op);
    q.arg[0] = ev.handle;
    EXPECT_EQ(slot_call(q), Status::kInvalidResourceHandle) << info(op).name;
    q.arg[0] = 777;
    EXPECT_EQ(slot_call(q), Status::kInvalidResourceHandle) << info(op).name;
  }
  Entry el = entry(Op::EventElapsed);
  el.arg[0] = again.handle;
  el.arg[1] = ev.handle;
  EXPECT_EQ(slot_call(el), Status::kInvalidResourceHandle);
  EXPECT_EQ(c_->event_destroy(again), Status::kSuccess);
}

// Event requests whose record is held behind a host function the guest has
// not finished do not wait for it (issue 28): a query is not ready; a destroy
// is answered at once and carried out once the record it names was
// dispatched; a second destroy and a request on the event fail, and the held
// record still finds its event.
TEST_F(Hostile, EventRequestsBehindAHeldHostFunctionAreAnsweredAtOnce) {
  create_ring(R_);
  void* p = nullptr;
  ASSERT_EQ(c_->malloc_host(&p, sizeof(HostFuncWords)), Status::kSuccess);
  Entry hf = entry(Op::HostFunc);
  hf.arg[0] = uint64_t(static_cast<std::byte*>(p) - guest::region_of(*c_).heap());
  auto* w = reinterpret_cast<HostFuncWords*>(region().heap() + hf.arg[0]);
  w->reached.store(0);
  w->done.store(0);
  hf.arg[1] = 3;
  Event ev;
  ASSERT_EQ(c_->event_create(&ev), Status::kSuccess);
  push(R_, hf);
  Entry rec = entry(Op::EventRecord, S_);
  rec.arg[0] = ev.handle;
  rec.arg[1] = 1;  // its first record
  const uint64_t rec_pos = push(R_, rec);
  ASSERT_TRUE(eventually([&] { return w->reached.load() == 3; }));
  const Edge past_record{R_, 0, rec_pos + 1}, past_hf{R_, 0, rec_pos};
  Entry q = entry(Op::EventQuery);
  q.arg[0] = ev.handle;
  q.arg[1] = 1;
  q.edge_count = 1;
  q.edges[0] = past_record;
  EXPECT_EQ(slot_call(q), Status::kNotReady);
  q.edges[0] = past_hf;  // the host function itself: not done either
  EXPECT_EQ(slot_call(q), Status::kNotReady);
  Entry destroy = entry(Op::EventDestroy);
  destroy.arg[0] = ev.handle;
  destroy.arg[1] = 1;  // after record 1, with no wait on it
  EXPECT_EQ(slot_call(destroy), Status::kSuccess);
  EXPECT_EQ(slot_call(destroy), Status::kInvalidResourceHandle) << "a second destroy of an event being destroyed";
  q.edge_count = 0;
  EXPECT_EQ(slot_call(q), Status::kInvalidResourceHandle) << "a request on a destroyed event";
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(region().ring(R_).head.load(), rec_pos) << "the record behind the host function was dispatched";
  w->done.store(3);
  ASSERT_TRUE(drained(R_));
  EXPECT_TRUE(no_new_error()) << "the record found its event destroyed";
  // Carried out: the index comes back with a new generation.
  Event again;
  ASSERT_EQ(c_->event_create(&again), Status::kSuccess);
  EXPECT_EQ(uint32_t(again.handle), uint32_t(ev.handle)) << "the deferred destroy was never carried out";
  expect_rejected(R_, rec, Status::kInvalidResourceHandle, "the destroyed event's record");
  EXPECT_EQ(c_->event_destroy(again), Status::kSuccess);
}

TEST_F(Hostile, EdgeToARingThatDoesNotExist) {
  create_ring(R_);
  for (uint32_t ring : {L_.ring_count, kMaxRings - 1, kMaxRings, UINT32_MAX}) {
    Entry e = memset_entry(dev_, 1, 8);
    e.edge_count = 2;
    e.edges[0] = {0, 0, 0};
    e.edges[1] = {ring, 0, 0};
    expect_rejected(R_, e, Status::kInvalidValue, "edge to ring " + std::to_string(ring));
  }
}

TEST_F(Hostile, EdgeToAFuturePositionIsAnErrorNotAWait) {
  create_ring(R_);
  ASSERT_TRUE(drained(R_));
  // The client is idle while these run, so the legacy ring's end is stable.
  auto legacy_tail = [&] { return published_end(kLegacyRing); };
  auto with_edge = [&](Edge edge) {
    Entry e = memset_entry(dev_, 1, 8);
    e.edge_count = 1;
    e.edges[0] = edge;
    return e;
  };
  // Own ring: the entry at position p may only wait for positions <= p.
  expect_rejected(R_, with_edge({R_, 0, tails_[R_] + 1}), Status::kIllegalState, "own ring, its own successor");
  expect_rejected(R_, with_edge({R_, 0, uint64_t{1} << 40}), Status::kIllegalState, "own ring far ahead");
  expect_rejected(R_, with_edge({R_, 0, UINT64_MAX}), Status::kIllegalState, "own ring max");
  // Other rings: not beyond what they published.
  expect_rejected(R_, with_edge({kLegacyRing, 0, legacy_tail() + 1}), Status::kIllegalState,
                  "legacy ring one past its tail");
  expect_rejected(R_, with_edge({kLegacyRing, 0, UINT64_MAX}), Status::kIllegalState, "legacy ring max");
  expect_rejected(R_, with_edge({R_ - 1, 0, 1}), Status::kIllegalState, "a ring nobody wrote");
  // One bad edge among good ones is enough.
  Entry mixed = with_edge({kLegacyRing, 0, 0});
  mixed.edge_count = kMaxEdges;
  mixed.edges[1] = {R_, 0, tails_[R_]};
  mixed.edges[2] = {R_ - 1, 0, 0};
  mixed.edges[3] = {kLegacyRing, 0, legacy_tail() + 5};
  expect_rejected(R_, mixed, Status::kIllegalState, "fourth edge in the future");
  // The same from a slot request: answered at once, not parked.
  Entry q = entry(Op::Null);
  q.edge_count = 1;
  q.edges[0] = {kLegacyRing, 0, legacy_tail() + 1000};
  EXPECT_EQ(slot_call(q), Status::kIllegalState);
  q.edges[0] = {R_, 0, tails_[R_] + 1};
  EXPECT_EQ(slot_call(q), Status::kIllegalState);
  // Edges to positions already published are fine.
  Entry ok_e = memset_entry(dev_, 2, 8);
  ok_e.edge_count = 3;
  ok_e.edges[0] = {R_, 0, tails_[R_]};  // itself: everything before it on its own ring
  ok_e.edges[1] = {kLegacyRing, 0, legacy_tail()};
  ok_e.edges[2] = {R_ - 1, 0, 0};
  push(R_, ok_e);
  ASSERT_TRUE(drained(R_));
  EXPECT_TRUE(no_new_error());
  q.edges[0] = {kLegacyRing, 0, legacy_tail()};
  EXPECT_EQ(slot_call(q), Status::kSuccess);
  q.edges[0] = {R_, 0, tails_[R_]};
  EXPECT_EQ(slot_call(q), Status::kSuccess);
}

TEST_F(Hostile, EdgeToAPublishedPositionOnAnotherRingIsHonoured) {
  // The good case the checks must keep working: ring A's entry follows ring B's
  // launch of a slow kernel (dispatch order).
  const uint32_t A = R_, B = R_ - 1;
  create_ring(A);
  create_ring(B);
  const uint32_t stamp = kernel(*c_, "ordo_stamp");
  uint64_t st = 0;
  ASSERT_EQ(c_->malloc(&st, 2 * sizeof(sim::Stamp)), Status::kSuccess);
  // B: a kernel that sleeps 30 ms, then a fence that the edge names.
  sim::StampArgs a{st, 0, 30000};
  std::memcpy(region().staging(B), &a, sizeof a);
  Entry l = good_launch();
  l.thread = S_;
  l.arg[0] = stamp;
  l.arg[5] = sizeof a;
  push(B, l);
  const uint64_t b_after = tails_[B];
  // A: memset with an edge to B's launch (dispatch order, not completion).
  Entry e = memset_entry(dev_, 0x31, kDevBytes);
  e.thread = S_;
  e.edge_count = 1;
  e.edges[0] = {B, 0, b_after};
  push(A, e);
  ASSERT_TRUE(synced(A));  // dispatched after B's launch, and done
  const uint64_t fence = push(B, entry(Op::Fence));
  // Free only after the kernel is done with the memory (the guest's duty).
  ASSERT_TRUE(eventually([&] { return region().ring(B).completed.load(std::memory_order_acquire) > fence; }));
  EXPECT_TRUE(no_new_error());
  std::vector<uint8_t> out(kDevBytes);
  ASSERT_EQ(c_->memcpy_d2h(out.data(), dev_, kDevBytes), Status::kSuccess);
  EXPECT_EQ(std::count(out.begin(), out.end(), 0x31), ptrdiff_t(kDevBytes));
  EXPECT_EQ(c_->free(st), Status::kSuccess);
}

TEST_F(Hostile, EntriesOnARingWithoutStreamCreate) {
  const uint32_t r = R_ - 2;
  open_ring(r);
  // Nothing but StreamCreate and Nop runs on a ring without a stream.
  auto rejected = [&](const Entry& e, const char* what) {
    SCOPED_TRACE(what);
    const uint64_t pos = push(r, e);
    auto err = next_error();
    ASSERT_TRUE(err) << "no error reported";
    EXPECT_EQ(err->status, Status::kInvalidResourceHandle);
    EXPECT_EQ(err->op, e.op);
    EXPECT_EQ(err->pos, pos);
    EXPECT_EQ(err->ring, r);
  };
  rejected(memset_entry(dev_, 1, 8), "memset before create");
  rejected(entry(Op::StreamDestroy), "destroy before create");
  Entry rec = entry(Op::EventRecord);
  rec.arg[0] = 0;
  rejected(rec, "record before create");
  rejected(good_launch(), "launch before create");
  // A fence covers the streams that got work from the ring since the last
  // one: none here, so it completes at once (nothing could run).
  const uint64_t fence = push(r, entry(Op::Fence));
  ASSERT_TRUE(eventually([&] { return region().ring(r).completed.load() == fence + 1; }));
  EXPECT_TRUE(no_new_error());
  push(r, entry(Op::Nop));
  ASSERT_TRUE(drained(r));
  EXPECT_TRUE(no_new_error());
  // Now create it: the ring works; creating twice is an error.
  Entry c = entry(Op::StreamCreate);
  c.arg[0] = kStreamNonBlocking;
  push(r, c);
  expect_ring_continues(r);
  expect_rejected(r, c, Status::kInvalidResourceHandle, "create twice");
  // Destroy: further work is rejected again; create again works.
  push(r, entry(Op::StreamDestroy));
  ASSERT_TRUE(drained(r));
  EXPECT_TRUE(no_new_error());
  rejected(memset_entry(dev_, 1, 8), "memset after destroy");
  rejected(entry(Op::StreamDestroy), "destroy twice");
  push(r, c);
  expect_ring_continues(r);
}

TEST_F(Hostile, RingNotMarkedOpenIsNotServed) {
  const uint32_t r = R_;
  Entry c = entry(Op::StreamCreate, S_);
  c.arg[0] = kStreamNonBlocking;
  push(r, c);
  push(r, memset_entry(dev_, 1, 8));
  ASSERT_TRUE(c_->null_call() == Status::kSuccess);  // at least one full worker pass
  std::this_thread::sleep_for(5ms);
  EXPECT_EQ(region().ring(r).head.load(), 0u);
  open_ring(r);
  ring_bell();
  ASSERT_TRUE(drained(r));
  EXPECT_TRUE(no_new_error());
  expect_ring_continues(r);
}

TEST_F(Hostile, OpenBitsBeyondTheRingCountAreIgnored) {
  ASSERT_LT(L_.ring_count, kMaxRings);
  RegionHeader* h = region().header();
  for (uint32_t w = 0; w < kMaxRings / 64; ++w) h->ring_open[w].fetch_or(~uint64_t{0});
  // Every existing ring is open now, with nothing published: nothing to do, nothing read out of range.
  ASSERT_EQ(c_->null_call(), Status::kSuccess);
  create_ring(R_);
  expect_ring_continues(R_);
  client_round_trip();
}

TEST_F(Hostile, LaunchOfUnknownKernel) {
  create_ring(R_);
  for (uint64_t k : {uint64_t{65535}, uint64_t{0xdeadbeef}, uint64_t{1} << 32 | 0xffffffff}) {
    Entry e = good_launch();
    e.arg[0] = k;
    e.arg[5] = 0;
    expect_rejected(R_, e, Status::kInvalidDeviceFunction, "kernel " + std::to_string(k));
  }
  // A real kernel with bad arguments fails on the stream, reported the same way.
  const uint32_t fill = kernel(*c_, "ordo_fill_u32");
  sim::FillU32Args a{dev_, 16, 1, 0};
  std::memcpy(region().staging(R_) + 128, &a, sizeof a);
  Entry e = good_launch();
  e.arg[0] = fill;
  e.arg[4] = 128;
  e.arg[5] = sizeof a;
  // Argument size mismatch. (sizeof a - 4 would be the packed size without the
  // struct's tail padding, which a CUDA launch sends and args<T>() accepts.)
  e.arg[5] = sizeof a - 8;
  expect_rejected(R_, e, Status::kInvalidValue, "short argument buffer");
  e.arg[5] = sizeof a + 8;
  expect_rejected(R_, e, Status::kInvalidValue, "long argument buffer");
  e = good_launch();
  e.arg[0] = fill;
  e.arg[2] = 1 | uint64_t{2048} << 32;  // block x 2048
  expect_rejected(R_, e, Status::kInvalidConfiguration, "block too large");
}

// A kernel that touches memory outside its allocations is a fault (CUDA's 700),
// reported on the stream like any async error, and sticky: the session's
// device work is over, as a CUDA context's is. The worker serves the next session.
TEST_F(Hostile, KernelFaultIsStickyForTheSession) {
  for (bool past_end : {false, true}) {
    SCOPED_TRACE(past_end ? "one element past the allocation" : "memory nobody allocated");
    create_ring(R_);
    const uint32_t fill = kernel(*c_, "ordo_fill_u32");
    sim::FillU32Args a = past_end ? sim::FillU32Args{dev_, kDevBytes / 4 + 1, 1, 0} : sim::FillU32Args{0xbad000, 16, 1, 0};
    std::memcpy(region().staging(R_) + 128, &a, sizeof a);
    Entry e = good_launch();
    e.arg[0] = fill;
    e.arg[4] = 128;
    e.arg[5] = sizeof a;
    const uint64_t pos = push(R_, e);
    auto err = next_error();
    ASSERT_TRUE(err) << "no error reported";
    EXPECT_EQ(err->status, Status::kIllegalAddress);
    EXPECT_EQ(err->pos, pos);
    EXPECT_EQ(err->ring, R_);
    uint64_t d = 0;
    EXPECT_EQ(c_->malloc(&d, 64), Status::kIllegalAddress);
    EXPECT_EQ(c_->device_synchronize(), Status::kIllegalAddress);
    EXPECT_EQ(c_->null_call(), Status::kIllegalAddress) << "the session's calls all return the fault";
    // A new session (process) starts clean.
    c_.reset();
    c_ = w_.attach();
    tails_.assign(L_.ring_count, 0);
    unpublished_.assign(L_.ring_count, {});
    error_seen_ = slot().error_seq.load(std::memory_order_acquire);
    ASSERT_EQ(c_->malloc(&dev_, kDevBytes), Status::kSuccess);
    client_round_trip();
  }
}

// A host function the guest never finishes (or whose done word it lowers again)
// holds its own ring's later entries and nothing else; a new session is served.
TEST_F(Hostile, UnfinishedHostFunctionHoldsOnlyItsRing) {
  create_ring(R_);
  void* p = nullptr;
  ASSERT_EQ(c_->malloc_host(&p, sizeof(HostFuncWords)), Status::kSuccess);
  auto* w = static_cast<HostFuncWords*>(p);
  w->reached.store(0);
  w->done.store(0);
  Entry hf = entry(Op::HostFunc);
  hf.arg[0] = uint64_t(static_cast<std::byte*>(p) - guest::region_of(*c_).heap());  // the client maps the region elsewhere
  w = reinterpret_cast<HostFuncWords*>(region().heap() + hf.arg[0]);
  hf.arg[1] = 7;
  push(R_, hf);
  const uint64_t held = push(R_, memset_entry(dev_, 0x5a, kDevBytes));
  ASSERT_TRUE(eventually([&] { return w->reached.load() == 7; }))
      << "the worker never said the stream got there; error " << (no_new_error() ? std::string("none") : std::string(status_name(next_error()->status)));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(region().ring(R_).head.load(), held) << "the entry after an unfinished host function was dispatched";
  w->done.store(7);
  ASSERT_TRUE(drained(R_));
  push(R_, hf);  // ticket 7 again: already done
  ASSERT_TRUE(drained(R_));
  hf.arg[1] = 8;
  push(R_, hf);
  push(R_, memset_entry(dev_, 0x5b, kDevBytes));
  ASSERT_TRUE(eventually([&] { return w->reached.load() == 8; }));
  w->done.store(3);  // lowered: still held
  client_round_trip();  // other rings and sync calls are served meanwhile
  std::this_thread::sleep_for(20ms);
  EXPECT_LT(region().ring(R_).head.load(), tails_[R_]);
  EXPECT_TRUE(no_new_error());
  // The session ends with its ring held: the next one is served.
  c_.reset();
  c_ = w_.attach();
  ASSERT_EQ(c_->malloc(&dev_, kDevBytes), Status::kSuccess);
  client_round_trip();
}

// A ring has no tail to forge: what a guest controls is each slot's lap. A slot
// at the head that shows any lap but its position's is no entry, whatever the
// slots after it show: nothing runs, nobody is blamed, the worker serves the
// others, and the ring goes on once the slot shows its own lap.
TEST_F(Hostile, SlotAtTheHeadShowingAnotherLapHoldsItsRingUntilItShowsItsOwn) {
  create_ring(R_);
  expect_ring_continues(R_);
  ASSERT_TRUE(drained(R_));
  const uint32_t cap = L_.ring_capacity;
  const uint64_t head = tails_[R_];  // everything so far was dispatched
  const uint8_t own = entry_lap(head, cap);
  Entry* slot = &region().entries(R_)[head & (cap - 1)];
  auto raw = [&](uint8_t value) {
    Entry e = memset_entry(dev_, value, kDevBytes);
    e.thread = S_;
    e.stream = raw_stream(R_);
    return e;
  };
  // Behind the head, entries that show their own laps: they must wait for it.
  // They write the buffer's first half only, so its second half tells whether
  // the head entry ran, and its first half whether it ran first.
  for (uint64_t p = head + 1; p < head + 4; ++p) {
    Entry later = raw(0xaa);
    later.arg[2] = kDevBytes / 2;
    publish_entry(&region().entries(R_)[p & (cap - 1)], later, p, cap);
  }
  const Entry first = raw(0x55);
  std::memcpy(reinterpret_cast<char*>(slot) + 8, reinterpret_cast<const char*>(&first) + 8, kCacheLine - 8);
  const uint64_t errors = w_.worker().stats().errors;
  for (uint8_t lap : {uint8_t(own - 1), uint8_t(own + 1), uint8_t(own + 128), uint8_t(0), uint8_t(0xff)}) {
    if (lap == own) continue;
    SCOPED_TRACE("lap " + std::to_string(lap) + " at the head, whose position's lap is " + std::to_string(own));
    uint64_t word;
    std::memcpy(&word, &first, sizeof word);
    entry_word(slot).store(with_lap(word, lap), std::memory_order_release);
    ring_bell();
    ASSERT_EQ(c_->null_call(), Status::kSuccess);
    client_round_trip();
    std::this_thread::sleep_for(30ms);
    EXPECT_EQ(region().ring(R_).head.load(), head) << "dispatched from a slot that shows another lap";
    EXPECT_EQ(w_.worker().stats().errors, errors) << "a slot not yet written is no error";
    EXPECT_TRUE(no_new_error());
  }
  // Its own lap: it runs, then the three behind it.
  publish_entry(slot, first, head, cap);
  tails_[R_] = head + 4;
  ring_bell();
  ASSERT_TRUE(synced(R_));
  std::vector<uint8_t> out(kDevBytes);
  ASSERT_EQ(c_->memcpy_d2h(out.data(), dev_, kDevBytes), Status::kSuccess);
  EXPECT_EQ(std::count(out.begin(), out.begin() + kDevBytes / 2, 0xaa), ptrdiff_t(kDevBytes / 2)) << "run out of order";
  EXPECT_EQ(std::count(out.begin() + kDevBytes / 2, out.end(), 0x55), ptrdiff_t(kDevBytes / 2)) << "the head entry did not run";
  EXPECT_TRUE(no_new_error());
  // A whole ring published at once is a full ring, not a bad one.
  for (uint64_t i = 0; i + 1 < cap; ++i) write(R_, memset_entry(dev_, uint8_t(i), kDevBytes));
  write(R_, memset_entry(dev_, 0x42, kDevBytes));
  publish(R_);
  ASSERT_TRUE(drained(R_));
  EXPECT_EQ(w_.worker().stats().errors, errors);
  EXPECT_TRUE(no_new_error());
  expect_ring_continues(R_);
}

TEST_F(Hostile, SlotRequestsWithBadOpsAndHandles) {
  EXPECT_EQ(slot_call(entry(Op::Null)), Status::kSuccess);
  Entry e{};
  e.op = uint16_t(kOpCount);
  EXPECT_EQ(slot_call(e), Status::kNotSupported);
  e.op = 0xffff;
  EXPECT_EQ(slot_call(e), Status::kNotSupported);
  // Ring ops are not sync calls.
  for (Op op : {Op::Memcpy, Op::Memset, Op::Launch, Op::StreamCreate, Op::StreamDestroy, Op::Fence, Op::Nop,
                Op::EventRecord})
    EXPECT_EQ(slot_call(entry(op)), Status::kInvalidValue) << info(op).name;
  // Malformed edges.
  e = entry(Op::Null);
  e.edge_count = kMaxEdges + 1;
  EXPECT_EQ(slot_call(e), Status::kInvalidValue);
  e.edge_count = 1;
  e.edges[0] = {L_.ring_count, 0, 0};
  EXPECT_EQ(slot_call(e), Status::kInvalidValue);
  // Free of pointers the worker never handed out (or not the start of one).
  Entry f = entry(Op::Free);
  for (uint64_t p : {uint64_t{0x1000}, dev_ + 16, dev_ - 256, UINT64_MAX}) {
    f.arg[0] = p;
    EXPECT_EQ(slot_call(f), Status::kInvalidDevicePointer) << p;
  }
  f.arg[0] = 0;
  EXPECT_EQ(slot_call(f), Status::kSuccess) << "cudaFree(nullptr)";
  // Malloc of nothing / of too much.
  Entry m = entry(Op::Malloc);
  uint64_t addr = 1;
  m.arg[0] = 0;
  EXPECT_NE(slot_call(m, &addr), Status::kSuccess);
  m.arg[0] = uint64_t{1} << 62;
  EXPECT_NE(slot_call(m, &addr), Status::kSuccess);
  // Kernel lookup with a payload that is not NUL-terminated.
  std::vector<char> name(kSlotPayload, 'A');
  EXPECT_EQ(slot_call(entry(Op::KernelLookup), nullptr, name.data(), name.size()), Status::kInvalidDeviceFunction);
  // ... and with a real name planted after junk: only up to the first NUL counts.
  const char real[] = "ordo_noop";
  std::memcpy(name.data(), real, sizeof real);
  uint64_t id = UINT64_MAX;
  EXPECT_EQ(slot_call(entry(Op::KernelLookup), &id, name.data(), name.size()), Status::kSuccess);
  EXPECT_EQ(uint32_t(id), kernel(*c_, "ordo_noop"));
  // Event calls with handles never issued.
  for (Op op : {Op::EventDestroy, Op::EventQuery, Op::EventSynchronize, Op::EventElapsed}) {
    Entry q = entry(op);
    q.arg[0] = 0xabcdef;
    q.arg[1] = 0x123456;
    EXPECT_EQ(slot_call(q), Status::kInvalidResourceHandle) << info(op).name;
  }
  // The device memory the client owns is untouched by all that.
  std::vector<uint8_t> out(kDevBytes, 1);
  ASSERT_EQ(c_->memcpy_d2h(out.data(), dev_, kDevBytes), Status::kSuccess);
  EXPECT_EQ(std::count(out.begin(), out.end(), 0), ptrdiff_t(kDevBytes));
}

TEST_F(Hostile, ModuleOpsWithBadIdsSizesAndOffsets) {
  const uint64_t heap = L_.heap_size;
  ASSERT_GT(heap, 4096u);
  Entry load = entry(Op::ModuleLoad);
  uint64_t id = 0;
  // Empty, oversize, and ranges that leave the pinned heap (incl. overflow).
  load.arg[0] = 0;
  load.arg[1] = 0;
  EXPECT_EQ(slot_call(load, &id), Status::kInvalidValue);
  load.arg[1] = kMaxModuleImage + 1;
  EXPECT_EQ(slot_call(load, &id), Status::kInvalidValue);
  for (auto [off, size] : {std::pair{heap, uint64_t{1}}, {heap - 8, uint64_t{16}}, {UINT64_MAX - 4, uint64_t{16}},
                           {uint64_t{16}, heap}}) {
    load.arg[0] = off;
    load.arg[1] = size;
    EXPECT_EQ(slot_call(load, &id), Status::kInvalidValue) << off << "+" << size;
  }
  // Module ids never issued: unload and lookup fail, also ids past 32 bits.
  for (uint64_t m : {uint64_t{1}, uint64_t{77}, uint64_t{0xffffffff}, uint64_t{1} << 32 | 1}) {
    Entry un = entry(Op::ModuleUnload);
    un.arg[0] = m;
    EXPECT_EQ(slot_call(un), Status::kInvalidResourceHandle) << m;
    EXPECT_EQ(slot_call(lookup_entry(m), &id, "ordo_noop", 10), Status::kInvalidResourceHandle) << m;
  }
  // A real load through the heap: the id works for lookups until unloaded, then not.
  load.arg[0] = 0;
  load.arg[1] = 64;
  ASSERT_EQ(slot_call(load, &id), Status::kSuccess);
  ASSERT_NE(id, 0u);
  const Entry lk = lookup_entry(id);
  uint64_t k = UINT64_MAX;
  EXPECT_EQ(slot_call(lk, &k, "ordo_noop", 10), Status::kSuccess);
  EXPECT_EQ(uint32_t(k), kernel(*c_, "ordo_noop"));
  Entry un = entry(Op::ModuleUnload);
  un.arg[0] = id;
  EXPECT_EQ(slot_call(un), Status::kSuccess);
  EXPECT_EQ(slot_call(un), Status::kInvalidResourceHandle) << "double unload";
  EXPECT_EQ(slot_call(lk, &k, "ordo_noop", 10), Status::kInvalidResourceHandle) << "lookup after unload";
  // Device info: only device 0; the answer is a terminated name.
  Entry di = entry(Op::DeviceInfo);
  di.arg[0] = 1;
  EXPECT_EQ(slot_call(di), Status::kInvalidDevice);
  di.arg[0] = 0;
  EXPECT_EQ(slot_call(di), Status::kSuccess);
  DeviceInfo dev;
  std::memcpy(&dev, slot().payload, sizeof dev);
  EXPECT_NE(std::memchr(dev.name, 0, sizeof dev.name), nullptr);
  EXPECT_GT(dev.total_global_mem, 0u);
  // Module ops are sync calls, not ring entries.
  create_ring(R_);
  for (Op op : {Op::ModuleLoad, Op::ModuleChunk, Op::ModuleUnload, Op::DeviceInfo})
    expect_rejected(R_, entry(op), Status::kInvalidValue, std::string(info(op).name) + " on a ring");
}

// Graphs: steps the worker cannot parse are refused at GraphCreate; ids it
// never issued, or destroyed, fail the launch on the stream like a bad handle;
// a step's device range is checked at each launch, as Memset's; a destroy
// waits for the launches it names. The session goes on through all of it.
TEST_F(Hostile, GraphsWithBadStepsIdsAndRanges) {
  void* block = nullptr;
  ASSERT_EQ(c_->malloc_host(&block, 4096), Status::kSuccess);
  const uint64_t off = uint64_t(static_cast<std::byte*>(block) - region().heap());
  auto create = [&](const std::vector<std::byte>& b, uint64_t* id) {
    std::memcpy(block, b.data(), b.size());
    return slot_call(graph_entry(Op::GraphCreate, off, b.size()), id);
  };
  auto put32 = [](std::vector<std::byte>& b, size_t at, uint32_t v) { std::memcpy(&b[at], &v, 4); };
  uint64_t id = 0;
  GraphStepWriter one;
  one.memset({dev_, 7, kDevBytes});
  std::vector<std::byte> b = one.bytes();
  put32(b, 0, 9);
  EXPECT_EQ(create(b, &id), Status::kInvalidValue) << "unknown step kind";
  b = one.bytes();
  put32(b, 4, 20);
  EXPECT_EQ(create(b, &id), Status::kInvalidValue) << "misaligned step size";
  put32(b, 4, 4096);
  EXPECT_EQ(create(b, &id), Status::kInvalidValue) << "step past the end";
  b = one.bytes();
  b.resize(12);
  EXPECT_EQ(create(b, &id), Status::kInvalidValue) << "step cut short";
  GraphStepWriter v;
  v.memset({dev_, 0x100, 16});
  EXPECT_EQ(create(v.bytes(), &id), Status::kInvalidValue) << "memset value not a byte";
  GraphStepWriter k;
  k.kernel({1, 0, {1, 1, 1}, {0, 1, 1}, 0, 0}, nullptr);
  EXPECT_EQ(create(k.bytes(), &id), Status::kInvalidValue) << "zero block dimension";
  b = k.bytes();
  put32(b, 8 + 32, 64);  // args_size beyond the step
  EXPECT_EQ(create(b, &id), Status::kInvalidValue) << "argument size past its step";
  EXPECT_EQ(slot_call(graph_entry(Op::GraphCreate, L_.heap_size - 8, 16), &id), Status::kInvalidValue);

  // A good graph: a memset of the buffer, then a kernel filling its first 16 words.
  const uint32_t fill = kernel(*c_, "ordo_fill_u32");
  const sim::FillU32Args fa{dev_, 16, 0xabcdef01u, 0};
  GraphStepWriter good;
  good.memset({dev_, 7, kDevBytes});
  good.kernel({fill, 0, {1, 1, 1}, {1, 1, 1}, sizeof fa, 0}, &fa);
  uint64_t g = 0;
  ASSERT_EQ(create(good.bytes(), &g), Status::kSuccess);
  ASSERT_NE(g, 0u);
  create_ring(R_);
  push(R_, graph_entry(Op::GraphLaunch, g));
  ASSERT_TRUE(synced(R_));
  EXPECT_TRUE(no_new_error());
  std::vector<uint32_t> words(kDevBytes / 4);
  ASSERT_EQ(c_->memcpy_d2h(words.data(), dev_, kDevBytes), Status::kSuccess);
  EXPECT_EQ(std::count(words.begin(), words.begin() + 16, 0xabcdef01u), 16);
  EXPECT_EQ(std::count(words.begin() + 16, words.end(), 0x07070707u), ptrdiff_t(words.size() - 16));

  // Ids never issued, on the ring: an error for the launch, the ring goes on.
  for (uint64_t bad : {g + 1, uint64_t{0xffffffff}})
    expect_rejected(R_, graph_entry(Op::GraphLaunch, bad), Status::kInvalidResourceHandle, "graph " + std::to_string(bad));
  // Steps that name memory past the allocation, or a kernel never looked up, fail each launch.
  GraphStepWriter past;
  past.memset({dev_ + kDevBytes - 8, 1, 16});
  uint64_t gp = 0, gk = 0;
  ASSERT_EQ(create(past.bytes(), &gp), Status::kSuccess);
  expect_rejected(R_, graph_entry(Op::GraphLaunch, gp), Status::kInvalidDevicePointer, "memset past the allocation");
  GraphStepWriter unknown;
  unknown.kernel({0xdeadbeef, 0, {1, 1, 1}, {1, 1, 1}, 0, 0}, nullptr);
  ASSERT_EQ(create(unknown.bytes(), &gk), Status::kSuccess);
  expect_rejected(R_, graph_entry(Op::GraphLaunch, gk), Status::kInvalidDeviceFunction, "unknown kernel");

  // A destroy naming two launches (one dispatched so far) leaves the graph for the second.
  EXPECT_EQ(slot_call(graph_entry(Op::GraphDestroy, g, 2)), Status::kSuccess);
  EXPECT_EQ(slot_call(graph_entry(Op::GraphDestroy, g, 2)), Status::kInvalidResourceHandle) << "destroyed twice";
  push(R_, graph_entry(Op::GraphLaunch, g));
  ASSERT_TRUE(synced(R_));
  EXPECT_TRUE(no_new_error()) << "the launch the destroy named must still run";
  expect_rejected(R_, graph_entry(Op::GraphLaunch, g), Status::kInvalidResourceHandle, "a launch after the destroy");
  for (uint64_t d : {gp, gk}) EXPECT_EQ(slot_call(graph_entry(Op::GraphDestroy, d, 1)), Status::kSuccess);
  EXPECT_EQ(slot_call(graph_entry(Op::GraphDestroy, 12345, 0)), Status::kInvalidResourceHandle);
  EXPECT_EQ(c_->free_host(block), Status::kSuccess);
}

// An image too large for one heap block comes in ModuleChunk pieces, which the
// worker appends to the session's one pending image, and a ModuleLoad naming
// how many bytes came before its own. A piece that does not continue the
// pending image (a gap, an overlap, another slot's, none pending) is refused
// and drops the image; the session goes on.
TEST_F(Hostile, ModuleImagePiecesOutOfOrderOrUnclaimed) {
  uint64_t id = 0;
  const auto chunk = [&](uint64_t at) { return slot_call(module_chunk_entry(0, 64, at)); };
  const auto load = [&](uint64_t sent) { return slot_call(module_load_entry(0, 64, sent), &id); };
  EXPECT_EQ(load(64), Status::kInvalidValue) << "a last piece with no image pending";
  EXPECT_EQ(chunk(64), Status::kInvalidValue) << "a middle piece with no image pending";
  ASSERT_EQ(chunk(0), Status::kSuccess);
  EXPECT_EQ(chunk(128), Status::kInvalidValue) << "a gap";
  EXPECT_EQ(load(64), Status::kInvalidValue) << "the image went with the gap";
  ASSERT_EQ(chunk(0), Status::kSuccess);
  ASSERT_EQ(chunk(64), Status::kSuccess);
  EXPECT_EQ(chunk(64), Status::kInvalidValue) << "a piece sent twice";
  ASSERT_EQ(chunk(0), Status::kSuccess);
  EXPECT_EQ(load(128), Status::kInvalidValue) << "a last piece claiming more than came";
  // Past kMaxModuleImage in all: refused before anything is copied.
  ASSERT_EQ(chunk(0), Status::kSuccess);
  EXPECT_EQ(slot_call(module_chunk_entry(0, 64, kMaxModuleImage - 32)), Status::kInvalidValue);
  EXPECT_EQ(slot_call(module_load_entry(0, 64, kMaxModuleImage - 32), &id), Status::kInvalidValue);
  // Another slot's piece does not continue this slot's image.
  ASSERT_EQ(chunk(0), Status::kSuccess);
  {
    const uint32_t own = S_;
    const uint64_t own_seq = slot_seq_;
    S_ = L_.slot_count - 2;
    slot_seq_ = slot().request.seq.load(std::memory_order_relaxed);
    EXPECT_EQ(chunk(64), Status::kInvalidValue) << "another slot's piece";
    S_ = own;
    slot_seq_ = own_seq;
  }
  EXPECT_EQ(load(64), Status::kInvalidValue) << "the image went with the other slot's piece";
  // A good sequence loads, and the module's kernels resolve; a piece at 0 starts over.
  ASSERT_EQ(chunk(0), Status::kSuccess);
  ASSERT_EQ(chunk(64), Status::kSuccess);
  ASSERT_EQ(chunk(0), Status::kSuccess);
  ASSERT_EQ(chunk(64), Status::kSuccess);
  ASSERT_EQ(load(128), Status::kSuccess);
  ASSERT_NE(id, 0u);
  const Entry lk = lookup_entry(id);
  uint64_t k = UINT64_MAX;
  EXPECT_EQ(slot_call(lk, &k, "ordo_noop", 10), Status::kSuccess);
  EXPECT_EQ(uint32_t(k), kernel(*c_, "ordo_noop"));
  EXPECT_EQ(load(128), Status::kInvalidValue) << "the pending image went into the module";
  // An image whose last piece never came is gone with its session.
  ASSERT_EQ(chunk(0), Status::kSuccess);
  c_.reset();
  c_ = w_.attach();
  slot_seq_ = slot().request.seq.load(std::memory_order_relaxed);
  EXPECT_EQ(load(64), Status::kInvalidValue) << "a new session has no image pending";
}

TEST_F(Hostile, SlotSequenceJumpsAreAnswered) {
  // request.seq is guest-written: any change is a new request, answered with that number.
  ReplySlot& s = slot();
  for (uint64_t seq : {uint64_t{1000}, uint64_t{5}, UINT64_MAX, uint64_t{0}, uint64_t{1}}) {
    const Entry null_req = entry(Op::Null);
    write_request(s, null_req, seq);
    post_slot(region().header(), S_);
    ring_bell();
    ASSERT_TRUE(eventually([&] { return s.reply_seq.load(std::memory_order_acquire) == seq; })) << seq;
    EXPECT_EQ(Status(s.status), Status::kSuccess);
  }
  slot_seq_ = 1;
  EXPECT_EQ(slot_call(entry(Op::Null)), Status::kSuccess);
}

// ---- Gaps found by review, fixed; kept as regression tests.

// check_edges accepts an edge when the target ring's slot before its position
// shows its lap *as read now*. That does not mean the target was published
// before the entry carrying the edge: two entries published one after the
// other, each naming the other's position, both pass once both are visible,
// and each would then wait for the other forever. The guest only stalls its
// own two rings, but a buggy (not even hostile) edge builder would hang
// instead of getting an error. The worker rejects the entry that closes a
// cycle in the waits-for graph when it starts waiting (waits_for_itself).
TEST_F(Hostile, EdgeCycleBetweenTwoRingsIsAnErrorNotAStall) {
  const uint32_t A = R_, B = R_ - 1;
  create_ring(A);
  create_ring(B);
  ASSERT_TRUE(drained(A));
  ASSERT_TRUE(drained(B));
  // Hide both rings from the worker while both entries are written, so that it
  // sees both entries before it validates either (deterministically; a
  // hostile guest can also just race it).
  RegionHeader* h = region().header();
  h->ring_open[0].fetch_and(~(uint64_t{1} << A | uint64_t{1} << B));
  ASSERT_EQ(c_->null_call(), Status::kSuccess);  // a worker pass that saw the bits cleared
  const uint64_t pa = tails_[A], pb = tails_[B];
  Entry ea = memset_entry(dev_, 0x11, kDevBytes);
  ea.edge_count = 1;
  ea.edges[0] = {B, 0, pb + 1};  // after B's next entry ...
  Entry eb = memset_entry(dev_, 0x22, kDevBytes);
  eb.edge_count = 1;
  eb.edges[0] = {A, 0, pa + 1};  // ... which is after A's next entry
  push(A, ea);
  push(B, eb);
  open_ring(A);
  open_ring(B);
  ring_bell();
  auto err = next_error(1000ms);
  ASSERT_TRUE(err) << "neither entry of the cycle was rejected: rings " << A << " (head "
                   << region().ring(A).head.load() << ") and " << B << " (head " << region().ring(B).head.load()
                   << ") wait for each other forever";
  EXPECT_EQ(err->status, Status::kIllegalState);
  EXPECT_TRUE(drained(A) && drained(B)) << "the rings must go on after the rejection";
}

// The same check reads the target ring's slots even when the worker ignores
// that ring (not open: never polled) or when the edge is more than a ring's
// capacity ahead of it, where a slot can show that position's lap but the ring
// cannot get there. The edge must not be accepted to wait forever: in
// check_edges, only an open ring's slots within capacity of its head count,
// else only positions it already dispatched.
TEST_F(Hostile, EdgeIntoARingTheWorkerIgnoresIsAnErrorNotAStall) {
  const uint32_t A = R_, B = R_ - 1, C = R_ - 2;
  create_ring(A);
  create_ring(B);
  ASSERT_TRUE(drained(B));
  const uint32_t cap = L_.ring_capacity;
  const uint64_t far = tails_[B] + 10 * uint64_t{cap};
  Entry nop = entry(Op::Nop, S_);
  nop.stream = raw_stream(B);
  publish_entry(&region().entries(B)[far & (cap - 1)], nop, far, cap);
  nop.stream = raw_stream(C);
  for (uint64_t p = 0; p < 3; ++p) publish_entry(&region().entries(C)[p], nop, p, cap);  // C is not open: never polled
  struct Case {
    const char* what;
    Edge edge;
  };
  for (Case c : {Case{"slot ten laps ahead", {B, 0, far + 1}}, Case{"ring that is not open", {C, 0, 3}}}) {
    Entry e = memset_entry(dev_, 0x33, kDevBytes);
    e.edge_count = 1;
    e.edges[0] = c.edge;
    const uint64_t pos = push(A, e);
    auto err = next_error(500ms);
    EXPECT_TRUE(err) << c.what << ": entry " << pos << " on ring " << A << " waits forever (head "
                     << region().ring(A).head.load() << ")";
    if (!err) break;
    EXPECT_EQ(err->status, Status::kIllegalState) << c.what;
    EXPECT_EQ(err->pos, pos) << c.what;
  }
}

// The worker frees device memory as soon as a Free request arrives; the guest
// library waits for all its rings first, a hostile guest does not. The sim
// backend looks a device address up when an op starts and then uses the raw
// host pointer (KernelContext::translate, the CopyOp/SetOp paths) with no
// reference held, so a Free while a kernel runs frees the block under it: a
// use-after-free in the worker process (ASan: heap-use-after-free; without ASan
// the late write lands in whatever reuses the block: here a fresh allocation
// of the same guest, elsewhere the worker's own heap; a Free during a memset of
// an mmap'd (>= 1 MiB) block faults the worker).
// Fix: keep the host block alive while an op uses it (allocs_ holds
// shared_ptr<HostBlock>; lookup returns a reference the op or KernelContext
// keeps until it ends), or make the worker's Free wait for the guest's created
// streams first (as cudaFree does) by deferring the reply through host_callback.
//
// Run in a child process (a death test) because the corruption can take the
// whole process down: with 4 KiB blocks the late write hits glibc's free-list
// metadata and the worker segfaults. The child exits 0 when nothing wrote into
// memory it no longer owned.
char g_child_region[256], g_child_bell[256];

// The child leaves no region file behind, whether it exits or crashes.
void child_cleanup() {
  ::unlink(g_child_region);
  ::unlink(g_child_bell);
}
void child_crash_handler(int sig) {
  child_cleanup();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void free_while_kernel_runs() {
  InProcessWorker w;
  std::snprintf(g_child_region, sizeof g_child_region, "%s", w.region_path().c_str());
  std::snprintf(g_child_bell, sizeof g_child_bell, "%s", doorbell_path(w.region_path()).c_str());
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL}) ::signal(sig, child_crash_handler);
  auto c = w.attach();
  Region& region = w.region();
  const Layout& l = region.layout();
  const uint32_t r = l.ring_count - 1, S = l.slot_count - 1;
  DoorbellRinger bell(doorbell_path(w.region_path()));
  uint64_t tail = 0;
  auto push = [&](const Entry& in) {
    Entry e = in;
    e.thread = S;
    const uint64_t pos = tail++;
    publish_entry(&region.entries(r)[pos & (l.ring_capacity - 1)], e, pos, l.ring_capacity);
    bell.ring();
    return pos;
  };
  auto check = [](bool ok, int code) {
    if (ok) return;
    child_cleanup();
    std::_Exit(code);
  };
  region.header()->ring_open[r / 64].fetch_or(uint64_t{1} << (r % 64));
  Entry create = entry(Op::StreamCreate);
  create.arg[0] = kStreamNonBlocking;
  push(create);
  uint32_t stamp = 0;
  check(c->kernel_lookup("ordo_stamp", &stamp) == Status::kSuccess, 3);
  constexpr uint64_t kBytes = 4096;
  uint64_t victim = 0;
  check(c->malloc(&victim, kBytes) == Status::kSuccess, 3);
  const sim::StampArgs a{victim, 0, 50000};  // writes start, sleeps 50 ms, writes end
  std::memcpy(region.staging(r), &a, sizeof a);
  Entry launch = good_launch();
  launch.arg[0] = stamp;
  launch.arg[5] = sizeof a;
  push(launch);
  check(eventually([&] { return region.ring(r).head.load() == tail; }), 3);
  std::this_thread::sleep_for(10ms);  // the kernel has translated its pointer and sleeps
  // The hostile part: free it now, through the slot, without waiting for the ring.
  ReplySlot& slot = region.slot(S);
  Entry f = entry(Op::Free);
  f.arg[0] = victim;
  write_request(slot, f, 1);
  post_slot(region.header(), S);
  bell.ring();
  check(eventually([&] { return slot.reply_seq.load(std::memory_order_acquire) == 1; }), 3);
  // New allocations of the same size; one of them may get the freed host block.
  std::vector<uint64_t> fresh(8);
  for (auto& d : fresh) check(c->malloc(&d, kBytes) == Status::kSuccess, 3);
  const uint64_t fence = push(entry(Op::Fence));
  check(eventually([&] { return region.ring(r).completed.load(std::memory_order_acquire) > fence; }), 3);
  for (uint64_t d : fresh) {
    sim::Stamp st{1, 1};
    check(c->memcpy_d2h(&st, d, sizeof st) == Status::kSuccess, 3);
    check(st.start == 0 && st.end == 0, 2);  // a freed kernel wrote into a new allocation
  }
  child_cleanup();
  std::_Exit(0);
}

TEST(HostileFree, FreeWhileAKernelUsesTheMemoryIsSafe) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(free_while_kernel_runs(), ::testing::ExitedWithCode(0), "")
      << "exit code 2: a kernel wrote into memory freed under it; a signal: the worker's heap was corrupted";
}

TEST(HostileLegacyRing, CannotBeDestroyedOrCreatedAgain) {
  // A raw guest session (no Client), so that the legacy ring is ours alone.
  InProcessWorker w;
  Region& region = w.region();
  RegionHeader* h = region.header();
  DoorbellRinger bell(doorbell_path(w.region_path()));
  const uint64_t session = 0x1234567890abcdefull;
  h->guest_session.store(session, std::memory_order_release);
  ASSERT_TRUE(eventually([&] {
    bell.ring();
    return h->attached_session.load(std::memory_order_acquire) == session;
  })) << "the worker did not accept a raw guest session";
  const uint32_t S = region.layout().slot_count - 1;
  ReplySlot& slot = region.slot(S);
  uint64_t tail = 0;
  auto push = [&](const Entry& in) {
    Entry e = in;
    e.thread = S;
    publish_entry(&region.entries(kLegacyRing)[tail & (region.layout().ring_capacity - 1)], e, tail,
                  region.layout().ring_capacity);
    ++tail;
    bell.ring();
  };
  uint64_t seen = 0;
  for (Op op : {Op::StreamDestroy, Op::StreamCreate}) {
    push(entry(op));
    ASSERT_TRUE(eventually([&] { return slot.error_seq.load(std::memory_order_acquire) > seen; })) << info(op).name;
    seen = slot.error_seq.load();
    EXPECT_EQ(Status(slot.error), Status::kInvalidResourceHandle) << info(op).name;
    EXPECT_EQ(slot.error_ring, kLegacyRing);
  }
  // The legacy stream still works.
  const uint64_t fence_pos = tail;
  push(entry(Op::Fence));
  ASSERT_TRUE(eventually([&] { return region.ring(kLegacyRing).completed.load() > fence_pos; }));
  // Detach; a client gets a fresh session with working streams.
  h->guest_session.store(0, std::memory_order_release);
  ASSERT_TRUE(eventually([&] {
    bell.ring();
    return h->attached_session.load(std::memory_order_acquire) == 0;
  }));
  auto c = w.attach();
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 64), Status::kSuccess);
  ASSERT_EQ(c->memset_async(d, 3, 64, kLegacyStream), Status::kSuccess);
  uint8_t out[64] = {};
  ASSERT_EQ(c->memcpy_d2h(out, d, 64), Status::kSuccess);
  for (uint8_t b : out) EXPECT_EQ(b, 3);
}

// A hostile thread keeps scribbling over one ring (entries and their laps) while the
// well-behaved client works on its own streams.
TEST_F(Hostile, MutatingRingWhileTheClientWorks) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "scribbling over entries the worker copies out with memcpy is the hostile guest's "
                  "data race by design; TSan would (rightly) report it";
#else
  const uint32_t r = R_;
  create_ring(r);
  ASSERT_TRUE(drained(r));
  const uint64_t errors_before = w_.worker().stats().errors;
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    std::mt19937_64 rng(0x5eed);
    RingControl& ctl = region().ring(r);
    Entry* ents = region().entries(r);
    const uint32_t cap = L_.ring_capacity;
    while (!stop.load(std::memory_order_relaxed)) {
      for (int k = 0; k < 64; ++k) {
        Entry& e = ents[rng() % cap];
        auto* words = reinterpret_cast<uint64_t*>(&e);
        for (size_t i = 0; i < sizeof(Entry) / 8; ++i) words[i] = rng();
        if (e.thread < L_.slot_count) e.thread = S_;  // never blame the client's slots
        if (rng() % 2) {
          // Plausible-looking: a known op from a valid thread with random arguments.
          e.op = uint16_t(rng() % (kOpCount + 1));
          e.thread = S_;
          e.edge_count = uint8_t(rng() % (kMaxEdges + 1));
          for (auto& edge : e.edges) {
            edge.ring = uint32_t(rng() % L_.ring_count);
            edge.pos = rng() % 3 ? rng() % 64 : rng();
          }
          e.flags = uint16_t(rng() % 16);
        }
      }
      // Laps: random above; often the ones the worker looks for at its head and after it.
      const uint64_t head = ctl.head.load(std::memory_order_relaxed);
      for (uint64_t p = head, n = rng() % 4; p < head + n; ++p) ents[p & (cap - 1)].lap = entry_lap(p, cap);
      ring_bell();
      std::this_thread::yield();
    }
  });
  // Correct work on the client's own streams for ~300 ms.
  const uint32_t fill = kernel(*c_, "ordo_fill_u32");
  const uint32_t add = kernel(*c_, "ordo_add_u64");
  Stream s1, s2;
  ASSERT_EQ(c_->stream_create(&s1), Status::kSuccess);
  ASSERT_EQ(c_->stream_create(&s2, kStreamNonBlocking), Status::kSuccess);
  ASSERT_NE(guest::ring_of_stream(*c_, s1), r);
  ASSERT_NE(guest::ring_of_stream(*c_, s2), r);
  constexpr uint32_t kN = 1024;
  uint64_t buf = 0, counter = 0;
  ASSERT_EQ(c_->malloc(&buf, kN * 4), Status::kSuccess);
  ASSERT_EQ(c_->malloc(&counter, 8), Status::kSuccess);
  ASSERT_EQ(c_->memset_async(counter, 0, 8, s2), Status::kSuccess);
  uint64_t expected_sum = 0;
  int rounds = 0;
  const auto end = std::chrono::steady_clock::now() + 300ms;
  std::vector<uint32_t> in(kN), out(kN);
  while (std::chrono::steady_clock::now() < end) {
    ++rounds;
    sim::FillU32Args a{buf, kN, 0x1000u + uint32_t(rounds), 0};
    ASSERT_EQ(c_->launch(fill, {4}, {256}, &a, sizeof a, s1), Status::kSuccess);
    ASSERT_EQ(c_->memcpy_d2h_async(out.data(), buf, kN * 4, s1), Status::kSuccess);
    for (uint32_t v : out) ASSERT_EQ(v, 0x1000u + uint32_t(rounds)) << "round " << rounds;
    for (uint32_t i = 0; i < kN; ++i) in[i] = i * 2654435761u + uint32_t(rounds);
    ASSERT_EQ(c_->memcpy_h2d_async(buf, in.data(), kN * 4, s1), Status::kSuccess);
    ASSERT_EQ(c_->memcpy_d2h_async(out.data(), buf, kN * 4, s1), Status::kSuccess);
    ASSERT_EQ(in, out) << "round " << rounds;
    sim::AddU64Args b{counter, uint64_t(rounds)};
    ASSERT_EQ(c_->launch(add, {1}, {1}, &b, sizeof b, s2), Status::kSuccess);
    expected_sum += uint64_t(rounds);
    ASSERT_EQ(c_->null_call(), Status::kSuccess);
  }
  stop.store(true);
  scribbler.join();
  ASSERT_EQ(c_->stream_synchronize(s2), Status::kSuccess);
  uint64_t sum = 0;
  ASSERT_EQ(c_->memcpy_d2h(&sum, counter, 8), Status::kSuccess);
  EXPECT_EQ(sum, expected_sum);
  EXPECT_GT(rounds, 5);
  EXPECT_GT(w_.worker().stats().errors, errors_before) << "the scribbles were rejected, not executed";
  EXPECT_EQ(c_->get_last_error(), Status::kSuccess) << "no error reached the client's own slot";
  EXPECT_EQ(c_->stream_destroy(s1), Status::kSuccess);
  EXPECT_EQ(c_->stream_destroy(s2), Status::kSuccess);
  EXPECT_EQ(c_->free(buf), Status::kSuccess);
  EXPECT_EQ(c_->free(counter), Status::kSuccess);
#endif
}

}  // namespace
}  // namespace ordo::test

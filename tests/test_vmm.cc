// Virtual memory management: the worker's books (VmmTable) on their own, and
// the client's requests against a worker, forged ones included: a guest that
// names a handle it never got, a range it never reserved or part of a mapping
// gets CUDA's error, and its session goes on. Random programs against a model
// of these rules: test_vmm_model.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <thread>
#include <vector>

#include "guest/core.h"
#include "harness.h"
#include "ordo/sim.h"
#include "transport/op_args.h"
#include "worker/vmm_table.h"

namespace ordo::test {
namespace {

constexpr uint64_t kG = kVmmGranularity;
constexpr uint64_t kRW = uint64_t(VmmAccess::kReadWrite);

TEST(VmmTable, ReservationsNeverOverlapAndLeaveOnlyWhole) {
  VmmTable t;
  EXPECT_EQ(t.add_reservation(10 * kG, 4 * kG), Status::kSuccess);
  EXPECT_EQ(t.add_reservation(13 * kG, kG), Status::kInvalidValue);  // its last granule
  EXPECT_EQ(t.add_reservation(8 * kG, 3 * kG), Status::kInvalidValue);  // runs into it
  EXPECT_EQ(t.add_reservation(14 * kG, kG), Status::kSuccess);          // right after it
  EXPECT_EQ(t.add_reservation(UINT64_MAX - kG + 1, 2 * kG), Status::kInvalidValue);  // wraps
  EXPECT_EQ(t.remove_reservation(10 * kG, 3 * kG), Status::kInvalidValue);  // not its size
  EXPECT_EQ(t.remove_reservation(11 * kG, 3 * kG), Status::kInvalidValue);  // not its start
  EXPECT_EQ(t.remove_reservation(10 * kG, 4 * kG), Status::kSuccess);
  EXPECT_EQ(t.remove_reservation(10 * kG, 4 * kG), Status::kInvalidValue);  // twice
}

TEST(VmmTable, MappingsStayInsideOneReservationOverNothingMapped) {
  VmmTable t;
  ASSERT_EQ(t.add_reservation(10 * kG, 4 * kG), Status::kSuccess);
  ASSERT_EQ(t.add_reservation(14 * kG, 4 * kG), Status::kSuccess);
  const uint64_t h = t.add_physical({.backend_handle = 77, .device = 0, .size = 2 * kG});
  EXPECT_EQ(t.check_map(10 * kG, 2 * kG, h + 1), Status::kInvalidValue);  // no such handle
  EXPECT_EQ(t.check_map(10 * kG, 3 * kG, h), Status::kInvalidValue);      // more than the memory
  EXPECT_EQ(t.check_map(13 * kG, 2 * kG, h), Status::kInvalidValue);      // across two reservations
  EXPECT_EQ(t.check_map(2 * kG, kG, h), Status::kInvalidValue);           // in none
  ASSERT_EQ(t.check_map(11 * kG, 2 * kG, h), Status::kSuccess);
  t.add_mapping(11 * kG, 2 * kG, h);
  EXPECT_EQ(t.check_map(12 * kG, kG, h), Status::kInvalidValue);  // over its second granule
  EXPECT_EQ(t.check_map(10 * kG, 2 * kG, h), Status::kInvalidValue);  // into its first
  EXPECT_EQ(t.check_map(10 * kG, kG, h), Status::kSuccess);  // beside it: the same memory again
  // A reservation with something mapped stays.
  EXPECT_EQ(t.remove_reservation(10 * kG, 4 * kG), Status::kInvalidValue);
}

TEST(VmmTable, UnmapAndAccessTakeWholeAdjacentMappings) {
  VmmTable t;
  ASSERT_EQ(t.add_reservation(0, 8 * kG), Status::kSuccess);
  const uint64_t a = t.add_physical({.backend_handle = 1, .device = 0, .size = kG});
  const uint64_t b = t.add_physical({.backend_handle = 2, .device = 1, .size = 2 * kG});
  t.add_mapping(0, kG, a);
  t.add_mapping(kG, 2 * kG, b);
  t.add_mapping(4 * kG, kG, a);  // a gap before it
  EXPECT_EQ(t.check_cover(0, 3 * kG), Status::kSuccess);
  EXPECT_EQ(t.check_cover(kG, 2 * kG), Status::kSuccess);
  EXPECT_EQ(t.check_cover(0, 2 * kG), Status::kInvalidValue);  // half of b
  EXPECT_EQ(t.check_cover(0, 5 * kG), Status::kInvalidValue);  // the gap
  EXPECT_EQ(t.check_cover(3 * kG, kG), Status::kInvalidValue);  // nothing there
  // Copies: mapped without a gap and accessible from some device.
  EXPECT_FALSE(t.accessible(0, 100));
  t.set_access(0, 3 * kG, 1 << 1, kRW << 2);
  EXPECT_TRUE(t.accessible(kG - 8, 16));  // across the seam
  EXPECT_TRUE(t.accessible(0, 3 * kG));
  EXPECT_FALSE(t.accessible(3 * kG - 8, 16));   // runs into the gap
  EXPECT_FALSE(t.accessible(4 * kG, 8));        // mapped, never granted
  EXPECT_FALSE(t.accessible(0, UINT64_MAX));
  // Setting device 0 leaves device 1's access as it was.
  t.set_access(0, kG, 1, 0);
  EXPECT_EQ(t.mappings().at(0).access, kRW << 2);
}

TEST(VmmTable, ReleasedMemoryGoesWithItsLastMapping) {
  VmmTable t;
  ASSERT_EQ(t.add_reservation(0, 4 * kG), Status::kSuccess);
  const uint64_t h = t.add_physical({.backend_handle = 9, .device = 0, .size = kG});
  t.add_mapping(0, kG, h);
  t.add_mapping(2 * kG, kG, h);
  bool gone = true;
  uint64_t backend = 0;
  ASSERT_EQ(t.release(h, &gone, &backend), Status::kSuccess);
  EXPECT_FALSE(gone);  // still mapped twice
  EXPECT_EQ(backend, 9u);
  EXPECT_EQ(t.release(h, &gone, &backend), Status::kInvalidValue);  // released already
  EXPECT_EQ(t.check_map(kG, kG, h), Status::kInvalidValue);        // and not mapped again
  std::vector<uint64_t> freed;
  t.remove_mappings(0, kG, &freed);
  EXPECT_TRUE(freed.empty());
  t.remove_mappings(2 * kG, kG, &freed);
  EXPECT_EQ(freed, std::vector<uint64_t>{9});
  EXPECT_TRUE(t.handles().empty());
}

// A reserved range with two allocations side by side, granted to device 0.
struct TwoMappings {
  uint64_t va = 0, h1 = 0, h2 = 0;
};
TwoMappings map_two(Client& c) {
  TwoMappings m;
  EXPECT_EQ(c.vmm_reserve(4 * kG, kG, 0, &m.va), Status::kSuccess);
  EXPECT_EQ(c.vmm_create(0, kG, &m.h1), Status::kSuccess);
  EXPECT_EQ(c.vmm_create(0, kG, &m.h2), Status::kSuccess);
  EXPECT_EQ(c.vmm_map(m.va, kG, m.h1), Status::kSuccess);
  EXPECT_EQ(c.vmm_map(m.va + kG, kG, m.h2), Status::kSuccess);
  EXPECT_EQ(c.vmm_set_access(m.va, 2 * kG, 1, kRW), Status::kSuccess);
  return m;
}

TEST(ClientVmm, CopiesAndKernelsCrossTheSeamAndAliasesShareBytes) {
  InProcessWorker w;
  auto c = w.attach();
  const TwoMappings m = map_two(*c);
  std::vector<uint32_t> in(4096), out(4096, 0);
  std::iota(in.begin(), in.end(), 1);
  const uint64_t seam = m.va + kG - 2048 * sizeof(uint32_t);
  ASSERT_EQ(c->memcpy_h2d(seam, in.data(), in.size() * 4), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h(out.data(), seam, out.size() * 4), Status::kSuccess);
  EXPECT_EQ(in, out);
  // A kernel over the seam.
  uint32_t fill = 0;
  ASSERT_EQ(c->kernel_lookup("ordo_fill_u32", &fill), Status::kSuccess);
  sim::FillU32Args a{seam, 4096, 0xfeedu, 0};
  ASSERT_EQ(c->launch(fill, {16}, {256}, &a, sizeof a, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h(out.data(), seam, out.size() * 4), Status::kSuccess);
  EXPECT_EQ(out, std::vector<uint32_t>(4096, 0xfeedu));
  // h2 again at the range's end: the same bytes at two addresses.
  ASSERT_EQ(c->vmm_map(m.va + 3 * kG, kG, m.h2), Status::kSuccess);
  ASSERT_EQ(c->vmm_set_access(m.va + 3 * kG, kG, 1, kRW), Status::kSuccess);
  uint32_t v = 0;
  ASSERT_EQ(c->memcpy_d2h(&v, m.va + 3 * kG, 4), Status::kSuccess);
  EXPECT_EQ(v, 0xfeedu);
  EXPECT_EQ(c->vmm_unmap(m.va, 2 * kG), Status::kSuccess);
  EXPECT_EQ(c->vmm_unmap(m.va + 3 * kG, kG), Status::kSuccess);
  EXPECT_EQ(c->vmm_release(m.h1), Status::kSuccess);
  EXPECT_EQ(c->vmm_release(m.h2), Status::kSuccess);
  EXPECT_EQ(c->vmm_address_free(m.va, 4 * kG), Status::kSuccess);
}

TEST(ClientVmm, MemoryWithoutAccessOrMappingIsNoDeviceMemory) {
  InProcessWorker w;
  auto c = w.attach();
  uint64_t va = 0, h = 0;
  ASSERT_EQ(c->vmm_reserve(2 * kG, 0, 0, &va), Status::kSuccess);
  ASSERT_EQ(c->vmm_create(0, kG, &h), Status::kSuccess);
  ASSERT_EQ(c->vmm_map(va, kG, h), Status::kSuccess);
  uint32_t v = 7;
  EXPECT_EQ(c->memcpy_h2d(va, &v, 4), Status::kInvalidDevicePointer);  // mapped, no access yet
  ASSERT_EQ(c->vmm_set_access(va, kG, 1, kRW), Status::kSuccess);
  EXPECT_EQ(c->memcpy_h2d(va, &v, 4), Status::kSuccess);
  EXPECT_EQ(c->memcpy_h2d(va + kG - 2, &v, 4), Status::kInvalidDevicePointer);  // runs past the mapping
  ASSERT_EQ(c->vmm_unmap(va, kG), Status::kSuccess);
  EXPECT_EQ(c->memcpy_h2d(va, &v, 4), Status::kInvalidDevicePointer);  // unmapped
  EXPECT_EQ(c->get_last_error(), Status::kInvalidDevicePointer);
}

TEST(ClientVmm, ForgedRequestsGetCudasErrorAndTheSessionGoesOn) {
  InProcessWorker w;
  auto c = w.attach();
  const TwoMappings m = map_two(*c);
  uint64_t h = 0, va = 0;
  EXPECT_EQ(c->vmm_map(m.va + 2 * kG, kG, m.h2 + 100), Status::kInvalidValue);  // a handle never given
  EXPECT_EQ(c->vmm_map(m.va + 64 * kG, kG, m.h1), Status::kInvalidValue);      // outside the reservation
  EXPECT_EQ(c->vmm_map(m.va, kG, m.h1), Status::kInvalidValue);                // over a mapping
  EXPECT_EQ(c->vmm_map(m.va + 2 * kG, 2 * kG, m.h1), Status::kInvalidValue);   // more than the memory
  EXPECT_EQ(c->vmm_map(m.va + 2 * kG + 4096, kG, m.h1), Status::kInvalidValue);  // inside a granule
  EXPECT_EQ(c->vmm_unmap(m.va, kG / 2), Status::kInvalidValue);
  EXPECT_EQ(c->vmm_unmap(m.va + 2 * kG, kG), Status::kInvalidValue);  // nothing mapped there
  EXPECT_EQ(c->vmm_set_access(m.va, 3 * kG, 1, kRW), Status::kInvalidValue);  // past the mappings
  EXPECT_EQ(c->vmm_set_access(m.va, kG, 1 << 5, kRW << 10), Status::kInvalidDevice);  // a device it lacks
  EXPECT_EQ(c->vmm_create(3, kG, &h), Status::kInvalidDevice);
  EXPECT_EQ(c->vmm_create(0, kG + 1, &h), Status::kInvalidValue);
  EXPECT_EQ(c->vmm_release(m.h2 + 100), Status::kInvalidValue);
  EXPECT_EQ(c->vmm_address_free(m.va, 2 * kG), Status::kInvalidValue);  // not its size
  EXPECT_EQ(c->vmm_address_free(m.va, 4 * kG), Status::kInvalidValue);  // still mapped
  EXPECT_EQ(c->vmm_reserve(kG, 3 * kG, 0, &va), Status::kInvalidValue);  // alignment not a power of two
  EXPECT_EQ(c->free(m.va), Status::kInvalidDevicePointer);  // mapped memory is not cuMemAlloc's
  // Nothing was disturbed: the mappings still hold their bytes.
  uint32_t in = 0x1234, out = 0;
  EXPECT_EQ(c->memcpy_h2d(m.va + kG - 2, &in, 4), Status::kSuccess);
  EXPECT_EQ(c->memcpy_d2h(&out, m.va + kG - 2, 4), Status::kSuccess);
  EXPECT_EQ(out, in);
  EXPECT_EQ(c->null_call(), Status::kSuccess);
}

TEST(ClientVmm, ReleasedWhileMappedLivesUntilUnmapped) {
  InProcessWorker w;
  auto c = w.attach();
  const TwoMappings m = map_two(*c);
  ASSERT_EQ(c->vmm_release(m.h1), Status::kSuccess);
  EXPECT_EQ(c->vmm_release(m.h1), Status::kInvalidValue);
  uint32_t in = 42, out = 0;
  EXPECT_EQ(c->memcpy_h2d(m.va, &in, 4), Status::kSuccess);
  EXPECT_EQ(c->memcpy_d2h(&out, m.va, 4), Status::kSuccess);
  EXPECT_EQ(out, 42u);
  EXPECT_EQ(c->vmm_map(m.va + 2 * kG, kG, m.h1), Status::kInvalidValue);  // released: no new mapping
  ASSERT_EQ(c->vmm_unmap(m.va, 2 * kG), Status::kSuccess);  // one call over both
  EXPECT_EQ(c->vmm_release(m.h2), Status::kSuccess);
  EXPECT_EQ(c->vmm_address_free(m.va, 4 * kG), Status::kSuccess);
}

// What a session leaves mapped is undone when it ends: the next session
// starts with nothing reserved, and the same sizes are there to take.
TEST(ClientVmm, ASessionsMemoryIsUndoneWhenItEnds) {
  InProcessWorker w;
  uint64_t first = 0;
  {
    auto c = w.attach();
    const TwoMappings m = map_two(*c);
    first = m.va;
    uint32_t v = 5;
    ASSERT_EQ(c->memcpy_h2d(m.va, &v, 4), Status::kSuccess);
  }
  auto c = w.attach();
  uint32_t v = 0;
  EXPECT_EQ(c->memcpy_d2h(&v, first, 4), Status::kInvalidDevicePointer);
  EXPECT_EQ(c->vmm_release(1), Status::kInvalidValue);
  const TwoMappings m = map_two(*c);
  EXPECT_EQ(c->memcpy_d2h(&v, m.va, 4), Status::kSuccess);
  EXPECT_EQ(v, 0u);  // fresh memory
}

// A guest that unmaps without waiting for its work (libcuda.so.1 always
// waits; a forged request need not): CUDA calls what the kernels then do
// undefined, and the worker must stay standing.
TEST(ClientVmm, UnmapUnderRunningKernelsLeavesTheWorkerStanding) {
  InProcessWorker w;
  auto c = w.attach();
  const uint64_t n = 64;
  uint64_t va = 0, h = 0;
  ASSERT_EQ(c->vmm_reserve(n * kG, 0, 0, &va), Status::kSuccess);
  ASSERT_EQ(c->vmm_create(0, n * kG, &h), Status::kSuccess);
  ASSERT_EQ(c->vmm_map(va, n * kG, h), Status::kSuccess);
  ASSERT_EQ(c->vmm_set_access(va, n * kG, 1, kRW), Status::kSuccess);
  const uint32_t fill = kernel(*c, "ordo_fill_u32");
  for (uint32_t i = 0; i < 20; ++i) {
    sim::FillU32Args a{va, n * kG / 4, i, 0};
    ASSERT_EQ(c->launch(fill, {1}, {1}, &a, sizeof a, kLegacyStream), Status::kSuccess);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the first fill well under way
  EXPECT_EQ(guest::core_of(*c).threads.call(make_entry<Op::VmmUnmap>({.addr = va, .size = n * kG})),
            Status::kSuccess);
  // A kernel that starts after the unmap faults, as on a GPU (sticky for the
  // session); one already running writes scratch memory.
  const Status s = c->device_synchronize();
  EXPECT_TRUE(s == Status::kSuccess || s == Status::kIllegalAddress) << status_name(s);
  c.reset();
  auto d = w.attach();  // the worker still serves
  uint64_t va2 = 0, h2 = 0;
  ASSERT_EQ(d->vmm_reserve(kG, 0, 0, &va2), Status::kSuccess);
  ASSERT_EQ(d->vmm_create(0, kG, &h2), Status::kSuccess);
  ASSERT_EQ(d->vmm_map(va2, kG, h2), Status::kSuccess);
  ASSERT_EQ(d->vmm_set_access(va2, kG, 1, kRW), Status::kSuccess);
  uint32_t in = 9, out = 0;
  EXPECT_EQ(d->memcpy_h2d(va2, &in, 4), Status::kSuccess);
  EXPECT_EQ(d->memcpy_d2h(&out, va2, 4), Status::kSuccess);
  EXPECT_EQ(out, in);
}

// Alignments are bounded, and addresses come back once a session holds none:
// no sequence of requests uses up the ranges for the requests after it.
TEST(ClientVmm, ReservationsNeverRunOut) {
  InProcessWorker w;
  auto c = w.attach();
  uint64_t va = 0;
  EXPECT_EQ(c->vmm_reserve(kG, kVmmMaxAlignment * 2, 0, &va), Status::kInvalidValue);
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(c->vmm_reserve(kG, kVmmMaxAlignment, 0, &va), Status::kSuccess) << i;
    ASSERT_EQ(c->vmm_address_free(va, kG), Status::kSuccess);
  }
}

// PyTorch reserves 1.125x the device's memory for each expandable segment
// (an H200's 141 GB: 159 GiB), several per device: address space that costs
// nothing until mapped.
TEST(ClientVmm, ReservationsLargerThanTheDevice) {
  InProcessWorker w;
  auto c = w.attach();
  const uint64_t big = uint64_t{159} << 30;
  uint64_t a = 0, b = 0, h = 0;
  ASSERT_EQ(c->vmm_reserve(big, 0, 0, &a), Status::kSuccess);
  ASSERT_EQ(c->vmm_reserve(big, 0, 0, &b), Status::kSuccess);
  EXPECT_TRUE(b >= a + big || a >= b + big);
  ASSERT_EQ(c->vmm_create(0, kG, &h), Status::kSuccess);
  ASSERT_EQ(c->vmm_map(b + big - kG, kG, h), Status::kSuccess);  // its last granule
  ASSERT_EQ(c->vmm_set_access(b + big - kG, kG, 1, kRW), Status::kSuccess);
  uint64_t in = 0x0123456789abcdef, out = 0;
  EXPECT_EQ(c->memcpy_h2d(b + big - 8, &in, 8), Status::kSuccess);
  EXPECT_EQ(c->memcpy_d2h(&out, b + big - 8, 8), Status::kSuccess);
  EXPECT_EQ(out, in);
  EXPECT_EQ(c->vmm_unmap(b + big - kG, kG), Status::kSuccess);
  EXPECT_EQ(c->vmm_release(h), Status::kSuccess);
  EXPECT_EQ(c->vmm_address_free(a, big), Status::kSuccess);
  EXPECT_EQ(c->vmm_address_free(b, big), Status::kSuccess);
}

// Four threads growing ranges of their own at once, as PyTorch's expandable
// segments do per stream: each sees only its own bytes.
TEST(ClientVmm, ThreadsGrowRangesOfTheirOwn) {
  InProcessWorker w;
  auto c = w.attach();
  std::vector<std::thread> ts;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      uint64_t va = 0;
      if (c->vmm_reserve(64 * kG, 0, 0, &va) != Status::kSuccess) return void(++failures[t]);
      for (int i = 0; i < 6; ++i) {
        uint64_t h = 0;
        failures[t] += c->vmm_create(0, kG, &h) != Status::kSuccess;
        failures[t] += c->vmm_map(va + i * kG, kG, h) != Status::kSuccess;
        failures[t] += c->vmm_set_access(va + i * kG, kG, 1, kRW) != Status::kSuccess;
        failures[t] += c->vmm_release(h) != Status::kSuccess;
        const uint32_t v = uint32_t(t * 100 + i);
        failures[t] += c->memcpy_h2d(va + i * kG - (i ? 2 : 0), &v, 4) != Status::kSuccess;  // across the seam
      }
      for (int i = 0; i < 6; ++i) {
        uint32_t v = 0;
        failures[t] += c->memcpy_d2h(&v, va + i * kG - (i ? 2 : 0), 4) != Status::kSuccess;
        failures[t] += v != uint32_t(t * 100 + i);
      }
      failures[t] += c->vmm_unmap(va, 6 * kG) != Status::kSuccess;
      failures[t] += c->vmm_address_free(va, 64 * kG) != Status::kSuccess;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace ordo::test

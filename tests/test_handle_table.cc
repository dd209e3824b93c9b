// HandleTable (src/transport/handle_table.h): the generation-tagged handles of
// the guest's streams, the worker's events and the cuda backend's kernels.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "transport/handle_table.h"

namespace ordo::test {
namespace {

using Kernels = HandleTable<20, 32>;  // as the cuda backend's KernelIds
using Events = HandleTable<32>;

TEST(HandleTable, ReleasedSlotsAreReusedAndOldHandlesStopResolving) {
  Kernels ids(2);
  uint32_t a = 0, b = 0, c = 0, ia = 0, ib = 0, ic = 0, slot = 0;
  ASSERT_TRUE(ids.acquire(&ia, &a));
  ASSERT_TRUE(ids.acquire(&ib, &b));
  EXPECT_NE(a, b);
  EXPECT_NE(ia, ib);
  EXPECT_TRUE(ids.full());
  EXPECT_FALSE(ids.acquire(&ic, &c));
  ids.release(ia);
  EXPECT_FALSE(ids.find(a, &slot));  // the slot is free
  ASSERT_TRUE(ids.acquire(&ic, &c));  // a long-running worker does not run out
  EXPECT_EQ(ic, ia);
  EXPECT_NE(c, a);
  EXPECT_FALSE(ids.find(a, &slot));  // reused: the stale handle still does not resolve
  ASSERT_TRUE(ids.find(c, &slot));
  EXPECT_EQ(slot, Kernels::index_of(a));
  EXPECT_TRUE(ids.find(b, &slot));
  EXPECT_FALSE(ids.find(0xffffffffu, &slot));
  EXPECT_FALSE(ids.find(0u, &slot));  // generation 0 is never handed out
}

TEST(HandleTable, FreedSlotsAreReusedOldestFirst) {
  Events ids(8);
  uint32_t idx[4];
  uint64_t h[4];
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ids.acquire(&idx[i], &h[i]));
  ids.release(idx[2]);
  ids.release(idx[0]);
  uint32_t i;
  uint64_t g;
  ASSERT_TRUE(ids.acquire(&i, &g));
  EXPECT_EQ(i, idx[2]);  // freed first, reused first
  ASSERT_TRUE(ids.acquire(&i, &g));
  EXPECT_EQ(i, idx[0]);
  ASSERT_TRUE(ids.acquire(&i, &g));
  EXPECT_EQ(i, 4u);  // then the table grows
}

TEST(HandleTable, ManyCyclesNeverExhaustTheSlots) {
  Kernels ids(4);
  uint32_t slot = 0;
  std::set<uint32_t> seen;
  for (int round = 0; round < 10000; ++round) {
    uint32_t got[4], idx[4];
    for (int k = 0; k < 4; ++k) ASSERT_TRUE(ids.acquire(&idx[k], &got[k])) << round;
    for (uint32_t h : got) ASSERT_TRUE(ids.find(h, &slot));
    for (uint32_t i : idx) ids.release(i);
    for (uint32_t h : got) EXPECT_FALSE(ids.find(h, &slot));
    if (round < 1000) seen.insert(got, got + 4);
  }
  EXPECT_EQ(seen.size(), 4000u);  // no handle repeats before the generations wrap
}

TEST(HandleTable, GenerationsWrapWithoutEverHandingOutZero) {
  Kernels ids(1);
  uint32_t i, h, first;
  ASSERT_TRUE(ids.acquire(&i, &first));
  ids.release(i);
  for (uint32_t n = 1; n < Kernels::kGenMask; ++n) {
    ASSERT_TRUE(ids.acquire(&i, &h));
    ASSERT_NE(Kernels::generation_of(h), 0u);
    ASSERT_NE(h, first) << n;
    ids.release(i);
  }
  ASSERT_TRUE(ids.acquire(&i, &h));
  EXPECT_EQ(h, first);  // after kGenMask reuses: documented in cuda_backend.h
}

TEST(HandleTable, ReleaseIgnoresFreeSlotsAndResetKeepsHandlesStale) {
  Events ids(4);
  uint32_t i, j;
  uint64_t a, b;
  ASSERT_TRUE(ids.acquire(&i, &a));
  ids.release(i);
  ids.release(i);  // twice: the slot is freed once
  ASSERT_TRUE(ids.acquire(&i, &a));
  ASSERT_TRUE(ids.acquire(&j, &b));
  EXPECT_NE(i, j);
  ids.reset();
  uint32_t k;
  EXPECT_FALSE(ids.find(a, &k));
  EXPECT_FALSE(ids.find(b, &k));
  uint64_t c;
  ASSERT_TRUE(ids.acquire(&k, &c));
  EXPECT_NE(c, a);  // a new session's handle never equals an old one
  EXPECT_NE(c, b);
}

TEST(HandleTable, SlotsBelowFirstAreTheOwnersAndHandOutNothing) {
  Events ids(4, 2, /*eager=*/true);
  EXPECT_FALSE(ids.live(0));
  ids.open(0);
  EXPECT_TRUE(ids.live(0));
  uint32_t i;
  uint64_t h;
  ASSERT_TRUE(ids.acquire(&i, &h));
  EXPECT_EQ(i, 2u);
  ASSERT_TRUE(ids.acquire(&i, &h));
  EXPECT_EQ(i, 3u);
  EXPECT_FALSE(ids.acquire(&i, &h));  // 0 and 1 are not handed out
  EXPECT_TRUE(ids.find(3, Events::generation_of(h)));
  EXPECT_FALSE(ids.find(3, Events::generation_of(h) + 1));
}

// As the guest's streams: lookups on other threads while one thread, under a
// lock, makes and ends handles. A lookup that finds a handle live sees what
// init wrote before it was published (run under TSan in CI).
TEST(HandleTable, EagerTableIsLookedUpConcurrently) {
  constexpr uint32_t kSlots = 64;
  Events ids(kSlots, 0, /*eager=*/true);
  std::atomic<uint64_t> payload[kSlots];
  std::atomic<uint64_t> published[kSlots];
  for (uint32_t s = 0; s < kSlots; ++s) payload[s] = published[s] = 0;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hits{0};
  auto reader = [&] {
    uint32_t idx;
    while (!stop.load(std::memory_order_relaxed)) {
      for (uint32_t s = 0; s < kSlots; ++s) {
        const uint64_t h = published[s].load(std::memory_order_relaxed);
        if (h && ids.find(h, &idx)) {
          // Found live: init's write for this handle happened before (the
          // slot may have been made again since, never with less).
          ASSERT_GE(payload[idx].load(std::memory_order_relaxed), h);
          hits.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
  };
  std::thread r1(reader), r2(reader);
  std::vector<uint32_t> held;
  bool made = true;
  for (int round = 0; made && round < 10'000'000 && (round < 20000 || hits.load() < 1000); ++round) {
    uint32_t idx;
    uint64_t h;
    made = ids.acquire(&idx, &h, [&](uint32_t i) {
      payload[i].store(uint64_t{ids.generation(i)} << 32 | i, std::memory_order_relaxed);
    });
    if (!made) break;
    published[idx].store(h, std::memory_order_relaxed);
    held.push_back(idx);
    if (held.size() > kSlots / 2) {  // end one of those made earlier
      const size_t k = size_t(round) * 7 % held.size();
      ids.release(held[k]);
      held.erase(held.begin() + ptrdiff_t(k));
    }
  }
  stop = true;
  r1.join();
  r2.join();
  EXPECT_TRUE(made) << "the table filled: releases were lost";
  EXPECT_GT(hits.load(), 0u);
}

}  // namespace
}  // namespace ordo::test

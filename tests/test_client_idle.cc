// The guest library and an idle worker: the worker sleeps and the doorbell
// wakes it, a watched slot's sync calls need no post, and an async publish
// racing the worker's sleep is never lost (ARCHITECTURE.md, "Idle").
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <random>

#include "guest/testing.h"
#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

TEST(Client, IdleWorkerSleepsAndTheDoorbellWakesIt) {
  InProcessWorker w;
  auto c = w.attach();
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  const RegionHeader* h = w.region().header();
  bool asleep = false;
  for (int i = 0; i < 2000 && !asleep; ++i) {
    asleep = h->worker_sleeping.load() == 1;
    if (!asleep) usleep(1000);
  }
  ASSERT_TRUE(asleep) << "an idle worker must stop spinning and sleep on its doorbell";
  const uint64_t before = w.worker().stats().wakeups_by_doorbell;
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  EXPECT_GT(w.worker().stats().wakeups_by_doorbell, before) << "the guest's call should have rung the doorbell";
}

// A thread that calls is watched: its next sync calls post nothing and the
// worker finds them by reading the slot's request line. Idle for a heartbeat,
// the slot is told it is no longer watched; a heartbeat later the worker stops
// reading it, and its calls are found by their posts again.
TEST(Client, SyncCallsOfAWatchedSlotNeedNoPost) {
  InProcessWorker w;
  auto c = w.attach();
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  auto watched = [&] {
    uint32_t n = 0;
    for (uint32_t s = 0; s < w.region().layout().slot_count; ++s) n += w.region().slot(s).watched.load();
    return n;
  };
  EXPECT_EQ(watched(), 1u) << "the calling thread's slot";
  const WorkerStats before = w.worker().stats();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(c->null_call(), Status::kSuccess);
  const WorkerStats after = w.worker().stats();
  EXPECT_EQ(after.slot_requests - before.slot_requests, 1000u);
  EXPECT_EQ(after.slot_posts, before.slot_posts) << "a watched slot's calls should not be posted";
  // Two heartbeats (100 ms each) without a call: no longer watched.
  bool left = false;
  for (int i = 0; i < 300 && !left; ++i) {
    left = watched() == 0;
    if (!left) usleep(10000);
  }
  ASSERT_TRUE(left) << "an idle slot should stop being watched";
  usleep(250000);  // the worker still reads it for a heartbeat after saying so, then drops it
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  EXPECT_EQ(w.worker().stats().slot_posts, after.slot_posts + 1) << "an unwatched slot posts its request";
  EXPECT_EQ(watched(), 1u) << "and is watched again";
}

// The guest publishes without a full fence before it reads worker_sleeping; the
// worker's grace re-poll is what keeps a publish racing its sleep from being
// lost (ARCHITECTURE.md, "Idle"). A worker that sleeps after every idle pass and
// would otherwise sleep a minute: each async launch, issued at a random point
// of the worker's sleep transition, must be dispatched without any guest help
// (no sync call, no wait that nudges the doorbell).
TEST(Client, AsyncPublishRacingTheWorkersSleepIsNeverLost) {
  WorkerOptions o;
  o.spin = std::chrono::microseconds(0);
  o.max_sleep = std::chrono::seconds(60);
  InProcessWorker w(o);
  auto c = w.attach();
  Stream s{};
  ASSERT_EQ(c->stream_create(&s), Status::kSuccess);
  const uint32_t add = kernel(*c, "ordo_add_u64");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 8), Status::kSuccess);
  const uint64_t zero = 0;
  ASSERT_EQ(c->memcpy_h2d(d, &zero, 8), Status::kSuccess);
  const RingControl& ring = w.region().ring(guest::ring_of_stream(*c, s));
  std::mt19937 rng(12);
  constexpr int kLaunches = 4000;
  for (int i = 0; i < kLaunches; ++i) {
    const sim::AddU64Args a{d, 1};
    ASSERT_EQ(c->launch(add, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
    const uint64_t want = guest::last_position(*c) + 1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ring.head.load() < want)
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "launch " << i << " was never dispatched: a lost wake-up";
    // Land the next publish anywhere from "worker still awake" to "asleep".
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(rng() % 40000);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
  uint64_t sum = 0;
  ASSERT_EQ(c->memcpy_d2h(&sum, d, 8), Status::kSuccess);
  EXPECT_EQ(sum, uint64_t(kLaunches));
  EXPECT_GT(w.worker().stats().sleeps, uint64_t(kLaunches / 10)) << "the worker should have slept between most launches";
}

}  // namespace
}  // namespace ordo::test

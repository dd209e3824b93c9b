// The guest library's streams, events and errors against a real worker: an
// asynchronous error reaches the thread that issued it, events time a kernel,
// per-thread streams each get a ring, and sixteen threads exhaust the rings and
// staging without losing a launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <thread>
#include <vector>

#include "guest/testing.h"
#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

TEST(Client, AsyncErrorReachesTheIssuingThreadsNextCall) {
  InProcessWorker w;
  auto c = w.attach();
  // A copy into memory that was never allocated is accepted by the guest (it
  // cannot know) and rejected by the worker: the error comes back asynchronously,
  // at the latest by this thread's next synchronizing call.
  uint32_t x = 1;
  // The worker may be fast enough that the call itself already sees the error.
  const Status issued = c->memcpy_h2d_async(0xdead0000, &x, sizeof x, kLegacyStream);
  ASSERT_TRUE(issued == Status::kSuccess || issued == Status::kInvalidDevicePointer) << int(issued);
  if (issued == Status::kSuccess) {
    EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kInvalidDevicePointer);
  } else {
    EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kSuccess) << "an error is reported once";
  }
  EXPECT_EQ(c->get_last_error(), Status::kInvalidDevicePointer);
  EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  EXPECT_EQ(c->device_synchronize(), Status::kSuccess) << "an error is reported once";
  // The next async call may already see it (the worker is fast) or not yet.
  const Status first = c->memcpy_h2d_async(0xdead0000, &x, sizeof x, kLegacyStream);
  ASSERT_TRUE(first == Status::kSuccess || first == Status::kInvalidDevicePointer) << int(first);
  std::thread([&] { EXPECT_EQ(c->device_synchronize(), Status::kSuccess) << "not this thread's error"; }).join();
  if (first == Status::kSuccess) {
    EXPECT_EQ(c->device_synchronize(), Status::kInvalidDevicePointer);
  }
  EXPECT_EQ(c->peek_last_error(), Status::kInvalidDevicePointer);
}

TEST(Client, EventsQuerySynchronizeAndTime) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t stamp = kernel(*c, "ordo_stamp");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, sizeof(sim::Stamp)), Status::kSuccess);
  Stream s;
  ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  Event a, b;
  ASSERT_EQ(c->event_create(&a), Status::kSuccess);
  ASSERT_EQ(c->event_create(&b), Status::kSuccess);
  ASSERT_EQ(c->event_record(a, s), Status::kSuccess);
  sim::StampArgs args{d, 0, 30000};
  ASSERT_EQ(c->launch(stamp, {1}, {1}, &args, sizeof args, s), Status::kSuccess);
  ASSERT_EQ(c->event_record(b, s), Status::kSuccess);
  EXPECT_EQ(c->event_query(b), Status::kNotReady);
  ASSERT_EQ(c->event_synchronize(b), Status::kSuccess);
  EXPECT_EQ(c->event_query(b), Status::kSuccess);
  float ms = 0;
  ASSERT_EQ(c->event_elapsed(&ms, a, b), Status::kSuccess);
  EXPECT_GE(ms, 25.0f);
  EXPECT_EQ(c->event_destroy(a), Status::kSuccess);
  EXPECT_EQ(c->event_destroy(a), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->event_destroy(b), Status::kSuccess);
}

TEST(Client, StreamQueryAndPerThreadStreams) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t stamp = kernel(*c, "ordo_stamp");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 4 * sizeof(sim::Stamp)), Status::kSuccess);
  std::vector<std::thread> ts;
  std::vector<uint32_t> rings(4);
  // All four streams live at once: a thread that exited first would release
  // its stream's ring to the next one (TSan's timing showed it).
  std::barrier all_created(4);
  for (uint32_t i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      Stream s = c->per_thread_stream();
      rings[i] = guest::ring_of_stream(*c, s);
      all_created.arrive_and_wait();
      sim::StampArgs a{d, i, 20000};
      EXPECT_EQ(c->launch(stamp, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
      EXPECT_EQ(c->stream_query(s), Status::kNotReady);
      EXPECT_EQ(c->stream_synchronize(s), Status::kSuccess);
      EXPECT_EQ(c->stream_query(s), Status::kSuccess);
    });
  for (auto& t : ts) t.join();
  std::sort(rings.begin(), rings.end());
  EXPECT_EQ(std::unique(rings.begin(), rings.end()), rings.end()) << "each thread gets its own stream";
  EXPECT_NE(rings[0], kLegacyRing);
}

TEST(Client, SixteenThreadsExhaustRingsAndStagingWithoutLoss) {
  // Small region: rings of 256 entries and 64 KiB staging windows fill up fast.
  InProcessWorker w({}, 4u << 20);
  auto c = w.attach();
  const uint32_t add = kernel(*c, "ordo_add_u64");
  constexpr int kThreads = 16, kCalls = 20000;
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, kThreads * 8), Status::kSuccess);
  ASSERT_EQ(c->memset_async(d, 0, kThreads * 8, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
  // Two threads per stream: they also contend for the stream's guest lock.
  std::vector<Stream> streams(kThreads / 2);
  for (auto& s : streams) ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      const Stream s = streams[t % streams.size()];
      for (int i = 1; i <= kCalls; ++i) {
        sim::AddU64Args a{d + 8 * uint64_t(t), uint64_t(i)};
        ASSERT_EQ(c->launch(add, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
      }
      ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
    });
  for (auto& t : ts) t.join();
  std::vector<uint64_t> out(kThreads);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, kThreads * 8), Status::kSuccess);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(out[t], uint64_t(kCalls) * (kCalls + 1) / 2) << "thread " << t;
}

}  // namespace
}  // namespace ordo::test

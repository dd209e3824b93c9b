// The mission: calls dispatch in an order consistent with what the guest could
// observe. Each scenario runs against a real ordo-worker process with --chaos,
// which holds every dispatchable entry for a random time so that many
// interleavings of the rings are tried. Each scenario also runs with ordering
// switched off (--unordered) and must then catch a violation: that is what
// shows the scenario can fail.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

constexpr uint32_t kBytes = 4096;

// Runs `a` on one thread and then, strictly after `a` returned, `b` on another:
// the guest-visible "A happened before B" of the seed scenario.
void a_then_b(const std::function<void()>& a, const std::function<void()>& b) {
  std::mutex mu;
  std::condition_variable cv;
  bool a_done = false;
  std::thread ta([&] {
    a();
    std::lock_guard lock(mu);
    a_done = true;
    cv.notify_one();
  });
  std::thread tb([&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return a_done; });
    lock.unlock();
    b();
  });
  ta.join();
  tb.join();
}

struct Buffers {
  uint64_t x = 0, out = 0;
  std::vector<uint8_t> old_x = std::vector<uint8_t>(kBytes, 0x11), new_x = std::vector<uint8_t>(kBytes, 0x22);
};

Buffers make_buffers(Client& c) {
  Buffers b;
  EXPECT_EQ(c.malloc(&b.x, kBytes), Status::kSuccess);
  EXPECT_EQ(c.malloc(&b.out, kBytes), Status::kSuccess);
  return b;
}

// Resets X to the old data and OUT to zero, everything idle afterwards.
void reset(Client& c, const Buffers& b) {
  ASSERT_EQ(c.memcpy_h2d(b.x, b.old_x.data(), kBytes), Status::kSuccess);
  ASSERT_EQ(c.memset_async(b.out, 0, kBytes, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c.device_synchronize(), Status::kSuccess);
}

// True when the slow kernel read the old X, as native CUDA guarantees.
bool kernel_saw_old_x(Client& c, const Buffers& b) {
  EXPECT_EQ(c.device_synchronize(), Status::kSuccess);
  std::vector<uint8_t> out(kBytes);
  EXPECT_EQ(c.memcpy_d2h(out.data(), b.out, kBytes), Status::kSuccess);
  if (out == b.old_x) return true;
  EXPECT_EQ(out, b.new_x) << "OUT is neither old nor new X: torn or lost data";
  return false;
}

sim::SlowCopyArgs slow_copy(const Buffers& b) { return {b.out, b.x, kBytes, 3000, 0}; }

// The seed scenario: A launches a kernel on S that reads X late; B, after A
// returned, records an event on S, makes S2 wait for it and overwrites X on S2.
int seed_violations(WorkerProcess& w, int iterations) {
  auto c = w.attach();
  const uint32_t k = kernel(*c, "ordo_slow_copy");
  Buffers b = make_buffers(*c);
  Stream s, s2;
  EXPECT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  EXPECT_EQ(c->stream_create(&s2, kStreamNonBlocking), Status::kSuccess);
  Event e;
  EXPECT_EQ(c->event_create(&e), Status::kSuccess);
  int violations = 0;
  for (int i = 0; i < iterations; ++i) {
    reset(*c, b);
    a_then_b(
        [&] {
          auto args = slow_copy(b);
          EXPECT_EQ(c->launch(k, {1}, {1}, &args, sizeof args, s), Status::kSuccess);
        },
        [&] {
          EXPECT_EQ(c->event_record(e, s), Status::kSuccess);
          EXPECT_EQ(c->stream_wait_event(s2, e), Status::kSuccess);
          EXPECT_EQ(c->memcpy_h2d_async(b.x, b.new_x.data(), kBytes, s2), Status::kSuccess);
        });
    violations += !kernel_saw_old_x(*c, b);
  }
  return violations;
}

// The legacy default stream: work on it waits for blocking streams and the
// other way round. `legacy_first`: A uses the legacy stream and B a blocking one.
int legacy_violations(WorkerProcess& w, int iterations, bool legacy_first) {
  auto c = w.attach();
  const uint32_t k = kernel(*c, "ordo_slow_copy");
  Buffers b = make_buffers(*c);
  Stream s;
  EXPECT_EQ(c->stream_create(&s), Status::kSuccess);  // blocking
  const Stream first = legacy_first ? kLegacyStream : s, second = legacy_first ? s : kLegacyStream;
  int violations = 0;
  for (int i = 0; i < iterations; ++i) {
    reset(*c, b);
    a_then_b(
        [&] {
          auto args = slow_copy(b);
          EXPECT_EQ(c->launch(k, {1}, {1}, &args, sizeof args, first), Status::kSuccess);
        },
        [&] { EXPECT_EQ(c->memcpy_h2d_async(b.x, b.new_x.data(), kBytes, second), Status::kSuccess); });
    violations += !kernel_saw_old_x(*c, b);
  }
  return violations;
}

// Re-recording an event must not overtake an earlier wait on it: S2 waits for
// the record after the slow kernel on S; then (after that wait returned) the
// event is re-recorded on an idle S3. If the re-record were dispatched first,
// S2 would wait for S3 only and overwrite X while the kernel still sleeps.
int rerecord_violations(WorkerProcess& w, int iterations) {
  auto c = w.attach();
  const uint32_t k = kernel(*c, "ordo_slow_copy");
  Buffers b = make_buffers(*c);
  Stream s, s2, s3;
  EXPECT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  EXPECT_EQ(c->stream_create(&s2, kStreamNonBlocking), Status::kSuccess);
  EXPECT_EQ(c->stream_create(&s3, kStreamNonBlocking), Status::kSuccess);
  Event e;
  EXPECT_EQ(c->event_create(&e), Status::kSuccess);
  int violations = 0;
  for (int i = 0; i < iterations; ++i) {
    reset(*c, b);
    auto args = slow_copy(b);
    EXPECT_EQ(c->launch(k, {1}, {1}, &args, sizeof args, s), Status::kSuccess);
    EXPECT_EQ(c->event_record(e, s), Status::kSuccess);
    a_then_b([&] { EXPECT_EQ(c->stream_wait_event(s2, e), Status::kSuccess); },
             [&] { EXPECT_EQ(c->event_record(e, s3), Status::kSuccess); });
    EXPECT_EQ(c->memcpy_h2d_async(b.x, b.new_x.data(), kBytes, s2), Status::kSuccess);
    violations += !kernel_saw_old_x(*c, b);
  }
  return violations;
}

const std::vector<std::string> kOrdered = {"--chaos", "7"};
const std::vector<std::string> kUnordered = {"--chaos", "7", "--unordered"};

TEST(Ordering, SeedScenarioHolds) {
  WorkerProcess w(kOrdered);
  EXPECT_EQ(seed_violations(w, 60), 0);
}

TEST(Ordering, SeedScenarioBreaksWithoutEdges) {
  WorkerProcess w(kUnordered);
  const int v = seed_violations(w, 60);
  std::printf("without edges: %d of 60 runs violated the seed scenario\n", v);
  EXPECT_GT(v, 0) << "with edges dropped the kernel must sometimes read the new X";
}

TEST(Ordering, LegacyStreamFollowsBlockingStreams) {
  WorkerProcess w(kOrdered);
  EXPECT_EQ(legacy_violations(w, 40, false), 0);
}

TEST(Ordering, BlockingStreamFollowsLegacyStream) {
  WorkerProcess w(kOrdered);
  EXPECT_EQ(legacy_violations(w, 40, true), 0);
}

TEST(Ordering, LegacyStreamBreaksWithoutEdges) {
  WorkerProcess w(kUnordered);
  const int v = legacy_violations(w, 40, false) + legacy_violations(w, 40, true);
  std::printf("without edges: %d of 80 runs violated legacy-stream order\n", v);
  EXPECT_GT(v, 0);
}

TEST(Ordering, ReRecordDoesNotOvertakeWait) {
  WorkerProcess w(kOrdered);
  EXPECT_EQ(rerecord_violations(w, 60), 0);
}

TEST(Ordering, ReRecordBreaksWithoutEdges) {
  WorkerProcess w(kUnordered);
  const int v = rerecord_violations(w, 60);
  std::printf("without edges: %d of 60 runs let a re-record overtake a wait\n", v);
  EXPECT_GT(v, 0);
}

// Calls that do not conflict are not delayed: a non-blocking stream runs while
// the legacy stream is busy, and independent streams overlap.
TEST(Ordering, IndependentStreamsAreNotSerialized) {
  WorkerProcess w(kOrdered);
  auto c = w.attach();
  const uint32_t stamp = kernel(*c, "ordo_stamp");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 3 * sizeof(sim::Stamp)), Status::kSuccess);
  Stream nb, other;
  ASSERT_EQ(c->stream_create(&nb, kStreamNonBlocking), Status::kSuccess);
  ASSERT_EQ(c->stream_create(&other, kStreamNonBlocking), Status::kSuccess);
  sim::StampArgs slow{d, 0, 200000}, fast1{d, 1, 0}, fast2{d, 2, 0};
  ASSERT_EQ(c->launch(stamp, {1}, {1}, &slow, sizeof slow, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c->launch(stamp, {1}, {1}, &fast1, sizeof fast1, nb), Status::kSuccess);
  ASSERT_EQ(c->launch(stamp, {1}, {1}, &fast2, sizeof fast2, other), Status::kSuccess);
  sim::Stamp st[3];
  ASSERT_EQ(c->memcpy_d2h(st, d, sizeof st), Status::kSuccess);
  EXPECT_LT(st[1].end, st[0].end) << "non-blocking stream waited for the legacy stream";
  EXPECT_LT(st[2].end, st[0].end) << "independent stream waited for the legacy stream";
}

}  // namespace
}  // namespace ordo::test

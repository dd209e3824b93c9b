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
#include "scenarios.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

using scenario::Problems;

const std::vector<std::string> kOrdered = {"--chaos", "7"};
const std::vector<std::string> kUnordered = {"--chaos", "7", "--unordered"};

TEST(Ordering, SeedScenarioHolds) {
  WorkerProcess w(kOrdered);
  Problems p;
  EXPECT_EQ(scenario::seed_violations(*w.attach(), 60, p), 0);
  EXPECT_TRUE(p.empty()) << p.first();
}

TEST(Ordering, SeedScenarioBreaksWithoutEdges) {
  WorkerProcess w(kUnordered);
  Problems p;
  const int v = scenario::seed_violations(*w.attach(), 60, p);
  std::printf("without edges: %d of 60 runs violated the seed scenario\n", v);
  EXPECT_GT(v, 0) << "with edges dropped the kernel must sometimes read the new X";
  EXPECT_TRUE(p.empty()) << p.first();
}

TEST(Ordering, LegacyStreamFollowsBlockingStreams) {
  WorkerProcess w(kOrdered);
  Problems p;
  EXPECT_EQ(scenario::legacy_violations(*w.attach(), 40, false, p), 0);
  EXPECT_TRUE(p.empty()) << p.first();
}

TEST(Ordering, BlockingStreamFollowsLegacyStream) {
  WorkerProcess w(kOrdered);
  Problems p;
  EXPECT_EQ(scenario::legacy_violations(*w.attach(), 40, true, p), 0);
  EXPECT_TRUE(p.empty()) << p.first();
}

TEST(Ordering, LegacyStreamBreaksWithoutEdges) {
  WorkerProcess w(kUnordered);
  Problems p;
  // On a sanitizer build a round of 80 shows 0-3 violations (the main build:
  // 20-30), and CI has seen rounds with none: rounds until one shows, at most
  // twelve.
  int v = 0, runs = 0;
  for (int round = 0; round < 12 && v == 0; ++round, runs += 80) {
    v += scenario::legacy_violations(*w.attach(), 40, false, p);
    v += scenario::legacy_violations(*w.attach(), 40, true, p);  // a new guest session
  }
  std::printf("without edges: %d of %d runs violated legacy-stream order\n", v, runs);
  EXPECT_GT(v, 0);
  EXPECT_TRUE(p.empty()) << p.first();
}

TEST(Ordering, ReRecordDoesNotOvertakeWait) {
  WorkerProcess w(kOrdered);
  Problems p;
  EXPECT_EQ(scenario::rerecord_violations(*w.attach(), 60, p), 0);
  EXPECT_TRUE(p.empty()) << p.first();
}

TEST(Ordering, ReRecordBreaksWithoutEdges) {
  WorkerProcess w(kUnordered);
  Problems p;
  // The overtaking needs a thread hand-off inside a chaos hold; under TSan's
  // slower threads it can take more than one round of 60 to show.
  auto c = w.attach();
  int v = 0, runs = 0;
  for (int round = 0; round < 4 && v == 0; ++round, runs += 60) v += scenario::rerecord_violations(*c, 60, p);
  std::printf("without edges: %d of %d runs let a re-record overtake a wait\n", v, runs);
  EXPECT_GT(v, 0);
  EXPECT_TRUE(p.empty()) << p.first();
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

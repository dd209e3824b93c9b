// Randomized ordering stress checked against a model of the allowed orders.
//
// Several guest threads issue random programs over blocking, non-blocking and
// the legacy default stream, with events and device-wide syncs. Every kernel is
// an `ordo_stamp` that records when it started and ended on one clock shared by
// all simulated streams. Afterwards the stamps are checked against what CUDA
// guarantees for the happens-before relation the program set up:
//   C1 stream order      same ring, earlier position   -> ends before the later starts
//   C2 events            work before the record a wait referred to -> ends before work after the wait
//   C3 legacy stream     legacy <-> blocking stream work ordered by happens-before
//   C4 device sync       work happening before cudaDeviceSynchronize -> ends before work after it
// Threads run in phases separated by barriers (happens-before across threads).
// Even phases may re-record events, odd phases wait on them, so each wait
// refers to exactly one record.
#include <gtest/gtest.h>

#include <cstdio>

#include "harness.h"
#include "scenarios.h"

namespace ordo::test {
namespace {

TEST(Model, RandomProgramsKeepEveryAllowedOrder) {
  WorkerProcess w({"--chaos", "11"});
  size_t stamps = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    scenario::Problems p;
    auto r = scenario::run_model(*w.attach(), seed, p);
    stamps += r.stamps;
    EXPECT_EQ(r.violations, 0u) << "seed " << seed << ": " << r.first;
    EXPECT_TRUE(p.empty()) << p.first();
  }
  std::printf("checked %zu stamped kernels over 4 random programs\n", stamps);
  EXPECT_GT(stamps, 800u);
}

TEST(Model, RandomProgramsBreakWithoutEdges) {
  WorkerProcess w({"--chaos", "11", "--unordered"});
  size_t violations = 0;
  std::string first;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    scenario::Problems p;
    auto r = scenario::run_model(*w.attach(), seed, p);
    if (first.empty()) first = r.first;
    violations += r.violations;
    EXPECT_TRUE(p.empty()) << p.first();
  }
  std::printf("without edges: %zu violated pairs, first: %s\n", violations, first.c_str());
  EXPECT_GT(violations, 0u) << "the model check must catch a worker that drops edges";
}

}  // namespace
}  // namespace ordo::test

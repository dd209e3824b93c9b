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

#include "generator.h"
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

// The generator: every stream/event API, destroy with pending work, ring and
// handle reuse, re-records across streams, event destroy with pending waits,
// per-thread streams of exiting threads, host functions on every stream kind.
// Programs of seeds 1..3, each on a fresh session of `w`, expected to keep
// every order; the sums of what they checked.
scenario::ModelResult ordered_seeds(WorkerProcess& w, const scenario::GenProgram& prog) {
  scenario::ModelResult sum;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    scenario::Problems p;
    auto r = scenario::run_generated(*w.attach(), seed, p, prog);
    sum.stamps += r.stamps;
    sum.host_functions += r.host_functions;
    sum.peer_copies += r.peer_copies;
    EXPECT_EQ(r.violations, 0u) << "seed " << seed << ": " << r.first;
    EXPECT_TRUE(p.empty()) << p.count() << " problems, first: " << p.first();
  }
  return sum;
}

TEST(Generator, RandomProgramsKeepEveryAllowedOrder) {
  WorkerProcess w({"--chaos", "23"}, "64M");  // 63 stream rings
  const auto r = ordered_seeds(w, {});
  std::printf("checked %zu stamped kernels and %zu host functions or host-to-host copies over 3 generated programs\n",
              r.stamps, r.host_functions);
  EXPECT_GT(r.stamps, 300u);
  EXPECT_GT(r.host_functions, 10u);
}

// More threads than the region has reply slots (64 at 16 MiB), each with its
// own streams, events and per-thread stream.
TEST(Generator, MoreThreadsThanSlots) {
  WorkerProcess w({"--chaos", "29"});
  scenario::Problems p;
  scenario::GenProgram prog;
  prog.threads = 80;
  prog.phases = 3;
  prog.ops_per_phase = 6;
  prog.private_streams = 1;  // with per-thread streams: 160 streams on 15 rings
  auto c = w.attach();
  ASSERT_LT(c->layout().slot_count, uint32_t(prog.threads));
  auto r = scenario::run_generated(*c, 7, p, prog);
  EXPECT_EQ(r.violations, 0u) << r.first;
  EXPECT_TRUE(p.empty()) << p.count() << " problems, first: " << p.first();
  std::printf("80 threads: checked %zu stamped kernels\n", r.stamps);
}

// Many more live streams than the region has rings (15 at 16 MiB): streams
// share rings, and every order CUDA promises still holds while each stream
// is destroyed and re-created with work pending (so ids and rings are reused).
TEST(Generator, MoreStreamsThanRings) {
  WorkerProcess w({"--chaos", "31"});
  scenario::GenProgram prog;
  prog.threads = 8;
  prog.phases = 4;
  prog.ops_per_phase = 16;
  prog.private_streams = 24;
  auto c = w.attach();
  ASSERT_LT(c->layout().ring_count * 4, uint32_t(prog.threads * (prog.private_streams + 1)));
  size_t stamps = 0;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    scenario::Problems p;
    auto r = scenario::run_generated(*c, seed, p, prog);
    stamps += r.stamps;
    EXPECT_EQ(r.violations, 0u) << "seed " << seed << ": " << r.first;
    EXPECT_TRUE(p.empty()) << p.count() << " problems, first: " << p.first();
  }
  std::printf("%d live streams per program on %u rings: checked %zu stamped kernels\n",
              prog.threads * (prog.private_streams + 1) + 4, c->layout().ring_count, stamps);
}

// Four devices: streams, events and memory spread over them, threads switching
// devices, events recorded on one device and waited on by another's streams,
// peer copies whose data must be the stamp they follow (C8), per-device legacy
// streams and device-wide waits.
TEST(Generator, MultiDeviceProgramsKeepEveryAllowedOrder) {
  WorkerProcess w({"--chaos", "41", "--sim-devices", "4"}, "64M");
  scenario::GenProgram prog;
  prog.devices = 4;
  prog.threads = 6;
  prog.ops_per_phase = 16;
  const auto r4 = ordered_seeds(w, prog);
  std::printf("4 devices: checked %zu stamped kernels and %zu peer copies over 3 generated programs\n", r4.stamps,
              r4.peer_copies);
  EXPECT_GT(r4.stamps, 300u);
  EXPECT_GT(r4.peer_copies, 10u);
  // More streams than rings: legacy streams of devices past 0 share rings too.
  WorkerProcess small({"--chaos", "43", "--sim-devices", "3"});
  prog.devices = 3;
  prog.private_streams = 12;
  auto c = small.attach();
  ASSERT_LT(c->layout().ring_count * 4, uint32_t(prog.threads * (prog.private_streams + 1)));
  scenario::Problems p;
  auto r = scenario::run_generated(*c, 5, p, prog);
  EXPECT_EQ(r.violations, 0u) << r.first;
  EXPECT_TRUE(p.empty()) << p.count() << " problems, first: " << p.first();
}

TEST(Generator, MultiDeviceProgramsBreakWithoutEdges) {
  WorkerProcess w({"--chaos", "41", "--sim-devices", "4", "--unordered"}, "64M");
  scenario::GenProgram prog;
  prog.devices = 4;
  prog.threads = 6;
  prog.ops_per_phase = 16;
  size_t violations = 0;
  std::string first;
  for (uint64_t seed = 1; seed <= 3 && violations == 0; ++seed) {
    scenario::Problems p;
    auto r = scenario::run_generated(*w.attach(), seed, p, prog);
    if (first.empty()) first = r.first;
    violations += r.violations;
  }
  std::printf("4 devices without edges: %zu violated pairs, first: %s\n", violations, first.c_str());
  EXPECT_GT(violations, 0u) << "the generator's check must catch a worker that drops edges";
}

TEST(Generator, RandomProgramsBreakWithoutEdges) {
  WorkerProcess w({"--chaos", "23", "--unordered"}, "64M");
  size_t violations = 0;
  std::string first;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    scenario::Problems p;
    auto r = scenario::run_generated(*w.attach(), seed, p);
    if (first.empty()) first = r.first;
    violations += r.violations;
  }
  std::printf("without edges: %zu violated pairs, first: %s\n", violations, first.c_str());
  EXPECT_GT(violations, 0u) << "the generator's check must catch a worker that drops edges";
  // Also when streams share rings (ring order then hides some violations).
  WorkerProcess shared({"--chaos", "37", "--unordered"});
  scenario::GenProgram prog;
  prog.threads = 8;
  prog.private_streams = 24;
  size_t shared_violations = 0;
  for (uint64_t seed = 1; seed <= 3 && shared_violations == 0; ++seed) {
    scenario::Problems p;
    shared_violations += scenario::run_generated(*shared.attach(), seed, p, prog).violations;
  }
  std::printf("without edges, streams sharing rings: %zu violated pairs\n", shared_violations);
  EXPECT_GT(shared_violations, 0u);
}

}  // namespace
}  // namespace ordo::test

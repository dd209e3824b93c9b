// Conditional graph programs through the Client and a worker on the sim:
// the device decides each IF, WHILE and SWITCH from the value its kernels set,
// a launch starts from each handle's default, a program the guest forges gets
// an error and the session goes on (a kernel misusing a handle faults, as on
// a device), and a program is ordered with the stream's other work like any
// launch.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"
#include "transport/graph_steps.h"

namespace ordo {
namespace {

using test::InProcessWorker;
using test::kernel;

struct Fixture {
  InProcessWorker w;
  std::unique_ptr<Client> c = w.attach();
  uint32_t add = kernel(*c, "ordo_add_u64");
  uint32_t set = kernel(*c, "ordo_set_conditional");
  uint32_t countdown = kernel(*c, "ordo_cond_countdown");
  uint32_t stamp = kernel(*c, "ordo_stamp");
  uint64_t mem = 0;  // [0] value for set, [8] counter, [16] sum
  Fixture() { EXPECT_EQ(c->malloc(&mem, 4096), Status::kSuccess); }

  uint64_t handle() {
    uint64_t h = 0;
    EXPECT_EQ(c->graph_cond_handle(0, &h), Status::kSuccess);
    return h;
  }
  void put(uint64_t off, uint64_t v) { ASSERT_EQ(c->memcpy_h2d(mem + off, &v, 8), Status::kSuccess); }
  uint64_t get(uint64_t off) {
    uint64_t v = 0;
    EXPECT_EQ(c->memcpy_d2h(&v, mem + off, 8), Status::kSuccess);
    return v;
  }
  void add_step(GraphStepWriter& w, uint64_t by) {
    const sim::AddU64Args a{mem + 16, by};
    w.kernel({add, 0, {1, 1, 1}, {1, 1, 1}, sizeof a, 0}, &a);
  }
  // Creates, launches, synchronizes and destroys `w`'s graph: the launch's status.
  Status run(const GraphStepWriter& w, Stream s = kLegacyStream) {
    uint32_t g = 0;
    if (Status st = c->graph_create(w.bytes().data(), w.bytes().size(), &g); !ok(st)) return st;
    EXPECT_EQ(c->graph_launch(g, s), Status::kSuccess);
    const Status done = c->stream_synchronize(s);
    const Status destroyed = c->graph_destroy(g);
    EXPECT_TRUE(destroyed == Status::kSuccess || destroyed == done) << status_name(destroyed);  // or the sticky error
    return done;
  }
};

TEST(Conditional, HandlesAreDistinctAndOnlyForDevicesThatExist) {
  Fixture f;
  const uint64_t a = f.handle(), b = f.handle();
  EXPECT_NE(a, b);
  EXPECT_NE(a, 0u);
  uint64_t h = 0;
  EXPECT_EQ(f.c->graph_cond_handle(7, &h), Status::kInvalidDevice);
  EXPECT_EQ(f.c->graph_cond_handle(kMaxDevices + 5, &h), Status::kInvalidDevice);
  EXPECT_EQ(f.c->null_call(), Status::kSuccess);
}

TEST(Conditional, TheKernelsValueChoosesTheBodyAtEachLaunch) {
  Fixture f;
  const uint64_t h = f.handle();
  // sum += 1 if value else 100 (IF/ELSE); then SWITCH on the same value: += 1000 * (value + 1) for 0..2.
  GraphStepWriter w;
  w.handle({h, 0, 0});
  const sim::SetConditionalArgs sa{h, f.mem};
  w.kernel({f.set, 0, {1, 1, 1}, {1, 1, 1}, sizeof sa, 0}, &sa);
  w.cond({h, uint32_t(CondType::kIf), 2});
  size_t b = w.begin_body();
  f.add_step(w, 1);
  w.end_body(b);
  b = w.begin_body();
  f.add_step(w, 100);
  w.end_body(b);
  w.cond({h, uint32_t(CondType::kSwitch), 3});
  for (uint64_t k = 0; k < 3; ++k) {
    b = w.begin_body();
    f.add_step(w, 1000 * (k + 1));
    w.end_body(b);
  }
  uint64_t expect = 0;
  for (uint64_t v : {0, 1, 2, 5, 1}) {
    f.put(0, v);
    f.put(16, 0);
    ASSERT_EQ(f.run(w), Status::kSuccess);
    expect = (v ? 1 : 100) + (v < 3 ? 1000 * (v + 1) : 0);
    EXPECT_EQ(f.get(16), expect) << "value " << v;
  }
}

TEST(Conditional, AWhileRunsUntilItsBodyClearsTheValueAndALaunchStartsFromTheDefault) {
  Fixture f;
  const uint64_t h = f.handle();
  GraphStepWriter w;
  w.handle({h, 1, kCondAssignDefault});
  w.cond({h, uint32_t(CondType::kWhile), 1});
  const size_t b = w.begin_body();
  f.add_step(w, 1);
  const sim::CondCountdownArgs ca{h, f.mem + 8};
  w.kernel({f.countdown, 0, {1, 1, 1}, {1, 1, 1}, sizeof ca, 0}, &ca);
  w.end_body(b);
  for (uint64_t n : {7, 1, 3}) {
    f.put(8, n);
    f.put(16, 0);
    ASSERT_EQ(f.run(w), Status::kSuccess);
    EXPECT_EQ(f.get(16), n) << "the second launch starts from the default again, not the 0 the first left";
  }
  // Without kCondAssignDefault a launch starts from 0: no pass.
  GraphStepWriter z;
  z.handle({h, 1, 0});
  z.cond({h, uint32_t(CondType::kWhile), 1});
  const size_t zb = z.begin_body();
  f.add_step(z, 1);
  z.end_body(zb);
  f.put(16, 0);
  ASSERT_EQ(f.run(z), Status::kSuccess);
  EXPECT_EQ(f.get(16), 0u);
}

// As a device faults on it: 719 (cudaErrorLaunchFailure), sticky as CUDA's is.
TEST(Conditional, AKernelSettingAHandleOutsideAGraphFaults) {
  Fixture f;
  const uint64_t h = f.handle();
  const sim::SetConditionalArgs sa{h, f.mem};
  ASSERT_EQ(f.c->launch(f.set, {1}, {1}, &sa, sizeof sa, kLegacyStream), Status::kSuccess);
  EXPECT_EQ(f.c->device_synchronize(), Status::kLaunchFailure);
  EXPECT_EQ(f.c->null_call(), Status::kLaunchFailure) << "sticky";
}

TEST(Conditional, AKernelSettingAHandleItsGraphDoesNotDeclareFaultsAndStopsTheLaunch) {
  Fixture f;
  const uint64_t h = f.handle(), other = f.handle();
  GraphStepWriter w;
  w.handle({h, 0, 0});
  const sim::SetConditionalArgs wrong{other, f.mem};
  w.kernel({f.set, 0, {1, 1, 1}, {1, 1, 1}, sizeof wrong, 0}, &wrong);
  f.add_step(w, 1);
  w.cond({h, uint32_t(CondType::kIf), 1});
  const size_t b = w.begin_body();
  w.end_body(b);
  f.put(16, 0);
  EXPECT_EQ(f.run(w), Status::kLaunchFailure);
  EXPECT_EQ(f.c->device_synchronize(), Status::kLaunchFailure) << "sticky";
}

TEST(Conditional, ForgedProgramsAreRefusedAtCreateOrLaunch) {
  Fixture f;
  const uint64_t h = f.handle();
  uint32_t g = 0;
  {
    GraphStepWriter w;  // a conditional whose handle the graph never declared
    w.cond({h, uint32_t(CondType::kIf), 1});
    const size_t b = w.begin_body();
    w.end_body(b);
    EXPECT_EQ(f.c->graph_create(w.bytes().data(), w.bytes().size(), &g), Status::kInvalidValue);
  }
  {
    GraphStepWriter w;  // a body's kernel the worker never issued: refused before anything runs
    w.handle({h, 1, kCondAssignDefault});
    f.add_step(w, 1);
    w.cond({h, uint32_t(CondType::kIf), 1});
    const size_t b = w.begin_body();
    w.kernel({12345, 0, {1, 1, 1}, {1, 1, 1}, 0, 0}, nullptr);
    w.end_body(b);
    f.put(16, 0);
    EXPECT_EQ(f.run(w), Status::kInvalidDeviceFunction);
    EXPECT_EQ(f.c->get_last_error(), Status::kInvalidDeviceFunction);
    EXPECT_EQ(f.get(16), 0u);
  }
  {
    GraphStepWriter w;  // a memset in a body that never runs, outside any allocation: checked anyway
    w.handle({h, 0, kCondAssignDefault});
    w.cond({h, uint32_t(CondType::kIf), 1});
    const size_t b = w.begin_body();
    w.memset({0xdead0000, 1, 64});
    w.end_body(b);
    EXPECT_NE(f.run(w), Status::kSuccess);
    f.c->get_last_error();
  }
  EXPECT_EQ(f.c->device_synchronize(), Status::kSuccess);
  EXPECT_EQ(f.c->null_call(), Status::kSuccess);
}

// A WHILE whose body never clears its value (here an empty body: nothing
// sets it) runs until its session ends; it must not keep the session's end,
// or the next guest's session, waiting.
TEST(Conditional, AWhileThatNeverEndsStopsWhenItsSessionEnds) {
  InProcessWorker w;
  {
    auto c = w.attach();
    uint64_t h = 0;
    ASSERT_EQ(c->graph_cond_handle(0, &h), Status::kSuccess);
    GraphStepWriter p;
    p.handle({h, 1, kCondAssignDefault});
    p.cond({h, uint32_t(CondType::kWhile), 1});
    const size_t b = p.begin_body();
    p.end_body(b);
    uint32_t g = 0;
    ASSERT_EQ(c->graph_create(p.bytes().data(), p.bytes().size(), &g), Status::kSuccess);
    Stream s;
    ASSERT_EQ(c->stream_create(&s), Status::kSuccess);
    ASSERT_EQ(c->graph_launch(g, s), Status::kSuccess);
    EXPECT_EQ(c->stream_query(s), Status::kNotReady);
  }  // detached with the loop running
  auto next = w.attach();
  EXPECT_EQ(next->null_call(), Status::kSuccess);
  EXPECT_EQ(next->device_synchronize(), Status::kSuccess);
}

// A program is one entry of its stream: stamps before and after it on the
// stream do not overlap the stamps its WHILE runs, and another stream's wait
// on an event recorded after it follows them all.
TEST(Conditional, AProgramIsOrderedWithItsStreamsWorkAndThroughEvents) {
  Fixture f;
  uint64_t stamps = 0;
  ASSERT_EQ(f.c->malloc(&stamps, 64 * sizeof(sim::Stamp)), Status::kSuccess);
  Stream s, s2;
  ASSERT_EQ(f.c->stream_create(&s), Status::kSuccess);
  ASSERT_EQ(f.c->stream_create(&s2), Status::kSuccess);
  Event e;
  ASSERT_EQ(f.c->event_create(&e), Status::kSuccess);
  const uint64_t h = f.handle();
  auto stamp = [&](GraphStepWriter* w, uint32_t i, Stream on) {
    const sim::StampArgs a{stamps, i, 300};
    if (w) w->kernel({f.stamp, 0, {1, 1, 1}, {1, 1, 1}, sizeof a, 0}, &a);
    else ASSERT_EQ(f.c->launch(f.stamp, {1}, {1}, &a, sizeof a, on), Status::kSuccess);
  };
  // The program: stamp 1, then a WHILE of three passes, each stamping 4 (the
  // last pass's stamp stays there).
  GraphStepWriter w;
  w.handle({h, 1, kCondAssignDefault});
  stamp(&w, 1, s);
  w.cond({h, uint32_t(CondType::kWhile), 1});
  const size_t b = w.begin_body();
  stamp(&w, 4, s);
  const sim::CondCountdownArgs ca{h, f.mem + 8};
  w.kernel({f.countdown, 0, {1, 1, 1}, {1, 1, 1}, sizeof ca, 0}, &ca);
  w.end_body(b);
  f.put(8, 3);
  uint32_t g = 0;
  ASSERT_EQ(f.c->graph_create(w.bytes().data(), w.bytes().size(), &g), Status::kSuccess);
  stamp(nullptr, 0, s);
  ASSERT_EQ(f.c->graph_launch(g, s), Status::kSuccess);
  ASSERT_EQ(f.c->event_record(e, s), Status::kSuccess);
  stamp(nullptr, 2, s);
  ASSERT_EQ(f.c->stream_wait_event(s2, e), Status::kSuccess);
  stamp(nullptr, 3, s2);
  ASSERT_EQ(f.c->graph_destroy(g), Status::kSuccess);
  ASSERT_EQ(f.c->device_synchronize(), Status::kSuccess);
  std::vector<sim::Stamp> st(5);
  ASSERT_EQ(f.c->memcpy_d2h(st.data(), stamps, 5 * sizeof(sim::Stamp)), Status::kSuccess);
  for (const auto& x : st) ASSERT_NE(x.end, 0u);
  EXPECT_LT(st[0].end, st[1].start) << "the program's first step follows the stream's earlier work";
  EXPECT_LT(st[1].end, st[4].start) << "the passes follow the program's earlier steps";
  EXPECT_LT(st[4].end, st[2].start) << "the stream's later work follows the program's last pass";
  EXPECT_LT(st[4].end, st[3].start) << "a wait on an event recorded after it follows it";
  EXPECT_EQ(f.get(8), 0u);
}

}  // namespace
}  // namespace ordo

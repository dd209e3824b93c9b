// The CPU simulator backend: stream order, events, the legacy default stream,
// memory and error reporting.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "ordo/layout.h"
#include "ordo/sim.h"
#include "worker/backends/sim/sim_backend.h"

namespace ordo::sim {
namespace {

using namespace std::chrono_literals;

constexpr auto kTimeout = 5s;
constexpr auto kSettle = 20ms;  // long enough for a wrongly unblocked stream to run

// Blocks the streams it is enqueued on until opened; opens itself on scope exit
// so a failing test never leaves a backend unable to drain.
class Gate {
 public:
  Gate() : fut_(p_.get_future().share()) {}
  ~Gate() { open(); }
  void open() {
    std::call_once(once_, [this] { p_.set_value(); });
  }
  std::function<void()> waiter() const {
    return [f = fut_] { f.wait(); };
  }

 private:
  std::promise<void> p_;
  std::shared_future<void> fut_;
  std::once_flag once_;
};

// A flag set by a host callback or notification.
struct Flag {
  std::promise<void> p;
  std::future<void> f = p.get_future();
  std::function<void()> setter() {
    return [this] { p.set_value(); };
  }
  bool wait(std::chrono::milliseconds d) { return f.wait_for(d) == std::future_status::ready; }
  bool set() { return wait(0ms); }
};

struct Error {
  OpTag tag;
  Status status;
};

class SimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    b_ = make_sim_backend();
    b_->set_error_sink([this](const OpTag& tag, Status s) {
      std::lock_guard lk(mu_);
      errors_.push_back({tag, s});
    });
  }

  uint32_t kernel(const char* name) {
    uint32_t id = 0;
    EXPECT_EQ(b_->kernel_lookup(0, name, &id), Status::kSuccess) << name;
    return id;
  }

  template <class A>
  Status launch(uint32_t stream, const char* name, const A& args, OpTag tag = {}) {
    LaunchParams p;
    p.kernel = kernel(name);
    p.args = reinterpret_cast<const std::byte*>(&args);
    p.args_size = sizeof(A);
    return b_->launch(stream, p, tag);
  }

  Status stamp(uint32_t stream, uint64_t stamps, uint32_t index, uint32_t sleep_us) {
    return launch(stream, "ordo_stamp", StampArgs{stamps, index, sleep_us});
  }

  // Waits for all work enqueued so far on `stream`.
  bool sync(uint32_t stream) {
    Flag f;
    b_->host_callback(stream, f.setter());
    return f.wait(std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout));
  }

  uint64_t alloc(uint64_t size) {
    uint64_t addr = 0;
    EXPECT_EQ(b_->malloc(0, size, &addr), Status::kSuccess);
    return addr;
  }

  static MemOperand dev(uint64_t addr) { return {true, addr}; }
  template <class T>
  static MemOperand host(T* p) {
    return {false, reinterpret_cast<uintptr_t>(p)};
  }

  template <class T>
  std::vector<T> read(uint64_t addr, size_t n, uint32_t stream = 0) {
    std::vector<T> out(n);
    EXPECT_EQ(b_->memcpy(stream, host(out.data()), dev(addr), n * sizeof(T), {}), Status::kSuccess);
    EXPECT_TRUE(sync(stream));
    return out;
  }

  std::vector<Error> errors() {
    std::lock_guard lk(mu_);
    return errors_;
  }

  std::unique_ptr<Backend> b_;
  std::mutex mu_;
  std::vector<Error> errors_;
};

TEST_F(SimTest, Name) { EXPECT_EQ(b_->name(), "sim"); }

TEST_F(SimTest, StreamRunsWorkInFifoOrder) {
  constexpr uint32_t kN = 32;
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  const uint64_t stamps = alloc(kN * sizeof(Stamp));
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(stamp(1, stamps, i, i % 4 == 0 ? 200 : 0), Status::kSuccess);
  auto s = read<Stamp>(stamps, kN, 1);
  for (uint32_t i = 0; i < kN; ++i) {
    EXPECT_LT(s[i].start, s[i].end) << i;
    if (i > 0) {
      EXPECT_LT(s[i - 1].end, s[i].start) << i;
    }
  }
}

TEST_F(SimTest, NonBlockingStreamsOverlap) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);
  const uint64_t stamps = alloc(2 * sizeof(Stamp));
  ASSERT_EQ(stamp(1, stamps, 0, 30000), Status::kSuccess);  // slow, enqueued first
  ASSERT_EQ(stamp(2, stamps, 1, 0), Status::kSuccess);
  ASSERT_TRUE(sync(1));
  ASSERT_TRUE(sync(2));
  auto s = read<Stamp>(stamps, 2);
  EXPECT_LT(s[1].end, s[0].end);
}

TEST_F(SimTest, StreamWaitEventOrdersAcrossStreams) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(7, 0, 0), Status::kSuccess);
  const uint64_t stamps = alloc(2 * sizeof(Stamp));
  ASSERT_EQ(stamp(1, stamps, 0, 5000), Status::kSuccess);
  ASSERT_EQ(b_->event_record(1, 7), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(2, 7), Status::kSuccess);
  ASSERT_EQ(stamp(2, stamps, 1, 0), Status::kSuccess);
  ASSERT_TRUE(sync(2));
  auto s = read<Stamp>(stamps, 2, 2);
  EXPECT_GT(s[0].end, 0u);
  EXPECT_GT(s[1].start, s[0].end);
}

// A kernel that reads its input late must see the input as it was when it was
// launched if the overwrite waits for it through an event.
TEST_F(SimTest, SlowCopyReadsBeforeEventOrderedOverwrite) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(1, 0, 0), Status::kSuccess);
  const uint64_t src = alloc(64), dst = alloc(64);
  ASSERT_EQ(b_->memset(0, src, 0x11, 64, {}), Status::kSuccess);
  ASSERT_TRUE(sync(0));
  ASSERT_EQ(launch(1, "ordo_slow_copy", SlowCopyArgs{dst, src, 64, 5000, 0}), Status::kSuccess);
  ASSERT_EQ(b_->event_record(1, 1), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(2, 1), Status::kSuccess);
  ASSERT_EQ(b_->memset(2, src, 0xff, 64, {}), Status::kSuccess);
  ASSERT_TRUE(sync(2));
  for (uint8_t v : read<uint8_t>(dst, 64)) ASSERT_EQ(v, 0x11);
  for (uint8_t v : read<uint8_t>(src, 64)) ASSERT_EQ(v, 0xff);
}

// Copies and memsets of up to 4 MiB into an idle stream run on the calling
// thread (run_inline). Into a stream with unfinished work they wait their turn.
TEST_F(SimTest, ShortCopyIntoIdleStreamIsDoneOnReturn) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  const uint64_t x = alloc(64);
  // Idle means the stream's thread is asleep: give it time to get there, and
  // retry on a machine slow enough to miss that.
  bool done_on_return = false;
  // Static: a copy still queued when an assertion returns early writes here later.
  static std::array<uint8_t, 64> out;
  out.fill(0);
  for (int attempt = 0; attempt < 50 && !done_on_return; ++attempt) {
    ASSERT_TRUE(sync(1));
    std::this_thread::sleep_for(kSettle);
    const uint8_t value = uint8_t(attempt + 1);
    ASSERT_EQ(b_->memset(1, x, value, 64, {}), Status::kSuccess);
    ASSERT_EQ(b_->memcpy(1, host(out.data()), dev(x), 64, {}), Status::kSuccess);
    done_on_return = std::all_of(out.begin(), out.end(), [&](uint8_t v) { return v == value; });
  }
  ASSERT_TRUE(sync(1));
  EXPECT_TRUE(done_on_return) << "no copy into the idle stream was done when memcpy returned";
}

TEST_F(SimTest, ShortCopyIntoBusyStreamWaitsItsTurn) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  const uint64_t x = alloc(64);
  Gate gate;
  b_->host_callback(1, gate.waiter());
  ASSERT_EQ(b_->memset(1, x, 0x22, 64, {}), Status::kSuccess);
  static std::array<uint8_t, 64> out;  // static: the copy may still be queued when an assertion returns
  out.fill(0);
  ASSERT_EQ(b_->memcpy(1, host(out.data()), dev(x), 64, {}), Status::kSuccess);
  std::this_thread::sleep_for(kSettle);
  for (uint8_t v : out) ASSERT_EQ(v, 0);  // neither ran past the gate
  for (uint8_t v : read<uint8_t>(x, 64, 0)) ASSERT_EQ(v, 0);
  gate.open();
  ASSERT_TRUE(sync(1));
  for (uint8_t v : out) ASSERT_EQ(v, 0x22);  // in stream order: the memset, then the copy
}

TEST_F(SimTest, ShortCopiesKeepTheLegacyStreamsImplicitOrder) {
  ASSERT_EQ(b_->stream_create(1, 0, true, 0), Status::kSuccess);   // blocking
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);  // non-blocking: reads while the others wait
  // A memset on `on` must wait for work held on `held`; stream 2 looks.
  auto waits_for = [&](uint32_t held, uint32_t on, uint8_t value) {
    const uint64_t x = alloc(64);
    Gate gate;
    b_->host_callback(held, gate.waiter());
    ASSERT_EQ(b_->memset(on, x, value, 64, {}), Status::kSuccess);
    std::this_thread::sleep_for(kSettle);
    for (uint8_t v : read<uint8_t>(x, 64, 2)) ASSERT_EQ(v, 0) << "stream " << on << " ran past stream " << held;
    gate.open();
    ASSERT_TRUE(sync(on));
    for (uint8_t v : read<uint8_t>(x, 64, 2)) ASSERT_EQ(v, value);
  };
  waits_for(0, 1, 0x33);  // a blocking stream's copy follows the legacy stream's earlier work
  waits_for(1, 0, 0x44);  // the legacy stream's copy follows a blocking stream's earlier work
}

TEST_F(SimTest, WaitOnNeverRecordedEventIsNoop) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(3, 0, 0), Status::kSuccess);
  Gate gate;
  b_->host_callback(1, gate.waiter());
  ASSERT_EQ(b_->stream_wait_event(2, 3), Status::kSuccess);
  Flag done;
  b_->host_callback(2, done.setter());
  EXPECT_TRUE(done.wait(2000ms));
  EXPECT_EQ(b_->event_query(3), Status::kSuccess);
  gate.open();
}

TEST_F(SimTest, WaitCapturesTheRecordCurrentAtWaitTime) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);  // gated
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);  // waits
  ASSERT_EQ(b_->stream_create(3, 0, false, 0), Status::kSuccess);  // idle
  ASSERT_EQ(b_->event_create(1, 0, 0), Status::kSuccess);
  Gate gate;
  b_->host_callback(1, gate.waiter());

  // Recorded on the gated stream, then waited on: the wait holds stream 2 even
  // after the event is re-recorded on an idle stream.
  ASSERT_EQ(b_->event_record(1, 1), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(2, 1), Status::kSuccess);
  Flag held;
  b_->host_callback(2, held.setter());
  ASSERT_EQ(b_->event_record(3, 1), Status::kSuccess);
  ASSERT_TRUE(sync(3));
  EXPECT_EQ(b_->event_query(1), Status::kSuccess);
  EXPECT_FALSE(held.wait(kSettle));

  // Re-recorded on the idle stream before the wait: the wait does not block.
  ASSERT_EQ(b_->event_record(1, 1), Status::kSuccess);
  ASSERT_EQ(b_->event_record(3, 1), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(4, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(4, 1), Status::kSuccess);
  Flag free_run;
  b_->host_callback(4, free_run.setter());
  EXPECT_TRUE(free_run.wait(2000ms));
  EXPECT_FALSE(held.set());

  gate.open();
  EXPECT_TRUE(held.wait(2000ms));
}

TEST_F(SimTest, LegacyStreamWaitsForBlockingStreamsOnly) {
  ASSERT_EQ(b_->stream_create(1, 0, true, 0), Status::kSuccess);   // blocking
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);  // non-blocking
  Gate blocking_gate, nonblocking_gate;

  // Stream 0 does not wait for a non-blocking stream.
  b_->host_callback(2, nonblocking_gate.waiter());
  Flag a;
  b_->host_callback(0, a.setter());
  EXPECT_TRUE(a.wait(2000ms));

  // Stream 0 waits for a blocking stream.
  b_->host_callback(1, blocking_gate.waiter());
  Flag c;
  b_->host_callback(0, c.setter());
  EXPECT_FALSE(c.wait(kSettle));
  blocking_gate.open();
  EXPECT_TRUE(c.wait(2000ms));
  nonblocking_gate.open();
}

TEST_F(SimTest, BlockingStreamsWaitForLegacyStream) {
  ASSERT_EQ(b_->stream_create(2, 0, false, 0), Status::kSuccess);  // non-blocking
  Gate gate;
  b_->host_callback(0, gate.waiter());
  // Created after the legacy work was enqueued: still waits for it.
  ASSERT_EQ(b_->stream_create(1, 0, true, 0), Status::kSuccess);
  Flag blocked, free_run;
  b_->host_callback(1, blocked.setter());
  b_->host_callback(2, free_run.setter());
  EXPECT_TRUE(free_run.wait(2000ms));
  EXPECT_FALSE(blocked.wait(kSettle));
  gate.open();
  EXPECT_TRUE(blocked.wait(2000ms));
}

// Only work enqueued *earlier* counts: legacy work does not wait for blocking
// work enqueued after it, and vice versa.
TEST_F(SimTest, LegacySyncOnlyCoversEarlierWork) {
  ASSERT_EQ(b_->stream_create(1, 0, true, 0), Status::kSuccess);
  Flag legacy;
  b_->host_callback(0, legacy.setter());
  Gate gate;
  b_->host_callback(1, gate.waiter());
  EXPECT_TRUE(legacy.wait(2000ms));
  // Stream 0 now waits for the gated blocking work; later blocking work on
  // another blocking stream waits for that legacy work in turn (transitively).
  Flag legacy2, blocking2;
  b_->host_callback(0, legacy2.setter());
  ASSERT_EQ(b_->stream_create(3, 0, true, 0), Status::kSuccess);
  b_->host_callback(3, blocking2.setter());
  EXPECT_FALSE(legacy2.wait(kSettle));
  EXPECT_FALSE(blocking2.set());
  gate.open();
  EXPECT_TRUE(legacy2.wait(2000ms));
  EXPECT_TRUE(blocking2.wait(2000ms));
}

TEST_F(SimTest, LegacyStreamWaitsForDestroyedBlockingStream) {
  ASSERT_EQ(b_->stream_create(1, 0, true, 0), Status::kSuccess);
  Gate gate;
  b_->host_callback(1, gate.waiter());
  ASSERT_EQ(b_->stream_destroy(1), Status::kSuccess);
  Flag legacy;
  b_->host_callback(0, legacy.setter());
  EXPECT_FALSE(legacy.wait(kSettle));
  gate.open();
  EXPECT_TRUE(legacy.wait(2000ms));
}

TEST_F(SimTest, EventQueryNotReadyThenSuccess) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(5, 0, 0), Status::kSuccess);
  EXPECT_EQ(b_->event_query(5), Status::kSuccess);  // never recorded
  EXPECT_EQ(b_->event_query(6), Status::kInvalidResourceHandle);
  Gate gate;
  b_->host_callback(1, gate.waiter());
  ASSERT_EQ(b_->event_record(1, 5), Status::kSuccess);
  EXPECT_EQ(b_->event_query(5), Status::kNotReady);
  Flag notified;
  b_->event_notify(5, notified.setter());
  EXPECT_FALSE(notified.wait(kSettle));
  EXPECT_EQ(b_->event_query(5), Status::kNotReady);
  gate.open();
  EXPECT_TRUE(notified.wait(2000ms));
  EXPECT_EQ(b_->event_query(5), Status::kSuccess);
}

TEST_F(SimTest, EventNotifyRunsAtOnceWhenNothingPending) {
  ASSERT_EQ(b_->event_create(1, 0, 0), Status::kSuccess);
  bool ran = false;
  b_->event_notify(1, [&] { ran = true; });  // never recorded
  EXPECT_TRUE(ran);
  ASSERT_EQ(b_->event_record(0, 1), Status::kSuccess);
  ASSERT_TRUE(sync(0));
  ran = false;
  b_->event_notify(1, [&] { ran = true; });  // complete
  EXPECT_TRUE(ran);
}

TEST_F(SimTest, EventElapsed) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(1, 0, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(2, 0, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(3, 0, 0x2), Status::kSuccess);  // cudaEventDisableTiming
  float ms = -1;
  EXPECT_EQ(b_->event_elapsed(1, 2, &ms), Status::kInvalidResourceHandle);  // never recorded
  EXPECT_EQ(b_->event_elapsed(1, 9, &ms), Status::kInvalidResourceHandle);

  const uint64_t stamps = alloc(sizeof(Stamp));
  ASSERT_EQ(b_->event_record(1, 1), Status::kSuccess);
  ASSERT_EQ(stamp(1, stamps, 0, 5000), Status::kSuccess);
  ASSERT_EQ(b_->event_record(1, 2), Status::kSuccess);
  ASSERT_EQ(b_->event_record(1, 3), Status::kSuccess);
  EXPECT_EQ(b_->event_elapsed(1, 2, &ms), Status::kNotReady);
  ASSERT_TRUE(sync(1));
  ASSERT_EQ(b_->event_elapsed(1, 2, &ms), Status::kSuccess);
  EXPECT_GE(ms, 4.5f);
  EXPECT_LT(ms, 1000.f);
  EXPECT_EQ(b_->event_elapsed(1, 3, &ms), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_elapsed(1, 2, nullptr), Status::kInvalidValue);
}

TEST_F(SimTest, EventIdsAndDestroy) {
  EXPECT_EQ(b_->event_create(kMaxBackendEvents, 0, 0), Status::kInvalidValue);
  ASSERT_EQ(b_->event_create(65535, 0, 0), Status::kSuccess);
  EXPECT_EQ(b_->event_create(65535, 0, 0), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_record(0, 4), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_record(9, 65535), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_wait_event(0, 4), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_destroy(65535), Status::kSuccess);
  EXPECT_EQ(b_->event_destroy(65535), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_query(65535), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_create(65535, 0, 0), Status::kSuccess);
}

TEST_F(SimTest, HostCallbackIsOrderedInItsStream) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  const uint64_t counter = alloc(sizeof(uint64_t));
  uint64_t before = 0, seen = 0, fed = 0;
  ASSERT_EQ(launch(1, "ordo_add_u64", AddU64Args{counter, 41}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(1, host(&before), dev(counter), 8, {}), Status::kSuccess);
  b_->host_callback(1, [&] {
    std::this_thread::sleep_for(2ms);  // later work must wait for this to return
    seen = before;
    fed = 1000;
  });
  ASSERT_EQ(b_->memcpy(1, dev(counter), host(&fed), 8, {}), Status::kSuccess);
  ASSERT_EQ(launch(1, "ordo_add_u64", AddU64Args{counter, 1}), Status::kSuccess);
  ASSERT_TRUE(sync(1));
  EXPECT_EQ(seen, 41u);
  EXPECT_EQ(read<uint64_t>(counter, 1)[0], 1001u);
}

TEST_F(SimTest, MemcpyAllDirectionsAndMemset) {
  constexpr size_t kN = 1000;
  std::vector<uint32_t> in(kN), out(kN, 0), h2h(kN, 0);
  for (size_t i = 0; i < kN; ++i) in[i] = static_cast<uint32_t>(i * 2654435761u);
  const uint64_t a = alloc(kN * 4), c = alloc(kN * 4);
  EXPECT_NE(a, c);
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(read<uint32_t>(a, kN), std::vector<uint32_t>(kN, 0));  // zeroed
  ASSERT_EQ(b_->memcpy(0, dev(a), host(in.data()), kN * 4, {}), Status::kSuccess);  // H2D
  ASSERT_EQ(b_->memcpy(0, dev(c), dev(a), kN * 4, {}), Status::kSuccess);           // D2D
  ASSERT_EQ(b_->memcpy(0, host(out.data()), dev(c), kN * 4, {}), Status::kSuccess);  // D2H
  ASSERT_EQ(b_->memcpy(0, host(h2h.data()), host(in.data()), kN * 4, {}), Status::kSuccess);
  ASSERT_TRUE(sync(0));
  EXPECT_EQ(out, in);
  EXPECT_EQ(h2h, in);

  // Sub-ranges: memset the middle, copy inside one allocation.
  ASSERT_EQ(b_->memset(0, c + 40, 0xab, 8, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, dev(c), dev(c + 4), 4, {}), Status::kSuccess);
  auto got = read<uint32_t>(c, kN);
  EXPECT_EQ(got[0], in[1]);
  EXPECT_EQ(got[9], in[9]);
  EXPECT_EQ(got[10], 0xababababu);
  EXPECT_EQ(got[11], 0xababababu);
  EXPECT_EQ(got[12], in[12]);

  // Zero-sized copies succeed and touch nothing.
  EXPECT_EQ(b_->memcpy(0, dev(0), dev(0), 0, {}), Status::kSuccess);
  EXPECT_EQ(b_->memset(0, 0, 1, 0, {}), Status::kSuccess);
}

TEST_F(SimTest, LargeAllocationIsZeroedAndUsable) {
  constexpr uint64_t kSize = uint64_t{8} << 20;
  const uint64_t a = alloc(kSize);
  const uint64_t tail = a + kSize - 16;
  EXPECT_EQ(read<uint8_t>(tail, 16), std::vector<uint8_t>(16, 0));
  ASSERT_EQ(b_->memset(0, tail, 7, 16, {}), Status::kSuccess);
  EXPECT_EQ(read<uint8_t>(tail, 16), std::vector<uint8_t>(16, 7));
  EXPECT_EQ(b_->free(a), Status::kSuccess);
}

TEST_F(SimTest, KernelsComputeResults) {
  constexpr uint64_t kN = 257;
  std::vector<float> x(kN), y(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 0.5f * static_cast<float>(i);
  }
  const uint64_t a = alloc(kN * 4), bb = alloc(kN * 4), c = alloc(kN * 4), f = alloc(kN * 4);
  ASSERT_EQ(b_->memcpy(0, dev(a), host(x.data()), kN * 4, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, dev(bb), host(y.data()), kN * 4, {}), Status::kSuccess);
  ASSERT_EQ(launch(0, "ordo_vec_add", VecAddArgs{a, bb, c, kN}), Status::kSuccess);
  ASSERT_EQ(launch(0, "ordo_fill_u32", FillU32Args{f, kN - 1, 0xdeadbeef, 0}), Status::kSuccess);
  LaunchParams noop;
  noop.kernel = kernel("ordo_noop");
  ASSERT_EQ(b_->launch(0, noop, {}), Status::kSuccess);  // no arguments at all
  auto sum = read<float>(c, kN);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(sum[i], 1.5f * static_cast<float>(i));
  auto fill = read<uint32_t>(f, kN);
  for (uint64_t i = 0; i + 1 < kN; ++i) ASSERT_EQ(fill[i], 0xdeadbeefu);
  EXPECT_EQ(fill[kN - 1], 0u);
  EXPECT_TRUE(errors().empty());
}

TEST_F(SimTest, InvalidRangesRejected) {
  const uint64_t a = alloc(100);
  uint8_t buf[256] = {};
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  auto copy_in = [&](uint64_t addr, uint64_t size) {
    return b_->memcpy(0, dev(addr), host(buf), size, {});
  };
  auto copy_out = [&](uint64_t addr, uint64_t size) {
    return b_->memcpy(0, host(buf), dev(addr), size, {});
  };
  EXPECT_EQ(copy_in(a, 100), Status::kSuccess);
  EXPECT_EQ(copy_in(a + 99, 1), Status::kSuccess);
  EXPECT_EQ(copy_in(a + 50, 51), Status::kInvalidValue);  // straddles the end
  EXPECT_EQ(copy_out(a, 101), Status::kInvalidValue);
  EXPECT_EQ(copy_in(a + 100, 1), Status::kInvalidDevicePointer);  // one past the end
  EXPECT_EQ(copy_in(a - 1, 2), Status::kInvalidDevicePointer);     // before the start
  EXPECT_EQ(copy_in(0, 1), Status::kInvalidDevicePointer);
  EXPECT_EQ(copy_in(reinterpret_cast<uintptr_t>(buf), 1), Status::kInvalidDevicePointer);  // host ptr
  EXPECT_EQ(copy_in(a + 10, kMax), Status::kInvalidValue);          // size overflows
  EXPECT_EQ(copy_in(a + 10, kMax - 9), Status::kInvalidValue);      // wraps to a
  EXPECT_EQ(copy_in(kMax, 1), Status::kInvalidDevicePointer);
  EXPECT_EQ(copy_in(kMax - 10, 100), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memcpy(0, dev(a), dev(a + 50), 60, {}), Status::kInvalidValue);
  EXPECT_EQ(b_->memcpy(0, dev(a), host<uint8_t>(nullptr), 1, {}), Status::kInvalidValue);
  EXPECT_EQ(b_->memset(0, a + 1, 0, 100, {}), Status::kInvalidValue);
  EXPECT_EQ(b_->memset(0, a + 4096, 0, 1, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memset(0, a, 0, kMax, {}), Status::kInvalidValue);

  // A range straddling two adjacent allocations is not inside one.
  const uint64_t next = alloc(100);
  EXPECT_EQ(b_->memset(0, a, 0, next + 100 - a, {}), Status::kInvalidValue);

  EXPECT_EQ(b_->free(a + 1), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->free(12345), Status::kInvalidDevicePointer);
  uint64_t addr = 0;
  EXPECT_EQ(b_->malloc(0, 0, &addr), Status::kInvalidValue);
  EXPECT_EQ(b_->malloc(0, (uint64_t{64} << 30) + 1, &addr), Status::kInvalidValue);
  EXPECT_EQ(b_->malloc(0, kMax, &addr), Status::kInvalidValue);
  EXPECT_EQ(b_->malloc(0, 16, nullptr), Status::kInvalidValue);
  ASSERT_TRUE(sync(0));
  EXPECT_TRUE(errors().empty());
}

TEST_F(SimTest, FreedMemoryRejected) {
  const uint64_t a = alloc(64);
  ASSERT_EQ(b_->free(a), Status::kSuccess);
  EXPECT_EQ(b_->free(a), Status::kInvalidDevicePointer);
  uint8_t buf[64] = {};
  EXPECT_EQ(b_->memcpy(0, dev(a), host(buf), 64, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memset(0, a, 0, 1, {}), Status::kInvalidDevicePointer);
  const uint64_t c = alloc(64);
  EXPECT_NE(c, a);  // addresses are never reused
  EXPECT_EQ(b_->memcpy(0, dev(a), dev(c), 8, {}), Status::kInvalidDevicePointer);

  // A kernel handed freed memory fails asynchronously.
  OpTag tag{1, 2, 3, 4};
  ASSERT_EQ(launch(0, "ordo_add_u64", AddU64Args{a, 1}, tag), Status::kSuccess);
  ASSERT_TRUE(sync(0));
  auto errs = errors();
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].status, Status::kIllegalAddress);
  EXPECT_EQ(errs[0].tag.pos, 3u);
}

void throws_runtime_error(KernelContext&) { throw std::runtime_error("boom"); }
void throws_illegal_state(KernelContext&) { throw KernelError(Status::kIllegalState, "bad"); }

TEST_F(SimTest, KernelErrorsReportedWithTag) {
  register_kernel("test_throws_runtime_error", &throws_runtime_error);
  register_kernel("test_throws_illegal_state", &throws_illegal_state);
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  const uint64_t buf = alloc(16);
  const uint64_t counter = alloc(8);

  OpTag t1{1, 10, 100, 7}, t2{2, 20, 200, 8}, t3{3, 30, 300, 9}, t4{4, 40, 400, 10}, t5{5, 50, 500, 11};
  ASSERT_EQ(launch(1, "ordo_fill_u32", FillU32Args{buf, 5, 1, 0}, t1), Status::kSuccess);  // 20 > 16 bytes
  ASSERT_EQ(launch(1, "test_throws_runtime_error", NoopArgs{}, t2), Status::kSuccess);
  ASSERT_EQ(launch(1, "test_throws_illegal_state", NoopArgs{}, t3), Status::kSuccess);
  ASSERT_EQ(launch(1, "ordo_add_u64", uint32_t{0}, t4), Status::kSuccess);  // wrong args size
  ASSERT_EQ(launch(1, "ordo_add_u64", AddU64Args{counter + 1, 1}, t5), Status::kSuccess);  // misaligned
  ASSERT_EQ(launch(1, "ordo_add_u64", AddU64Args{counter, 5}), Status::kSuccess);  // still runs
  EXPECT_EQ(read<uint64_t>(counter, 1, 1)[0], 5u);

  auto errs = errors();
  ASSERT_EQ(errs.size(), 5u);
  const std::pair<OpTag, Status> want[] = {{t1, Status::kIllegalAddress},
                                           {t2, Status::kLaunchFailure},
                                           {t3, Status::kIllegalState},
                                           {t4, Status::kInvalidValue},
                                           {t5, Status::kMisalignedAddress}};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(errs[i].status, want[i].second) << i;
    EXPECT_EQ(errs[i].tag.ring, want[i].first.ring) << i;
    EXPECT_EQ(errs[i].tag.thread, want[i].first.thread) << i;
    EXPECT_EQ(errs[i].tag.pos, want[i].first.pos) << i;
    EXPECT_EQ(errs[i].tag.op, want[i].first.op) << i;
  }
}

TEST_F(SimTest, LaunchValidation) {
  uint32_t id = 0;
  EXPECT_EQ(b_->kernel_lookup(0, "no_such_kernel", &id), Status::kInvalidDeviceFunction);
  LaunchParams p;
  p.kernel = 1u << 30;
  EXPECT_EQ(b_->launch(0, p, {}), Status::kInvalidDeviceFunction);
  p.kernel = kernel("ordo_noop");
  EXPECT_EQ(b_->launch(99, p, {}), Status::kInvalidResourceHandle);
  p.grid.y = 0;
  EXPECT_EQ(b_->launch(0, p, {}), Status::kInvalidConfiguration);
  p.grid.y = 1;
  p.block.x = 2048;
  EXPECT_EQ(b_->launch(0, p, {}), Status::kInvalidConfiguration);
  p.block.x = 1;
  p.args_size = 4;
  EXPECT_EQ(b_->launch(0, p, {}), Status::kInvalidValue);  // null args
}

// Arguments are copied at launch(): the caller may reuse its buffer at once.
TEST_F(SimTest, LaunchCopiesArguments) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  Gate gate;
  b_->host_callback(1, gate.waiter());
  const uint64_t counter = alloc(8);
  std::vector<std::byte> big(200);  // larger than any inline buffer
  AddU64Args args{counter, 3};
  LaunchParams p;
  p.kernel = kernel("ordo_add_u64");
  p.args = reinterpret_cast<const std::byte*>(&args);
  p.args_size = sizeof(args);
  ASSERT_EQ(b_->launch(1, p, {}), Status::kSuccess);
  args.value = 1000;
  args.counter = 0;
  register_kernel("test_big_args", [](KernelContext& ctx) {
    auto a = ctx.args<std::array<std::byte, 200>>();
    if (a[199] != std::byte{42}) throw KernelError(Status::kInvalidValue, "bad args");
  });
  big[199] = std::byte{42};
  p.kernel = kernel("test_big_args");
  p.args = big.data();
  p.args_size = 200;
  OpTag tag{9, 9, 9, 9};
  ASSERT_EQ(b_->launch(1, p, tag), Status::kSuccess);
  big[199] = std::byte{0};
  gate.open();
  EXPECT_EQ(read<uint64_t>(counter, 1, 1)[0], 3u);
  EXPECT_TRUE(errors().empty());
}

TEST_F(SimTest, StreamIds) {
  EXPECT_EQ(b_->stream_create(0, 0, false, 0), Status::kInvalidResourceHandle);  // exists
  EXPECT_EQ(b_->stream_create(kMaxStreams, 0, false, 0), Status::kInvalidValue);
  ASSERT_EQ(b_->stream_create(kMaxStreams - 1, 0, false, 0), Status::kSuccess);
  EXPECT_EQ(b_->stream_create(kMaxStreams - 1, 0, true, 0), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_destroy(0), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_destroy(17), Status::kInvalidResourceHandle);
  uint8_t x = 0;
  EXPECT_EQ(b_->memcpy(17, host(&x), host(&x), 1, {}), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->memcpy(1000, host(&x), host(&x), 1, {}), Status::kInvalidResourceHandle);
  ASSERT_EQ(b_->stream_destroy(kMaxStreams - 1), Status::kSuccess);
  EXPECT_EQ(b_->stream_destroy(kMaxStreams - 1), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->memcpy(kMaxStreams - 1, host(&x), host(&x), 1, {}), Status::kInvalidResourceHandle);
  ASSERT_EQ(b_->stream_create(kMaxStreams - 1, 0, true, 0), Status::kSuccess);  // id reused
  EXPECT_TRUE(sync(kMaxStreams - 1));
}

TEST_F(SimTest, DestroyedStreamFinishesPendingWork) {
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(1, 0, 0), Status::kSuccess);
  const uint64_t counter = alloc(8);
  Gate gate;
  b_->host_callback(1, gate.waiter());
  for (int i = 0; i < 10; ++i) ASSERT_EQ(launch(1, "ordo_add_u64", AddU64Args{counter, 1}), Status::kSuccess);
  ASSERT_EQ(b_->event_record(1, 1), Status::kSuccess);
  ASSERT_EQ(b_->stream_destroy(1), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(1, 0, false, 0), Status::kSuccess);  // a new stream, same id
  ASSERT_TRUE(sync(1));
  EXPECT_EQ(b_->event_query(1), Status::kNotReady);
  ASSERT_EQ(b_->stream_wait_event(0, 1), Status::kSuccess);
  Flag notified;
  b_->event_notify(1, notified.setter());
  gate.open();
  EXPECT_TRUE(notified.wait(2000ms));
  EXPECT_EQ(read<uint64_t>(counter, 1)[0], 10u);
  EXPECT_EQ(b_->event_query(1), Status::kSuccess);
}

TEST(SimBackend, DestructorDrainsAllStreams) {
  std::atomic<int> ran{0};
  {
    auto b = make_sim_backend();
    for (uint32_t s = 1; s <= 4; ++s) {
      ASSERT_EQ(b->stream_create(s, 0, s % 2 == 0, 0), Status::kSuccess);
      for (int i = 0; i < 3; ++i) {
        b->host_callback(s, [&] {
          std::this_thread::sleep_for(1ms);
          ran.fetch_add(1);
        });
      }
    }
    ASSERT_EQ(b->stream_destroy(3), Status::kSuccess);
    b->host_callback(0, [&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 13);
}

TEST(SimBackend, BuiltinRegistrationIsIdempotent) {
  auto b = make_sim_backend();
  uint32_t stamp_id = 0;
  ASSERT_EQ(b->kernel_lookup(0, "ordo_stamp", &stamp_id), Status::kSuccess);
  EXPECT_EQ(b->kernel_lookup(0, "ordo_stamp", nullptr), Status::kInvalidValue);
  register_builtin_kernels();  // idempotent: ids do not change
  uint32_t again = 0;
  ASSERT_EQ(b->kernel_lookup(0, "ordo_stamp", &again), Status::kSuccess);
  EXPECT_EQ(again, stamp_id);
}

// Many streams, cross-stream event waits and legacy synchronization at once:
// every add lands exactly once and the final chain sees all of them.
TEST_F(SimTest, ConcurrentChainsStress) {
  constexpr uint32_t kStreams = 6;
  constexpr int kRounds = 300;
  const uint64_t counters = alloc(kStreams * 8);
  for (uint32_t s = 1; s <= kStreams; ++s) {
    ASSERT_EQ(b_->stream_create(s, 0, s % 2 == 0, 0), Status::kSuccess);
    ASSERT_EQ(b_->event_create(s, 0, 0), Status::kSuccess);
  }
  for (int r = 0; r < kRounds; ++r) {
    for (uint32_t s = 1; s <= kStreams; ++s) {
      // Each stream's counter is touched only by its own stream and stream 0 (which
      // is ordered with it through the event waits below).
      ASSERT_EQ(launch(s, "ordo_add_u64", AddU64Args{counters + (s - 1) * 8, 1}), Status::kSuccess);
      ASSERT_EQ(b_->event_record(s, s), Status::kSuccess);
      const uint32_t next = s % kStreams + 1;
      ASSERT_EQ(b_->stream_wait_event(next, s), Status::kSuccess);
    }
    if (r % 50 == 0) {
      for (uint32_t s = 1; s <= kStreams; ++s) ASSERT_EQ(b_->stream_wait_event(0, s), Status::kSuccess);
      ASSERT_EQ(launch(0, "ordo_add_u64", AddU64Args{counters, 1000}), Status::kSuccess);
      ASSERT_EQ(b_->event_record(0, 1), Status::kSuccess);
      ASSERT_EQ(b_->stream_wait_event(1, 1), Status::kSuccess);
    }
  }
  for (uint32_t s = 1; s <= kStreams; ++s) ASSERT_EQ(b_->stream_wait_event(0, s), Status::kSuccess);
  auto c = read<uint64_t>(counters, kStreams);
  EXPECT_EQ(c[0], kRounds + 6 * 1000u);
  for (uint32_t s = 1; s < kStreams; ++s) EXPECT_EQ(c[s], uint64_t{kRounds}) << s;
  EXPECT_TRUE(errors().empty());
}

}  // namespace
}  // namespace ordo::sim

// Regression tests for reported ordering and lifetime bugs. Each runs against a
// real ordo-worker process; a hang is turned into a failure by a watchdog that
// kills the worker (the client's calls then fail with kDevicesUnavailable once
// the heartbeat stops) and, as a last resort, ends the process.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "guest/testing.h"
#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kBytes = 4096;
constexpr uint8_t kOld = 0x11, kNew = 0x22;

ClientOptions quick_timeout() {
  ClientOptions o;
  o.worker_timeout = 2000ms;
  return o;
}

// Runs `body` on its own thread. If it is not done within `limit`, the test
// fails, the worker is killed (so that waiting calls fail instead of waiting
// forever), and if the body still does not return the process exits.
void with_deadline(WorkerProcess& w, std::chrono::seconds limit, const std::function<void()>& body) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread t([&] {
    body();
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  if (!cv.wait_for(lock, limit, [&] { return done; })) {
    ADD_FAILURE() << "hang: the test body did not finish within " << limit.count()
                  << " s; killing the worker";
    kill(w.pid(), SIGKILL);
    if (!cv.wait_for(lock, 10s, [&] { return done; })) {
      std::fprintf(stderr, "[  FAILED  ] %s: still hung after the worker was killed\n",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
      std::fflush(stderr);
      _exit(1);
    }
  }
  lock.unlock();
  t.join();
}

std::vector<uint8_t> bytes(uint8_t v, uint64_t n = kBytes) { return std::vector<uint8_t>(n, v); }

// A device buffer of `size` zero bytes, ready (0 and a test failure if not).
uint64_t zeroed(Client& c, uint64_t size) {
  uint64_t d = 0;
  EXPECT_EQ(c.malloc(&d, size), Status::kSuccess);
  EXPECT_EQ(c.memset_async(d, 0, size, kLegacyStream), Status::kSuccess);
  EXPECT_EQ(c.device_synchronize(), Status::kSuccess);
  return d;
}

// Reads device memory without any device-wide synchronization: on a
// non-blocking stream into pinned memory, then a sync of that stream only.
std::vector<uint8_t> peek(Client& c, Stream side, void* pinned, uint64_t src) {
  EXPECT_EQ(c.memcpy_d2h_async(pinned, src, kBytes, side), Status::kSuccess);
  EXPECT_EQ(c.stream_synchronize(side), Status::kSuccess);
  const auto* p = static_cast<const uint8_t*>(pinned);
  return std::vector<uint8_t>(p, p + kBytes);
}

// cudaDeviceSynchronize waits for all work issued before it, including work on
// streams that were destroyed (cudaStreamDestroy returns at once; the work goes on).
TEST(Regress, DestroyedStreamWorkIsWaitedFor) {
  WorkerProcess w;
  auto c = w.attach(quick_timeout());
  with_deadline(w, 20s, [&] {
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    uint64_t x = 0, out = 0;
    ASSERT_EQ(c->malloc(&x, kBytes), Status::kSuccess);
    ASSERT_EQ(c->malloc(&out, kBytes), Status::kSuccess);
    void* pinned = nullptr;
    ASSERT_EQ(c->malloc_host(&pinned, kBytes), Status::kSuccess);
    Stream side;
    ASSERT_EQ(c->stream_create(&side, kStreamNonBlocking), Status::kSuccess);
    const auto old_x = bytes(kOld);
    ASSERT_EQ(c->memcpy_h2d(x, old_x.data(), kBytes), Status::kSuccess);
    int unfinished = 0;
    constexpr int kIterations = 10;
    for (int i = 0; i < kIterations; ++i) {
      ASSERT_EQ(c->memset_async(out, 0, kBytes, kLegacyStream), Status::kSuccess);
      ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
      Stream a;
      ASSERT_EQ(c->stream_create(&a, i % 2 ? 0 : kStreamNonBlocking), Status::kSuccess);
      sim::SlowCopyArgs args{out, x, kBytes, 3000, 0};
      ASSERT_EQ(c->launch(k, {1}, {1}, &args, sizeof args, a), Status::kSuccess);
      ASSERT_EQ(c->stream_destroy(a), Status::kSuccess);
      ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
      unfinished += peek(*c, side, pinned, out) != old_x;
    }
    EXPECT_EQ(unfinished, 0) << "device_synchronize returned before a destroyed stream's kernel finished in "
                             << unfinished << " of " << kIterations << " iterations";
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
    ASSERT_EQ(c->stream_destroy(side), Status::kSuccess);
    EXPECT_EQ(c->free_host(pinned), Status::kSuccess);
    EXPECT_EQ(c->free(x), Status::kSuccess);
    EXPECT_EQ(c->free(out), Status::kSuccess);
  });
}

// cudaFree synchronizes the device first, destroyed streams included: a kernel
// still reading the buffer on a destroyed stream finishes before the memory goes.
TEST(Regress, FreeWaitsForDestroyedStreamWork) {
  WorkerProcess w;
  auto c = w.attach(quick_timeout());
  with_deadline(w, 20s, [&] {
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    const auto old_x = bytes(kOld);
    int bad_out = 0, errors = 0;
    std::string first;
    auto check = [&](Status s, const char* what, int i) {
      if (s == Status::kSuccess) return;
      if (!errors++) first = std::string(what) + " in iteration " + std::to_string(i) + ": " + std::string(status_name(s));
    };
    constexpr int kIterations = 10;
    for (int i = 0; i < kIterations; ++i) {
      uint64_t x = 0, out = 0;
      ASSERT_EQ(c->malloc(&x, kBytes), Status::kSuccess);
      ASSERT_EQ(c->malloc(&out, kBytes), Status::kSuccess);
      ASSERT_EQ(c->memcpy_h2d(x, old_x.data(), kBytes), Status::kSuccess);
      Stream a;
      ASSERT_EQ(c->stream_create(&a, kStreamNonBlocking), Status::kSuccess);
      sim::SlowCopyArgs args{out, x, kBytes, 3000, 0};
      ASSERT_EQ(c->launch(k, {1}, {1}, &args, sizeof args, a), Status::kSuccess);
      ASSERT_EQ(c->stream_destroy(a), Status::kSuccess);
      check(c->free(x), "free", i);
      std::this_thread::sleep_for(10ms);  // the kernel is done (or has failed) by now
      check(c->device_synchronize(), "device_synchronize after free", i);
      check(c->get_last_error(), "get_last_error after free", i);
      std::vector<uint8_t> got(kBytes);
      check(c->memcpy_d2h(got.data(), out, kBytes), "memcpy_d2h", i);
      bad_out += got != old_x;
      check(c->free(out), "free(out)", i);
    }
    EXPECT_EQ(errors, 0) << "calls failed after freeing memory a destroyed stream's kernel still used; first: "
                         << first;
    EXPECT_EQ(bad_out, 0) << "the kernel did not copy its input in " << bad_out << " of " << kIterations
                          << " iterations";
  });
}

// A stream created right after another was destroyed (on the same ring: the
// lowest free one) must synchronize normally, although the old stream had a
// completion fence (queued by stream_query) behind slow work outstanding.
// kSettle: B's work is fenced at once and waited for only after A's slow
// kernel is certainly done. kPageable: B's pageable copy finishes close to
// A's kernel, on either side of it.
enum class Reuse { kSettle, kPageable };

void ring_reuse(Reuse mode) {
  WorkerProcess w;
  auto c = w.attach(quick_timeout());
  with_deadline(w, 10s, [&] {
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    uint64_t x = 0, out_a = 0, out_b = 0;
    ASSERT_EQ(c->malloc(&x, kBytes), Status::kSuccess);
    ASSERT_EQ(c->malloc(&out_a, kBytes), Status::kSuccess);
    ASSERT_EQ(c->malloc(&out_b, kBytes), Status::kSuccess);
    const auto old_x = bytes(kOld);
    ASSERT_EQ(c->memcpy_h2d(x, old_x.data(), kBytes), Status::kSuccess);
    // Occupy every ring but one (and the legacy ring): B can only get A's ring,
    // which ordo hands out again once A's pending work is done.
    std::vector<Stream> fillers(c->layout().ring_count - 2);
    for (auto& f : fillers) ASSERT_EQ(c->stream_create(&f), Status::kSuccess);
    std::mt19937 rng(11);
    int reused = 0, wrong = 0;
    const int iterations = mode == Reuse::kSettle ? 10 : 40;
    for (int i = 0; i < iterations; ++i) {
      Stream a, b;
      ASSERT_EQ(c->stream_create(&a), Status::kSuccess);
      const uint32_t ring_a = guest::ring_of_stream(*c, a);
      sim::SlowCopyArgs slow{out_a, x, kBytes, 3000, 0};
      ASSERT_EQ(c->launch(k, {1}, {1}, &slow, sizeof slow, a), Status::kSuccess);
      EXPECT_EQ(c->stream_query(a), Status::kNotReady);  // queues a completion fence
      ASSERT_EQ(c->stream_destroy(a), Status::kSuccess);
      ASSERT_EQ(c->stream_create(&b), Status::kSuccess);
      reused += guest::ring_of_stream(*c, b) == ring_a;
      if (mode == Reuse::kSettle) {
        sim::SlowCopyArgs quick{out_b, x, kBytes, 0, 0};
        ASSERT_EQ(c->launch(k, {1}, {1}, &quick, sizeof quick, b), Status::kSuccess);
        const Status q = c->stream_query(b);  // fences B's kernel now
        EXPECT_TRUE(q == Status::kNotReady || q == Status::kSuccess) << status_name(q);
        std::this_thread::sleep_for(8ms);  // B's fence and then A's kernel are done
        ASSERT_EQ(c->stream_synchronize(b), Status::kSuccess) << "iteration " << i;
      } else {
        const uint32_t us = uint32_t(std::uniform_int_distribution<>(2400, 3000)(rng));
        sim::SlowCopyArgs quick{out_b, x, kBytes, us, 0};
        ASSERT_EQ(c->launch(k, {1}, {1}, &quick, sizeof quick, b), Status::kSuccess);
        std::vector<uint8_t> got(kBytes);
        ASSERT_EQ(c->memcpy_d2h_async(got.data(), out_b, kBytes, b), Status::kSuccess) << "iteration " << i;
        wrong += got != old_x;
      }
      ASSERT_EQ(c->stream_destroy(b), Status::kSuccess);
      ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
    }
    EXPECT_GT(reused, 0) << "no iteration reused the destroyed stream's ring: the test checks nothing";
    for (auto& f : fillers) EXPECT_EQ(c->stream_destroy(f), Status::kSuccess);
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  });
}

TEST(Regress, RingReuseDoesNotHang) { ring_reuse(Reuse::kSettle); }
TEST(Regress, RingReuseDoesNotHangPageableCopy) { ring_reuse(Reuse::kPageable); }

// More guest threads than reply slots: every call still works, no kernel is
// silently dropped, and no call fails for lack of a slot.
TEST(Regress, MoreThreadsThanSlots) {
  WorkerProcess w;
  auto c = w.attach(quick_timeout());
  with_deadline(w, 20s, [&] {
    const uint32_t k = kernel(*c, "ordo_stamp");
    const uint32_t n = c->layout().slot_count + 16;
    const uint64_t stamps = zeroed(*c, n * sizeof(sim::Stamp));
    ASSERT_NE(stamps, 0u);
    std::barrier all(n), with_main(n + 1);
    std::atomic<int> failed_launch{0}, failed_sync{0}, failed_malloc{0}, failed_free{0};
    std::vector<Status> first_error(n, Status::kSuccess);
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        c->peek_last_error();  // this thread's state exists from now on
        all.arrive_and_wait();  // all n threads are alive together
        sim::StampArgs args{stamps, i, 0};
        Status s = c->launch(k, {1}, {1}, &args, sizeof args, kLegacyStream);
        if (s != Status::kSuccess) ++failed_launch, first_error[i] = s;
        uint64_t mem = 0;
        s = c->malloc(&mem, 256);
        if (s != Status::kSuccess) {
          ++failed_malloc;
          if (first_error[i] == Status::kSuccess) first_error[i] = s;
        }
        with_main.arrive_and_wait();  // the main thread checks the stamps
        with_main.arrive_and_wait();
        s = c->stream_synchronize(kLegacyStream);
        if (s != Status::kSuccess) ++failed_sync;
        if (mem && c->free(mem) != Status::kSuccess) ++failed_free;
      });
    }
    with_main.arrive_and_wait();
    EXPECT_EQ(c->device_synchronize(), Status::kSuccess);
    std::vector<sim::Stamp> got(n);
    EXPECT_EQ(c->memcpy_d2h(got.data(), stamps, n * sizeof(sim::Stamp)), Status::kSuccess);
    uint32_t missing = 0;
    for (uint32_t i = 0; i < n; ++i) missing += got[i].end == 0;
    with_main.arrive_and_wait();
    for (auto& t : threads) t.join();
    uint32_t errs = 0;
    for (uint32_t i = 0; i < n; ++i) errs += first_error[i] != Status::kSuccess;
    EXPECT_EQ(missing, 0u) << missing << " of " << n << " kernels never ran (slot_count "
                           << c->layout().slot_count << ")";
    EXPECT_EQ(failed_launch.load(), 0);
    EXPECT_EQ(failed_malloc.load(), 0) << "malloc failed on threads beyond the reply slots";
    EXPECT_EQ(failed_sync.load(), 0);
    EXPECT_EQ(failed_free.load(), 0);
    EXPECT_EQ(errs, 0u);
    for (uint32_t i = 0; i < n; ++i)
      if (first_error[i] != Status::kSuccess) {
        ADD_FAILURE() << "thread " << i << ": first error " << status_name(first_error[i]);
        break;
      }
    EXPECT_EQ(c->free(stamps), Status::kSuccess);
  });
}

struct Pair {
  uint64_t x = 0, out = 0;
};

Pair make_bufs(Client& c) {
  Pair p;
  EXPECT_EQ(c.malloc(&p.x, kBytes), Status::kSuccess);
  EXPECT_EQ(c.malloc(&p.out, kBytes), Status::kSuccess);
  return p;
}

void reset(Client& c, const Pair& p) {
  const auto old_x = bytes(kOld);
  EXPECT_EQ(c.memcpy_h2d(p.x, old_x.data(), kBytes), Status::kSuccess);
  EXPECT_EQ(c.memset_async(p.out, 0, kBytes, kLegacyStream), Status::kSuccess);
  EXPECT_EQ(c.device_synchronize(), Status::kSuccess);
}

// 0: the kernel saw the old X; 1: the new X (an ordering violation); 2: neither.
int outcome(Client& c, const Pair& p) {
  EXPECT_EQ(c.device_synchronize(), Status::kSuccess);
  std::vector<uint8_t> got(kBytes);
  EXPECT_EQ(c.memcpy_d2h(got.data(), p.out, kBytes), Status::kSuccess);
  if (got == bytes(kOld)) return 0;
  return got == bytes(kNew) ? 1 : 2;
}

// An event recorded on A and then re-recorded on B stands for B's work: a wait
// issued after the re-record waits for B, whatever order the worker sees the
// two records in.
TEST(Regress, ReRecordOnAnotherStream) {
  WorkerProcess w({"--chaos", "5"});
  auto c = w.attach(quick_timeout());
  with_deadline(w, 20s, [&] {
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    Pair pa = make_bufs(*c), pb = make_bufs(*c);
    Stream a, b, s3;
    ASSERT_EQ(c->stream_create(&a, kStreamNonBlocking), Status::kSuccess);
    ASSERT_EQ(c->stream_create(&b, kStreamNonBlocking), Status::kSuccess);
    ASSERT_EQ(c->stream_create(&s3, kStreamNonBlocking), Status::kSuccess);
    const auto new_x = bytes(kNew);
    int violations = 0, torn = 0, errors = 0;
    constexpr int kIterations = 80;
    for (int i = 0; i < kIterations; ++i) {
      reset(*c, pa);
      reset(*c, pb);
      Event e;
      ASSERT_EQ(c->event_create(&e), Status::kSuccess);
      sim::SlowCopyArgs quick{pa.out, pa.x, kBytes, 0, 0};
      sim::SlowCopyArgs slow{pb.out, pb.x, kBytes, 3000, 0};
      errors += c->launch(k, {1}, {1}, &quick, sizeof quick, a) != Status::kSuccess;
      errors += c->event_record(e, a) != Status::kSuccess;
      errors += c->launch(k, {1}, {1}, &slow, sizeof slow, b) != Status::kSuccess;
      errors += c->event_record(e, b) != Status::kSuccess;
      errors += c->stream_wait_event(s3, e) != Status::kSuccess;
      errors += c->memcpy_h2d_async(pb.x, new_x.data(), kBytes, s3) != Status::kSuccess;
      const int o = outcome(*c, pb);
      violations += o == 1;
      torn += o == 2;
      errors += c->event_destroy(e) != Status::kSuccess;
      errors += c->get_last_error() != Status::kSuccess;
    }
    EXPECT_EQ(violations, 0) << "B's kernel saw X overwritten by a stream that waited for the re-recorded event in "
                             << violations << " of " << kIterations << " iterations";
    EXPECT_EQ(torn, 0);
    EXPECT_EQ(errors, 0);
  });
}

// cudaEventDestroy right after cudaStreamWaitEvent is legal: the wait still
// waits for the recorded work, and nothing reports an invalid handle.
TEST(Regress, EventDestroyAfterPendingWaits) {
  WorkerProcess w({"--chaos", "9"});
  auto c = w.attach(quick_timeout());
  with_deadline(w, 20s, [&] {
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    Pair p = make_bufs(*c);
    Stream s, s2;
    ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
    ASSERT_EQ(c->stream_create(&s2, kStreamNonBlocking), Status::kSuccess);
    const auto new_x = bytes(kNew);
    int violations = 0, torn = 0, errors = 0;
    Status first = Status::kSuccess;
    auto check = [&](Status st) {
      if (st == Status::kSuccess) return;
      ++errors;
      if (first == Status::kSuccess) first = st;
    };
    constexpr int kIterations = 80;
    for (int i = 0; i < kIterations; ++i) {
      reset(*c, p);
      Event e;
      ASSERT_EQ(c->event_create(&e), Status::kSuccess);
      sim::SlowCopyArgs slow{p.out, p.x, kBytes, 3000, 0};
      check(c->launch(k, {1}, {1}, &slow, sizeof slow, s));
      check(c->event_record(e, s));
      check(c->stream_wait_event(s2, e));
      check(c->event_destroy(e));
      check(c->memcpy_h2d_async(p.x, new_x.data(), kBytes, s2));
      check(c->stream_synchronize(s2));
      const int o = outcome(*c, p);
      violations += o == 1;
      torn += o == 2;
      check(c->get_last_error());
    }
    EXPECT_EQ(errors, 0) << "first error: " << status_name(first);
    EXPECT_EQ(violations, 0) << "the kernel saw X overwritten after a wait on a since-destroyed event in "
                             << violations << " of " << kIterations << " iterations";
    EXPECT_EQ(torn, 0);
  });
}

}  // namespace
}  // namespace ordo::test

namespace ordo::test {
namespace {

// Launch-configuration errors come back from the launch itself, as CUDA's
// cudaErrorInvalidConfiguration, and leave nothing pending for a later sync.
TEST(Regress, LaunchConfigurationErrorsAtLaunch) {
  WorkerProcess w;
  auto c = w.attach(quick_timeout());
  const uint32_t k = kernel(*c, "ordo_stamp");
  uint64_t stamps = 0;
  ASSERT_EQ(c->malloc(&stamps, sizeof(sim::Stamp)), Status::kSuccess);
  sim::StampArgs a{stamps, 0, 0};
  const struct {
    Dim3 grid, block;
  } bad[] = {{{1}, {1025}}, {{1}, {32, 32, 2}}, {{1}, {1, 1, 65}}, {{1, 65536, 1}, {1}}, {{1, 1, 65536}, {1}},
             {{0x80000000u}, {1}}};
  for (const auto& b : bad) {
    EXPECT_EQ(c->launch(k, b.grid, b.block, &a, sizeof a, kLegacyStream), Status::kInvalidConfiguration)
        << "grid " << b.grid.x << "x" << b.grid.y << "x" << b.grid.z << " block " << b.block.x << "x" << b.block.y
        << "x" << b.block.z;
    EXPECT_EQ(c->get_last_error(), Status::kInvalidConfiguration);
  }
  EXPECT_EQ(c->launch(k, {1}, {32, 32, 1}, &a, sizeof a, kLegacyStream), Status::kSuccess);
  EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kSuccess) << "a refused launch left an error pending";
  EXPECT_EQ(c->get_last_error(), Status::kSuccess);
}


// Class 7: streams are allocated as needed, far beyond the region's rings (15
// at 16 MiB), and none is refused or silently replaced. A chain runs through
// all of them: stream i copies stream i-1's buffer after waiting for its
// event, so a wait lost or reordered among streams that share a ring leaves a
// buffer with the old bytes. Then 200 threads each use a per-thread stream.
TEST(Regress, ThousandsOfStreams) {
  WorkerProcess w({"--chaos", "41"});
  with_deadline(w, 120s, [&] {
    auto c = w.attach(quick_timeout());
    ASSERT_LT(c->layout().ring_count, 64u);
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    constexpr int kStreams = 2000;
    constexpr uint64_t kChunk = 256;
    uint64_t buf = 0;
    ASSERT_EQ(c->malloc(&buf, kChunk * kStreams), Status::kSuccess);
    ASSERT_EQ(c->memset_async(buf, kOld, kChunk * kStreams, kLegacyStream), Status::kSuccess);
    const auto fresh = bytes(kNew, kChunk);
    ASSERT_EQ(c->memcpy_h2d(buf, fresh.data(), kChunk), Status::kSuccess);
    std::vector<Stream> s(kStreams);
    std::vector<Event> e(kStreams);
    int refused = 0;
    for (int i = 0; i < kStreams; ++i) {
      refused += c->stream_create(&s[i], kStreamNonBlocking) != Status::kSuccess;
      ASSERT_EQ(c->event_create(&e[i]), Status::kSuccess);
    }
    ASSERT_EQ(refused, 0) << "stream creation refused with " << kStreams << " streams";
    for (int i = 1; i < kStreams; ++i) {
      if (i > 1) {
        ASSERT_EQ(c->stream_wait_event(s[i], e[i - 1]), Status::kSuccess);
      }
      sim::SlowCopyArgs copy{buf + i * kChunk, buf + (i - 1) * kChunk, kChunk, uint32_t(i % 7 == 0 ? 200 : 5), 0};
      ASSERT_EQ(c->launch(k, {1}, {1}, &copy, sizeof copy, s[i]), Status::kSuccess);
      ASSERT_EQ(c->event_record(e[i], s[i]), Status::kSuccess);
    }
    ASSERT_EQ(c->stream_synchronize(s[kStreams - 1]), Status::kSuccess);
    std::vector<uint8_t> got(kChunk * kStreams);
    ASSERT_EQ(c->memcpy_d2h(got.data(), buf, got.size()), Status::kSuccess);
    int stale = 0;
    for (int i = 0; i < kStreams; ++i)
      stale += std::vector<uint8_t>(got.begin() + i * kChunk, got.begin() + (i + 1) * kChunk) != fresh;
    EXPECT_EQ(stale, 0) << "of " << kStreams << " chained streams";
    for (int i = 0; i < kStreams; ++i) {
      EXPECT_EQ(c->stream_destroy(s[i]), Status::kSuccess);
      EXPECT_EQ(c->event_destroy(e[i]), Status::kSuccess);
    }
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);

    // Per-thread streams of many threads: each is a stream of its own, never the legacy one.
    constexpr int kThreads = 200;
    uint64_t counters = 0;
    ASSERT_EQ(c->malloc(&counters, 8 * kThreads), Status::kSuccess);
    ASSERT_EQ(c->memset_async(counters, 0, 8 * kThreads, kLegacyStream), Status::kSuccess);
    ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
    const uint32_t addk = kernel(*c, "ordo_add_u64");
    std::atomic<int> legacy{0}, failed{0};
    std::barrier all(kThreads);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        const Stream pt = c->per_thread_stream();
        legacy += pt.id == kLegacyStreamId || pt.id == kNoStream;
        all.arrive_and_wait();  // all alive at once
        sim::AddU64Args a{counters + 8 * uint64_t(t), uint64_t(t) + 1};
        failed += c->launch(addk, {1}, {1}, &a, sizeof a, pt) != Status::kSuccess;
        failed += c->stream_synchronize(pt) != Status::kSuccess;
        failed += c->get_last_error() != Status::kSuccess;
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(legacy.load(), 0) << "per-thread streams replaced by the legacy stream";
    EXPECT_EQ(failed.load(), 0);
    std::vector<uint64_t> sums(kThreads);
    ASSERT_EQ(c->memcpy_d2h(sums.data(), counters, 8 * kThreads), Status::kSuccess);
    int wrong = 0;
    for (int t = 0; t < kThreads; ++t) wrong += sums[t] != uint64_t(t) + 1;
    EXPECT_EQ(wrong, 0) << "of " << kThreads << " per-thread stream kernels";
  });
}


// Class 8: a host function returns at once and runs later, after the stream's
// earlier work, and the stream's later work waits for it. Each function here
// waits for a flag the calling thread sets only after the call returned (a
// deadlock when the call runs the function itself), checks the stream's
// earlier copy landed, then writes the pinned bytes the stream's next copy
// reads. On every stream kind.
TEST(Regress, HostFunctionsRunAsynchronously) {
  WorkerProcess w({"--chaos", "43"});
  with_deadline(w, 60s, [&] {
    auto c = w.attach(quick_timeout());
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    uint64_t src = 0, mid = 0, out = 0;
    ASSERT_EQ(c->malloc(&src, kBytes), Status::kSuccess);
    ASSERT_EQ(c->malloc(&mid, kBytes), Status::kSuccess);
    ASSERT_EQ(c->malloc(&out, kBytes), Status::kSuccess);
    void* seen_p = nullptr;
    void* next_p = nullptr;
    ASSERT_EQ(c->malloc_host(&seen_p, kBytes), Status::kSuccess);
    ASSERT_EQ(c->malloc_host(&next_p, kBytes), Status::kSuccess);
    auto* seen = static_cast<uint8_t*>(seen_p);
    auto* next = static_cast<uint8_t*>(next_p);
    Stream blocking, nonblocking;
    ASSERT_EQ(c->stream_create(&blocking), Status::kSuccess);
    ASSERT_EQ(c->stream_create(&nonblocking, kStreamNonBlocking), Status::kSuccess);
    const struct {
      const char* name;
      std::function<Stream()> get;
    } kinds[] = {{"legacy", [] { return kLegacyStream; }},
                 {"blocking", [&] { return blocking; }},
                 {"non-blocking", [&] { return nonblocking; }},
                 {"per-thread", [&] { return c->per_thread_stream(); }}};
    int ran_early = 0, saw_stale = 0, wrong_after = 0, timed_out = 0;
    for (int i = 0; i < 8; ++i)
      for (const auto& kind : kinds) {
        SCOPED_TRACE(kind.name);
        const Stream s = kind.get();
        const uint8_t v = uint8_t(0x30 + i);
        ASSERT_EQ(c->memset_async(src, v, kBytes, s), Status::kSuccess);
        std::memset(seen, 0, kBytes);
        std::memset(next, 0, kBytes);
        sim::SlowCopyArgs slow{mid, src, kBytes, 2000, 0};
        ASSERT_EQ(c->launch(k, {1}, {1}, &slow, sizeof slow, s), Status::kSuccess);
        ASSERT_EQ(c->memcpy_d2h_async(seen, mid, kBytes, s), Status::kSuccess);  // pinned: stream work
        std::atomic<bool> go{false}, ran{false};
        ASSERT_EQ(c->host_func(s, [&] {
          const auto until = std::chrono::steady_clock::now() + 5s;
          while (!go.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
          timed_out += !go.load();
          saw_stale += std::count(seen, seen + kBytes, v) != ptrdiff_t(kBytes);
          std::this_thread::sleep_for(3ms);  // the next copy must wait for this, not race it
          std::memset(next, v + 1, kBytes);
          ran = true;
        }), Status::kSuccess);
        ran_early += ran.load();
        go = true;  // what the caller does next, after the call returned
        ASSERT_EQ(c->memcpy_h2d_async(out, next, kBytes, s), Status::kSuccess);  // pinned: read when it runs
        ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
        EXPECT_TRUE(ran.load()) << "stream_synchronize returned before the host function ran";
        std::vector<uint8_t> got(kBytes);
        ASSERT_EQ(c->memcpy_d2h(got.data(), out, kBytes), Status::kSuccess);
        wrong_after += got != std::vector<uint8_t>(kBytes, uint8_t(v + 1));
      }
    EXPECT_EQ(ran_early, 0) << "host functions ran before host_func returned";
    EXPECT_EQ(timed_out, 0) << "host functions waited for the caller in vain";
    EXPECT_EQ(saw_stale, 0) << "host functions ran before the stream's earlier work";
    EXPECT_EQ(wrong_after, 0) << "the stream's later work did not wait for the host function";
    EXPECT_EQ(c->stream_destroy(blocking), Status::kSuccess);
    EXPECT_EQ(c->stream_destroy(nonblocking), Status::kSuccess);
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  });
}


// A session ready to fault: ordo_add_u64, a counter to add to and a
// non-blocking stream to launch on.
struct FaultRig {
  std::unique_ptr<Client> c;
  uint32_t add = 0;
  uint64_t counter = 0;
  Stream a;
};
FaultRig fault_rig(WorkerProcess& w) {
  FaultRig r;
  r.c = w.attach(quick_timeout());
  r.add = kernel(*r.c, "ordo_add_u64");
  if (r.c->malloc(&r.counter, 8) != Status::kSuccess || r.c->stream_create(&r.a, kStreamNonBlocking) != Status::kSuccess)
    throw std::runtime_error("fault_rig: malloc or stream_create failed");
  return r;
}

// Class 9: a kernel's illegal memory access is CUDA's 700, sticky for the
// context: every later call of every thread fails with it, and
// cudaGetLastError keeps returning it.
TEST(Regress, KernelFaultIsStickyForEveryThread) {
  WorkerProcess w;
  with_deadline(w, 30s, [&] {
    auto [c, add, counter, a] = fault_rig(w);
    // One host function before the fault, so the library's host-function
    // machinery exists when the next one is asked for after it.
    std::atomic<int> before{0};
    ASSERT_EQ(c->host_func(kLegacyStream, [&before] { before.fetch_add(1); }), Status::kSuccess);
    ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
    ASSERT_EQ(before.load(), 1);
    sim::AddU64Args bad{counter + (uint64_t{1} << 32), 1};  // far outside any allocation
    ASSERT_EQ(c->launch(add, {1}, {1}, &bad, sizeof bad, a), Status::kSuccess);
    // The sim reports 700; an H200 reports an atomic far outside any
    // allocation as 717 (cudaErrorInvalidAddressSpace). Either is sticky.
    const Status fault = c->stream_synchronize(a);
    EXPECT_TRUE(sticky(fault)) << "a kernel fault reported as " << status_name(fault) << " (" << int32_t(fault) << ")";
    // Another thread that never touched stream a sees the fault in every call.
    std::thread([&] {
      uint64_t d = 0;
      EXPECT_EQ(c->malloc(&d, 64), fault);
      sim::AddU64Args good{counter, 1};
      EXPECT_EQ(c->launch(add, {1}, {1}, &good, sizeof good, kLegacyStream), fault);
      EXPECT_EQ(c->device_synchronize(), fault);
      EXPECT_EQ(c->get_last_error(), fault);
      EXPECT_EQ(c->get_last_error(), fault) << "a sticky error is not cleared by reading it";
      // Nothing new is created or queued, as with CUDA: a caller told its host
      // function failed frees what the function uses (cudart does), so it must
      // never run; a stream handle reported as failed would leak.
      std::atomic<int> ran{0};
      EXPECT_EQ(c->host_func(kLegacyStream, [&ran] { ran.fetch_add(1); }), fault);
      Stream s2{kNoStream, 0};
      EXPECT_EQ(c->stream_create(&s2, kStreamNonBlocking), fault);
      EXPECT_EQ(s2.id, kNoStream);
      std::this_thread::sleep_for(300ms);
      EXPECT_EQ(ran.load(), 0) << "a host function whose caller was told it failed ran";
    }).join();
    EXPECT_EQ(c->get_last_error(), fault);
    EXPECT_EQ(c->get_last_error(), fault);
    // A new process (session) starts clean.
    c.reset();
    auto fresh = w.attach(quick_timeout());
    uint64_t d = 0;
    EXPECT_EQ(fresh->malloc(&d, 64), Status::kSuccess);
    EXPECT_EQ(fresh->get_last_error(), Status::kSuccess);
  });
}

// An async call answers for the errors that were there when it enqueued, never
// for the one its own work causes, however soon the worker runs it (on a GPU
// the launch returns long before the kernel faults): a kernel fault and a copy
// to freed memory each reach the *next* call. Before the fix a launch whose
// kernel the worker ran before the call returned answered 700 itself.
TEST(Regress, AnAsyncCallNeverReportsItsOwnFailure) {
  WorkerProcess w;
  with_deadline(w, 60s, [&] {
    {
      auto c = w.attach(quick_timeout());
      uint64_t dead = 0;
      ASSERT_EQ(c->malloc(&dead, 64), Status::kSuccess);
      ASSERT_EQ(c->free(dead), Status::kSuccess);
      Stream a;
      ASSERT_EQ(c->stream_create(&a, kStreamNonBlocking), Status::kSuccess);
      for (int i = 0; i < 300; ++i) {
        ASSERT_EQ(c->memset_async(dead, 1, 64, a), Status::kSuccess) << "iteration " << i;
        ASSERT_EQ(c->stream_synchronize(a), Status::kInvalidDevicePointer) << "iteration " << i;
      }
    }
    for (int i = 0; i < 40; ++i) {  // a fault is sticky: a session each
      auto [c, add, counter, a] = fault_rig(w);
      sim::AddU64Args bad{counter + (uint64_t{1} << 32), 1};
      ASSERT_EQ(c->launch(add, {1}, {1}, &bad, sizeof bad, a), Status::kSuccess) << "iteration " << i;
      const Status fault = c->stream_synchronize(a);
      ASSERT_TRUE(sticky(fault)) << "iteration " << i << ": " << status_name(fault) << " (" << int32_t(fault) << ")";
    }
  });
}

// Class 9: dynamic shared memory above what the device allows any kernel
// (DeviceInfo::shared_mem_per_block_optin) fails the launch itself.
TEST(Regress, DynamicSharedMemoryAboveTheDeviceLimitFailsAtLaunch) {
  WorkerProcess w;
  auto c = w.attach(quick_timeout());
  const uint32_t k = kernel(*c, "ordo_noop");
  DeviceInfo info{};
  ASSERT_EQ(c->device_info(&info), Status::kSuccess);
  ASSERT_GT(info.shared_mem_per_block_optin, 48u * 1024);
  EXPECT_EQ(c->launch(k, {1}, {1}, nullptr, 0, kLegacyStream, uint32_t(info.shared_mem_per_block_optin) + 1),
            Status::kInvalidValue);
  EXPECT_EQ(c->get_last_error(), Status::kInvalidValue);
  EXPECT_EQ(c->launch(k, {1}, {1}, nullptr, 0, kLegacyStream, 48 * 1024), Status::kSuccess);
  EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kSuccess) << "a refused launch left an error pending";
}


// Class 6: cudaStreamSynchronize and cudaStreamQuery of the legacy stream
// cover the blocking streams' work issued before them, also work issued after
// the legacy stream's last work, as a launch there would. CUDA's documentation
// leaves it open; the driver does (an H200, driver 580: the synchronize waited
// 290 ms for such work and the query said not ready), and programs that use
// cudaStreamSynchronize(0) as a barrier rely on it. Before the fix ordo covered
// the legacy stream's own work only.
TEST(Regress, LegacyStreamSynchronizeCoversEarlierBlockingWork) {
  WorkerProcess w;
  with_deadline(w, 30s, [&] {
    auto c = w.attach(quick_timeout());
    const uint32_t k = kernel(*c, "ordo_stamp");
    const uint64_t d = zeroed(*c, 4 * sizeof(sim::Stamp));
    ASSERT_NE(d, 0u);
    Stream b, n;
    ASSERT_EQ(c->stream_create(&b), Status::kSuccess);  // blocking
    ASSERT_EQ(c->stream_create(&n, kStreamNonBlocking), Status::kSuccess);
    sim::StampArgs before{d, 0, 20000}, legacy{d, 1, 0}, after{d, 2, 300000}, probe{d, 3, 0};
    ASSERT_EQ(c->launch(k, {1}, {1}, &before, sizeof before, b), Status::kSuccess);
    ASSERT_EQ(c->launch(k, {1}, {1}, &legacy, sizeof legacy, kLegacyStream), Status::kSuccess);
    ASSERT_EQ(c->launch(k, {1}, {1}, &after, sizeof after, b), Status::kSuccess);
    std::this_thread::sleep_for(50ms);  // the legacy stream's own work is done by now
    (void)c->stream_query(kLegacyStream);  // the first query may only ask the worker to report
    std::this_thread::sleep_for(30ms);
    EXPECT_EQ(c->stream_query(kLegacyStream), Status::kNotReady)
        << "querying the legacy stream ignored blocking-stream work issued before the query";
    ASSERT_EQ(c->stream_synchronize(kLegacyStream), Status::kSuccess);
    // Work on a non-blocking stream, which waits for nothing else, starts after `after` ended.
    ASSERT_EQ(c->launch(k, {1}, {1}, &probe, sizeof probe, n), Status::kSuccess);
    sim::Stamp st[4];
    ASSERT_EQ(c->memcpy_d2h_async(st, d, sizeof st, n), Status::kSuccess);
    ASSERT_EQ(c->stream_synchronize(n), Status::kSuccess);
    EXPECT_LT(st[0].end, st[1].start) << "legacy work overtook earlier blocking work";
    EXPECT_LT(st[1].end, st[2].start) << "blocking work overtook earlier legacy work";
    EXPECT_NE(st[2].end, 0u);
    EXPECT_GT(st[3].start, st[2].end)
        << "synchronizing the legacy stream returned before blocking-stream work issued before it";
    EXPECT_EQ(c->stream_query(kLegacyStream), Status::kSuccess);
    EXPECT_EQ(c->stream_destroy(b), Status::kSuccess);
    EXPECT_EQ(c->stream_destroy(n), Status::kSuccess);
  });
}

TEST(Regress, SynchronizingASharedRingStreamWaitsForItAlone) {
  WorkerProcess w;
  with_deadline(w, 30s, [&] {
    auto c = w.attach(quick_timeout());
    const uint32_t k = kernel(*c, "ordo_stamp");
    const uint64_t d = zeroed(*c, 3 * sizeof(sim::Stamp));
    ASSERT_NE(d, 0u);
    // One stream per ring, then one more: it shares a ring with one of them.
    std::vector<Stream> s(c->layout().ring_count);
    for (auto& x : s) ASSERT_EQ(c->stream_create(&x, kStreamNonBlocking), Status::kSuccess);
    const Stream mine = s.back();
    Stream mate{};
    for (size_t i = 0; i + 1 < s.size(); ++i)
      if (guest::ring_of_stream(*c, s[i]) == guest::ring_of_stream(*c, mine)) mate = s[i];
    ASSERT_NE(mate.id, 0u) << "no stream shares a ring with the last one";
    sim::StampArgs slow{d, 0, 400000}, quick{d, 1, 0}, probe{d, 2, 0};
    ASSERT_EQ(c->launch(k, {1}, {1}, &slow, sizeof slow, mate), Status::kSuccess);
    ASSERT_EQ(c->launch(k, {1}, {1}, &quick, sizeof quick, mine), Status::kSuccess);
    ASSERT_EQ(c->stream_synchronize(mine), Status::kSuccess);
    ASSERT_EQ(c->launch(k, {1}, {1}, &probe, sizeof probe, s[0].id == mate.id ? s[1] : s[0]), Status::kSuccess);
    ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
    sim::Stamp st[3];
    ASSERT_EQ(c->memcpy_d2h(st, d, sizeof st), Status::kSuccess);
    EXPECT_GT(st[1].end, 0u) << "the synchronized stream's kernel had not run";
    EXPECT_LT(st[2].start, st[0].end) << "synchronizing a stream waited for its ring-mate's kernel";
    for (auto& x : s) EXPECT_EQ(c->stream_destroy(x), Status::kSuccess);
  });
}

// Issue 28: a host function's stream work ends when the function returned, not
// when the stream reached it. Work issued after it on the other side of the
// legacy/blocking boundary (either way, cudaStreamPerThread included), a
// synchronous copy, a legacy-stream or device synchronize, and the
// synchronize of a stream that shares its ring, all wait for the function.
// Each function sleeps, then writes the pinned bytes that what follows reads.
TEST(Regress, HostFunctionsHoldTheLegacyStreamBothWays) {
  WorkerProcess w;
  with_deadline(w, 60s, [&] {
    auto c = w.attach(quick_timeout());
    uint64_t dev = 0;
    ASSERT_EQ(c->malloc(&dev, kBytes), Status::kSuccess);
    void* pinned_p = nullptr;
    ASSERT_EQ(c->malloc_host(&pinned_p, kBytes), Status::kSuccess);
    auto* pinned = static_cast<uint8_t*>(pinned_p);
    Stream blocking, nonblocking;
    ASSERT_EQ(c->stream_create(&blocking), Status::kSuccess);
    ASSERT_EQ(c->stream_create(&nonblocking, kStreamNonBlocking), Status::kSuccess);
    // A stream that shares a ring: fill every ring, then one more.
    std::vector<Stream> fill(c->layout().ring_count);
    for (auto& x : fill) ASSERT_EQ(c->stream_create(&x), Status::kSuccess);
    const Stream shared = fill.back();
    const Stream per_thread = c->per_thread_stream();
    std::vector<uint8_t> pageable(kBytes);
    enum Then { kCopyOn, kMemcpy, kPageableMemcpy, kLegacySync, kDeviceSync, kStreamSync };
    const struct {
      const char* name;
      Stream fn;
      Then then;
      Stream on;
    } cases[] = {
        {"blocking -> legacy copy", blocking, kCopyOn, kLegacyStream},
        {"per-thread -> legacy copy", per_thread, kCopyOn, kLegacyStream},
        {"legacy -> blocking copy", kLegacyStream, kCopyOn, blocking},
        {"legacy -> per-thread copy", kLegacyStream, kCopyOn, per_thread},
        {"blocking -> cudaMemcpy", blocking, kMemcpy, {}},
        {"legacy -> cudaMemcpy", kLegacyStream, kMemcpy, {}},
        {"blocking -> pageable cudaMemcpy", blocking, kPageableMemcpy, {}},
        {"legacy -> pageable cudaMemcpy", kLegacyStream, kPageableMemcpy, {}},
        {"blocking -> legacy synchronize", blocking, kLegacySync, {}},
        {"per-thread -> legacy synchronize", per_thread, kLegacySync, {}},
        {"non-blocking -> device synchronize", nonblocking, kDeviceSync, {}},
        {"shared ring -> its synchronize", shared, kStreamSync, {}},
    };
    for (int i = 0; i < 4; ++i)
      for (const auto& k : cases) {
        SCOPED_TRACE(k.name);
        const uint8_t v = uint8_t(0x40 + i);
        std::memset(pinned, 0, kBytes);
        std::fill(pageable.begin(), pageable.end(), uint8_t(0));
        ASSERT_EQ(c->memset_async(dev, 0, kBytes, kLegacyStream), Status::kSuccess);
        ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
        uint8_t* written = k.then == kPageableMemcpy ? pageable.data() : pinned;
        ASSERT_EQ(c->host_func(k.fn, [written, v] {
          std::this_thread::sleep_for(5ms);
          std::memset(written, v, kBytes);
        }), Status::kSuccess);
        std::vector<uint8_t> got(kBytes);
        switch (k.then) {
          case kCopyOn:
            ASSERT_EQ(c->memcpy_h2d_async(dev, pinned, kBytes, k.on), Status::kSuccess);  // pinned: read when it runs
            ASSERT_EQ(c->stream_synchronize(k.on), Status::kSuccess);
            ASSERT_EQ(c->memcpy_d2h(got.data(), dev, kBytes), Status::kSuccess);
            break;
          case kMemcpy:
          case kPageableMemcpy:
            ASSERT_EQ(c->memcpy_h2d(dev, written, kBytes), Status::kSuccess);
            ASSERT_EQ(c->memcpy_d2h(got.data(), dev, kBytes), Status::kSuccess);
            break;
          default:
            ASSERT_EQ(k.then == kLegacySync  ? c->stream_synchronize(kLegacyStream)
                      : k.then == kDeviceSync ? c->device_synchronize()
                                              : c->stream_synchronize(k.fn),
                      Status::kSuccess);
            std::memcpy(got.data(), pinned, kBytes);
            break;
        }
        EXPECT_EQ(std::count(got.begin(), got.end(), v), ptrdiff_t(kBytes))
            << "what followed the host function did not wait for it to return";
        ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
      }
    for (auto& x : fill) EXPECT_EQ(c->stream_destroy(x), Status::kSuccess);
    EXPECT_EQ(c->stream_destroy(blocking), Status::kSuccess);
    EXPECT_EQ(c->stream_destroy(nonblocking), Status::kSuccess);
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  });
}

// A host function that has not returned holds what CUDA holds (its stream, and
// the legacy stream's later work when it is on a blocking stream) and nothing
// more: a non-blocking stream and another blocking stream go on, and so does
// a blocking stream of another device after that device's legacy work.
TEST(Regress, AnUnfinishedHostFunctionHoldsOnlyWhatCudaHolds) {
  WorkerProcess w({"--sim-devices", "2"});
  with_deadline(w, 60s, [&] {
    auto c = w.attach(quick_timeout());
    ASSERT_EQ(c->device_count(), 2u);
    uint64_t dev = 0;
    ASSERT_EQ(c->malloc(&dev, kBytes), Status::kSuccess);
    Stream blocking, other, nonblocking;
    ASSERT_EQ(c->stream_create(&blocking), Status::kSuccess);
    ASSERT_EQ(c->stream_create(&other), Status::kSuccess);
    ASSERT_EQ(c->stream_create(&nonblocking, kStreamNonBlocking), Status::kSuccess);
    Event after_legacy;
    ASSERT_EQ(c->event_create(&after_legacy), Status::kSuccess);
    std::atomic<bool> release{false}, returned{false};
    ASSERT_EQ(c->host_func(blocking, [&] {
      const auto until = std::chrono::steady_clock::now() + 20s;
      while (!release.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
      returned = true;
    }), Status::kSuccess);
    // Not held: another blocking stream (before any legacy work), a non-blocking one.
    ASSERT_EQ(c->memset_async(dev, 1, kBytes, other), Status::kSuccess);
    EXPECT_EQ(c->stream_synchronize(other), Status::kSuccess);
    ASSERT_EQ(c->memset_async(dev, 2, kBytes, nonblocking), Status::kSuccess);
    EXPECT_EQ(c->stream_synchronize(nonblocking), Status::kSuccess);
    // Another device's legacy stream and a blocking stream after it.
    ASSERT_EQ(c->set_device(1), Status::kSuccess);
    uint64_t dev1 = 0;
    ASSERT_EQ(c->malloc(&dev1, kBytes), Status::kSuccess);
    Stream blocking1;
    ASSERT_EQ(c->stream_create(&blocking1), Status::kSuccess);
    ASSERT_EQ(c->memset_async(dev1, 3, kBytes, kLegacyStream), Status::kSuccess);
    ASSERT_EQ(c->memset_async(dev1, 4, kBytes, blocking1), Status::kSuccess);
    EXPECT_EQ(c->stream_synchronize(blocking1), Status::kSuccess);
    EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kSuccess);
    ASSERT_EQ(c->set_device(0), Status::kSuccess);
    // Held, as in CUDA: device 0's legacy stream after the function.
    ASSERT_EQ(c->memset_async(dev, 5, kBytes, kLegacyStream), Status::kSuccess);
    ASSERT_EQ(c->event_record(after_legacy, kLegacyStream), Status::kSuccess);
    std::this_thread::sleep_for(50ms);
    // These never wait for stream work in CUDA; they must not wait for the function either.
    EXPECT_EQ(c->event_query(after_legacy), Status::kNotReady)
        << "legacy-stream work after an unfinished host function on a blocking stream completed";
    Event early;
    ASSERT_EQ(c->event_create(&early), Status::kSuccess);
    ASSERT_EQ(c->event_record(early, nonblocking), Status::kSuccess);
    ASSERT_EQ(c->event_synchronize(early), Status::kSuccess);
    float ms = 0;
    EXPECT_EQ(c->event_elapsed(&ms, early, after_legacy), Status::kNotReady);
    // Destroyed with its record held, and with waits on more rings than a request has edges.
    Event held;
    ASSERT_EQ(c->event_create(&held), Status::kSuccess);
    ASSERT_EQ(c->event_record(held, blocking), Status::kSuccess);
    std::vector<Stream> waiters(kMaxEdges + 3);
    for (auto& x : waiters) {
      ASSERT_EQ(c->stream_create(&x, kStreamNonBlocking), Status::kSuccess);
      ASSERT_EQ(c->stream_wait_event(x, held), Status::kSuccess);
    }
    EXPECT_EQ(c->event_destroy(held), Status::kSuccess);
    EXPECT_EQ(c->event_query(held), Status::kInvalidResourceHandle);
    EXPECT_EQ(c->get_last_error(), Status::kInvalidResourceHandle);  // that query's, as cudaGetLastError
    EXPECT_FALSE(returned.load()) << "the host function returned before it was released";
    release = true;
    EXPECT_EQ(c->event_synchronize(after_legacy), Status::kSuccess);
    EXPECT_TRUE(returned.load()) << "the legacy stream's later work did not wait for the host function";
    EXPECT_EQ(c->device_synchronize(), Status::kSuccess);
    for (Stream s : {blocking, other, nonblocking}) EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
    EXPECT_EQ(c->stream_destroy(blocking1), Status::kSuccess);
    EXPECT_EQ(c->event_destroy(after_legacy), Status::kSuccess);
    EXPECT_EQ(c->event_destroy(early), Status::kSuccess);
    for (Stream x : waiters) EXPECT_EQ(c->stream_destroy(x), Status::kSuccess);
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  });
}

// An event re-recorded while its earlier record (and a wait on it) are held
// behind a host function that has not returned: CUDA replaces the event's
// state at once, so the new record, waits on it, a synchronize, a query and a
// destroy go on; the held wait keeps the earlier record's meaning, so the copy
// after it still sees what the function wrote (that part fails with --unordered).
// Returns what the copy after the held wait saw; with ordering off, only that.
int rerecord_behind_a_host_function(bool ordered) {
  WorkerProcess w(ordered ? std::vector<std::string>{} : std::vector<std::string>{"--unordered"});
  int seen = 0;
  auto expect = [&](Status got, Status want, const char* what) {
    if (ordered) {
      EXPECT_EQ(got, want) << what;
    }
  };
  with_deadline(w, 60s, [&] {
    auto c = w.attach(quick_timeout());
    uint64_t dev = 0, scratch = 0;
    ASSERT_EQ(c->malloc(&dev, sizeof(int)), Status::kSuccess);
    ASSERT_EQ(c->malloc(&scratch, kBytes), Status::kSuccess);
    ASSERT_EQ(c->memset_async(dev, 0, sizeof(int), kLegacyStream), Status::kSuccess);
    void* p = nullptr;
    ASSERT_EQ(c->malloc_host(&p, sizeof(int)), Status::kSuccess);
    auto* flag = static_cast<int*>(p);
    *flag = 0;
    Stream a, b, held_waiter, new_waiter;
    for (Stream* x : {&a, &b, &held_waiter, &new_waiter})
      ASSERT_EQ(c->stream_create(x, kStreamNonBlocking), Status::kSuccess);
    ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
    Event e, other;
    ASSERT_EQ(c->event_create(&e), Status::kSuccess);
    ASSERT_EQ(c->event_create(&other), Status::kSuccess);
    std::atomic<bool> release{false}, returned{false};
    ASSERT_EQ(c->host_func(a, [&] {
      const auto until = std::chrono::steady_clock::now() + 20s;
      while (!release.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
      std::atomic_ref<int>(*flag).store(7);
      returned = true;
    }), Status::kSuccess);
    ASSERT_EQ(c->event_record(e, a), Status::kSuccess);
    ASSERT_EQ(c->stream_wait_event(held_waiter, e), Status::kSuccess);
    ASSERT_EQ(c->memcpy_h2d_async(dev, flag, sizeof(int), held_waiter), Status::kSuccess);
    for (int round = 0; round < 3; ++round) {  // a second re-record needs the first one's backend event no more
      ASSERT_EQ(c->event_record(e, b), Status::kSuccess);
      expect(c->event_synchronize(e), Status::kSuccess, "synchronize the re-recorded event");
      expect(c->event_query(e), Status::kSuccess, "query the re-recorded event");
      ASSERT_EQ(c->stream_wait_event(new_waiter, e), Status::kSuccess);
      ASSERT_EQ(c->memset_async(scratch, uint8_t(round), kBytes, new_waiter), Status::kSuccess);
      expect(c->stream_synchronize(new_waiter), Status::kSuccess, "a wait on the new record");
      ASSERT_EQ(c->event_record(other, b), Status::kSuccess);
      ASSERT_EQ(c->event_synchronize(other), Status::kSuccess);
      float ms = -1;
      expect(c->event_elapsed(&ms, e, other), Status::kSuccess, "elapsed time to the new record");
    }
    EXPECT_EQ(c->event_destroy(e), Status::kSuccess);
    if (ordered) {
      EXPECT_FALSE(returned.load()) << "the re-record waited for the host function";
    }
    EXPECT_EQ(c->event_query(e), Status::kInvalidResourceHandle);
    EXPECT_EQ(c->get_last_error(), Status::kInvalidResourceHandle);
    std::this_thread::sleep_for(50ms);  // unordered, the copy has run by now
    release = true;
    // Unordered, the held record comes after the destroy and fails.
    expect(c->stream_synchronize(held_waiter), Status::kSuccess, "the held wait");
    expect(c->device_synchronize(), Status::kSuccess, "the held record");
    c->get_last_error();
    ASSERT_EQ(c->memcpy_d2h(&seen, dev, sizeof seen), Status::kSuccess);
    // The destroyed event's index is free again once its held record and wait ran.
    std::vector<Event> more(4);
    for (Event& x : more) ASSERT_EQ(c->event_create(&x), Status::kSuccess);
    if (ordered) {
      EXPECT_TRUE(std::any_of(more.begin(), more.end(), [&](Event x) { return uint32_t(x.handle) == uint32_t(e.handle); }))
          << "the destroyed event was never freed";
    }
    for (Event& x : more) EXPECT_EQ(c->event_destroy(x), Status::kSuccess);
    EXPECT_EQ(c->event_destroy(other), Status::kSuccess);
    for (Stream x : {a, b, held_waiter, new_waiter}) EXPECT_EQ(c->stream_destroy(x), Status::kSuccess);
    expect(c->get_last_error(), Status::kSuccess, "no error left");
  });
  return seen;
}

TEST(Regress, AReRecordDoesNotWaitForARecordHeldBehindAHostFunction) {
  EXPECT_EQ(rerecord_behind_a_host_function(true), 7)
      << "the wait issued before the re-record did not wait for the host function's write";
}

TEST(Regress, AReRecordBehindAHostFunctionUnorderedControl) {
  EXPECT_NE(rerecord_behind_a_host_function(false), 7) << "the scenario cannot see a misordered wait";
}

// One event re-recorded round-robin on 4 streams behind slow kernels, each
// record waited on by one of 8 streams: the worker dispatches one ring's
// records far ahead of the others', and keeps every record until its
// successor and its waits were dispatched (a first EventTable with a fixed
// per-event cap hung here, found by a test campaign). Then the destroyed
// event's index comes back.
TEST(Regress, RoundRobinReRecordsAcrossRingsFinish) {
  WorkerProcess w;
  with_deadline(w, 60s, [&] {
    auto c = w.attach(quick_timeout());
    const uint32_t k = kernel(*c, "ordo_slow_copy");
    uint64_t src = 0, dst = 0;
    ASSERT_EQ(c->malloc(&src, 64), Status::kSuccess);
    ASSERT_EQ(c->malloc(&dst, 64), Status::kSuccess);
    std::vector<Stream> producers(4), waiters(8);
    for (auto& s : waiters) ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
    for (auto& s : producers) ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
    Event e;
    ASSERT_EQ(c->event_create(&e), Status::kSuccess);
    for (size_t i = 0; i < 400; ++i) {
      sim::SlowCopyArgs a{src, src, 64, 500, 0};
      ASSERT_EQ(c->launch(k, {1}, {1}, &a, sizeof a, producers[i % 4]), Status::kSuccess);
      ASSERT_EQ(c->event_record(e, producers[i % 4]), Status::kSuccess);
      ASSERT_EQ(c->stream_wait_event(waiters[i % 8], e), Status::kSuccess);
      ASSERT_EQ(c->memcpy_d2d_async(dst, src, 64, waiters[i % 8]), Status::kSuccess);
    }
    EXPECT_EQ(c->device_synchronize(), Status::kSuccess);
    EXPECT_EQ(c->event_destroy(e), Status::kSuccess);
    Event again;
    ASSERT_EQ(c->event_create(&again), Status::kSuccess);
    EXPECT_EQ(uint32_t(again.handle), uint32_t(e.handle)) << "the destroyed event was never freed";
    EXPECT_EQ(c->event_destroy(again), Status::kSuccess);
    for (Stream s : producers) EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
    for (Stream s : waiters) EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  });
}

// A stream destroyed (or a per-thread stream released by its thread's exit)
// with a host function that has not returned leaves its ring held until the
// function returns; a new stream must not be put on that ring while others
// are free, or its work would wait for the function, which CUDA's would not.
TEST(Regress, ANewStreamDoesNotInheritAHeldRing) {
  WorkerProcess w;
  with_deadline(w, 60s, [&] {
    auto c = w.attach(quick_timeout());
    uint64_t dev = 0;
    ASSERT_EQ(c->malloc(&dev, kBytes), Status::kSuccess);
    for (const bool exiting_thread : {false, true}) {
      SCOPED_TRACE(exiting_thread ? "per-thread stream of an exited thread" : "destroyed stream");
      std::atomic<bool> release{false}, returned{false};
      auto held = [&] {
        const auto until = std::chrono::steady_clock::now() + 10s;
        while (!release.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
        returned = true;
      };
      if (exiting_thread) {
        std::thread([&] { ASSERT_EQ(c->host_func(c->per_thread_stream(), held), Status::kSuccess); }).join();
      } else {
        Stream a;
        ASSERT_EQ(c->stream_create(&a, kStreamNonBlocking), Status::kSuccess);
        ASSERT_EQ(c->host_func(a, held), Status::kSuccess);
        ASSERT_EQ(c->stream_destroy(a), Status::kSuccess);
      }
      Stream n;
      ASSERT_EQ(c->stream_create(&n, kStreamNonBlocking), Status::kSuccess);
      ASSERT_EQ(c->memset_async(dev, 1, kBytes, n), Status::kSuccess);
      EXPECT_EQ(c->stream_synchronize(n), Status::kSuccess);
      EXPECT_FALSE(returned.load()) << "a new stream's work waited for another stream's host function";
      release = true;
      EXPECT_EQ(c->device_synchronize(), Status::kSuccess);
      EXPECT_TRUE(returned.load());
      EXPECT_EQ(c->stream_destroy(n), Status::kSuccess);
    }
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  });
}

}  // namespace
}  // namespace ordo::test

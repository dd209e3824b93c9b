// Several dispatch threads per session (WorkerOptions::dispatch_threads,
// ARCHITECTURE.md "Dispatch threads"): each ring keeps one consumer, the
// rings are shared out, and edges across threads are honoured. The ordering
// suites run with three dispatch threads too (the `lanes` suite).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "harness.h"
#include "worker/backends/null/null_backend.h"

namespace ordo::test {
namespace {

// Records, per launch, the stream and the thread that dispatched it, in the
// order the backend was called. A launch whose argument is kSlow takes 20 ms.
class RecordingBackend : public NullBackend {
 public:
  static constexpr uint64_t kSlow = 0x51;
  struct Call {
    uint32_t stream;
    std::thread::id thread;
    uint64_t arg;
  };
  Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) override {
    uint64_t arg = 0;
    if (p.args_size >= sizeof arg) std::memcpy(&arg, p.args, sizeof arg);
    if (arg == kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    {
      std::lock_guard lock(mu_);
      calls_.push_back({stream, std::this_thread::get_id(), arg});
    }
    return NullBackend::launch(stream, p, tag);
  }
  std::vector<Call> calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  // While held, a module load (a long JIT compile) and a free (cudaFree waits
  // for the device) wait in the backend.
  Status module_load(uint32_t module, std::span<const std::byte> image) override {
    hold_here();
    return NullBackend::module_load(module, image);
  }
  Status free(uint64_t addr) override {
    hold_here();
    return NullBackend::free(addr);
  }
  void hold_loads(bool hold) {
    std::lock_guard lock(mu_);
    hold_loads_ = hold;
    cv_.notify_all();
  }
  // Waits until a load is in the backend; whether one still is.
  bool wait_loading(std::chrono::seconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return loading_; });
  }
  bool loading() {
    std::lock_guard lock(mu_);
    return loading_;
  }

 private:
  void hold_here() {
    std::unique_lock lock(mu_);
    loading_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_loads_; });
    loading_ = false;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  bool hold_loads_ = false, loading_ = false;
};

struct Session {
  explicit Session(uint32_t dispatch_threads, bool ordered = true) {
    auto b = std::make_unique<RecordingBackend>();
    backend = b.get();
    worker = std::make_unique<InProcessWorker>(WorkerOptions{.ordered = ordered, .dispatch_threads = dispatch_threads},
                                               16u << 20, std::move(b));
    client = worker->attach();
  }
  RecordingBackend* backend;
  std::unique_ptr<InProcessWorker> worker;
  std::unique_ptr<Client> client;
};

TEST(DispatchThreads, EachRingKeepsOneThreadAndTheRingsAreSharedOut) {
  Session s(3);
  Client& c = *s.client;
  std::vector<Stream> streams(6);
  for (Stream& st : streams) ASSERT_EQ(c.stream_create(&st, kStreamNonBlocking), Status::kSuccess);
  for (int i = 0; i < 600; ++i) {
    const uint64_t arg = uint64_t(i);
    ASSERT_EQ(c.launch(0, {1}, {1}, &arg, sizeof arg, streams[size_t(i) % streams.size()]), Status::kSuccess);
  }
  for (Stream& st : streams) ASSERT_EQ(c.stream_synchronize(st), Status::kSuccess);
  std::map<uint32_t, std::set<std::thread::id>> by_stream;
  std::map<uint32_t, uint64_t> last;
  std::set<std::thread::id> threads;
  size_t n = 0;
  for (const auto& call : s.backend->calls()) {
    by_stream[call.stream].insert(call.thread);
    threads.insert(call.thread);
    if (last.count(call.stream)) {
      EXPECT_GT(call.arg, last[call.stream]) << "stream order broken";
    }
    last[call.stream] = call.arg;
    ++n;
  }
  EXPECT_EQ(n, 600u);
  ASSERT_EQ(by_stream.size(), 6u);
  for (const auto& [stream, ids] : by_stream) EXPECT_EQ(ids.size(), 1u) << "stream " << stream << " on several threads";
  EXPECT_EQ(threads.size(), 3u) << "six streams on their own rings, three dispatch threads";
}

// Stream B waits for an event recorded after a slow launch on stream A, whose
// ring another thread serves: B's launch must reach the backend after A's
// returned. Without edges (the control) it overtakes it.
void slow_then_wait(Session& s, bool* b_after_a) {
  Client& c = *s.client;
  Stream a, b;
  ASSERT_EQ(c.stream_create(&a, kStreamNonBlocking), Status::kSuccess);
  ASSERT_EQ(c.stream_create(&b, kStreamNonBlocking), Status::kSuccess);
  Event e;
  ASSERT_EQ(c.event_create(&e), Status::kSuccess);
  const uint64_t slow = RecordingBackend::kSlow, fast = 7;
  ASSERT_EQ(c.launch(0, {1}, {1}, &slow, sizeof slow, a), Status::kSuccess);
  ASSERT_EQ(c.event_record(e, a), Status::kSuccess);
  ASSERT_EQ(c.stream_wait_event(b, e), Status::kSuccess);
  ASSERT_EQ(c.launch(0, {1}, {1}, &fast, sizeof fast, b), Status::kSuccess);
  ASSERT_EQ(c.stream_synchronize(a), Status::kSuccess);
  ASSERT_EQ(c.stream_synchronize(b), Status::kSuccess);
  const auto calls = s.backend->calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_NE(calls[0].thread, calls[1].thread) << "the two rings share a dispatch thread: the test shows nothing";
  *b_after_a = calls[0].arg == slow && calls[1].arg == fast;
}

TEST(DispatchThreads, AnEdgeToAnotherThreadsRingWaitsForItsDispatch) {
  Session s(2);
  bool b_after_a = false;
  slow_then_wait(s, &b_after_a);
  EXPECT_TRUE(b_after_a);
}

TEST(DispatchThreads, ControlWithoutEdgesTheWaitingStreamOvertakes) {
  Session s(2, /*ordered=*/false);
  bool b_after_a = true;
  slow_then_wait(s, &b_after_a);
  EXPECT_FALSE(b_after_a) << "without edges B's launch should have run during A's 20 ms one";
}

// A session ends and a new one attaches while the other threads are parked
// or busy: every ring starts again at 0 on every thread.
// A module load (a JIT compile, seconds on a GPU) and a free (cudaFree waits
// for the device) run off the dispatch threads: meanwhile every ring, the
// legacy stream's too, and every other thread's sync calls are served.
// Without that, the calls below wait for the watchdog's release and find the
// call gone.
enum class Long { kModuleLoad, kFree };
void long_call_holds_nothing(uint32_t dispatch_threads, Long what) {
  Session s(dispatch_threads);
  Client& c = *s.client;
  uint64_t dev = 0;
  ASSERT_EQ(c.malloc(&dev, 4096), Status::kSuccess);
  s.backend->hold_loads(true);
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 1000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s.backend->hold_loads(false);
  });
  uint32_t module = 0;
  Status loaded = Status::kNotReady;
  std::thread loader([&] {
    const std::vector<std::byte> image(4096, std::byte{0x7f});
    loaded = what == Long::kModuleLoad ? c.module_load(image.data(), image.size(), &module) : c.free(dev);
  });
  ASSERT_TRUE(s.backend->wait_loading(std::chrono::seconds(10)));
  Stream other;
  ASSERT_EQ(c.stream_create(&other, kStreamNonBlocking), Status::kSuccess);
  for (Stream st : {kLegacyStream, other}) {
    const uint64_t arg = 1;
    ASSERT_EQ(c.launch(0, {1}, {1}, &arg, sizeof arg, st), Status::kSuccess);
    ASSERT_EQ(c.stream_synchronize(st), Status::kSuccess);
  }
  Event e;
  ASSERT_EQ(c.event_create(&e), Status::kSuccess);
  ASSERT_EQ(c.event_record(e, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c.event_synchronize(e), Status::kSuccess);
  EXPECT_TRUE(s.backend->loading()) << "the calls above waited for the long call";
  done = true;
  s.backend->hold_loads(false);
  loader.join();
  watchdog.join();
  ASSERT_EQ(loaded, Status::kSuccess);
  if (what == Long::kFree) {
    EXPECT_EQ(c.free(dev), Status::kInvalidDevicePointer) << "freed once, and only once";
    return;
  }
  uint32_t kernel = 0;
  EXPECT_EQ(c.kernel_lookup(module, "k", &kernel), Status::kSuccess) << "the loaded module is the session's";
  EXPECT_EQ(c.module_unload(module), Status::kSuccess);
  EXPECT_EQ(c.free(dev), Status::kSuccess);
}

TEST(DispatchThreads, ALongModuleLoadHoldsNoStreamOneThread) { long_call_holds_nothing(1, Long::kModuleLoad); }
TEST(DispatchThreads, ALongModuleLoadHoldsNoStreamThreeThreads) { long_call_holds_nothing(3, Long::kModuleLoad); }
TEST(DispatchThreads, ALongFreeHoldsNoStreamOneThread) { long_call_holds_nothing(1, Long::kFree); }
TEST(DispatchThreads, ALongFreeHoldsNoStreamThreeThreads) { long_call_holds_nothing(3, Long::kFree); }

TEST(DispatchThreads, SessionsComeAndGo) {
  auto b = std::make_unique<RecordingBackend>();
  RecordingBackend* backend = b.get();
  InProcessWorker w(WorkerOptions{.dispatch_threads = 4}, 16u << 20, std::move(b));
  for (int session = 0; session < 5; ++session) {
    auto c = w.attach();
    std::vector<Stream> streams(5);
    for (Stream& st : streams) ASSERT_EQ(c->stream_create(&st, kStreamNonBlocking), Status::kSuccess);
    for (int i = 0; i < 50; ++i) {
      const uint64_t arg = uint64_t(i);
      ASSERT_EQ(c->launch(0, {1}, {1}, &arg, sizeof arg, streams[size_t(i) % 5]), Status::kSuccess);
    }
    ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
  }
  EXPECT_EQ(backend->calls().size(), 250u);
}

}  // namespace
}  // namespace ordo::test

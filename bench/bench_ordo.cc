// ordo's own costs, next to the floors it is judged against (docs/BENCHMARKS.md).
//
// The worker runs in a thread of this process on a /dev/shm region, over a
// NullBackend that does no work, so the numbers are the transport and the
// ordering logic, not a device or the simulator. One group goes through the
// sim backend for reference. The baselines (cache-line ping-pong, Unix socket,
// boost spsc_queue) run in the same binary so ratios come from one run.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/lockfree/spsc_queue.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ordo/client.h"
#include "ordo/doorbell.h"
#include "ordo/layout.h"
#include "ordo/region.h"
#include "worker/backend.h"
#include "worker/backends/null/null_backend.h"
#include "worker/worker.h"
#include "transport/graph_steps.h"
#include "transport/ring.h"

namespace {

using ordo::Status;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_ordo: %s\n", what.c_str());
  std::exit(1);
}

// Threads are pinned so the scheduler's placement does not add noise: the
// calling ("guest") threads on CPU 0, the worker and every baseline's server
// thread on CPU 1, a core to itself as in production. Without this, a thread
// woken or created on its partner's CPU spins there until the load balancer
// moves it, which on 2 vCPUs turned ~0.5 us round trips into ~100 us ones.
// ORDO_BENCH_NO_PIN=1 turns it off.
constexpr int kGuestCpu = 0, kServerCpu = 1, kAnyCpu = -1;
bool g_pin = false;

void pin(int cpu) {
  if (!g_pin) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu == kAnyCpu) {
    for (int i = 0; i < CPU_SETSIZE; ++i) CPU_SET(i, &set);  // the kernel keeps the CPUs that exist
  } else {
    CPU_SET(cpu, &set);
  }
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// A server thread: runs `fn` pinned to the server CPU.
template <class F>
std::thread server_thread(F fn) {
  return std::thread([fn = std::move(fn)]() mutable {
    pin(kServerCpu);
    fn();
  });
}

using ordo::NullBackend;

struct Config {
  bool sim = false;           // the sim backend instead of NullBackend
  bool guest_edges = true;    // ClientOptions::ordered
  bool worker_edges = true;   // WorkerOptions::ordered
  bool shared = false;        // all threads on one stream instead of one each
  bool blocking = false;      // blocking streams (they order against the legacy stream)
  bool idle_sleep = false;    // the worker's default idle policy: sleep after 200 us without work
  bool trace = false;         // WorkerOptions::trace (ordo-worker --trace)
  uint32_t region_mb = 64;    // the region's size (a power of two)
  uint32_t launch_ns = 0;     // NullBackend's cost model: CPU time per launch
  uint32_t dispatch = 1;      // WorkerOptions::dispatch_threads
};

// A worker thread on a fresh region, one client, and the streams the threads use.
// Built by Setup before the benchmark's threads start, so they all share it.
class Env {
 public:
  Env(const Config& c, int threads) {
    static int n = 0;
    path_ = "/dev/shm/ordo-bench-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    ordo::Layout l;
    if (!ordo::plan_default_layout(uint64_t{c.region_mb} << 20, &l)) die("plan_default_layout failed");
    std::string err;
    region_ = ordo::Region::create(path_, l, &err);
    if (!region_) die(err);
    if (c.sim) {
      // Made unpinned: its stream threads run on any CPU (the sim gives them
      // the CPUs it was made on), while the worker keeps its own.
      std::thread([&] {
        pin(kAnyCpu);
        backend_ = ordo::make_backend("sim", &err);
      }).join();
      if (!backend_) die(err);
    } else {
      backend_ = std::make_unique<NullBackend>(1, c.launch_ns);
    }
    ordo::WorkerOptions wo;
    wo.ordered = c.worker_edges;
    wo.trace = c.trace;
    // Never sleep between calls while measuring, unless the benchmark alternates
    // between workers and wants the idle one off the CPU.
    if (!c.idle_sleep) wo.spin = std::chrono::milliseconds(50);
    wo.quiet = true;
    wo.dispatch_threads = c.dispatch;
    worker_ = std::make_unique<ordo::Worker>(*region_, *backend_, wo);
    // With a cost model, the worker's threads (and their lanes, which inherit
    // the CPUs) go where the scheduler puts them, 1 dispatch thread as N.
    if (c.launch_ns) {
      thread_ = std::thread([w = worker_.get()] {
        pin(kAnyCpu);
        w->run(nullptr);
      });
    } else {
      thread_ = server_thread([w = worker_.get()] { w->run(nullptr); });
    }
    client_ = ordo::Client::attach(path_, &err, ordo::ClientOptions{.ordered = c.guest_edges});
    if (!client_) die(err);
    if (!ok(client_->kernel_lookup("ordo_noop", &kernel_))) die("kernel_lookup(ordo_noop) failed");
    const int want = c.shared ? 1 : threads;
    for (int i = 0; i < want; ++i) {
      ordo::Stream s;
      if (!ok(client_->stream_create(&s, c.blocking ? 0 : ordo::kStreamNonBlocking))) die("stream_create failed");
      streams_.push_back(s);
    }
  }

  ~Env() {
    worker_->stop();
    thread_.join();
    client_.reset();
    worker_.reset();
    backend_.reset();  // joins sim stream threads, which may still write into the region
    region_.reset();
    unlink(path_.c_str());
  }

  ordo::Client& client() { return *client_; }
  ordo::Stream stream(int thread) const { return streams_[size_t(thread) % streams_.size()]; }
  uint32_t kernel() const { return kernel_; }
  ordo::WorkerStats stats() const { return worker_->stats(); }

 private:
  std::string path_;
  std::unique_ptr<ordo::Region> region_;
  std::unique_ptr<ordo::Backend> backend_;
  std::unique_ptr<ordo::Worker> worker_;
  std::thread thread_;
  std::unique_ptr<ordo::Client> client_;
  std::vector<ordo::Stream> streams_;
  uint32_t kernel_ = 0;
};

std::unique_ptr<Env> g_env;

template <Config C>
void setup(const benchmark::State& st) {
  g_env = std::make_unique<Env>(C, st.threads());
}
void teardown(const benchmark::State&) { g_env.reset(); }

struct Args16 {
  uint64_t a, b;
};

constexpr double kMinTime = 0.3;

// ---- ordo ------------------------------------------------------------------

// Caller-side cost of one async launch while the worker keeps up: bursts of
// 256 launches into an empty ring (the ring never fills), timed per burst; the
// stream_synchronize that empties the ring between bursts is not timed.
void BM_Enqueue(benchmark::State& state) {
  constexpr int kBurst = 256;
  ordo::Client& c = g_env->client();
  const ordo::Stream s = g_env->stream(0);
  const uint32_t k = g_env->kernel();
  const Args16 args{1, 2};
  const uint32_t size = uint32_t(state.range(0));
  double total_ns = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    bool failed = false;
    for (int i = 0; i < kBurst; ++i) failed |= !ok(c.launch(k, {1}, {1}, size ? &args : nullptr, size, s));
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    state.SetIterationTime(ns * 1e-9);
    total_ns += ns;
    if (failed || !ok(c.stream_synchronize(s))) {
      state.SkipWithError("launch or stream_synchronize failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * kBurst);
  state.counters["ns_per_call"] = total_ns / double(state.iterations() * kBurst);
}
BENCHMARK(BM_Enqueue)->Name("ordo/enqueue")->ArgName("args_bytes")->Arg(16)->Arg(0)
    ->Setup(setup<Config{}>)->Teardown(teardown)->UseManualTime()->MinTime(kMinTime);

// Sync round trip: a reply-slot request the worker answers without a backend call.
void BM_NullCall(benchmark::State& state) {
  ordo::Client& c = g_env->client();
  for (auto _ : state) {
    if (!ok(c.null_call())) {
      state.SkipWithError("null_call failed");
      break;
    }
  }
}
BENCHMARK(BM_NullCall)->Name("ordo/sync_null_call")->Setup(setup<Config{}>)->Teardown(teardown)
    ->UseRealTime()->MinTime(kMinTime);

// ---- copies -----------------------------------------------------------------
//
// Synchronous copies of 4 KiB to 256 MiB through ordo against memcpy of the
// same size in this process (issue 12's figures): pageable host memory goes
// through the stream's staging window in chunks, pinned memory (malloc_host,
// the region's heap) is copied by the worker directly. On the null backend
// the device side does nothing: what is left is the transport. The region is
// 1 GiB so a 256 MiB pinned buffer fits its heap; copy/sim_64m/ is the
// default region's size.

constexpr Config kCopySim{.sim = true, .region_mb = 1024};
constexpr Config kCopyNull{.region_mb = 1024};
// ordo-worker's default region (64 MiB): a ring's window is 256 KiB, so
// copies that do not fit the staging pool move in 64 KiB chunks.
constexpr Config kCopySim64{.sim = true, .region_mb = 64};

enum class Dir { kH2D, kD2H };

template <Dir D, bool kPinned>
void BM_Copy(benchmark::State& state) {
  ordo::Client& c = g_env->client();
  const uint64_t n = uint64_t(state.range(0));
  uint64_t dev = 0;
  if (!ok(c.malloc(&dev, n))) {
    state.SkipWithError("malloc failed");
    return;
  }
  // Touched, as the host buffers are: the sim's device memory is mapped lazily,
  // so an untouched one would time page faults (H2D) or reads of the shared
  // zero page (D2H).
  if (!ok(c.memset_async(dev, 2, n, ordo::kLegacyStream)) || !ok(c.stream_synchronize(ordo::kLegacyStream))) {
    state.SkipWithError("memset failed");
    c.free(dev);
    return;
  }
  std::vector<std::byte> pageable;
  void* host = nullptr;
  if (kPinned) {
    if (!ok(c.malloc_host(&host, n))) {
      state.SkipWithError("malloc_host failed (the region's heap is too small)");
      c.free(dev);
      return;
    }
    std::memset(host, 1, n);
  } else {
    pageable.assign(n, std::byte{1});  // touched: page faults are not the copy's
    host = pageable.data();
  }
  for (auto _ : state) {
    const Status st = D == Dir::kH2D ? c.memcpy_h2d(dev, host, n) : c.memcpy_d2h(host, dev, n);
    if (!ok(st)) {
      state.SkipWithError("copy failed");
      break;
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
  if (kPinned) c.free_host(host);
  c.free(dev);
}

// The baseline: one memcpy of the same size between two touched buffers.
void BM_Memcpy(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  std::vector<std::byte> a(n, std::byte{1}), b(n, std::byte{0});
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
}

// The floor of a staged copy on this machine: the bytes go through staging
// blocks from one thread to the other, as a pageable copy through ordo on the
// sim goes from the guest to the worker, with the client's chunking (an eighth
// of the copy, 256 KiB to 1 MiB, up to 8 blocks) and a counter each way instead
// of a protocol. What ordo adds is the ratio of the two; what the machine
// charges for two copies on two cores is this against memcpy.
template <Dir D>
void BM_StagedMemcpy(benchmark::State& state) {
  const uint64_t n = uint64_t(state.range(0));
  const uint64_t chunk = std::clamp<uint64_t>((n / 8 + 4095) & ~uint64_t{4095}, 256 << 10, 1 << 20);
  const uint64_t chunks = (n + chunk - 1) / chunk;
  const uint64_t nb = std::min<uint64_t>(8, chunks);
  std::vector<std::byte> src(n, std::byte{1}), dst(n, std::byte{0}), staging(nb * chunk, std::byte{0});
  // Counts run on across rounds: chunk i of round r is number r * chunks + i.
  alignas(64) std::atomic<uint64_t> filled{0};
  alignas(64) std::atomic<uint64_t> drained{0};
  alignas(64) std::atomic<uint64_t> rounds{0};
  alignas(64) std::atomic<bool> stop{false};
  auto spin_until = [&](auto done) {
    while (!done()) {
      if (stop.load(std::memory_order_relaxed)) return false;
      _mm_pause();
    }
    return true;
  };
  auto part = [&](uint64_t i) { return std::min(chunk, n - i * chunk); };
  // The two copies of every chunk of one round: into staging, and out of it.
  auto produce = [&](uint64_t base) {
    for (uint64_t i = 0; i < chunks; ++i) {
      if (!spin_until([&] { return base + i - drained.load(std::memory_order_acquire) < nb; })) return;
      std::memcpy(staging.data() + (i % nb) * chunk, src.data() + i * chunk, part(i));
      filled.store(base + i + 1, std::memory_order_release);
    }
  };
  auto consume = [&](uint64_t base) {
    for (uint64_t i = 0; i < chunks; ++i) {
      if (!spin_until([&] { return filled.load(std::memory_order_acquire) > base + i; })) return;
      std::memcpy(dst.data() + i * chunk, staging.data() + (i % nb) * chunk, part(i));
      drained.store(base + i + 1, std::memory_order_release);
    }
  };
  std::thread server = server_thread([&] {
    for (uint64_t r = 0;; ++r) {
      if (!spin_until([&] { return rounds.load(std::memory_order_acquire) > r; })) return;
      D == Dir::kH2D ? consume(r * chunks) : produce(r * chunks);
    }
  });
  uint64_t r = 0;
  for (auto _ : state) {
    rounds.store(r + 1, std::memory_order_release);
    D == Dir::kH2D ? produce(r * chunks) : consume(r * chunks);
    ++r;
    spin_until([&] { return drained.load(std::memory_order_acquire) == r * chunks; });  // H2D: the server's last copy
  }
  stop.store(true);
  server.join();
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
}

void copy_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{4} << 10, int64_t{64} << 10, int64_t{1} << 20, int64_t{16} << 20, int64_t{256} << 20})
    b->Arg(n);
}

// The sizes that stage through the pinned heap (the client's kPoolCopyMin and up).
void pool_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 20, int64_t{16} << 20, int64_t{256} << 20}) b->Arg(n);
}

#define ORDO_COPY_BENCH(backend, config, kind, pinned)                                                      \
  BENCHMARK(BM_Copy<Dir::kH2D, pinned>)->Name("copy/" backend "/" kind "_h2d")->Apply(copy_sizes)           \
      ->Setup(setup<config>)->Teardown(teardown)->UseRealTime()->MinTime(kMinTime);                        \
  BENCHMARK(BM_Copy<Dir::kD2H, pinned>)->Name("copy/" backend "/" kind "_d2h")->Apply(copy_sizes)           \
      ->Setup(setup<config>)->Teardown(teardown)->UseRealTime()->MinTime(kMinTime)
ORDO_COPY_BENCH("sim", kCopySim, "pageable", false);
ORDO_COPY_BENCH("sim_64m", kCopySim64, "pageable", false);
ORDO_COPY_BENCH("sim", kCopySim, "pinned", true);
ORDO_COPY_BENCH("null", kCopyNull, "pageable", false);
ORDO_COPY_BENCH("null", kCopyNull, "pinned", true);
BENCHMARK(BM_Memcpy)->Name("baseline/memcpy")->Apply(copy_sizes)->UseRealTime()->MinTime(kMinTime);
BENCHMARK(BM_StagedMemcpy<Dir::kH2D>)->Name("baseline/staged_memcpy_h2d")->Apply(pool_sizes)->UseRealTime()
    ->MinTime(kMinTime);
BENCHMARK(BM_StagedMemcpy<Dir::kD2H>)->Name("baseline/staged_memcpy_d2h")->Apply(pool_sizes)->UseRealTime()
    ->MinTime(kMinTime);

// Diagnostic: one Worker::poll_once() with nothing to do (no worker thread; an
// attached but idle client, its legacy ring and 64 idle reply slots). A request
// waits on average half a pass before the worker sees it, so this bounds how
// close the sync round trip can get to the ping-pong floor.
template <bool serve>
void BM_IdlePass(benchmark::State& state) {
  const std::string path = "/dev/shm/ordo-bench-" + std::to_string(getpid()) + "-idle";
  ordo::Layout l;
  std::string err;
  if (!ordo::plan_default_layout(64u << 20, &l)) die("plan_default_layout failed");
  auto region = ordo::Region::create(path, l, &err);
  if (!region) die(err);
  NullBackend backend;
  ordo::WorkerOptions wo;
  wo.quiet = true;
  {
    ordo::Worker w(*region, backend, wo);
    // attach() waits for the worker to accept the session, which happens in poll_once().
    std::unique_ptr<ordo::Client> client;
    std::atomic<bool> attached{false};
    std::thread attacher([&] {
      client = ordo::Client::attach(path, &err);
      attached.store(true);
    });
    while (!attached.load()) w.poll_once();
    attacher.join();
    if (!client) die(err);
    if (!serve) {
      for (auto _ : state) benchmark::DoNotOptimize(w.poll_once());
    } else {
      // A slot no client thread uses, as a guest thread would call on it.
      const uint32_t s = l.slot_count - 2;
      ordo::ReplySlot& slot = region->slot(s);
      ordo::Entry e{};
      e.op = uint16_t(ordo::Op::Null);
      uint64_t seq = slot.request.seq.load();
      for (auto _ : state) {
        ordo::write_request(slot, e, ++seq);
        if (!slot.watched.load(std::memory_order_relaxed)) ordo::post_slot(region->header(), s);
        w.poll_once();
        if (slot.reply_seq.load(std::memory_order_acquire) != seq) die("the worker did not answer in one pass");
      }
    }
  }
  region.reset();
  unlink(path.c_str());
}
BENCHMARK(BM_IdlePass<false>)->Name("ordo/worker_idle_pass")->MinTime(kMinTime);
// Diagnostic: a null call written and answered on one thread (write_request,
// then one poll_once): what both sides' code costs a sync call, without the
// cache-line transfers and the waiting that the round trip adds.
BENCHMARK(BM_IdlePass<true>)->Name("ordo/serve_pass")->MinTime(kMinTime);

// Sustained async launches (16-byte args), each thread on the stream Env gave it.
// `mixed`: every 8th launch goes to the legacy stream instead, so blocking
// streams and the legacy stream order against each other (real edges).
// The last iteration synchronizes every stream the thread used, inside the timed
// region: items/s counts only work the worker has dispatched.
template <bool mixed>
void BM_Launch(benchmark::State& state) {
  ordo::Client& c = g_env->client();
  const ordo::Stream own = g_env->stream(state.thread_index());
  const uint32_t k = g_env->kernel();
  const Args16 args{1, 2};
  const ordo::WorkerStats before = state.thread_index() == 0 ? g_env->stats() : ordo::WorkerStats{};
  int64_t n = 0;
  for (auto _ : state) {
    const ordo::Stream s = mixed && (n & 7) == 7 ? ordo::kLegacyStream : own;
    if (!ok(c.launch(k, {1}, {1}, &args, sizeof args, s))) {
      state.SkipWithError("launch failed");
      break;
    }
    if (++n == state.max_iterations) {
      const bool synced = ok(c.stream_synchronize(own)) && (!mixed || ok(c.stream_synchronize(ordo::kLegacyStream)));
      if (!synced) state.SkipWithError("stream_synchronize failed");
    }
  }
  state.SetItemsProcessed(n);
  if (state.thread_index() == 0) {
    // All threads have left the loop here (the loop ends at a barrier).
    const ordo::WorkerStats after = g_env->stats();
    const double calls = double(n) * state.threads();
    state.counters["entries_per_call"] = double(after.entries - before.entries) / calls;
    state.counters["edge_waits_per_call"] = double(after.edge_waits - before.edge_waits) / calls;
  }
}

constexpr Config kIndependent{};
constexpr Config kShared{.shared = true};
constexpr Config kNoGuestEdges{.guest_edges = false};
constexpr Config kNoEdges{.guest_edges = false, .worker_edges = false};
constexpr Config kMixed{.blocking = true};
constexpr Config kMixedNoGuestEdges{.guest_edges = false, .blocking = true};
constexpr Config kMixedNoEdges{.guest_edges = false, .worker_edges = false, .blocking = true};
constexpr Config kSim{.sim = true};
constexpr Config kTraced{.trace = true};

#define ORDO_LAUNCH(mixed, name, config, lo, hi)                                          \
  BENCHMARK(BM_Launch<mixed>)->Name(name)->Setup(setup<config>)->Teardown(teardown)   \
      ->ThreadRange(lo, hi)->UseRealTime()->MinTime(kMinTime)

ORDO_LAUNCH(false, "ordo/throughput/independent", kIndependent, 1, 8);
ORDO_LAUNCH(false, "ordo/throughput/shared_stream", kShared, 1, 8);
// Ordering overhead: the same load with ordering on (the default), with the
// guest building no edges (the worker still honours any it gets), and off on
// both sides. paired/ordering/* below measures the on/off ratio more robustly.
// Tracing overhead (ordo-worker --trace): every dispatch recorded.
ORDO_LAUNCH(false, "ordo/tracing/independent/trace_off", kIndependent, 1, 2);
ORDO_LAUNCH(false, "ordo/tracing/independent/trace_on", kTraced, 1, 2);
ORDO_LAUNCH(false, "ordo/ordering/independent/edges_on", kIndependent, 1, 2);
ORDO_LAUNCH(false, "ordo/ordering/independent/guest_edges_off", kNoGuestEdges, 1, 2);
ORDO_LAUNCH(false, "ordo/ordering/independent/edges_off", kNoEdges, 1, 2);
ORDO_LAUNCH(true, "ordo/ordering/mixed_legacy/edges_on", kMixed, 1, 2);
ORDO_LAUNCH(true, "ordo/ordering/mixed_legacy/guest_edges_off", kMixedNoGuestEdges, 1, 2);
ORDO_LAUNCH(true, "ordo/ordering/mixed_legacy/edges_off", kMixedNoEdges, 1, 2);
// Reference only: the sim backend runs each stream on its own host thread, so
// this measures the simulator's hand-off as much as ordo.
ORDO_LAUNCH(false, "sim_backend/throughput/independent", kSim, 1, 2);

// Dispatch threads (ARCHITECTURE.md, "Dispatch threads"): launches that cost
// what a driver launch costs (NullBackend's cost model: 5 us of CPU each, as
// `ordo-worker --backend null --null-launch-ns 5000`), each guest thread on a
// stream (and a ring) of its own, served by 1 or by 2 dispatch threads. One
// dispatch thread caps the rate near 200k launches/s whatever the guest does.
constexpr Config kCost1{.launch_ns = 5000, .dispatch = 1};
constexpr Config kCost2{.launch_ns = 5000, .dispatch = 2};
ORDO_LAUNCH(false, "ordo/dispatch/launch_5us/dispatch_threads:1", kCost1, 1, 4);
ORDO_LAUNCH(false, "ordo/dispatch/launch_5us/dispatch_threads:2", kCost2, 1, 4);

// Scaling with guest threads: 1..256 threads launching at once, each on its
// own stream (past 63 streams they share rings; threads past the 55 permanent
// reply slots lease one per sync call, their launches need none).
constexpr Config kManyThreads{};
BENCHMARK(BM_Launch<false>)->Name("ordo/scaling/threads")->Setup(setup<kManyThreads>)->Teardown(teardown)
    ->Threads(1)->Threads(16)->Threads(64)->Threads(256)->UseRealTime()->MinTime(kMinTime);

// Scaling with live streams: one thread launching round-robin over N streams.
// Up to 62 (64 rings at 64 MiB, less the legacy ring and Env's stream) each has
// a ring of its own; beyond that they share rings (ARCHITECTURE.md, "Streams
// and rings"), and the sim runs a host thread per stream.
void BM_LiveStreams(benchmark::State& state) {
  ordo::Client& c = g_env->client();
  const uint32_t k = g_env->kernel();
  const Args16 args{1, 2};
  std::vector<ordo::Stream> streams(size_t(state.range(0)));
  for (auto& s : streams)
    if (!ok(c.stream_create(&s, ordo::kStreamNonBlocking))) {
      state.SkipWithError("stream_create failed");
      return;
    }
  int64_t n = 0;
  for (auto _ : state) {
    if (!ok(c.launch(k, {1}, {1}, &args, sizeof args, streams[size_t(n) % streams.size()]))) {
      state.SkipWithError("launch failed");
      break;
    }
    if (++n == state.max_iterations)
      for (auto& s : streams)
        if (!ok(c.stream_synchronize(s))) state.SkipWithError("stream_synchronize failed");
  }
  state.SetItemsProcessed(n);
  for (auto& s : streams) c.stream_destroy(s);
}
BENCHMARK(BM_LiveStreams)->Name("ordo/scaling/live_streams")->Setup(setup<kIndependent>)->Teardown(teardown)
    ->ArgName("streams")->Arg(1)->Arg(8)->Arg(62)->Arg(256)->Arg(1024)->Arg(4096)->UseRealTime()->MinTime(kMinTime);

// ---- baselines -------------------------------------------------------------

// The floor: two threads bouncing one cache line. The responder turns an odd
// value into the next even one; the caller waits for it. Both spin with pause,
// as ordo's worker and client do.
class PingPong {
 public:
  PingPong() : responder_(server_thread([this] {
      for (;;) {
        const uint64_t v = line_.v.load(std::memory_order_acquire);
        if (v == kStop) return;
        if (v & 1) line_.v.store(v + 1, std::memory_order_release);
        else _mm_pause();
      }
    })) {}
  ~PingPong() {
    line_.v.store(kStop);
    responder_.join();
  }
  void round_trip() {
    line_.v.store(++x_, std::memory_order_release);
    ++x_;
    while (line_.v.load(std::memory_order_acquire) != x_) _mm_pause();
  }

 private:
  static constexpr uint64_t kStop = ~uint64_t{0};
  struct alignas(ordo::kCacheLine) Line {  // a line of its own: alignas rounds the size up too
    std::atomic<uint64_t> v{0};
  };
  Line line_;
  uint64_t x_ = 0;
  std::thread responder_;  // last: starts once the line is initialised
};

void BM_PingPong(benchmark::State& state) {
  auto pp = std::make_unique<PingPong>();
  for (auto _ : state) pp->round_trip();
}
BENCHMARK(BM_PingPong)->Name("baseline/cacheline_pingpong")->UseRealTime()->MinTime(kMinTime);

bool full_io(ssize_t (*io)(int, void*, size_t), int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n) {
    const ssize_t r = io(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}
ssize_t write_fn(int fd, void* b, size_t n) { return ::write(fd, b, n); }
ssize_t read_fn(int fd, void* b, size_t n) { return ::read(fd, b, n); }

// A typical RPC transport: 8-byte request, 8-byte reply over AF_UNIX, blocking
// reads on both sides (the server thread sleeps in read between requests).
void BM_UnixSocket(benchmark::State& state) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    state.SkipWithError("socketpair failed");
    return;
  }
  std::thread server = server_thread([fd = fds[1]] {
    uint64_t v;
    while (full_io(read_fn, fd, &v, sizeof v)) {
      ++v;
      if (!full_io(write_fn, fd, &v, sizeof v)) return;
    }
  });
  uint64_t v = 0;
  for (auto _ : state) {
    if (!full_io(write_fn, fds[0], &v, sizeof v) || !full_io(read_fn, fds[0], &v, sizeof v)) {
      state.SkipWithError("socket i/o failed");
      break;
    }
  }
  ::close(fds[0]);  // the server's read sees end-of-file
  server.join();
  ::close(fds[1]);
}
BENCHMARK(BM_UnixSocket)->Name("baseline/unix_socket_roundtrip")->UseRealTime()->MinTime(kMinTime);

using Spsc = boost::lockfree::spsc_queue<uint64_t, boost::lockfree::capacity<1024>>;

// Producer -> consumer thread through one queue, the ring size ordo uses. As in
// BM_Launch, the last iteration waits until the consumer has taken everything.
// `fenced`: after each push, the seq_cst fence and flag load that ordo's
// notify_worker() does per entry (the sleep handshake), to price that alone.
template <bool fenced>
void BM_SpscThroughput(benchmark::State& state) {
  struct alignas(ordo::kCacheLine) Flag {
    std::atomic<uint32_t> sleeping{0};
  };
  static Flag flag;
  auto q = std::make_unique<Spsc>();
  std::atomic<uint64_t> consumed{0};
  std::atomic<bool> stop{false};
  std::thread consumer = server_thread([&] {
    uint64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const size_t got = q->consume_all([](uint64_t) {});
      if (got) consumed.store(n += got, std::memory_order_release);
      else _mm_pause();
    }
  });
  uint64_t n = 0;
  for (auto _ : state) {
    while (!q->push(n)) _mm_pause();
    if (fenced) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      benchmark::DoNotOptimize(flag.sleeping.load(std::memory_order_relaxed));
    }
    if (int64_t(++n) == state.max_iterations)
      while (consumed.load(std::memory_order_acquire) != n) _mm_pause();
  }
  stop.store(true);
  consumer.join();
  state.SetItemsProcessed(int64_t(n));
}
BENCHMARK(BM_SpscThroughput<false>)->Name("baseline/spsc_queue_throughput")->UseRealTime()->MinTime(kMinTime);
BENCHMARK(BM_SpscThroughput<true>)->Name("baseline/spsc_queue_throughput_fenced")->UseRealTime()->MinTime(kMinTime);

// Request/reply over two spsc_queues: a round trip built from the same parts.
void BM_SpscRoundTrip(benchmark::State& state) {
  auto req = std::make_unique<Spsc>();
  auto rep = std::make_unique<Spsc>();
  std::atomic<bool> stop{false};
  std::thread server = server_thread([&] {
    uint64_t v;
    while (!stop.load(std::memory_order_relaxed)) {
      if (req->pop(v)) {
        while (!rep->push(v + 1)) _mm_pause();
      } else {
        _mm_pause();
      }
    }
  });
  uint64_t v = 0;
  for (auto _ : state) {
    while (!req->push(v)) _mm_pause();
    while (!rep->pop(v)) _mm_pause();
  }
  stop.store(true);
  server.join();
}
BENCHMARK(BM_SpscRoundTrip)->Name("baseline/spsc_queue_roundtrip")->UseRealTime()->MinTime(kMinTime);

// The floor under ordo/enqueue: a ring of one-line entries that publish
// themselves (ordo's publish_entry), a consumer that polls the slot at its head
// and copies each entry out (as the worker does), and a producer that does
// `work` steps of a dependent multiply-add chain (about 1.2 ns each here; no
// memory, no pause: a pause also waits for the core's stores) and `stores`
// stores to its own stack before each entry. Timed as BM_Enqueue: bursts of
// 256, the ring drained between them. A consumer that keeps up is polling the
// very line the producer writes next, so the entry's store waits for that line
// at the head of the core's store queue; the stores after it queue up behind
// it, and once the queue is full the producer waits out the line's trip. The
// stores are the launch's other ones (spills, bookkeeping): `stores` against
// `stores:0` is what they cost at the placement of the run.
void BM_LineRing(benchmark::State& state) {
  constexpr uint32_t kCap = 1024;
  constexpr int kBurst = 256;
  auto ring = std::make_unique<ordo::Entry[]>(kCap);
  struct alignas(ordo::kCacheLine) Head {
    std::atomic<uint64_t> v{0};
  };
  auto head = std::make_unique<Head>();
  std::atomic<bool> stop{false};
  std::thread consumer = server_thread([&] {
    uint64_t pos = 0, sink = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      ordo::Entry* slot = &ring[pos & (kCap - 1)];
      const uint64_t word = ordo::entry_word(slot).load(std::memory_order_acquire);
      if (ordo::word_lap(word) != ordo::entry_lap(pos, kCap)) {
        _mm_pause();
        continue;
      }
      alignas(ordo::kCacheLine) ordo::Entry copy;
      std::memcpy(&copy, slot, ordo::kCacheLine);
      sink += copy.arg[0];
      head->v.store(++pos, std::memory_order_release);
    }
    benchmark::DoNotOptimize(sink);
  });
  const int work = int(state.range(0));
  const int stores = int(state.range(1));
  std::array<uint64_t, 128> stack{};
  ordo::Entry e{};
  e.op = uint16_t(ordo::Op::Launch);
  uint64_t pos = 0, x = 1;
  double total_ns = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBurst; ++i, ++pos) {
      for (int k = 0; k < work; ++k) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        asm volatile("" : "+r"(x));
      }
      if (stores) {
        for (int k = 0; k < stores; ++k) stack[k] = x + k;
        benchmark::DoNotOptimize(stack);  // stored, each time: as a launch's spills are
      }
      e.arg[0] = x;
      ordo::publish_entry(&ring[pos & (kCap - 1)], e, pos, kCap);
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    state.SetIterationTime(ns * 1e-9);
    total_ns += ns;
    while (head->v.load(std::memory_order_acquire) != pos) _mm_pause();
  }
  stop.store(true);
  consumer.join();
  state.counters["ns_per_entry"] = total_ns / double(state.iterations() * kBurst);
}
BENCHMARK(BM_LineRing)->Name("baseline/line_ring")->ArgNames({"work", "stores"})
    ->Args({0, 0})->Args({40, 0})->Args({40, 32})->Args({40, 64})->UseManualTime()->MinTime(kMinTime);

// ---- paired A/B ------------------------------------------------------------
//
// On this shared VM the floor itself moves (the ping-pong ranged from ~35 to
// ~440 ns between runs, with the host's placement of the vCPUs and other load),
// so the target ratios are also measured in short alternating phases inside
// one benchmark: both sides see the same conditions. Each phase first lets the
// other side's worker fall asleep (idle_sleep), so only one server spins.

double ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

// ---- sessions --------------------------------------------------------------
//
// Aggregate launch rate of N guest processes on one region (ordo-worker
// --sessions 4, null backend: transport and dispatch only), each launching
// kLaunches on a stream of its own and synchronizing. Process start and attach
// are outside the timed part: the processes wait on a pipe to start together.

void BM_Sessions(benchmark::State& state) {
  constexpr int kLaunches = 20000;
  const char* exe = std::getenv("ORDO_WORKER");
  if (!exe) {
    state.SkipWithError("ORDO_WORKER is not set (meson test --benchmark sets it to the built ordo-worker)");
    return;
  }
  const std::string region = "/dev/shm/ordo-bench-sessions-" + std::to_string(getpid());
  const std::string ready = region + ".ready";
  unlink(ready.c_str());  // the previous argument's run left one
  // The benchmark pins its own threads; these processes get every CPU, as in production.
  auto unpin = [] {
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof all, &all);
  };
  const pid_t worker = fork();
  if (worker == 0) {
    unpin();
    execl(exe, exe, "--region", region.c_str(), "--size", "64M", "--sessions", "4", "--backend", "null",
          "--ready-file", ready.c_str(), "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 1000 && access(ready.c_str(), F_OK) != 0; ++i) usleep(5000);
  const int n = int(state.range(0));
  for (auto _ : state) {
    int go[2], attached[2];
    if (pipe(go) != 0 || pipe(attached) != 0) die("pipe failed");
    std::vector<pid_t> guests;
    for (int k = 0; k < n; ++k) {
      const pid_t pid = fork();
      if (pid == 0) {
        unpin();
        close(attached[0]);
        close(go[1]);
        std::string err;
        auto c = ordo::Client::attach(region, &err);
        ordo::Stream s{};
        if (!c || !ok(c->stream_create(&s))) {
          std::fprintf(stderr, "ordo/sessions: guest %d: %s\n", k, c ? "stream_create failed" : err.c_str());
          _exit(2);
        }
        char b = 1;
        if (write(attached[1], &b, 1) != 1 || read(go[0], &b, 1) != 1) _exit(3);
        const Args16 args{1, 2};
        for (int i = 0; i < kLaunches; ++i)
          if (!ok(c->launch(0, {1}, {1}, &args, sizeof args, s))) _exit(4);
        _exit(ok(c->stream_synchronize(s)) ? 0 : 5);
      }
      guests.push_back(pid);
    }
    close(attached[1]);  // a guest that dies before attaching ends the read below
    close(go[0]);
    char b = 1;
    for (int k = 0; k < n; ++k)
      if (read(attached[0], &b, 1) != 1) die("a guest process did not attach");
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < n; ++k)
      if (write(go[1], &b, 1) != 1) die("pipe write failed");
    bool failed = false;
    for (pid_t pid : guests) {
      int st = 0;
      waitpid(pid, &st, 0);
      failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    state.SetIterationTime(ns_since(t0) * 1e-9);
    close(go[1]);
    close(attached[0]);
    if (failed) {
      state.SkipWithError("a guest process failed");
      break;
    }
  }
  kill(worker, SIGTERM);
  waitpid(worker, nullptr, 0);
  unlink(region.c_str());
  unlink(ready.c_str());
  for (uint32_t k = 0; k < 4; ++k) unlink(ordo::doorbell_path(region, k).c_str());
  state.SetItemsProcessed(state.iterations() * n * kLaunches);
}
BENCHMARK(BM_Sessions)->Name("ordo/sessions/processes")->Arg(1)->Arg(2)->Arg(4)->UseManualTime()
    ->Iterations(5);

// Lets every idle worker pass its 200 us spin and sleep, then wakes `env`'s.
void settle(Env* env) {
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (env && !ok(env->client().null_call())) die("null_call failed");
}

// Runs phases `a` and `b` once each per iteration, in ABBA order so that
// drift falls on both alike. Each returns its time per item in ns, over
// `items` items; the iteration's time is both phases'. Returns the sums of
// a's and b's results.
template <class A, class B>
std::pair<double, double> abba(benchmark::State& state, double items, A a, B b) {
  double sum_a = 0, sum_b = 0;
  bool flip = false;
  for (auto _ : state) {
    double x, y;
    if ((flip = !flip)) {
      x = a();
      y = b();
    } else {
      y = b();
      x = a();
    }
    state.SetIterationTime((x + y) * items * 1e-9);
    sum_a += x;
    sum_b += y;
  }
  return {sum_a, sum_b};
}

// Sync null call vs the ping-pong floor, 2000 round trips per phase.
void BM_PairedSyncVsPingPong(benchmark::State& state) {
  constexpr int kN = 2000;
  Env env(Config{.idle_sleep = true}, 1);
  double sync_ns = 0, pp_ns = 0;
  for (auto _ : state) {
    settle(&env);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kN; ++i)
      if (!ok(env.client().null_call())) die("null_call failed");
    const double a = ns_since(t0);
    settle(nullptr);
    double b;
    {
      PingPong pp;
      pp.round_trip();  // the responder thread is running
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kN; ++i) pp.round_trip();
      b = ns_since(t0);
    }
    state.SetIterationTime((a + b) * 1e-9);
    sync_ns += a;
    pp_ns += b;
  }
  const double n = double(state.iterations()) * kN;
  state.counters["sync_rt_ns"] = sync_ns / n;
  state.counters["pingpong_rt_ns"] = pp_ns / n;
  state.counters["sync_over_pingpong"] = sync_ns / pp_ns;
}
BENCHMARK(BM_PairedSyncVsPingPong)->Name("paired/sync_vs_pingpong")->UseManualTime()->MinTime(kMinTime);

// One phase of 16384 launches (16-byte args) and the synchronize that ends it, in ns.
double launch_phase(Env& env, bool mixed) {
  constexpr int kN = 16384;
  ordo::Client& c = env.client();
  const ordo::Stream own = env.stream(0);
  const Args16 args{1, 2};
  settle(&env);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i)
    if (!ok(c.launch(env.kernel(), {1}, {1}, &args, sizeof args, mixed && (i & 7) == 7 ? ordo::kLegacyStream : own)))
      die("launch failed");
  if (!ok(c.stream_synchronize(own)) || (mixed && !ok(c.stream_synchronize(ordo::kLegacyStream))))
    die("stream_synchronize failed");
  return ns_since(t0) / kN;
}

// Ordering on (both sides) vs off (both sides), one thread, alternating ABBA.
// `control`: both sides ordered (an A/A run), which shows what two otherwise
// identical setups differ by, i.e. the resolution of the on/off ratio.
template <bool mixed, bool control = false>
void BM_PairedOrdering(benchmark::State& state) {
  Env on(Config{.blocking = mixed, .idle_sleep = true}, 1);
  Env off(Config{.guest_edges = control, .worker_edges = control, .blocking = mixed, .idle_sleep = true}, 1);
  const auto [on_ns, off_ns] =
      abba(state, 16384, [&] { return launch_phase(on, mixed); }, [&] { return launch_phase(off, mixed); });
  const double n = double(state.iterations());
  state.counters["on_Mitems_s"] = 1e3 * n / on_ns;
  state.counters["off_Mitems_s"] = 1e3 * n / off_ns;
  state.counters["on_over_off"] = off_ns / on_ns;  // throughput ratio
}
BENCHMARK(BM_PairedOrdering<false>)->Name("paired/ordering/independent")->UseManualTime()->MinTime(kMinTime);
BENCHMARK(BM_PairedOrdering<true>)->Name("paired/ordering/mixed_legacy")->UseManualTime()->MinTime(kMinTime);
BENCHMARK(BM_PairedOrdering<false, true>)->Name("paired/ordering/independent_control_on_vs_on")
    ->UseManualTime()->MinTime(kMinTime);

// One phase of `reps` launches of worker graph `graph` (of `kernels` kernels)
// on `s` and the synchronize that ends it: ns per kernel.
double graph_launches(Env& env, uint32_t graph, ordo::Stream s, int reps, int kernels) {
  settle(&env);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r)
    if (!ok(env.client().graph_launch(graph, s))) die("graph_launch failed");
  if (!ok(env.client().stream_synchronize(s))) die("stream_synchronize failed");
  return ns_since(t0) / (reps * kernels);
}

// A CUDA graph's kernels as one GraphLaunch entry vs the same kernels
// launched one by one, on one stream of one worker, alternating ABBA; each
// phase is 64 repetitions and the synchronize that ends it. Per kernel, in ns.
void BM_PairedGraphVsLaunches(benchmark::State& state) {
  const int kernels = int(state.range(0));
  constexpr int kReps = 64;
  Env env(Config{.idle_sleep = true}, 1);
  ordo::Client& c = env.client();
  const ordo::Stream s = env.stream(0);
  const Args16 args{1, 2};
  ordo::GraphStepWriter w;
  for (int i = 0; i < kernels; ++i) w.kernel({env.kernel(), 0, {1, 1, 1}, {1, 1, 1}, sizeof args, 0}, &args);
  uint32_t graph = 0;
  if (!ok(c.graph_create(w.bytes().data(), w.bytes().size(), &graph))) die("graph_create failed");
  auto graph_phase = [&] { return graph_launches(env, graph, s, kReps, kernels); };
  auto launch_phase = [&] {
    settle(&env);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps * kernels; ++r)
      if (!ok(c.launch(env.kernel(), {1}, {1}, &args, sizeof args, s))) die("launch failed");
    if (!ok(c.stream_synchronize(s))) die("stream_synchronize failed");
    return ns_since(t0) / (kReps * kernels);
  };
  const auto [graph_ns, launch_ns] = abba(state, kReps * kernels, graph_phase, launch_phase);
  if (!ok(c.graph_destroy(graph))) die("graph_destroy failed");
  const double n = double(state.iterations());
  state.counters["graph_ns_per_kernel"] = graph_ns / n;
  state.counters["launch_ns_per_kernel"] = launch_ns / n;
  state.counters["launch_over_graph"] = launch_ns / graph_ns;  // > 1: the graph is cheaper per kernel
}
BENCHMARK(BM_PairedGraphVsLaunches)->Name("paired/graph_vs_launches")->ArgName("kernels")->Arg(1)->Arg(8)->Arg(64)
    ->UseManualTime()->MinTime(kMinTime);

// A graph with a conditional node (an IF its handle's default takes, holding
// the kernels) vs the same kernels as a plain graph, alternating ABBA as
// above, on the sim (the null backend runs no programs): what running a
// program whole costs (the worker checks every step, the sim's stream thread
// runs it as one op) against step-by-step dispatch.
void BM_PairedConditionalVsGraph(benchmark::State& state) {
  const int kernels = int(state.range(0));
  constexpr int kReps = 64;
  Env env(Config{.sim = true, .idle_sleep = true}, 1);
  ordo::Client& c = env.client();
  const ordo::Stream s = env.stream(0);
  const Args16 args{1, 2};
  uint64_t h = 0;
  if (!ok(c.graph_cond_handle(0, &h))) die("graph_cond_handle failed");
  ordo::GraphStepWriter plain, cond;
  cond.handle({h, 1, ordo::kCondAssignDefault});
  cond.cond({h, uint32_t(ordo::CondType::kIf), 1});
  const size_t body = cond.begin_body();
  for (int i = 0; i < kernels; ++i) {
    plain.kernel({env.kernel(), 0, {1, 1, 1}, {1, 1, 1}, sizeof args, 0}, &args);
    cond.kernel({env.kernel(), 0, {1, 1, 1}, {1, 1, 1}, sizeof args, 0}, &args);
  }
  cond.end_body(body);
  uint32_t pg = 0, cg = 0;
  if (!ok(c.graph_create(plain.bytes().data(), plain.bytes().size(), &pg)) ||
      !ok(c.graph_create(cond.bytes().data(), cond.bytes().size(), &cg)))
    die("graph_create failed");
  auto phase = [&](uint32_t graph) { return graph_launches(env, graph, s, kReps, kernels); };
  const auto [cond_ns, plain_ns] = abba(state, kReps * kernels, [&] { return phase(cg); }, [&] { return phase(pg); });
  if (!ok(c.graph_destroy(pg)) || !ok(c.graph_destroy(cg))) die("graph_destroy failed");
  const double n = double(state.iterations());
  state.counters["cond_ns_per_kernel"] = cond_ns / n;
  state.counters["graph_ns_per_kernel"] = plain_ns / n;
  state.counters["graph_over_cond"] = plain_ns / cond_ns;  // > 1: the conditional program is cheaper per kernel
}
BENCHMARK(BM_PairedConditionalVsGraph)->Name("paired/conditional_vs_graph")->ArgName("kernels")->Arg(1)->Arg(8)
    ->Arg(64)->UseManualTime()->MinTime(kMinTime);

}  // namespace

int main(int argc, char** argv) {
  const char* no_pin = std::getenv("ORDO_BENCH_NO_PIN");
  g_pin = std::thread::hardware_concurrency() >= 2 && !(no_pin && *no_pin == '1');
  pin(kGuestCpu);  // benchmark threads are started from this one and inherit it
  benchmark::AddCustomContext("pinned", g_pin ? "guest threads cpu 0, worker/servers cpu 1" : "no");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

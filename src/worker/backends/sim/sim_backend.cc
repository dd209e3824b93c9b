// The CPU simulator backend.
//
// Threads: one host thread per stream runs that stream's ops strictly in FIFO
// order. The caller (the worker's dispatch thread) enqueues, except that it runs
// a short copy or memset itself when the stream is idle (Device::run_inline).
//
// Locking:
//   Device::mu_     stream table, event table, every stream's `enqueued` count
//                   and the legacy-stream bookkeeping; held for each enqueue so
//                   that "earlier call" is well defined.
//   Stream::mu      that stream's queue, its completion waiters and pending
//                   event notifications. Taken after Device::mu_, never the
//                   other way round; a stream thread never holds it while it
//                   runs an op or a callback. The completion count itself is an
//                   atomic; the stream thread takes Stream::mu after a
//                   completion only when someone waits or has a notification.
//   Device::mem_mu_ the allocation map (shared for translations).
//   No lock is held while an op (kernel, copy, host callback) runs.
//
// Completion: a stream counts the ops enqueued and the ops completed. A point in
// a stream is (stream, seq) and is complete when completed >= seq. Events capture
// such a point; dependencies between streams (stream_wait_event, the legacy
// default stream's implicit synchronization) are WaitOps in the waiting stream's
// queue that block its thread on the other stream's condition variable.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "ordo/layout.h"
#include "ordo/sim.h"
#include "sim_backend.h"

namespace ordo::sim {

// Simulated device work touches device memory the way a GPU does: two streams
// the program did not order may touch the same bytes at once. Such a race is
// the guest program's bug (and the tests that switch ordering off provoke it
// on purpose), so every access by device work goes through these two
// functions, which tests/tsan.supp names.
[[gnu::noinline]] void device_copy(void* dst, const void* src, uint64_t n) { std::memmove(dst, src, n); }
[[gnu::noinline]] void device_fill(void* dst, uint8_t v, uint64_t n) { std::memset(dst, v, n); }

namespace {

constexpr uint32_t kMaxKernels = 65536;
constexpr uint64_t kMaxAllocBytes = uint64_t{64} << 30;
constexpr uint64_t kAllocAlign = 256;
constexpr uint64_t kMmapThreshold = uint64_t{1} << 20;
// The largest copy or memset the dispatching thread runs itself (Device::run_inline):
// about 100 us of memcpy, so the worker's other rings wait no longer than that.
constexpr uint64_t kInlineBytes = uint64_t{4} << 20;
// Synthetic device addresses are non-canonical on x86-64 and AArch64 (4- and
// 5-level paging alike), so they can never equal a real host pointer.
constexpr uint64_t kDeviceBase = 0x0d00'0000'0000'0000;
// Each device's allocations in a range of their own, so an address names its device.
constexpr unsigned kDeviceSpanShift = 44;
uint32_t device_of_addr(uint64_t addr) { return uint32_t((addr - kDeviceBase) >> kDeviceSpanShift); }
constexpr uint32_t kEventDisableTiming = 0x2;  // cudaEventDisableTiming
constexpr uint64_t kMaxBlockThreads = 1024;

std::atomic<uint64_t> g_tick{0};

// ---------------------------------------------------------------- kernel registry

struct Registry {
  std::shared_mutex mu;
  std::map<std::string, uint32_t, std::less<>> ids;  // guarded by mu
  std::array<std::atomic<Kernel>, kMaxKernels> fns{};
  // Kernels of loaded modules with no host twin, by id: found, but launching them fails.
  std::map<uint32_t, std::string> missing;  // guarded by mu
  std::atomic<uint32_t> count{0};
};

Registry& registry() {
  static Registry r;
  return r;
}

Kernel kernel_by_id(uint32_t id) {
  Registry& r = registry();
  if (id >= r.count.load(std::memory_order_acquire)) return nullptr;
  return r.fns[id].load(std::memory_order_acquire);
}

// What the sim reports as its device: a plausible modern GPU, so that programs
// that size their launches from the properties behave.
DeviceInfo sim_device_info(uint32_t device) {
  DeviceInfo d{};
  std::snprintf(d.name, sizeof d.name, "ordo sim device %u", device);
  d.total_global_mem = uint64_t{16} << 30;
  d.shared_mem_per_block = 48 << 10;
  d.shared_mem_per_block_optin = 227 << 10;
  d.shared_mem_per_multiprocessor = 228 << 10;
  d.total_const_mem = 64 << 10;
  d.texture_alignment = 512;
  d.mem_pitch = INT32_MAX;
  d.major = 9;
  d.minor = 0;
  d.multi_processor_count = 4;
  d.warp_size = 32;
  d.max_threads_per_block = int32_t(kMaxBlockThreads);
  d.max_threads_dim[0] = d.max_threads_dim[1] = 1024;
  d.max_threads_dim[2] = 64;
  d.max_grid_size[0] = INT32_MAX;
  d.max_grid_size[1] = d.max_grid_size[2] = 65535;
  d.regs_per_block = d.regs_per_multiprocessor = 65536;
  d.clock_rate_khz = 1'000'000;
  d.memory_clock_rate_khz = 1'000'000;
  d.memory_bus_width = 256;
  d.l2_cache_size = 4 << 20;
  d.max_threads_per_multiprocessor = 2048;
  d.max_blocks_per_multiprocessor = 32;
  d.compute_mode = 0;  // default
  d.concurrent_kernels = 1;
  d.async_engine_count = 2;
  d.unified_addressing = 1;
  d.can_map_host_memory = 1;
  d.stream_priorities_supported = 1;
  d.global_l1_cache_supported = d.local_l1_cache_supported = 1;
  static constexpr uint8_t kUuid[16] = {'o', 'r', 'd', 'o', '-', 's', 'i', 'm', '-', 'd', 'e', 'v', 'i', 'c', 'e', '0'};
  std::memcpy(d.uuid, kUuid, sizeof kUuid);
  d.uuid[15] = uint8_t(kUuid[15] + device);  // libraries tell devices apart by UUID and bus id
  d.pci_bus_id = int32_t(0x1b + device);
  return d;
}

// ---------------------------------------------------------------- host memory

// Zeroed host memory behind one device allocation, aligned like the device address.
class HostBlock {
 public:
  HostBlock() = default;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  HostBlock(HostBlock&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(o.size_), mapped_(o.mapped_) {}
  HostBlock& operator=(HostBlock&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = o.size_;
      mapped_ = o.mapped_;
    }
    return *this;
  }
  ~HostBlock() { release(); }

  bool allocate(uint64_t size) {
    release();
    if (size >= kMmapThreshold) {
      // Anonymous mappings are zero-filled lazily: a large allocation costs no time.
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return false;
      ptr_ = static_cast<std::byte*>(p);
      mapped_ = true;
    } else {
      void* p = nullptr;
      if (::posix_memalign(&p, kAllocAlign, size) != 0 || p == nullptr) return false;
      std::memset(p, 0, size);
      ptr_ = static_cast<std::byte*>(p);
      mapped_ = false;
    }
    size_ = size;
    return true;
  }

  std::byte* data() const { return ptr_; }
  uint64_t size() const { return size_; }

 private:
  void release() {
    if (!ptr_) return;
    if (mapped_) {
      ::munmap(ptr_, size_);
    } else {
      std::free(ptr_);
    }
    ptr_ = nullptr;
  }
  std::byte* ptr_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

// ---------------------------------------------------------------- ops and streams

// Kernel argument bytes, copied at launch(); small ones inline.
class ArgBuf {
 public:
  ArgBuf() = default;
  ArgBuf(const std::byte* p, uint32_t n) : size_(n) {
    if (n == 0) return;
    std::byte* dst = inline_;
    if (n > kInline) {
      heap_ = std::make_unique_for_overwrite<std::byte[]>(n);
      dst = heap_.get();
    }
    std::memcpy(dst, p, n);
  }
  std::span<const std::byte> span() const { return {heap_ ? heap_.get() : inline_, size_}; }

 private:
  static constexpr uint32_t kInline = 64;
  std::byte inline_[kInline];
  uint32_t size_ = 0;
  std::unique_ptr<std::byte[]> heap_;
};

struct Stream;

// A point in a stream's work captured by event_record.
struct Capture {
  std::shared_ptr<Stream> stream;
  uint64_t seq = 0;                             // set by event_record, under Device::mu_
  std::chrono::steady_clock::time_point time{};  // written by the record op before it completes
};

struct LaunchOp {
  Kernel fn;
  std::string_view missing;  // the kernel's name when there is no twin (fn is null)
  Dim3 grid, block;
  ArgBuf args;
  uint32_t device;  // the stream's: whose memory the kernel may touch
};
struct CopyOp {
  MemOperand dst, src;
  uint64_t size;
};
struct SetOp {
  uint64_t dst;
  uint64_t size;
  uint8_t value;
};
struct RecordOp {
  std::shared_ptr<Capture> cap;
};
struct WaitOp {
  std::shared_ptr<Stream> stream;
  uint64_t seq;
};
struct HostOp {
  std::function<void()> fn;
};


struct Op {
  OpTag tag;
  std::variant<LaunchOp, CopyOp, SetOp, RecordOp, WaitOp, HostOp> body;
};

void run_guarded(std::function<void()>& fn) {
  try {
    if (fn) fn();
  } catch (...) {
    // A throwing host function must not take the stream thread down.
  }
}

struct Stream {
  Stream(uint32_t i, uint32_t d, bool b, bool l) : id(i), device(d), blocking(b), legacy(l) {}

  const uint32_t id;
  const uint32_t device;
  const bool blocking;
  const bool legacy;  // its device's legacy default stream

  // Guarded by Device::mu_.
  uint64_t enqueued = 0;
  uint64_t legacy_seen = 0;     // blocking stream: its legacy stream's count it already depends on
  uint64_t seen_by_legacy = 0;  // blocking stream: own count its legacy stream already depends on
  bool destroyed = false;

  std::mutex mu;
  std::condition_variable work_cv;  // the stream thread waits here for work
  std::condition_variable done_cv;  // others wait here for completions
  std::deque<Op> queue;             // guarded by mu
  bool stopping = false;            // guarded by mu
  bool idle = false;                // guarded by mu
  bool inline_busy = false;         // guarded by mu: an op runs on the dispatching thread (run_inline)
  uint32_t done_waiters = 0;        // guarded by mu
  std::multimap<uint64_t, std::function<void()>> notifies;  // guarded by mu
  // Completed ops; stored by the stream thread, or by run_inline while that thread sleeps.
  std::atomic<uint64_t> completed{0};
  // done_waiters + notifies.size(), changed under mu. The stream thread takes mu
  // after a completion only when this is nonzero. Both sides use seq_cst (store
  // completed, then load watchers; change watchers, then load completed), so a
  // watcher either sees the new count or is seen by the stream thread.
  std::atomic<uint64_t> watchers{0};
  std::atomic<bool> exited{false};

  bool done(uint64_t seq) const { return completed.load(std::memory_order_acquire) >= seq; }

  void wait_for(uint64_t seq) {
    if (done(seq)) return;
    std::unique_lock lk(mu);
    ++done_waiters;
    watchers.fetch_add(1);
    done_cv.wait(lk, [&] { return completed.load() >= seq; });
    watchers.fetch_sub(1);
    --done_waiters;
  }

  // Registers fn to run once seq completes; false (fn untouched) if it already has.
  bool add_notify(uint64_t seq, std::function<void()>& fn) {
    std::lock_guard lk(mu);
    watchers.fetch_add(1);
    if (completed.load() >= seq) {
      watchers.fetch_sub(1);
      return false;
    }
    notifies.emplace(seq, std::move(fn));
    return true;
  }

  // Called by the stream thread after each op; moves due notifications to `ready`.
  void complete_one(std::vector<std::function<void()>>& ready) {
    const uint64_t c = completed.load(std::memory_order_relaxed) + 1;
    completed.store(c);
    if (watchers.load() == 0) return;
    std::lock_guard lk(mu);
    if (done_waiters != 0) done_cv.notify_all();
    while (!notifies.empty() && notifies.begin()->first <= c) {
      auto node = notifies.extract(notifies.begin());
      ready.push_back(std::move(node.mapped()));
      watchers.fetch_sub(1);
    }
  }
};

struct Event {
  uint32_t flags = 0;
  std::shared_ptr<Capture> cap;  // null until first recorded
};

bool capture_done(const Capture& c) { return c.stream->done(c.seq); }

}  // namespace

// ---------------------------------------------------------------- the device

class Device final : public Backend {
 public:
  explicit Device(uint32_t devices) : devices_(devices), blocking_(devices), destroyed_blocking_(devices) {
    if (sched_getaffinity(0, sizeof cpus_, &cpus_) != 0) CPU_ZERO(&cpus_);
    for (uint32_t d = 0; d < devices_; ++d) {
      streams_[d] = start_stream_locked(d, d, false, true);
      next_addr_[d] = kDeviceBase + (uint64_t{d} << kDeviceSpanShift);
    }
  }

  ~Device() override {
    // Drain every stream and join its thread. Loop in case a host callback
    // created a stream meanwhile.
    for (;;) {
      std::vector<Worker> workers;
      {
        std::lock_guard lk(mu_);
        workers.swap(workers_);
      }
      if (workers.empty()) break;
      for (auto& w : workers) stop(*w.stream);
      for (auto& w : workers) w.thread.join();
    }
  }

  std::string_view name() const override { return "sim"; }

  uint32_t device_count() const override { return devices_; }

  Status stream_create(uint32_t id, uint32_t device, bool blocking, int /*priority*/) override {
    if (id >= kMaxStreams || device >= devices_) return Status::kInvalidValue;
    std::lock_guard lk(mu_);
    reap_locked();
    if (streams_[id]) return Status::kInvalidResourceHandle;
    try {
      streams_[id] = start_stream_locked(id, device, blocking, false);
      if (blocking) blocking_[device].push_back(streams_[id]);
    } catch (const std::bad_alloc&) {
      return Status::kMemoryAllocation;
    } catch (const std::system_error&) {
      return Status::kMemoryAllocation;
    }
    return Status::kSuccess;
  }

  Status stream_destroy(uint32_t id) override {
    if (id >= kMaxStreams) return Status::kInvalidResourceHandle;
    std::lock_guard lk(mu_);
    if (!streams_[id] || streams_[id]->legacy) return Status::kInvalidResourceHandle;
    std::shared_ptr<Stream> s = std::move(streams_[id]);
    s->destroyed = true;
    if (s->blocking) {
      if (s->enqueued == s->seen_by_legacy) {
        std::erase(blocking_[s->device], s);
      } else {
        destroyed_blocking_[s->device] = true;  // its legacy stream still has to depend on its last work
      }
    }
    stop(*s);
    reap_locked();
    return Status::kSuccess;
  }

  Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) override {
    Kernel fn = kernel_by_id(p.kernel);
    std::string_view missing;
    if (!fn) {
      Registry& r = registry();
      std::shared_lock lk(r.mu);
      auto it = r.missing.find(p.kernel);
      if (it == r.missing.end()) return Status::kInvalidDeviceFunction;
      missing = it->second;  // a map node: stable while the process lives
    }
    if (p.grid.x == 0 || p.grid.y == 0 || p.grid.z == 0 || p.block.x == 0 || p.block.y == 0 ||
        p.block.z == 0) {
      return Status::kInvalidConfiguration;
    }
    if (uint64_t{p.block.x} * p.block.y * p.block.z > kMaxBlockThreads) {
      return Status::kInvalidConfiguration;
    }
    if (p.args_size != 0 && p.args == nullptr) return Status::kInvalidValue;
    Op op{tag, LaunchOp{fn, missing, p.grid, p.block, ArgBuf(p.args, p.args_size), 0}};
    std::lock_guard lk(mu_);
    Stream* s = find_stream_locked(stream);
    if (!s) return Status::kInvalidResourceHandle;
    std::get<LaunchOp>(op.body).device = s->device;
    push_locked(*s, std::move(op));
    return Status::kSuccess;
  }

  Status memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size,
                const OpTag& tag) override {
    if (size != 0) {
      if (Status st = check_operand(dst, size); !ok(st)) return st;
      if (Status st = check_operand(src, size); !ok(st)) return st;
    }
    return push_or_run(stream, Op{tag, CopyOp{dst, src, size}}, size);
  }

  Status memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size,
                const OpTag& tag) override {
    if (size != 0) {
      if (Status st = check_operand(MemOperand{true, dst}, size); !ok(st)) return st;
    }
    return push_or_run(stream, Op{tag, SetOp{dst, size, value}}, size);
  }

  // A copy or memset of `size` bytes: run on this thread when its stream is
  // idle and it is short enough not to hold up the worker's other rings.
  Status push_or_run(uint32_t stream, Op&& op, uint64_t size) {
    std::shared_ptr<Stream> claimed;
    {
      std::lock_guard lk(mu_);
      Stream* s = find_stream_locked(stream);
      if (!s) return Status::kInvalidResourceHandle;
      if (size == 0) return Status::kSuccess;
      if (!enqueue_locked(*s, op, size <= kInlineBytes)) return Status::kSuccess;
      claimed = streams_[stream];
    }
    run_inline(*claimed, op);
    return Status::kSuccess;
  }

  Status event_create(uint32_t event, uint32_t device, uint32_t flags) override {
    if (event >= kMaxBackendEvents || device >= devices_) return Status::kInvalidValue;
    std::lock_guard lk(mu_);
    auto [it, inserted] = events_.try_emplace(event);
    if (!inserted) return Status::kInvalidResourceHandle;
    it->second.flags = flags;
    return Status::kSuccess;
  }

  Status event_destroy(uint32_t event) override {
    std::lock_guard lk(mu_);
    return events_.erase(event) ? Status::kSuccess : Status::kInvalidResourceHandle;
  }

  Status event_record(uint32_t stream, uint32_t event) override {
    std::lock_guard lk(mu_);
    Stream* s = find_stream_locked(stream);
    Event* e = find_event_locked(event);
    if (!s || !e) return Status::kInvalidResourceHandle;
    auto cap = std::make_shared<Capture>();
    cap->stream = streams_[stream];
    push_locked(*s, Op{OpTag{}, RecordOp{cap}});
    cap->seq = s->enqueued;  // includes the record op itself, so its timestamp is set
    e->cap = std::move(cap);
    return Status::kSuccess;
  }

  Status stream_wait_event(uint32_t stream, uint32_t event) override {
    std::lock_guard lk(mu_);
    Stream* s = find_stream_locked(stream);
    Event* e = find_event_locked(event);
    if (!s || !e) return Status::kInvalidResourceHandle;
    const std::shared_ptr<Capture>& cap = e->cap;
    // Never recorded, already complete, or earlier on this very stream (FIFO): no-op.
    if (!cap || cap->stream.get() == s || capture_done(*cap)) return Status::kSuccess;
    push_locked(*s, Op{OpTag{}, WaitOp{cap->stream, cap->seq}});
    return Status::kSuccess;
  }

  Status event_query(uint32_t event) override {
    std::lock_guard lk(mu_);
    Event* e = find_event_locked(event);
    if (!e) return Status::kInvalidResourceHandle;
    if (!e->cap || capture_done(*e->cap)) return Status::kSuccess;
    return Status::kNotReady;
  }

  Status event_elapsed(uint32_t start, uint32_t end, float* ms) override {
    if (!ms) return Status::kInvalidValue;
    std::lock_guard lk(mu_);
    Event* a = find_event_locked(start);
    Event* b = find_event_locked(end);
    if (!a || !b) return Status::kInvalidResourceHandle;
    if ((a->flags | b->flags) & kEventDisableTiming) return Status::kInvalidResourceHandle;
    if (!a->cap || !b->cap) return Status::kInvalidResourceHandle;
    if (!capture_done(*a->cap) || !capture_done(*b->cap)) return Status::kNotReady;
    *ms = std::chrono::duration<float, std::milli>(b->cap->time - a->cap->time).count();
    return Status::kSuccess;
  }

  void event_notify(uint32_t event, std::function<void()> fn) override {
    std::shared_ptr<Capture> cap;
    uint64_t seq = 0;
    {
      std::lock_guard lk(mu_);
      if (Event* e = find_event_locked(event); e && e->cap) {
        cap = e->cap;
        seq = cap->seq;
      }
    }
    if (!cap || !cap->stream->add_notify(seq, fn)) run_guarded(fn);
  }

  void stream_notify(uint32_t stream, std::function<void()> fn) override {
    std::shared_ptr<Stream> s;
    uint64_t seq = 0;
    {
      std::lock_guard lk(mu_);
      if (stream < kMaxStreams && streams_[stream]) {
        s = streams_[stream];
        seq = s->enqueued;
      }
    }
    if (!s || !s->add_notify(seq, fn)) run_guarded(fn);
  }

  void host_callback(uint32_t stream, std::function<void()> fn) override {
    {
      std::lock_guard lk(mu_);
      if (Stream* s = find_stream_locked(stream)) {
        push_locked(*s, Op{OpTag{}, HostOp{std::move(fn)}});
        return;
      }
    }
    run_guarded(fn);  // unknown stream: nothing to wait for
  }

  Status malloc(uint32_t device, uint64_t size, uint64_t* device_addr) override {
    if (!device_addr || size == 0 || size > kMaxAllocBytes || device >= devices_) return Status::kInvalidValue;
    HostBlock block;
    if (!block.allocate(size)) return Status::kMemoryAllocation;
    std::unique_lock lk(mem_mu_);
    uint64_t& next = next_addr_[device];
    const uint64_t addr = next;
    // Round up and leave an unmapped gap so that adjacent allocations never touch.
    const uint64_t end = next + (size + kAllocAlign - 1) / kAllocAlign * kAllocAlign + kAllocAlign;
    if (device_of_addr(end) != device) return Status::kMemoryAllocation;  // 16 TiB handed out
    next = end;
    try {
      allocs_.emplace(addr, std::make_shared<HostBlock>(std::move(block)));
    } catch (const std::bad_alloc&) {
      return Status::kMemoryAllocation;
    }
    *device_addr = addr;
    return Status::kSuccess;
  }

  Status free(uint64_t device_addr) override {
    if (device_addr == 0) return Status::kSuccess;  // like cudaFree(nullptr)
    std::shared_ptr<HostBlock> dead;  // released after the lock is dropped, or by the last op using it
    std::unique_lock lk(mem_mu_);
    auto it = allocs_.find(device_addr);
    if (it == allocs_.end()) return Status::kInvalidDevicePointer;
    dead = std::move(it->second);
    allocs_.erase(it);
    return Status::kSuccess;
  }

  // The sim cannot run device code: a module's kernels are found by name among
  // the registered kernels (host twins, see `ordo-worker --sim-kernels`). Loading
  // only records the module id so that lookups in unknown modules fail as on a GPU.
  Status module_load(uint32_t module, std::span<const std::byte>) override {
    if (module == 0) return Status::kInvalidValue;
    std::lock_guard lk(modules_mu_);
    if (!modules_.insert(module).second) return Status::kInvalidValue;
    return Status::kSuccess;
  }

  Status module_unload(uint32_t module) override {
    std::vector<uint64_t> dead;
    {
      std::lock_guard lk(modules_mu_);
      if (!modules_.erase(module)) return Status::kInvalidResourceHandle;
      for (auto it = globals_.lower_bound({module, 0, {}}); it != globals_.end() && std::get<0>(it->first) == module;) {
        dead.push_back(it->second.first);
        it = globals_.erase(it);
      }
    }
    for (uint64_t a : dead) free(a);
    return Status::kSuccess;
  }

  // The sim cannot read the image's initial values: a device variable starts
  // zeroed, in memory of its own, for the module's lifetime.
  Status module_global(uint32_t module, uint32_t device, std::string_view name, uint64_t size_hint, uint64_t* addr,
                       uint64_t* size) override {
    if (device >= devices_) return Status::kInvalidValue;
    std::lock_guard lk(modules_mu_);
    if (!modules_.count(module)) return Status::kInvalidResourceHandle;
    GlobalKey key{module, device, std::string(name)};
    if (auto it = globals_.find(key); it != globals_.end()) {
      *addr = it->second.first;
      *size = it->second.second;
      return Status::kSuccess;
    }
    if (size_hint == 0) return Status::kInvalidDeviceFunction;  // not a variable of this module
    if (Status s = malloc(device, size_hint, addr); !ok(s)) return s;
    *size = size_hint;
    globals_.emplace(std::move(key), std::make_pair(*addr, size_hint));
    return Status::kSuccess;
  }

  Status device_info(uint32_t device, DeviceInfo* out) override {
    if (!out || device >= devices_) return Status::kInvalidValue;
    *out = sim_device_info(device);
    return Status::kSuccess;
  }

  // The sim is an all-to-all NVLink box: any device may reach any other once enabled.
  bool can_access_peer(uint32_t device, uint32_t peer) override {
    return device < devices_ && peer < devices_ && device != peer;
  }

  Status set_peer_access(uint32_t device, uint32_t peer, bool enable) override {
    if (!can_access_peer(device, peer)) return Status::kPeerAccessUnsupported;
    if (enable) peers_[device].fetch_or(1u << peer, std::memory_order_release);
    else peers_[device].fetch_and(~(1u << peer), std::memory_order_release);
    return Status::kSuccess;
  }

  // Whether a kernel on `device` may touch memory at `addr`: its own device's,
  // or an enabled peer's.
  bool reachable(uint32_t device, uint64_t addr) const {
    const uint32_t owner = device_of_addr(addr);
    return owner == device || (owner < kMaxDevices && (peers_[device].load(std::memory_order_acquire) >> owner & 1));
  }

  Status kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) override {
    if (!kernel) return Status::kInvalidValue;
    if (module != 0) {
      std::lock_guard lk(modules_mu_);
      if (!modules_.count(module)) return Status::kInvalidResourceHandle;
    }
    Registry& r = registry();
    {
      std::shared_lock lk(r.mu);
      if (auto it = r.ids.find(name); it != r.ids.end()) {
        *kernel = it->second;
        return Status::kSuccess;
      }
    }
    if (module == 0) return Status::kInvalidDeviceFunction;
    // A loaded module's kernel: it exists on a GPU, so the lookup succeeds, and
    // without a twin its launches fail (kernel_runnable).
    std::unique_lock lk(r.mu);
    if (auto it = r.ids.find(name); it != r.ids.end()) {
      *kernel = it->second;
      return Status::kSuccess;
    }
    const uint32_t id = r.count.load(std::memory_order_relaxed);
    if (id >= kMaxKernels) return Status::kLaunchOutOfResources;
    r.ids.emplace(std::string(name), id);
    r.missing.emplace(id, std::string(name));
    r.count.store(id + 1, std::memory_order_release);
    *kernel = id;
    return Status::kSuccess;
  }

  // The attributes DeviceInfo carries, plus what identifies an H200 to libraries
  // that pick kernels by chip (docs/CUDA.md, "The sim's device").
  Status device_attributes(uint32_t device, uint32_t first, int32_t* out) override {
    if (Status s = Backend::device_attributes(device, first, out); !ok(s)) return s;
    auto set = [&](uint32_t attr, int32_t v) {
      if (attr >= first && attr < first + kDeviceAttributesPerCall) out[attr - first] = v;
    };
    set(139, int32_t(0x233510DE));  // GPU_PCI_DEVICE_ID: H200 SXM (0x2335), NVIDIA (0x10DE)
    return Status::kSuccess;
  }

  bool kernel_runnable(uint32_t kernel) override { return kernel_by_id(kernel) != nullptr; }

  // Translates [addr, addr + bytes) (bytes > 0) to host memory if it lies inside
  // one live allocation: kInvalidDevicePointer if addr is in none,
  // kInvalidValue if the range runs past the end of the one it starts in.
  // `pin` keeps the block alive while the caller uses it (a concurrent free only
  // unlinks it).
  Status lookup(uint64_t addr, uint64_t bytes, void** out, std::shared_ptr<const void>* pin = nullptr) const {
    std::shared_lock lk(mem_mu_);
    auto it = allocs_.upper_bound(addr);
    if (it == allocs_.begin()) return Status::kInvalidDevicePointer;
    --it;
    const uint64_t off = addr - it->first;  // addr >= it->first
    const uint64_t size = it->second->size();
    if (off >= size) return Status::kInvalidDevicePointer;
    if (bytes > size - off) return Status::kInvalidValue;
    *out = it->second->data() + off;
    if (pin) *pin = it->second;
    return Status::kSuccess;
  }

 private:
  struct Worker {
    std::shared_ptr<Stream> stream;
    std::thread thread;
  };

  // Requires mu_ (or construction).
  std::shared_ptr<Stream> start_stream_locked(uint32_t id, uint32_t device, bool blocking, bool legacy) {
    auto s = std::make_shared<Stream>(id, device, blocking, legacy);
    workers_.reserve(workers_.size() + 1);
    std::thread t([this, s] {
      // A stream is a device engine: it runs where the device was made, not on
      // the CPU a latency-minded dispatcher pinned itself to.
      if (CPU_COUNT(&cpus_) != 0) pthread_setaffinity_np(pthread_self(), sizeof cpus_, &cpus_);
      run(*s);
    });
    workers_.push_back(Worker{s, std::move(t)});
    return s;
  }

  static void stop(Stream& s) {
    {
      std::lock_guard lk(s.mu);
      s.stopping = true;
    }
    s.work_cv.notify_one();
  }

  // Joins the threads of destroyed streams that have drained. Requires mu_.
  void reap_locked() {
    std::erase_if(workers_, [](Worker& w) {
      if (!w.stream->destroyed || !w.stream->exited.load(std::memory_order_acquire)) return false;
      w.thread.join();  // it has already left run(): returns at once
      return true;
    });
  }

  Stream* find_stream_locked(uint32_t id) const {
    return id < kMaxStreams ? streams_[id].get() : nullptr;
  }

  Event* find_event_locked(uint32_t id) {
    auto it = events_.find(id);
    return it == events_.end() ? nullptr : &it->second;
  }

  Status check_operand(const MemOperand& m, uint64_t size) const {
    if (!m.device) return m.addr == 0 ? Status::kInvalidValue : Status::kSuccess;
    void* p = nullptr;
    return lookup(m.addr, size, &p);
  }

  // Enqueues `op` on `s` after the implicit legacy-default-stream dependencies.
  // Requires mu_.
  void push_locked(Stream& s, Op&& op) { enqueue_locked(s, op, false); }

  // As push_locked; but when `may_inline` and `s` has nothing to wait for (its
  // thread asleep with every earlier op complete, no implicit dependency
  // pending), claims the stream and returns true without taking `op`: the
  // caller drops mu_ and calls run_inline. Requires mu_.
  bool enqueue_locked(Stream& s, Op& op, bool may_inline) {
    std::unique_lock lk(s.mu);
    if (s.blocking) {
      // Wait for all work enqueued on its device's legacy stream so far.
      Stream& z = *streams_[s.device];
      if (z.enqueued > s.legacy_seen) {
        s.legacy_seen = z.enqueued;
        if (!z.done(s.legacy_seen)) {
          s.queue.push_back(Op{OpTag{}, WaitOp{streams_[s.device], s.legacy_seen}});
          ++s.enqueued;
        }
      }
    } else if (s.legacy) {
      // Wait for all work enqueued on every blocking stream of the device so far.
      for (const auto& b : blocking_[s.device]) {
        if (b->enqueued > b->seen_by_legacy) {
          b->seen_by_legacy = b->enqueued;
          if (!b->done(b->seen_by_legacy)) {
            s.queue.push_back(Op{OpTag{}, WaitOp{b, b->seen_by_legacy}});
            ++s.enqueued;
          }
        }
      }
      if (destroyed_blocking_[s.device]) {
        std::erase_if(blocking_[s.device], [](const std::shared_ptr<Stream>& b) { return b->destroyed; });
        destroyed_blocking_[s.device] = false;
      }
    }
    if (may_inline && s.idle && s.queue.empty() && !s.inline_busy) {
      s.inline_busy = true;
      ++s.enqueued;
      return true;
    }
    s.queue.push_back(std::move(op));
    ++s.enqueued;
    const bool wake = s.idle && !s.inline_busy;  // else run_inline wakes it
    lk.unlock();
    if (wake) s.work_cv.notify_one();
    return false;
  }

  // Runs an op that enqueue_locked claimed for the calling thread, as the
  // stream's thread would have: a copy into an idle stream starts at once on a
  // GPU, and handing it to a sleeping thread costs more than a small copy (tens
  // of microseconds on a busy machine). Ops enqueued meanwhile wait in the queue.
  void run_inline(Stream& s, Op& op) {
    std::vector<std::function<void()>> ready;
    execute(op);
    s.complete_one(ready);
    for (auto& fn : ready) run_guarded(fn);  // before later ops complete, as on the stream thread
    std::unique_lock lk(s.mu);
    s.inline_busy = false;
    const bool wake = s.idle && (!s.queue.empty() || s.stopping);
    lk.unlock();
    if (wake) s.work_cv.notify_one();
  }

  // The stream thread.
  void run(Stream& s) {
    std::deque<Op> batch;
    std::vector<std::function<void()>> ready;
    for (;;) {
      {
        std::unique_lock lk(s.mu);
        if (s.queue.empty() && !s.stopping) {
          // One yield (no spinning) before sleeping: a dispatcher that is
          // enqueueing right now usually refills the queue, sparing it a wakeup.
          lk.unlock();
          std::this_thread::yield();
          lk.lock();
        }
        while (s.inline_busy || (s.queue.empty() && !s.stopping)) {
          s.idle = true;
          s.work_cv.wait(lk);
          s.idle = false;
        }
        if (s.queue.empty()) break;  // stopping and drained
        batch.swap(s.queue);
      }
      while (!batch.empty()) {
        execute(batch.front());
        batch.pop_front();  // release what the op holds before it counts as complete
        s.complete_one(ready);
        for (auto& fn : ready) run_guarded(fn);
        ready.clear();
      }
    }
    s.exited.store(true, std::memory_order_release);
  }

  void execute(Op& op) {
    if (auto* l = std::get_if<LaunchOp>(&op.body)) {
      if (!l->fn) {
        // In stream order, as a GPU reports an image it cannot run.
        std::fprintf(stderr,
                     "ordo-worker (sim): kernel %.*s has no host twin, so the sim cannot run it; the launch fails "
                     "with cudaErrorNoKernelImageForDevice (add a twin with --sim-kernels, or use --backend cuda)\n",
                     int(l->missing.size()), l->missing.data());
        return report(op.tag, Status::kNoKernelImage);
      }
      KernelContext ctx(*this, l->grid, l->block, l->args.span(), l->device);
      try {
        l->fn(ctx);
      } catch (const KernelError& e) {
        if (!ok(e.status)) report(op.tag, e.status);
      } catch (...) {
        report(op.tag, Status::kLaunchFailure);
      }
    } else if (auto* c = std::get_if<CopyOp>(&op.body)) {
      void* dst = nullptr;
      const void* src = nullptr;
      std::shared_ptr<const void> dst_pin, src_pin;
      if (c->dst.device) {
        if (!ok(lookup(c->dst.addr, c->size, &dst, &dst_pin))) return report(op.tag, Status::kInvalidDevicePointer);
      } else {
        dst = reinterpret_cast<void*>(static_cast<uintptr_t>(c->dst.addr));
      }
      if (c->src.device) {
        void* p = nullptr;
        if (!ok(lookup(c->src.addr, c->size, &p, &src_pin))) return report(op.tag, Status::kInvalidDevicePointer);
        src = p;
      } else {
        src = reinterpret_cast<const void*>(static_cast<uintptr_t>(c->src.addr));
      }
      device_copy(dst, src, c->size);
    } else if (auto* m = std::get_if<SetOp>(&op.body)) {
      void* dst = nullptr;
      std::shared_ptr<const void> pin;
      if (!ok(lookup(m->dst, m->size, &dst, &pin))) return report(op.tag, Status::kInvalidDevicePointer);
      device_fill(dst, m->value, m->size);
    } else if (auto* r = std::get_if<RecordOp>(&op.body)) {
      r->cap->time = std::chrono::steady_clock::now();
    } else if (auto* w = std::get_if<WaitOp>(&op.body)) {
      w->stream->wait_for(w->seq);
    } else if (auto* h = std::get_if<HostOp>(&op.body)) {
      run_guarded(h->fn);
    }
  }

  const uint32_t devices_;
  cpu_set_t cpus_;  // the constructing thread's CPUs: every stream thread's
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Stream>> streams_ = std::vector<std::shared_ptr<Stream>>(kMaxStreams);  // guarded by mu_; by stream id
  // Per device: live blocking streams, plus destroyed ones its legacy stream has yet to depend on.
  std::vector<std::vector<std::shared_ptr<Stream>>> blocking_;  // guarded by mu_
  std::vector<bool> destroyed_blocking_;                       // guarded by mu_
  std::array<std::atomic<uint32_t>, kMaxDevices> peers_{};     // per device: bit p = may reach device p's memory
  std::unordered_map<uint32_t, Event> events_;     // guarded by mu_
  std::vector<Worker> workers_;                    // guarded by mu_

  mutable std::shared_mutex mem_mu_;
  std::map<uint64_t, std::shared_ptr<HostBlock>> allocs_;  // guarded by mem_mu_
  std::array<uint64_t, kMaxDevices> next_addr_{};  // guarded by mem_mu_; per device: its next address

  std::mutex modules_mu_;
  std::set<uint32_t> modules_;  // guarded by modules_mu_
  using GlobalKey = std::tuple<uint32_t, uint32_t, std::string>;  // module, device, name
  std::map<GlobalKey, std::pair<uint64_t, uint64_t>> globals_;      // -> (addr, size)
};

// ---------------------------------------------------------------- public API

uint64_t KernelContext::tick() const { return g_tick.fetch_add(1, std::memory_order_acq_rel) + 1; }

void* KernelContext::translate(uint64_t device_addr, uint64_t bytes) const {
  if (bytes == 0) return nullptr;  // nothing may be touched
  void* p = nullptr;
  std::shared_ptr<const void> pin;
  if (!ok(dev_.lookup(device_addr, bytes, &p, &pin))) {
    throw KernelError(Status::kIllegalAddress, "kernel touched memory outside a live allocation");
  }
  if (!dev_.reachable(device_, device_addr)) {
    // A GPU faults the same way on another device's memory without peer access.
    throw KernelError(Status::kIllegalAddress, "kernel touched another device's memory without peer access");
  }
  pins_.push_back(std::move(pin));  // alive until the kernel returns
  return p;
}

void register_kernel(std::string_view name, Kernel fn) {
  Registry& r = registry();
  std::unique_lock lk(r.mu);
  auto it = r.ids.find(name);
  if (it != r.ids.end()) {
    r.missing.erase(it->second);
    r.fns[it->second].store(fn, std::memory_order_release);
    return;
  }
  const uint32_t id = r.count.load(std::memory_order_relaxed);
  if (id >= kMaxKernels) throw std::length_error("ordo::sim: too many kernels registered");
  r.ids.emplace(std::string(name), id);
  r.fns[id].store(fn, std::memory_order_release);
  r.count.store(id + 1, std::memory_order_release);
}

std::unique_ptr<Backend> make_sim_backend(uint32_t devices) {
  if (devices == 0 || devices > kMaxDevices) return nullptr;
  register_builtin_kernels();
  return std::make_unique<Device>(devices);
}

}  // namespace ordo::sim

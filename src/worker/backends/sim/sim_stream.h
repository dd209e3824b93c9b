// A sim stream and what it runs: the ops (launch, copy, memset, event record,
// cross-stream wait, host callback), the stream's queue and completion count,
// and events (a captured point in a stream). The stream thread and enqueueing
// are Device's (sim_stream.cc); sim_device.h describes the locking.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "ordo/sim.h"
#include "worker/backend.h"

namespace ordo::sim {

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
// A graph with conditional nodes, run whole (sim_program.cc).
struct ProgramOp {
  std::shared_ptr<const std::vector<GraphStep>> steps;
  uint32_t device;  // the stream's
  uint64_t epoch;   // Device::program_epoch_ when launched: a later one stops its WHILEs
};


struct Op {
  OpTag tag;
  std::variant<LaunchOp, CopyOp, SetOp, RecordOp, WaitOp, HostOp, ProgramOp> body;
};

// Runs a host function; one that throws must not take the stream thread down.
void run_guarded(std::function<void()>& fn);

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

// An interprocess event's state, in a page of a memfd that every worker
// process holding the event maps (sim_ipc.cc): records are numbered across
// processes, and record n, once complete, marks its slot with n.
struct IpcEventCell {
  static constexpr uint64_t kSlots = 64;
  struct Shared {
    std::atomic<uint64_t> recorded;  // records issued, by every process
    std::atomic<uint64_t> done[kSlots];
    std::atomic<uint64_t> recorder[kSlots];  // the worker process that issued the slot's record
  };
  int fd = -1;
  Shared* shared = nullptr;
  IpcEventCell() = default;
  IpcEventCell(const IpcEventCell&) = delete;
  IpcEventCell& operator=(const IpcEventCell&) = delete;
  ~IpcEventCell();
  // Record n is complete, or a later record of the same slot is: a program
  // that re-records an event 64 times while a wait on it is pending elsewhere
  // releases that wait early (docs/CUDA.md, IPC).
  bool done(uint64_t n) const { return n == 0 || shared->done[n % kSlots].load(std::memory_order_acquire) >= n; }
  // Record n can never complete: the worker process that issued it is gone.
  bool orphaned(uint64_t n) const;
};

struct Event {
  uint32_t flags = 0;
  std::shared_ptr<Capture> cap;          // null until first recorded
  std::shared_ptr<IpcEventCell> ipc;     // an interprocess event: records and waits go through it
};

inline bool capture_done(const Capture& c) { return c.stream->done(c.seq); }

}  // namespace ordo::sim

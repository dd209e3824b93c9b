// The sim's streams: creation and destruction, the stream threads, and
// enqueueing with the legacy default stream's implicit dependencies (the
// locking is described in sim_device.h).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "sim_device.h"

namespace ordo::sim {

void run_guarded(std::function<void()>& fn) {
  try {
    if (fn) fn();
  } catch (...) {
    // A throwing host function must not take the stream thread down.
  }
}

Status Device::stream_create(uint32_t id, uint32_t device, bool blocking, int /*priority*/) {
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

Status Device::stream_destroy(uint32_t id) {
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

// Requires mu_ (or construction).
std::shared_ptr<Stream> Device::start_stream_locked(uint32_t id, uint32_t device, bool blocking, bool legacy) {
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

void Device::stop(Stream& s) {
  {
    std::lock_guard lk(s.mu);
    s.stopping = true;
  }
  s.work_cv.notify_one();
}

// Joins the threads of destroyed streams that have drained. Requires mu_.
void Device::reap_locked() {
  std::erase_if(workers_, [](Worker& w) {
    if (!w.stream->destroyed || !w.stream->exited.load(std::memory_order_acquire)) return false;
    w.thread.join();  // it has already left run(): returns at once
    return true;
  });
}

// As push_locked; but when `may_inline` and `s` has nothing to wait for (its
// thread asleep with every earlier op complete, no implicit dependency
// pending), claims the stream and returns true without taking `op`: the
// caller drops mu_ and calls run_inline. Requires mu_.
bool Device::enqueue_locked(Stream& s, Op& op, bool may_inline) {
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
void Device::run_inline(Stream& s, Op& op) {
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
void Device::run(Stream& s) {
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

}  // namespace ordo::sim

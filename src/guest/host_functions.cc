#include "guest/host_functions.h"
#include "transport/op_args.h"

#include <immintrin.h>
#include <time.h>

#include <algorithm>

namespace ordo::guest {

HostFunctions::~HostFunctions() { stop(); }

void HostFunctions::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  slot_cv_.notify_all();
  if (runner_.joinable()) runner_.join();
}

Status HostFunctions::start_locked() {
  void* p = nullptr;
  if (Status st = memory_.malloc_host(&p, sizeof(HostFuncWords) * kSlots); !ok(st)) return st;
  words_ = static_cast<HostFuncWords*>(p);
  for (uint32_t i = 0; i < kSlots; ++i) {
    words_[i].reached.store(0, std::memory_order_relaxed);
    words_[i].done.store(0, std::memory_order_relaxed);
    free_.push_back(kSlots - 1 - i);
  }
  tickets_.assign(kSlots, 0);
  runner_ = std::thread([this] { run(); });
  return Status::kSuccess;
}

Status HostFunctions::host_func(Stream s, std::function<void()> fn) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!streams_.bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  if (!fn) return threads_.finish(t, Status::kInvalidValue);
  uint32_t slot;
  uint64_t ticket;
  auto verdict = std::make_shared<std::atomic<int>>(kUndecided);
  {
    std::unique_lock lock(mu_);
    if (!words_)
      if (Status st = start_locked(); !ok(st)) return threads_.finish(t, st);
    // All slots taken: one frees once its function ran, which needs only the worker.
    while (free_.empty()) {
      if (session_.lost() || stop_) return threads_.finish(t, Status::kDevicesUnavailable);
      slot_cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
    slot = free_.back();
    free_.pop_back();
    ticket = ++tickets_[slot];
    pending_.push_back({slot, ticket, std::move(fn), verdict});
    session_.host_functions_pending().fetch_add(1, std::memory_order_acq_rel);
  }
  work_cv_.notify_one();
  Entry e = make_entry<Op::HostFunc>(
      {.words = uint64_t(reinterpret_cast<std::byte*>(&words_[slot]) - session_.region().heap()), .ticket = ticket});
  {
    std::lock_guard lock(b.g->mu);
    producer_.push(t, *b.g, b.s, e);
  }
  const Status r = threads_.finish_async(t);
  verdict->store(ok(r) ? kRun : kSkip, std::memory_order_release);
  return r;
}

std::deque<HostFunctions::Pending>::iterator HostFunctions::ready_locked() {
  // Any that was reached, not only the oldest: streams progress independently.
  return std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) {
    return words_[p.slot].reached.load(std::memory_order_acquire) >= p.ticket &&
           p.verdict->load(std::memory_order_acquire) != kUndecided;
  });
}

void HostFunctions::run() {
  std::unique_lock lock(mu_);
  uint32_t idle = 0;
  while (!stop_) {
    if (pending_.empty()) {
      idle = 0;
      work_cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      continue;
    }
    auto it = ready_locked();
    if (it == pending_.end()) {
      if (session_.lost()) {
        work_cv_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      // Poll with capped backoff, as wait_worker does.
      lock.unlock();
      if (++idle < 64) {
        _mm_pause();
      } else {
        timespec ts{0, long(std::min<uint32_t>(2u << std::min<uint32_t>(idle - 64, 8), 500)) * 1000};
        nanosleep(&ts, nullptr);
      }
      lock.lock();
      continue;
    }
    idle = 0;
    Pending p = std::move(*it);
    pending_.erase(it);
    lock.unlock();
    try {
      if (p.verdict->load(std::memory_order_acquire) == kRun) p.fn();
    } catch (...) {
      // A throwing host function must not end the runner (CUDA's would terminate the program).
    }
    session_.host_function_ran();
    words_[p.slot].done.store(p.ticket, std::memory_order_release);
    session_.host_functions_pending().fetch_sub(1, std::memory_order_acq_rel);
    // Rung like a publish: a sleeping worker would otherwise hold the stream's
    // next work, and the legacy stream's, for up to its max_sleep.
    session_.notify_worker();
    lock.lock();
    free_.push_back(p.slot);
    slot_cv_.notify_one();
  }
}

}  // namespace ordo::guest

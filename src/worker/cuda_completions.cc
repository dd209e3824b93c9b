#include "cuda_completions.h"

#include <immintrin.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace ordo::cuda {
namespace {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000 + uint64_t(ts.tv_nsec);
}

constexpr uint64_t kSpinNs = 20000;  // poll without sleeping while the youngest watch is this young
constexpr uint64_t kMaxSleepNs = 200000;

}  // namespace

Completions::Completions(std::function<void()> bind) : bind_(std::move(bind)), thread_([this] { run(); }) {}

Completions::~Completions() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

cudaError_t Completions::watch(cudaStream_t s, Done& done) {
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lk(mu_);
    if (!spare_.empty()) {
      ev = spare_.back();
      spare_.pop_back();
    }
  }
  if (!ev) {
    if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) return e;
  }
  if (cudaError_t e = cudaEventRecord(ev, s); e != cudaSuccess) {
    std::lock_guard lk(mu_);
    spare_.push_back(ev);
    return e;
  }
  {
    std::lock_guard lk(mu_);
    pending_.push_back({ev, s, now_ns(), std::move(done)});
  }
  cv_.notify_one();
  return cudaSuccess;
}

void Completions::run() {
  bind_();
  // This thread only polls: sleeping a microsecond longer than asked is plenty.
  prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
  std::vector<Watch> work, finished;
  std::vector<cudaStream_t> behind;  // streams with an unfinished watch in this pass
  std::vector<cudaError_t> results;
  std::unique_lock lk(mu_);
  for (;;) {
    if (pending_.empty()) {
      if (stop_) return;
      cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      continue;
    }
    work.swap(pending_);
    lk.unlock();
    // A watch completes only after the earlier ones on its stream: their work
    // came first, and what they release (fences) must be released in order.
    behind.clear();
    results.assign(work.size(), cudaErrorNotReady);
    for (size_t i = 0; i < work.size(); ++i) {
      if (std::find(behind.begin(), behind.end(), work[i].stream) != behind.end()) continue;
      results[i] = cudaEventQuery(work[i].event);
      if (results[i] == cudaErrorNotReady) behind.push_back(work[i].stream);
    }
    std::vector<Watch> still;
    for (size_t i = 0; i < work.size(); ++i) {
      if (results[i] == cudaErrorNotReady) {
        still.push_back(std::move(work[i]));
        continue;
      }
      work[i].done(results[i]);
      finished.push_back(std::move(work[i]));
    }
    work.clear();
    lk.lock();
    for (Watch& w : finished) spare_.push_back(w.event);
    finished.clear();
    // Older watches go back in front of those added meanwhile.
    pending_.insert(pending_.begin(), std::make_move_iterator(still.begin()), std::make_move_iterator(still.end()));
    if (pending_.empty()) continue;
    uint64_t youngest = 0;
    for (const Watch& w : pending_) youngest = std::max(youngest, w.since_ns);
    const uint64_t now = now_ns();
    const uint64_t age = now > youngest ? now - youngest : 0;
    if (age < kSpinNs) {
      lk.unlock();
      _mm_pause();
      lk.lock();
      continue;
    }
    cv_.wait_for(lk, std::chrono::nanoseconds(std::min(age / 8, kMaxSleepNs)));
  }
}

}  // namespace ordo::cuda

#include "cuda_completions.h"

#include <immintrin.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace ordo::cuda {
namespace {

using Clock = std::chrono::steady_clock;
// Poll without sleeping while the youngest watch is this young.
constexpr Clock::duration kSpin = std::chrono::microseconds(20);
constexpr Clock::duration kMaxSleep = std::chrono::microseconds(200);

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
    pending_.push_back({ev, s, Clock::now(), std::move(done)});
  }
  cv_.notify_one();
  return cudaSuccess;
}

void Completions::run() {
  bind_();
  // This thread only polls: sleeping a microsecond longer than asked is plenty.
  prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
  std::vector<Watch> work, still;
  std::vector<cudaEvent_t> freed;
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
    for (size_t i = 0; i < work.size(); ++i) {
      if (results[i] == cudaErrorNotReady) {
        still.push_back(std::move(work[i]));
        continue;
      }
      work[i].done(results[i]);
      freed.push_back(work[i].event);
    }
    work.clear();
    lk.lock();
    spare_.insert(spare_.end(), freed.begin(), freed.end());
    freed.clear();
    // Older watches go back in front of those added meanwhile.
    pending_.insert(pending_.begin(), std::make_move_iterator(still.begin()), std::make_move_iterator(still.end()));
    still.clear();
    if (pending_.empty()) continue;
    Clock::time_point youngest{};
    for (const Watch& w : pending_) youngest = std::max(youngest, w.since);
    const Clock::duration age = Clock::now() - youngest;
    if (age < kSpin) {
      lk.unlock();
      _mm_pause();
      lk.lock();
      continue;
    }
    cv_.wait_for(lk, std::min<Clock::duration>(age / 8, kMaxSleep));
  }
}

}  // namespace ordo::cuda

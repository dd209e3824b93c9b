#include "side_thread.h"

namespace ordo {

SideThread::~SideThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SideThread::post(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
    ++posted_;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
}

void SideThread::drain() {
  std::unique_lock lock(mu_);
  const uint64_t target = posted_;
  cv_.wait(lock, [&] { return done_ >= target; });
}

void SideThread::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // its captures go before it counts as done
    lock.lock();
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace ordo

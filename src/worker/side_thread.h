// A thread for slot calls that may take long in the backend (a module load
// is a JIT compile for PTX or another GPU's SASS: seconds), so that lane 0,
// which serves every slot and its share of the rings, never waits for one.
// Jobs run one at a time, in the order posted; the thread starts with the
// first job.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ordo {

class SideThread {
 public:
  SideThread() = default;
  SideThread(const SideThread&) = delete;
  SideThread& operator=(const SideThread&) = delete;
  ~SideThread();  // runs what is queued, then joins

  void post(std::function<void()> job);
  // Returns once every job posted before the call has run.
  void drain();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  uint64_t posted_ = 0, done_ = 0;           // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;
};

}  // namespace ordo

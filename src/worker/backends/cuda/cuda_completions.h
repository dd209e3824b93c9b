// Completions of the cuda backend: "run this once the GPU has passed this point
// of that stream", seen by one thread polling events instead of a stream
// callback. CUDA hands a callback to its own thread some ten microseconds after
// the work ends; a poll sees it within about one, and a guest's fence or
// stream synchronize is answered that much sooner (bench_cuda's LaunchSync and
// small copies on an H200 were bound by it).
//
// The poller spins while the youngest watch is young, then sleeps an eighth of
// that watch's age (at most 200 us), so a long kernel costs little CPU, its
// completion is seen at most 12% late, and a new short watch is not kept
// waiting behind an old long one. It sleeps on a condition
// variable when nothing is watched.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ordo::cuda {

class Completions {
 public:
  // cudaSuccess, or the error CUDA reports for the stream (a kernel fault).
  using Done = std::function<void(cudaError_t)>;

  // `bind` makes the backend's context current on the polling thread.
  explicit Completions(std::function<void()> bind);
  ~Completions();  // after cudaDeviceSynchronize: runs what is left, then stops
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  // Records an event on `s` now and calls `done` on the polling thread once
  // the stream has passed it. Calls on one stream complete in the order they
  // were watched. On an error `done` is left untouched and not called.
  cudaError_t watch(cudaStream_t s, Done& done);

 private:
  struct Watch {
    cudaEvent_t event;
    cudaStream_t stream;
    std::chrono::steady_clock::time_point since;  // when watched
    Done done;
  };
  void run();

  std::function<void()> bind_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Watch> pending_;       // guarded by mu_; in the order watched
  std::vector<cudaEvent_t> spare_;   // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  std::thread thread_;
};

}  // namespace ordo::cuda

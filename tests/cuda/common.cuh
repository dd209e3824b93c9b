// What the ordering programs (seed.cu, hostfunc.cu) share: the error check and
// the slow copy kernel whose twin the sim runs (twins.cc).
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

__global__ void slow_copy(const int* in, int* out, int n, unsigned sleep_us) {
  // Wait first, read after: a copy into `in` that jumps the queue is seen.
  for (unsigned t = 0; t < sleep_us; t += 1000) __nanosleep(1000000);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}

#define CHECK(call)                                                                     \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      std::printf("FAIL %s:%d: %s -> error %d (%s)\n", __FILE__, __LINE__, #call, int(e_), \
                  cudaGetErrorName(e_));                                                \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

// One round of the seed scenario's two threads: A runs `a` (its work on
// stream s) and then tells B; B records `ev` on s, makes s2 wait for it, and
// copies `bytes` of `replacement` into `in` on s2. Returns once both are done.
template <class A>
void seed_round(A a, cudaStream_t s, cudaStream_t s2, cudaEvent_t ev, int* in, const int* replacement, size_t bytes) {
  std::mutex mu;
  std::condition_variable cv;
  bool launched = false;
  std::thread ta([&] {
    a();
    std::lock_guard lock(mu);
    launched = true;
    cv.notify_one();
  });
  std::thread tb([&] {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return launched; });
    }
    CHECK(cudaEventRecord(ev, s));
    CHECK(cudaStreamWaitEvent(s2, ev, 0));
    CHECK(cudaMemcpyAsync(in, replacement, bytes, cudaMemcpyHostToDevice, s2));
    CHECK(cudaStreamSynchronize(s2));
  });
  ta.join();
  tb.join();
}

// The seed scenario's rounds: each fills `in` (n ints) with fresh input and
// clears `out`, runs seed_round with the replacement for `in`, and counts a
// violation when `out` is not that round's input (the work `a` issued read
// the replacement) or `also_ok()` is false. Returns the violations.
template <class A, class Ok>
int seed_rounds(int iterations, int n, int* in, int* out, cudaStream_t s, cudaStream_t s2, cudaEvent_t ev, A a,
                Ok also_ok) {
  std::vector<int> original(n), replacement(n), result(n);
  int violations = 0;
  for (int it = 0; it < iterations; ++it) {
    for (int i = 0; i < n; ++i) {
      original[i] = it * 100000 + i;
      replacement[i] = -1 - i;
    }
    CHECK(cudaMemcpy(in, original.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(out, 0, n * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    seed_round(a, s, s2, ev, in, replacement.data(), n * sizeof(int));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(result.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    if (result != original || !also_ok()) ++violations;
  }
  return violations;
}

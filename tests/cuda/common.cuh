// What the ordering programs (seed.cu, hostfunc.cu) share: the error check and
// the slow copy kernel whose twin the sim runs (twins.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

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

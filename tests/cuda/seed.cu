// The seed ordering scenario of the foundation issue, against the CUDA runtime
// API with two host threads:
//   thread A launches a slow kernel on stream S that copies `in` to `out`, then
//   tells thread B; B records an event on S, makes S2 wait for it, and copies
//   new data into `in` on S2. The kernel must have read the original input.
// Repeats ITERATIONS times (argv[1], default 20); prints the number of
// violations and exits 1 if there was any. argv[2]: the kernel's sleep in
// microseconds; argv[3] "graph": thread A launches a CUDA graph captured from
// the kernel launch instead (a graph launch is ordered like a kernel).
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common.cuh"
#include "kernels.h"

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20;
  const int n = 4096;
  const unsigned sleep_us = argc > 2 ? unsigned(std::atoi(argv[2])) : 3000;
  int *in, *out;
  CHECK(cudaMalloc(&in, n * sizeof(int)));
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  cudaStream_t s, s2;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const bool graph = argc > 3 && std::strcmp(argv[3], "graph") == 0;
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    slow_copy<<<1, 256, 0, s>>>(in, out, n, sleep_us);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  const int violations = seed_rounds(
      iterations, n, in, out, s, s2, ev,
      [&] {
        if (graph) {
          CHECK(cudaGraphLaunch(exec, s));
        } else {
          slow_copy<<<1, 256, 0, s>>>(in, out, n, sleep_us);
          CHECK(cudaGetLastError());
        }
      },
      [] { return true; });
  if (exec) CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaEventDestroy(ev));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  std::printf("seed scenario%s: %d violations in %d iterations\n", graph ? " (graph launches)" : "", violations,
              iterations);
  return violations ? 1 : 0;
}

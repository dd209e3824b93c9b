// What a CUDA runtime call costs through each of ordo's guest libraries. One
// binary (nvcc -cudart shared), run twice by bench/cuda_api.sh: on ordo's
// runtime shim (libcudart.so.13) and on NVIDIA's runtime over ordo's driver
// (libcuda.so.1), against the same sim worker.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// basic.cu's kernel, so the sim runs it with tests/cuda's twin of it.
__global__ void fill(int* p, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

// Calls that stay in the guest: the runtime's own bookkeeping plus, over the
// driver, a context-local-storage lookup per call.
void BM_GetDevice(benchmark::State& state) {
  int d = -1;
  for (auto _ : state) benchmark::DoNotOptimize(cudaGetDevice(&d));
}
BENCHMARK(BM_GetDevice);

void BM_GetLastError(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(cudaGetLastError());
}
BENCHMARK(BM_GetLastError);

// An async launch (an entry in the stream's ring), synchronized every 256
// launches so the ring never fills; the synchronize is part of the cost.
void BM_LaunchAsync(benchmark::State& state) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  int n = 0;
  for (auto _ : state) {
    fill<<<1, 1, 0, s>>>(nullptr, 0, 0);  // n = 0: the twin returns at once
    if (++n % 256 == 0) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
}
BENCHMARK(BM_LaunchAsync);

}  // namespace

int main(int argc, char** argv) {
  check(cudaFree(nullptr), "cudaFree(0)");  // initialization outside the timed loops
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

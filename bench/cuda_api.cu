// What a CUDA call costs through ordo's libcuda.so.1, runtime call against the
// driver call it ends in, in one run (bench/cuda_api.sh, a sim worker): the
// runtime's share (NVIDIA's static cudart, a context-local-storage lookup per
// call) next to ordo's own.
#include <benchmark/benchmark.h>
#include <cuda.h>
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

void BM_DriverCtxGetDevice(benchmark::State& state) {
  CUdevice d = -1;
  for (auto _ : state) benchmark::DoNotOptimize(cuCtxGetDevice(&d));
}
BENCHMARK(BM_DriverCtxGetDevice);

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

// The same launch straight through the driver: the runtime's launch ends here.
void BM_DriverLaunchAsync(benchmark::State& state) {
  CUstream s;
  CUfunction f;
  check(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&f), reinterpret_cast<const void*>(fill)),
        "cudaGetFuncBySymbol");
  if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) std::exit(1);
  int* p = nullptr;
  int len = 0, v = 0;  // len = 0: the twin returns at once
  void* args[] = {&p, &len, &v};
  int n = 0;
  for (auto _ : state) {
    if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr) != CUDA_SUCCESS) std::exit(1);
    if (++n % 256 == 0) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  cuStreamDestroy(s);
}
BENCHMARK(BM_DriverLaunchAsync);

}  // namespace

int main(int argc, char** argv) {
  check(cudaFree(nullptr), "cudaFree(0)");  // initialization outside the timed loops
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// A CUDA program exercising what the ordo guest library implements: device
// queries, memory (device, pinned, pageable), kernels with mixed parameter
// layouts, streams, events, async copies, memset, host callbacks, the legacy
// and per-thread default streams, and local error checking. Exits 0 when every
// result is right; without a driver (no GPU, no ordo) it exits 3 on error 35.
// With --bad-handles it also passes a forged stream and destroyed handles,
// which ordo must refuse; NVIDIA's driver may crash on them (undefined in CUDA),
// so the native comparison on a GPU runs without it.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "expect.cuh"

__global__ void fill(int* p, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

__global__ void saxpy(float a, const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void mixed(char c, double d, short s, Pair pair, long long* out) {
  out[0] = c;
  out[1] = (long long)d;
  out[2] = s;
  out[3] = pair.a;
  out[4] = pair.b;
  out[5] = (long long)pair.c;
}


#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::printf("FAIL %s:%d: %s -> error %d (%s)\n", __FILE__, __LINE__, #call, int(e_), \
                  cudaGetErrorName(e_));                                                     \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)


// Driver calls from an exit handler registered after the first CUDA call,
// which runs before the driver's own and after the main thread's thread_local
// objects are gone, as cuFFT's (it frees its buffers there): each must answer,
// CUDA_SUCCESS or CUDA_ERROR_DEINITIALIZED, not crash.
struct ExitCalls {
  CUdeviceptr ptr = 0;
  CUresult (*get_attributes)(unsigned, CUpointer_attribute*, void**, CUdeviceptr) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
} g_exit;

template <class F>
static void driver_entry(const char* name, F* fn) {
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, reinterpret_cast<void**>(fn), CUDART_VERSION, cudaEnableDefault, &q));
}

static void exit_calls() {
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
  unsigned type = 0;
  void* data[] = {&type};
  CUcontext ctx = nullptr;
  const CUresult r[] = {g_exit.get_attributes(1, &attr, data, g_exit.ptr), g_exit.ctx_get_current(&ctx),
                        g_exit.mem_free(g_exit.ptr)};
  for (const CUresult e : r)
    if (e != CUDA_SUCCESS && e != CUDA_ERROR_DEINITIALIZED) {
      std::printf("FAIL a driver call from an exit handler gave %d\n", int(e));
      std::fflush(stdout);
      std::_Exit(1);
    }
}

static void CUDART_CB host_fn(void* data) { ++*static_cast<int*>(data); }
static void CUDART_CB stream_cb(cudaStream_t, cudaError_t status, void* data) {
  if (status == cudaSuccess) ++*static_cast<int*>(data);
}

int main(int argc, char** argv) {
  const bool bad_handles = argc > 1 && std::strcmp(argv[1], "--bad-handles") == 0;
  int count = -1;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::printf("cudaGetDeviceCount failed: error %d (%s): %s\n", int(e), cudaGetErrorName(e), cudaGetErrorString(e));
    return e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice ? 3 : 1;
  }
  EXPECT(count == 1);
  CHECK(cudaSetDevice(0));
  int dev = -1;
  CHECK(cudaGetDevice(&dev));
  EXPECT(dev == 0);
  EXPECT(cudaSetDevice(1) == cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError() == cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError() == cudaSuccess);

  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, sm %d.%d, %d SMs, %zu MiB\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              prop.totalGlobalMem >> 20);
  EXPECT(prop.warpSize == 32);
  EXPECT(prop.maxThreadsPerBlock >= 256);
  int attr = 0;
  CHECK(cudaDeviceGetAttribute(&attr, cudaDevAttrMaxThreadsPerBlock, 0));
  EXPECT(attr == prop.maxThreadsPerBlock);
  CHECK(cudaDeviceGetAttribute(&attr, cudaDevAttrMultiProcessorCount, 0));
  EXPECT(attr == prop.multiProcessorCount);
  CHECK(cudaDeviceGetAttribute(&attr, cudaDevAttrComputeCapabilityMajor, 0));
  EXPECT(attr == prop.major);
  int version = 0;
  CHECK(cudaRuntimeGetVersion(&version));
  EXPECT(version >= 13000);
  CHECK(cudaDriverGetVersion(&version));
  EXPECT(version >= 13000);

  // Kernel on the legacy stream, result through a pageable copy.
  const int n = 10000;
  int* d_ints = nullptr;
  CHECK(cudaMalloc(&d_ints, n * sizeof(int)));
  CHECK(cudaMemset(d_ints, 0, n * sizeof(int)));
  fill<<<(n + 255) / 256, 256>>>(d_ints, n, 7);
  CHECK(cudaGetLastError());
  std::vector<int> ints(n);
  CHECK(cudaMemcpy(ints.data(), d_ints, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (ints[i] != 7 + i) {
      std::printf("FAIL fill[%d] = %d\n", i, ints[i]);
      ++failures;
      break;
    }

  // saxpy on a non-blocking, prioritized stream with pinned buffers and async copies.
  cudaStream_t s1, s2;
  int least = 0, greatest = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CHECK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, greatest));
  CHECK(cudaStreamCreate(&s2));
  float *h_x, *h_y, *d_x, *d_y;
  CHECK(cudaMallocHost(&h_x, n * sizeof(float)));
  CHECK(cudaHostAlloc(&h_y, n * sizeof(float), cudaHostAllocDefault));
  for (int i = 0; i < n; ++i) {
    h_x[i] = float(i);
    h_y[i] = 1.0f;
  }
  CHECK(cudaMalloc(&d_x, n * sizeof(float)));
  CHECK(cudaMalloc(&d_y, n * sizeof(float)));
  cudaEvent_t start, stop, copied;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  CHECK(cudaEventRecord(start, s1));
  CHECK(cudaMemcpyAsync(d_x, h_x, n * sizeof(float), cudaMemcpyHostToDevice, s1));
  CHECK(cudaMemcpyAsync(d_y, h_y, n * sizeof(float), cudaMemcpyDefault, s1));  // pinned host -> device, inferred
  CHECK(cudaEventRecord(copied, s1));
  // s2 waits for the copies, then runs saxpy and copies back.
  CHECK(cudaStreamWaitEvent(s2, copied, 0));
  saxpy<<<(n + 127) / 128, 128, 0, s2>>>(2.0f, d_x, d_y, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(h_y, d_y, n * sizeof(float), cudaMemcpyDeviceToHost, s2));
  CHECK(cudaEventRecord(stop, s2));
  CHECK(cudaEventSynchronize(stop));
  EXPECT(cudaEventQuery(stop) == cudaSuccess);
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  EXPECT(ms >= 0);
  EXPECT(cudaEventElapsedTime(&ms, start, copied) != cudaSuccess);  // timing disabled on `copied`
  cudaGetLastError();
  for (int i = 0; i < n; ++i)
    if (h_y[i] != 2.0f * float(i) + 1.0f) {
      std::printf("FAIL saxpy[%d] = %f\n", i, double(h_y[i]));
      ++failures;
      break;
    }

  // Parameters of every alignment and a struct by value.
  long long* d_out;
  CHECK(cudaMalloc(&d_out, 6 * sizeof(long long)));
  CHECK(cudaMemsetAsync(d_out, 0xff, 6 * sizeof(long long), s1));
  mixed<<<1, 1, 0, s1>>>('x', 12345.0, short(-321), Pair{-7, 'q', 99.0}, d_out);
  long long out[6] = {};
  CHECK(cudaMemcpyAsync(out, d_out, sizeof out, cudaMemcpyDeviceToHost, s1));  // pageable: returns when done
  EXPECT(out[0] == 'x' && out[1] == 12345 && out[2] == -321 && out[3] == -7 && out[4] == 'q' && out[5] == 99);

  // Device to device, cudaMemcpyDefault both ways, the per-thread and legacy streams.
  int* d_copy;
  CHECK(cudaMalloc(&d_copy, n * sizeof(int)));
  CHECK(cudaMemcpyAsync(d_copy, d_ints, n * sizeof(int), cudaMemcpyDeviceToDevice, cudaStreamPerThread));
  CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  fill<<<1, 16, 0, cudaStreamLegacy>>>(d_copy, 16, 1000);
  std::vector<int> back(n);
  CHECK(cudaMemcpy(back.data(), d_copy, n * sizeof(int), cudaMemcpyDefault));
  EXPECT(back[0] == 1000 && back[15] == 1015 && back[16] == 7 + 16 && back[n - 1] == 7 + n - 1);
  std::vector<int> host_copy(n);
  CHECK(cudaMemcpy(host_copy.data(), back.data(), n * sizeof(int), cudaMemcpyHostToHost));
  EXPECT(host_copy == back);

  // Host functions run after the stream's earlier work.
  int calls = 0;
  fill<<<1, 1, 0, s2>>>(d_ints, 1, 42);
  CHECK(cudaLaunchHostFunc(s2, host_fn, &calls));
  CHECK(cudaStreamAddCallback(s2, stream_cb, &calls, 0));
  CHECK(cudaStreamSynchronize(s2));
  EXPECT(calls == 2);
  CHECK(cudaStreamQuery(s2));
  int first = 0;
  CHECK(cudaMemcpy(&first, d_ints, sizeof first, cudaMemcpyDeviceToHost));
  EXPECT(first == 42);

  // The kernels' module lists its functions (what cuFFT finds its kernels by).
  {
    cudaFunction_t f = nullptr;
    CHECK(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(fill)));
    CUresult (*get_module)(CUmodule*, CUfunction) = nullptr;
    CUresult (*count_functions)(unsigned*, CUmodule) = nullptr;
    CUresult (*enumerate_functions)(CUfunction*, unsigned, CUmodule) = nullptr;
    CUresult (*get_name)(const char**, CUfunction) = nullptr;
    driver_entry("cuFuncGetModule", &get_module);
    driver_entry("cuModuleGetFunctionCount", &count_functions);
    driver_entry("cuModuleEnumerateFunctions", &enumerate_functions);
    driver_entry("cuFuncGetName", &get_name);
    CUmodule mod = nullptr;
    unsigned count = 0;
    EXPECT(get_module(&mod, reinterpret_cast<CUfunction>(f)) == CUDA_SUCCESS);
    EXPECT(count_functions(&count, mod) == CUDA_SUCCESS && count == 3);
    CUfunction fns[3] = {};
    EXPECT(enumerate_functions(fns, 3, mod) == CUDA_SUCCESS);
    int named = 0;
    for (CUfunction fn : fns) {
      const char* name = nullptr;
      if (fn && get_name(&name, fn) == CUDA_SUCCESS)
        for (const char* want : {"_Z4fillPiii", "_Z5saxpyfPKfPfi", "_Z5mixedcds4PairPx"}) named += !std::strcmp(name, want);
    }
    EXPECT(named == 3);
  }

  // Errors are found locally and answered at once.
  EXPECT(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue);
  if (bad_handles) EXPECT(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(0x1234)) == cudaErrorInvalidResourceHandle);
  EXPECT(cudaEventRecord(nullptr, s1) == cudaErrorInvalidResourceHandle);
  EXPECT(cudaMemcpy(d_x, h_x, 4, cudaMemcpyKind(17)) == cudaErrorInvalidMemcpyDirection);
  EXPECT(cudaPeekAtLastError() == cudaErrorInvalidMemcpyDirection);
  EXPECT(cudaGetLastError() == cudaErrorInvalidMemcpyDirection);
  EXPECT(cudaGetLastError() == cudaSuccess);
  fill<<<0, 1>>>(d_ints, 1, 1);
  // What NVIDIA's driver 580 and cudart 13 answer on an H200 (not cudaErrorInvalidConfiguration).
  if (const cudaError_t empty = cudaGetLastError(); empty != cudaErrorInvalidValue) {
    std::printf("FAIL %s:%d: <<<0, 1>>> gave error %d (%s), not cudaErrorInvalidValue\n", __FILE__, __LINE__,
                int(empty), cudaGetErrorName(empty));
    ++failures;
  }
  EXPECT(std::strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0);
  EXPECT(std::strlen(cudaGetErrorString(cudaErrorInvalidValue)) > 0);
  cudaStream_t dead;
  CHECK(cudaStreamCreateWithFlags(&dead, cudaStreamNonBlocking));
  CHECK(cudaStreamDestroy(dead));
  if (bad_handles) EXPECT(cudaStreamQuery(dead) == cudaErrorInvalidResourceHandle);
  cudaEvent_t dead_event;
  CHECK(cudaEventCreate(&dead_event));
  CHECK(cudaEventDestroy(dead_event));
  if (bad_handles) EXPECT(cudaEventQuery(dead_event) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();

  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaEventDestroy(copied));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaFreeHost(h_x));
  CHECK(cudaFreeHost(h_y));
  for (void* p : {(void*)d_ints, (void*)d_x, (void*)d_y, (void*)d_out, (void*)d_copy}) CHECK(cudaFree(p));

  void* exit_buf = nullptr;
  CHECK(cudaMalloc(&exit_buf, 256));
  g_exit.ptr = reinterpret_cast<CUdeviceptr>(exit_buf);
  driver_entry("cuPointerGetAttributes", &g_exit.get_attributes);
  driver_entry("cuCtxGetCurrent", &g_exit.ctx_get_current);
  driver_entry("cuMemFree", &g_exit.mem_free);
  std::atexit(exit_calls);
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}

// Mapped pinned memory, as cuDNN, NCCL and XLA use it: host memory a kernel
// reads and writes directly. Under unified addressing (every 64-bit CUDA
// device) the device pointer of page-locked memory is its host pointer, and
// every cudaMallocHost allocation is mapped, flag or not. The same program
// must pass natively and through ordo.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <thread>

#include "common.cuh"

__global__ void fill(int* p, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

namespace {

int fails = 0;

void expect_run(const int* p, int from, int n, int v, const char* what) {
  for (int i = from; i < from + n; ++i)
    if (p[i] != v + (i - from)) {
      std::printf("FAIL %s: [%d] = %d, expected %d\n", what, i, p[i], v + (i - from));
      ++fails;
      return;
    }
}

}  // namespace

int main() {
  const int n = 1024;
  int can_map = 0, uva = 0;
  CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
  CHECK(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, 0));
  if (!can_map || !uva) {
    std::printf("FAIL: the device says it cannot map host memory (%d) or has no unified addressing (%d)\n", can_map,
                uva);
    return 1;
  }

  // cudaHostAllocMapped: the device pointer is the host pointer.
  int* h = nullptr;
  CHECK(cudaHostAlloc(&h, n * sizeof(int), cudaHostAllocMapped));
  int* d = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d), h, 0));
  if (d != h) {
    std::printf("FAIL: cudaHostGetDevicePointer gave %p for %p\n", static_cast<void*>(d), static_cast<void*>(h));
    ++fails;
  }
  std::memset(h, 0, n * sizeof(int));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  fill<<<n / 256, 256, 0, s>>>(d, n, 100);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s));
  expect_run(h, 0, n, 100, "kernel through cudaHostGetDevicePointer");

  // cudaMallocHost, no flag: still reachable at its host address.
  int* plain = nullptr;
  CHECK(cudaMallocHost(&plain, n * sizeof(int)));
  cudaPointerAttributes attr{};
  CHECK(cudaPointerGetAttributes(&attr, plain));
  if (attr.type != cudaMemoryTypeHost || attr.devicePointer != plain || attr.hostPointer != plain) {
    std::printf("FAIL: attributes of cudaMallocHost memory: type %d device %p host %p\n", int(attr.type),
                attr.devicePointer, attr.hostPointer);
    ++fails;
  }
  fill<<<n / 256, 256, 0, s>>>(plain, n, 7);
  CHECK(cudaStreamSynchronize(s));
  expect_run(plain, 0, n, 7, "kernel on cudaMallocHost memory");

  // Copies and memsets that name it as device memory, in stream order.
  int* dev = nullptr;
  CHECK(cudaMalloc(&dev, n * sizeof(int)));
  CHECK(cudaMemcpyAsync(dev, d, n * sizeof(int), cudaMemcpyDeviceToDevice, s));
  CHECK(cudaMemsetAsync(d, 0, n * sizeof(int), s));  // after the copy read it
  CHECK(cudaMemcpyAsync(plain, dev, n * sizeof(int), cudaMemcpyDefault, s));
  CHECK(cudaStreamSynchronize(s));
  expect_run(plain, 0, n, 100, "device-to-device copy from mapped memory");
  for (int i = 0; i < n; ++i)
    if (h[i] != 0) {
      std::printf("FAIL: memset of mapped memory: [%d] = %d\n", i, h[i]);
      ++fails;
      break;
    }
  // A kernel and the host take turns on one buffer, ordered by the stream.
  for (int round = 0; round < 4; ++round) {
    fill<<<1, 256, 0, s>>>(h + round * 256, 256, round * 1000);
  }
  CHECK(cudaStreamSynchronize(s));
  for (int round = 0; round < 4; ++round) expect_run(h, round * 256, 256, round * 1000, "rounds");

  CHECK(cudaFree(dev));
  CHECK(cudaFreeHost(plain));
  CHECK(cudaFreeHost(h));
  CHECK(cudaStreamDestroy(s));
  if (fails) return 1;
  std::printf("mapped: kernels read and write page-locked host memory at its host address\n");
  // A thread left running past exit that still writes page-locked memory, as
  // NCCL's proxy threads do: the process must end as it does natively.
  int* spin = nullptr;
  CHECK(cudaMallocHost(&spin, 4096));
  std::atomic<bool> started{false};
  std::thread([spin, &started] {
    started.store(true);
    for (uint64_t i = 0;; ++i) reinterpret_cast<volatile int*>(spin)[i % 1024] = int(i);
  }).detach();
  while (!started.load()) {
  }
  return 0;
}

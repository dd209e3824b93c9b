// Several devices in one program, through ordo's libcuda.so.1: run against a
// worker with --sim-devices 4. Each device gets its own memory, stream and
// kernel chain; device 1 waits on an event of device 0's stream, pulls device
// 0's result over with a peer copy and works on it; peer access is enabled,
// used by a kernel, and disabled, with CUDA's errors for doing either twice;
// module variables have a copy per device.
// Exits 0 when every result is exactly right.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

__device__ int tag;  // one copy per device

constexpr int kDevices = 4;
constexpr int n = 4096;
constexpr int kBlocks = (n + 255) / 256;

// d's chain leaves 1000 * d + i + d + 1 in element i.
static int chain_value(int d, int i) { return 1000 * d + i + d + 1; }

// The first element of `got` that is not want(i), or -1.
template <typename F>
static int first_wrong(const std::vector<int>& got, F want) {
  for (int i = 0; i < int(got.size()); ++i)
    if (got[i] != want(i)) {
      std::printf("  element %d: %d, want %d\n", i, got[i], want(i));
      return i;
    }
  return -1;
}

int main() {
  int count = -1;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count == kDevices);
  if (count != kDevices) {
    std::printf("FAILED: %d devices; start the worker with --sim-devices %d\n", count, kDevices);
    return 1;
  }

  // Every device answers for itself, each with its own UUID.
  cudaDeviceProp props[kDevices];
  for (int d = 0; d < kDevices; ++d) CHECK(cudaGetDeviceProperties(&props[d], d));
  for (int a = 0; a < kDevices; ++a)
    for (int b = a + 1; b < kDevices; ++b) EXPECT(std::memcmp(&props[a].uuid, &props[b].uuid, 16) != 0);

  // Per device: memory, a stream and a kernel chain on it. Device 0's last
  // step is slow, so device 1 only sees its result if it really waits.
  int* a[kDevices];
  int* b[kDevices];
  cudaStream_t s[kDevices];
  for (int d = 0; d < kDevices; ++d) {
    CHECK(cudaSetDevice(d));
    int cur = -1;
    CHECK(cudaGetDevice(&cur));
    EXPECT(cur == d);
    CHECK(cudaMalloc(&a[d], n * sizeof(int)));
    CHECK(cudaMalloc(&b[d], n * sizeof(int)));
    CHECK(cudaStreamCreate(&s[d]));
    fill<<<kBlocks, 256, 0, s[d]>>>(a[d], n, 1000 * d);
    add<<<kBlocks, 256, 0, s[d]>>>(a[d], n, d + 1);
    slow_copy<<<1, 256, 0, s[d]>>>(a[d], b[d], n, d == 0 ? 200000 : 0);
    CHECK(cudaGetLastError());
  }

  // Streams and allocations know their device.
  for (int d = 0; d < kDevices; ++d) {
    int dev = -1;
    CHECK(cudaStreamGetDevice(s[d], &dev));
    EXPECT(dev == d);
    cudaPointerAttributes attr{};
    CHECK(cudaPointerGetAttributes(&attr, b[d]));
    EXPECT(attr.type == cudaMemoryTypeDevice);
    EXPECT(attr.device == d);
  }

  // Each device has its own copy of a module variable.
  for (int d = 0; d < kDevices; ++d) {
    CHECK(cudaSetDevice(d));
    const int v = 100 + d;
    CHECK(cudaMemcpyToSymbol(tag, &v, sizeof v));
  }
  for (int d = kDevices - 1; d >= 0; --d) {
    CHECK(cudaSetDevice(d));
    int v = -1;
    CHECK(cudaMemcpyFromSymbol(&v, tag, sizeof v));
    EXPECT(v == 100 + d);
    void* p = nullptr;
    CHECK(cudaGetSymbolAddress(&p, tag));
    cudaPointerAttributes attr{};
    CHECK(cudaPointerGetAttributes(&attr, p));
    EXPECT(attr.device == d);
  }

  // Device 1 waits for device 0's chain, copies its result over and adds 7.
  cudaEvent_t done0;
  CHECK(cudaSetDevice(0));
  CHECK(cudaEventCreateWithFlags(&done0, cudaEventDisableTiming));
  CHECK(cudaEventRecord(done0, s[0]));
  CHECK(cudaSetDevice(1));
  int* c1 = nullptr;
  CHECK(cudaMalloc(&c1, n * sizeof(int)));
  CHECK(cudaStreamWaitEvent(s[1], done0, 0));
  CHECK(cudaMemcpyPeerAsync(c1, 1, b[0], 0, n * sizeof(int), s[1]));
  add<<<kBlocks, 256, 0, s[1]>>>(c1, n, 7);
  CHECK(cudaGetLastError());
  std::vector<int> host(n);
  CHECK(cudaMemcpyAsync(host.data(), c1, n * sizeof(int), cudaMemcpyDeviceToHost, s[1]));
  CHECK(cudaStreamSynchronize(s[1]));
  EXPECT(first_wrong(host, [](int i) { return chain_value(0, i) + 7; }) < 0);

  // Every device's own chain, read back from the device it ran on.
  for (int d = 0; d < kDevices; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host.data(), b[d], n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(first_wrong(host, [d](int i) { return chain_value(d, i); }) < 0);
  }

  // A synchronous peer copy and a unified one (cudaMemcpyDefault), from device 3's current context.
  CHECK(cudaSetDevice(3));
  CHECK(cudaMemcpyPeer(a[2], 2, b[1], 1, n * sizeof(int)));
  CHECK(cudaMemcpy(host.data(), a[2], n * sizeof(int), cudaMemcpyDefault));
  EXPECT(first_wrong(host, [](int i) { return chain_value(1, i); }) < 0);
  CHECK(cudaMemcpy(a[3], b[2], n * sizeof(int), cudaMemcpyDefault));
  CHECK(cudaMemcpy(host.data(), a[3], n * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(first_wrong(host, [](int i) { return chain_value(2, i); }) < 0);

  // Peer access: queried, enabled once, used by a kernel, disabled once.
  int can = -1;
  CHECK(cudaDeviceCanAccessPeer(&can, 1, 0));
  EXPECT(can == 1);
  int same = -1;
  CHECK(cudaDeviceCanAccessPeer(&same, 2, 2));
  EXPECT(same == 0);
  int attr = -1;
  CHECK(cudaDeviceGetP2PAttribute(&attr, cudaDevP2PAttrAccessSupported, 1, 0));
  EXPECT(attr == can);
  EXPECT(cudaDeviceGetP2PAttribute(&attr, cudaDevP2PAttrAccessSupported, 1, 1) == cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError() == cudaErrorInvalidDevice);
  EXPECT(cudaDeviceCanAccessPeer(&can, 0, kDevices) == cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError() == cudaErrorInvalidDevice);

  CHECK(cudaSetDevice(1));
  CHECK(cudaDeviceEnablePeerAccess(0, 0));
  EXPECT(cudaDeviceEnablePeerAccess(0, 0) == cudaErrorPeerAccessAlreadyEnabled);
  EXPECT(cudaGetLastError() == cudaErrorPeerAccessAlreadyEnabled);
  EXPECT(cudaDeviceEnablePeerAccess(2, 1) == cudaErrorInvalidValue);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  EXPECT(cudaDeviceEnablePeerAccess(1, 0) == cudaErrorInvalidDevice);  // its own device
  EXPECT(cudaGetLastError() == cudaErrorInvalidDevice);
  // Device 1's kernel reads device 0's memory directly.
  slow_copy<<<1, 256, 0, s[1]>>>(b[0], c1, n, 0);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(host.data(), c1, n * sizeof(int), cudaMemcpyDeviceToHost, s[1]));
  CHECK(cudaStreamSynchronize(s[1]));
  EXPECT(first_wrong(host, [](int i) { return chain_value(0, i); }) < 0);
  CHECK(cudaDeviceDisablePeerAccess(0));
  EXPECT(cudaDeviceDisablePeerAccess(0) == cudaErrorPeerAccessNotEnabled);
  EXPECT(cudaGetLastError() == cudaErrorPeerAccessNotEnabled);

  // No fifth device; the current one stays.
  EXPECT(cudaSetDevice(kDevices) == cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError() == cudaErrorInvalidDevice);
  int cur = -1;
  CHECK(cudaGetDevice(&cur));
  EXPECT(cur == 1);

  for (int d = 0; d < kDevices; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaStreamDestroy(s[d]));
    CHECK(cudaFree(a[d]));
    CHECK(cudaFree(b[d]));
  }
  CHECK(cudaSetDevice(1));
  CHECK(cudaFree(c1));
  CHECK(cudaSetDevice(0));
  CHECK(cudaEventDestroy(done0));
  CHECK(cudaGetLastError());

  std::printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}

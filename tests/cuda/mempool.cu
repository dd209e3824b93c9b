// Stream-ordered allocation as NCCL and PyTorch use it: a pool per device
// (cudaMemPoolCreate, its attributes), cudaMallocAsync/cudaMallocFromPoolAsync
// and cudaFreeAsync in stream order with data round trips, on every device.
// The same program must pass natively and through ordo.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "common.cuh"

namespace {

int fails = 0;

#define EXPECT(cond)                                              \
  do {                                                            \
    if (!(cond)) {                                                \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++fails;                                                    \
    }                                                             \
  } while (0)

// Data written into stream-ordered memory comes back, before the free.
void round_trip(void* dev, size_t n, int seed, cudaStream_t s) {
  std::vector<int> in(n / sizeof(int)), out(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = seed + int(i);
  CHECK(cudaMemcpyAsync(dev, in.data(), n, cudaMemcpyHostToDevice, s));
  CHECK(cudaMemcpyAsync(out.data(), dev, n, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(in == out);
}

void on_device(int d) {
  CHECK(cudaSetDevice(d));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = d;
  cudaMemPool_t pool;
  CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t threshold = ~uint64_t(0), read = 0;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &read));
  EXPECT(read == threshold);

  void* a = nullptr;
  CHECK(cudaMallocFromPoolAsync(&a, 1 << 20, pool, s));
  uint64_t used = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used >= (1u << 20));
  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, a));
  EXPECT(attr.type == cudaMemoryTypeDevice && attr.device == d);
  round_trip(a, 1 << 20, 100 * d, s);
  CHECK(cudaFreeAsync(a, s));

  void* b = nullptr;  // the device's current pool
  CHECK(cudaMallocAsync(&b, 4096, s));
  round_trip(b, 4096, 7 + d, s);
  CHECK(cudaFreeAsync(b, s));
  cudaMemPool_t def, cur;
  CHECK(cudaDeviceGetDefaultMemPool(&def, d));
  CHECK(cudaDeviceGetMemPool(&cur, d));
  EXPECT(def == cur);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemPoolDestroy(pool));
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  for (int d = 0; d < n; ++d) on_device(d);
  std::printf("%s: stream-ordered allocation on %d device(s)\n", fails ? "FAIL" : "ok", n);
  return fails ? 1 : 0;
}

// A kernel's attributes as the device reports them: registers, local and
// static shared memory, and the threads per block its launch bound and
// registers allow (cudaFuncGetAttributes, cuFuncGetAttribute, the occupancy
// calculator). Libraries size their launches from these (Triton and
// TorchInductor drop configurations by register count, CUB by occupancy); a
// guess (no registers, the device's 1024 threads) sends them launches the
// device refuses.
//
// The checks here hold on any device; the exact numbers are printed, and
// tests/gpu/run.sh holds ordo's run to the native one's output on a GPU.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "common.cuh"
#include "expect.cuh"

// Bounded to 128 threads, 4 KiB of static shared memory, and a local array
// indexed at run time, which has to live in local memory.
__global__ void __launch_bounds__(128) tiled(float* out, const float* in, int n) {
  __shared__ float tile[1024];
  float local[256];  // more than any thread's registers
  for (int i = 0; i < 256; ++i) local[i] = in[(threadIdx.x + i) % n];
  tile[threadIdx.x] = local[in[threadIdx.x] > 0 ? threadIdx.x : 0];
  __syncthreads();
  out[threadIdx.x] = tile[(threadIdx.x + 1) % 128] + local[(threadIdx.x * 7) % 256];
}

__global__ void plain(int* p) { p[threadIdx.x] = 1; }

int main() {
  cudaFuncAttributes t{}, p{};
  CHECK(cudaFuncGetAttributes(&t, tiled));
  CHECK(cudaFuncGetAttributes(&p, plain));
  std::printf("tiled: maxThreadsPerBlock %d sharedSizeBytes %zu localSizeBytes %zu numRegs %d "
              "maxDynamicSharedSizeBytes %d\n",
              t.maxThreadsPerBlock, t.sharedSizeBytes, t.localSizeBytes, t.numRegs, t.maxDynamicSharedSizeBytes);
  std::printf("plain: maxThreadsPerBlock %d sharedSizeBytes %zu localSizeBytes %zu numRegs %d\n",
              p.maxThreadsPerBlock, p.sharedSizeBytes, p.localSizeBytes, p.numRegs);
  EXPECT(t.maxThreadsPerBlock > 0 && t.maxThreadsPerBlock <= 128);
  EXPECT(t.sharedSizeBytes >= 4096 && t.sharedSizeBytes <= 4096 + 1024);
  EXPECT(t.localSizeBytes >= 256 * sizeof(float));
  EXPECT(t.numRegs > 0 && t.numRegs <= 255);
  EXPECT(t.maxDynamicSharedSizeBytes == int(48 * 1024 - t.sharedSizeBytes));
  EXPECT(p.maxThreadsPerBlock == 1024);
  EXPECT(p.sharedSizeBytes == 0 && p.localSizeBytes == 0);
  EXPECT(p.numRegs > 0 && p.numRegs <= 255);

  // The driver API reads the same numbers (reached as the runtime reaches it: no -lcuda).
  cudaFunction_t fn = nullptr;
  CHECK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(tiled)));
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuFuncGetAttribute", &entry, 12000, cudaEnableDefault, &q));
  const auto get = reinterpret_cast<CUresult (*)(int*, CUfunction_attribute, CUfunction)>(entry);
  int regs = 0, threads = 0;
  EXPECT(get && get(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn) == CUDA_SUCCESS && regs == t.numRegs);
  EXPECT(get && get(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn) == CUDA_SUCCESS &&
         threads == t.maxThreadsPerBlock);

  // A hint reads back as set.
  CHECK(cudaFuncSetAttribute(tiled, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
  CHECK(cudaFuncGetAttributes(&t, tiled));
  std::printf("tiled: preferredShmemCarveout %d\n", t.preferredShmemCarveout);
  EXPECT(t.preferredShmemCarveout == 50);

  // Occupancy counts the kernel's static shared memory and registers.
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int blocks = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, tiled, 128, 0));
  std::printf("tiled: %d blocks of 128 threads per multiprocessor\n", blocks);
  EXPECT(blocks >= 1);
  EXPECT(uint64_t(blocks) * t.sharedSizeBytes <= prop.sharedMemPerMultiprocessor);
  EXPECT(uint64_t(blocks) * 128 * t.numRegs <= uint64_t(prop.regsPerMultiprocessor));
  // 48 KiB of dynamic shared memory on top of its static 4 KiB needs the
  // kernel's opt-in; with it, it fits.
  int dyn_blocks = -1;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&dyn_blocks, tiled, 128, 48 * 1024));
  std::printf("tiled: %d blocks with 48 KiB dynamic shared memory, no opt-in\n", dyn_blocks);
  EXPECT(dyn_blocks == 0);
  CHECK(cudaFuncSetAttribute(tiled, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&dyn_blocks, tiled, 128, 48 * 1024));
  std::printf("tiled: %d blocks with 48 KiB dynamic shared memory, opted in\n", dyn_blocks);
  EXPECT(dyn_blocks >= 1 && uint64_t(dyn_blocks) * (t.sharedSizeBytes + 48 * 1024) <= prop.sharedMemPerMultiprocessor);
  // Static and dynamic together stay within the device's opt-in limit.
  EXPECT(cudaFuncSetAttribute(tiled, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              int(prop.sharedMemPerBlockOptin)) == cudaErrorInvalidValue);
  cudaGetLastError();

  std::printf(failures ? "funcattr: %d FAILED\n" : "funcattr: ok\n", failures);
  return failures != 0;
}

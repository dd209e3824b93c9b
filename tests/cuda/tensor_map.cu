// Tensor maps as Hopper libraries and Triton make them (cuTensorMapEncodeTiled,
// Im2col, ReplaceAddress): what the driver accepts, that the same request
// gives the same descriptor, that a new address gives another, and the
// requests cuda.h's rules refuse. The descriptors' bytes are the driver's
// own format, so only their equality is checked: the same program must pass
// natively and through ordo.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common.cuh"
#include "expect.cuh"

namespace {

CUdeviceptr base = 0;

CUresult tiled(CUtensorMap* m, CUdeviceptr addr, cuuint32_t rank = 2, cuuint32_t box0 = 32,
               CUtensorMapInterleave interleave = CU_TENSOR_MAP_INTERLEAVE_NONE,
               CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE) {
  // Six of each: the rank-6 case must be refused, not read past the arrays.
  const cuuint64_t dim[6] = {64, 64, 4, 4, 4, 4};
  const cuuint64_t strides[5] = {256, 256 * 64, 256 * 64 * 4, 256 * 64 * 16, 256 * 64 * 64};
  const cuuint32_t box[6] = {box0, 8, 1, 1, 1, 1};
  const cuuint32_t element_strides[6] = {1, 1, 1, 1, 1, 1};
  return cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, reinterpret_cast<void*>(addr), dim, strides,
                                box, element_strides, interleave, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

bool same(const CUtensorMap& a, const CUtensorMap& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void encodes() {
  CUtensorMap a, b, c;
  EXPECT(tiled(&a, base) == CUDA_SUCCESS);
  EXPECT(tiled(&b, base) == CUDA_SUCCESS);
  EXPECT(same(a, b));
  EXPECT(tiled(&c, base + 4096) == CUDA_SUCCESS);
  EXPECT(!same(a, c));
  for (cuuint32_t rank = 1; rank <= 5; ++rank) EXPECT(tiled(&c, base, rank) == CUDA_SUCCESS);
  // A 128-byte box row under 128-byte swizzling.
  EXPECT(tiled(&c, base, 2, 32, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_SUCCESS);
}

void replaces_address() {
  CUtensorMap a, moved;
  EXPECT(tiled(&a, base) == CUDA_SUCCESS);
  moved = a;
  EXPECT(cuTensorMapReplaceAddress(&moved, reinterpret_cast<void*>(base + 8192)) == CUDA_SUCCESS);
  EXPECT(!same(a, moved));
  EXPECT(cuTensorMapReplaceAddress(&moved, reinterpret_cast<void*>(base)) == CUDA_SUCCESS);
  EXPECT(same(a, moved));
  EXPECT(cuTensorMapReplaceAddress(&moved, reinterpret_cast<void*>(base + 8)) == CUDA_ERROR_INVALID_VALUE);
}

void im2col() {
  // NHWC half, 16x16 pixels of 64 channels: a 3x3 convolution's window.
  const cuuint64_t dim[4] = {64, 16, 16, 2};
  const cuuint64_t strides[3] = {64 * 2, 64 * 2 * 16, 64 * 2 * 16 * 16};
  const int lower[2] = {-1, -1}, upper[2] = {-1, -1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap m;
  EXPECT(cuTensorMapEncodeIm2col(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, reinterpret_cast<void*>(base), dim, strides,
                                 lower, upper, 64, 128, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
  EXPECT(cuTensorMapEncodeIm2col(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, reinterpret_cast<void*>(base), dim, strides,
                                 lower, upper, 64, 128, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);  // rank below 3
}

// What cuda.h says the driver refuses.
void refuses() {
  CUtensorMap m;
  EXPECT(tiled(&m, base + 8) == CUDA_ERROR_INVALID_VALUE);  // address not 16-byte aligned
  EXPECT(tiled(&m, base, 0) == CUDA_ERROR_INVALID_VALUE);   // rank 0
  EXPECT(tiled(&m, base, 6) == CUDA_ERROR_INVALID_VALUE);   // rank past 5
  EXPECT(tiled(&m, base, 2, 512) == CUDA_ERROR_INVALID_VALUE);  // box past 256
  EXPECT(tiled(&m, base, 2, 2) == CUDA_ERROR_INVALID_VALUE);    // box row of 8 bytes
  // A 128-byte box row under 32-byte swizzling.
  EXPECT(tiled(&m, base, 2, 32, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_32B) == CUDA_ERROR_INVALID_VALUE);
  // 32-byte interleave wants 32-byte swizzling.
  EXPECT(tiled(&m, base, 3, 32, CU_TENSOR_MAP_INTERLEAVE_32B, CU_TENSOR_MAP_SWIZZLE_NONE) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuTensorMapReplaceAddress(nullptr, reinterpret_cast<void*>(base)) == CUDA_ERROR_INVALID_VALUE);
}

}  // namespace

// --require: a device without tensor maps fails the run instead of skipping
// it (the sim reports compute capability 9.0).
int main(int argc, char** argv) {
  const bool require = argc > 1 && std::strcmp(argv[1], "--require") == 0;
  int major = 0;
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) {
    std::printf("%s: device 0 is compute capability %d; tensor maps need 9.0\n", require ? "FAIL" : "SKIP", major);
    return require ? 1 : 0;
  }
  CHECK(cudaFree(nullptr));  // the primary context, current
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 1 << 22));
  base = reinterpret_cast<CUdeviceptr>(p);
  encodes();
  replaces_address();
  im2col();
  refuses();
  CHECK(cudaFree(p));
  std::printf("%s: %d failures\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}

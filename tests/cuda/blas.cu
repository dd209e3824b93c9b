// An unmodified cuBLAS program: handle, stream, one SGEMM, checked against a
// CPU reference. On a GPU it must pass. On the sim, which has no host twin of
// cuBLAS's kernels, every call up to the SGEMM's launch must succeed and the
// launch must fail in stream order with cudaErrorNoKernelImageForDevice (209):
// with --expect-no-twin the program checks exactly that and exits 0.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"

#define CHECK_BLAS(call)                                                                   \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      std::printf("FAIL %s:%d: %s -> cuBLAS status %d (%s)\n", __FILE__, __LINE__, #call,  \
                  int(s_), cublasGetStatusString(s_));                                     \
      return 2;                                                                            \
    }                                                                                      \
  } while (0)

int main(int argc, char** argv) {
  const bool expect_no_twin = argc > 1 && std::strcmp(argv[1], "--expect-no-twin") == 0;
  const int m = 64, n = 48, k = 32;
  std::vector<float> a(m * k), b(k * n), c(m * n, 0.f), ref(m * n, 0.f);
  for (int i = 0; i < m * k; ++i) a[i] = float(i % 7) - 3.f;
  for (int i = 0; i < k * n; ++i) b[i] = float(i % 5) * 0.5f;
  for (int j = 0; j < n; ++j)  // column-major, as cuBLAS
    for (int i = 0; i < m; ++i) {
      float s = 0.f;
      for (int p = 0; p < k; ++p) s += a[i + p * m] * b[p + j * k];
      ref[i + j * m] = s;
    }

  cublasHandle_t handle;
  CHECK_BLAS(cublasCreate(&handle));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_BLAS(cublasSetStream(handle, stream));
  float *da, *db, *dc;
  CHECK(cudaMalloc(&da, a.size() * sizeof(float)));
  CHECK(cudaMalloc(&db, b.size() * sizeof(float)));
  CHECK(cudaMalloc(&dc, c.size() * sizeof(float)));
  CHECK_BLAS(cublasSetMatrix(m, k, sizeof(float), a.data(), m, da, m));
  CHECK_BLAS(cublasSetMatrix(k, n, sizeof(float), b.data(), k, db, k));
  CHECK(cudaMemset(dc, 0, c.size() * sizeof(float)));
  const float alpha = 1.f, beta = 0.f;
  CHECK_BLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta, dc, m));
  const cudaError_t sync = cudaStreamSynchronize(stream);
  if (expect_no_twin) {
    if (sync != cudaErrorNoKernelImageForDevice) {
      std::printf("FAIL: SGEMM's launch on the sim gave error %d (%s), expected 209 (no host twin)\n", int(sync),
                  cudaGetErrorName(sync));
      return 1;
    }
    std::printf("blas: every call before the SGEMM launch succeeded; its launch failed with 209 as expected\n");
    return 0;
  }
  CHECK(sync);
  CHECK_BLAS(cublasGetMatrix(m, n, sizeof(float), dc, m, c.data(), m));
  int bad = 0;
  for (int i = 0; i < m * n; ++i)
    if (std::fabs(c[i] - ref[i]) > 1e-3f * (1.f + std::fabs(ref[i]))) {
      if (bad++ < 5) std::printf("FAIL c[%d] = %g, expected %g\n", i, c[i], ref[i]);
    }
  CHECK_BLAS(cublasDestroy(handle));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  if (bad) {
    std::printf("FAIL: %d of %d elements wrong\n", bad, m * n);
    return 1;
  }
  std::printf("blas: SGEMM %dx%dx%d matches the CPU reference\n", m, n, k);
  return 0;
}

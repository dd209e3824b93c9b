// APIs the ordo guest library does not implement answer cudaErrorNotSupported
// (and name themselves once on stderr); the program goes on working.
#include <cuda_runtime.h>

#include <cstdio>

__global__ void touch(int* p) { *p = 5; }

int main() {
  int failures = 0;
  int* d;
  failures += cudaMalloc(&d, sizeof(int)) != cudaSuccess;
  cudaError_t e;
  cudaArray_t array;
  const cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  for (int i = 0; i < 3; ++i) {  // logged once
    e = cudaMallocArray(&array, &desc, 16, 16);
    failures += e != cudaErrorNotSupported;
  }
  void* managed = nullptr;
  e = cudaMallocManaged(&managed, 64);
  failures += e != cudaErrorNotSupported;
  // Still working afterwards.
  int v = 0;
  touch<<<1, 1>>>(d);
  failures += cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess;
  failures += v != 5;
  failures += cudaFree(d) != cudaSuccess;
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}

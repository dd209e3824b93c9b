// APIs the ordo guest library does not implement answer cudaErrorNotSupported
// (and name themselves once on stderr); the program goes on working.
#include <cuda_runtime.h>

#include <cstdio>

__global__ void touch(int* p) { *p = 5; }

int main() {
  int failures = 0;
  cudaGraph_t graph;
  cudaError_t e = cudaGraphCreate(&graph, 0);
  std::printf("cudaGraphCreate -> %d (%s)\n", int(e), cudaGetErrorName(e));
  failures += e != cudaErrorNotSupported;
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
  int* d;
  int v = 0;
  failures += cudaMalloc(&d, sizeof(int)) != cudaSuccess;
  touch<<<1, 1>>>(d);
  failures += cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess;
  failures += v != 5;
  failures += cudaFree(d) != cudaSuccess;
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}

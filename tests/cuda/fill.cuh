// The fill and add kernels of peer.cu, graphs.cu and launch_ex.cu, under
// the names their host twins are registered by (twins.cc: _Z4fillPiii,
// _Z3addPiii).
#pragma once

__global__ void fill(int* p, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

__global__ void add(int* p, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

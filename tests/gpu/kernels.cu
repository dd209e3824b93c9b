// Kernels for the cuda backend's own tests (test_cuda_backend.cc), built by nvcc
// into a fatbin (sm_90 code plus PTX), an sm_90 cubin and plain PTX.
#include <cstdint>

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

extern "C" __global__ void empty() {}

// Parameters of mixed sizes: the packed buffer has them at offsets 0, 8 and 16.
extern "C" __global__ void fill(uint32_t* p, uint32_t value, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x)
    p[i] = value;
}

extern "C" __global__ void add_one(uint32_t* p, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x)
    p[i] += 1;
}

// Waits `us` microseconds, then stores `value`: work that is still running when
// the test looks.
extern "C" __global__ void spin_then_write(uint64_t* p, uint64_t value, uint32_t us) {
  const uint64_t until = now_ns() + uint64_t{us} * 1000;
  while (now_ns() < until) __nanosleep(1000);
  *p = value;
}

// Stores through whatever pointer it is given (the async-error test hands it a bad one).
extern "C" __global__ void store(uint64_t* p, uint64_t value) { *p = value; }

// A C++ (mangled) name: _Z5scalePffi.
__global__ void scale(float* p, float f, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= f;
}

// A module variable, of which each device that loads the module has its own copy.
__device__ uint64_t ordo_test_counter = 5;
extern "C" __global__ void bump(uint64_t by) { ordo_test_counter += by; }

// ordo's built-in kernels for the cuda backend: the same names, argument
// layouts and effects as the simulator's
// (src/worker/backends/sim/sim_kernels.cc), so that the demo, the tests and
// the benchmarks that launch them by name run unchanged on a GPU. Built by nvcc
// into a fatbin that the worker embeds and loads as module 0 ("no module",
// src/worker/backend.h).
//
// The simulator runs a kernel once for the whole launch; here every kernel uses
// grid-stride loops, and the ones with a single effect (add_u64, stamp) let one
// thread do it, so any launch configuration has the simulator's result.
//
// Unlike the simulator, a GPU kernel cannot check that its pointers lie inside
// the guest's allocations: a guest can hand these kernels any device address,
// as native CUDA lets a program do. The worker's own copies and memsets are
// checked (cuda_backend.cc).
#include <cstdint>

// Argument structs: the layouts of ordo::sim::*Args in include/ordo/sim.h
// (FillU32Args and SlowCopyArgs are parameter lists below).
struct AddU64Args { uint64_t counter; uint64_t value; };
struct Stamp { uint64_t start; uint64_t end; };
struct StampArgs { uint64_t stamps; uint32_t index; uint32_t sleep_us; };
struct VecAddArgs { uint64_t a; uint64_t b; uint64_t c; uint64_t n; };
static_assert(sizeof(AddU64Args) == 16 && sizeof(StampArgs) == 16 && sizeof(VecAddArgs) == 32);

namespace {

// Orders kernel events across all streams, like the simulator's tick().
__device__ unsigned long long g_tick;

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void sleep_us(uint32_t us) {
  if (us == 0) return;
  const uint64_t until = global_ns() + uint64_t{us} * 1000;
  while (global_ns() < until) __nanosleep(1000);
}

__device__ uint64_t thread_index() {
  const uint64_t block = blockIdx.x + uint64_t{gridDim.x} * (blockIdx.y + uint64_t{gridDim.y} * blockIdx.z);
  const uint64_t in_block = threadIdx.x + uint64_t{blockDim.x} * (threadIdx.y + uint64_t{blockDim.y} * threadIdx.z);
  return block * (uint64_t{blockDim.x} * blockDim.y * blockDim.z) + in_block;
}

__device__ uint64_t thread_count() {
  return uint64_t{gridDim.x} * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
}

}  // namespace

extern "C" __global__ void ordo_noop() {}

// Parameters, not a struct: sim.h's FillU32Args/SlowCopyArgs end in padding
// that a packed launch buffer leaves out (it ends with the last parameter), and
// a struct parameter would make the driver expect those bytes too.
extern "C" __global__ void ordo_fill_u32(uint64_t dst_addr, uint64_t count, uint32_t value) {
  uint32_t* dst = reinterpret_cast<uint32_t*>(dst_addr);
  for (uint64_t i = thread_index(); i < count; i += thread_count()) dst[i] = value;
}

// Every thread waits first, so the source is read late whichever block runs first.
extern "C" __global__ void ordo_slow_copy(uint64_t dst_addr, uint64_t src_addr, uint64_t bytes, uint32_t wait_us) {
  sleep_us(wait_us);
  unsigned char* dst = reinterpret_cast<unsigned char*>(dst_addr);
  const unsigned char* src = reinterpret_cast<const unsigned char*>(src_addr);
  for (uint64_t i = thread_index(); i < bytes; i += thread_count()) dst[i] = src[i];
}

// A plain read-modify-write, as in the simulator: racing launches lose updates,
// which is what the ordering tests look for.
extern "C" __global__ void ordo_add_u64(AddU64Args a) {
  if (thread_index() != 0) return;
  volatile uint64_t* p = reinterpret_cast<volatile uint64_t*>(a.counter);
  *p = *p + a.value;
}

extern "C" __global__ void ordo_stamp(StampArgs a) {
  if (thread_index() != 0) return;
  Stamp* s = reinterpret_cast<Stamp*>(a.stamps) + a.index;
  s->start = atomicAdd(&g_tick, 1ull) + 1;
  sleep_us(a.sleep_us);
  s->end = atomicAdd(&g_tick, 1ull) + 1;
}

extern "C" __global__ void ordo_vec_add(VecAddArgs a) {
  const float* x = reinterpret_cast<const float*>(a.a);
  const float* y = reinterpret_cast<const float*>(a.b);
  float* z = reinterpret_cast<float*>(a.c);
  for (uint64_t i = thread_index(); i < a.n; i += thread_count()) z[i] = x[i] + y[i];
}

// Host twins of the device kernels in basic.cu, seed.cu, peer.cu, unsupported.cu, launch_ex.cu and conditional.cu, for
// ordo-worker --sim-kernels: registered under the kernels' mangled names, each
// reads the packed parameter buffer through its kernels.h struct and does what
// the device code does, over the whole grid.
#include <chrono>
#include <cstdint>
#include <thread>

#include "kernels.h"
#include "ordo/sim.h"

namespace {

using ordo::sim::KernelContext;

uint64_t threads(const KernelContext& c) {
  const ordo::Dim3 g = c.grid(), b = c.block();
  return uint64_t{g.x} * g.y * g.z * b.x * b.y * b.z;
}

void fill(KernelContext& c) {
  const auto a = c.args<FillArgs>();
  if (a.n <= 0) return;
  const uint64_t n = std::min<uint64_t>(uint64_t(a.n), threads(c));
  int32_t* p = c.span<int32_t>(a.p, n);
  for (uint64_t i = 0; i < n; ++i) p[i] = a.v + int32_t(i);
}

void add(KernelContext& c) {
  const auto a = c.args<FillArgs>();
  if (a.n <= 0) return;
  const uint64_t n = std::min<uint64_t>(uint64_t(a.n), threads(c));
  int32_t* p = c.span<int32_t>(a.p, n);
  for (uint64_t i = 0; i < n; ++i) p[i] += a.v;
}

void saxpy(KernelContext& c) {
  const auto a = c.args<SaxpyArgs>();
  if (a.n <= 0) return;
  const uint64_t n = std::min<uint64_t>(uint64_t(a.n), threads(c));
  const float* x = c.span<float>(a.x, n);
  float* y = c.span<float>(a.y, n);
  for (uint64_t i = 0; i < n; ++i) y[i] = a.a * x[i] + y[i];
}

void mixed(KernelContext& c) {
  const auto a = c.args<MixedArgs>();
  int64_t* out = c.span<int64_t>(a.out, 6);
  out[0] = a.c;
  out[1] = int64_t(a.d);
  out[2] = a.s;
  out[3] = a.pair.a;
  out[4] = a.pair.b;
  out[5] = int64_t(a.pair.c);
}

void slow_copy(KernelContext& c) {
  const auto a = c.args<SlowCopyArgs>();
  std::this_thread::sleep_for(std::chrono::microseconds(a.sleep_us));
  if (a.n <= 0) return;
  const int32_t* in = c.span<const int32_t>(a.in, uint64_t(a.n));
  int32_t* out = c.span<int32_t>(a.out, uint64_t(a.n));
  for (int32_t i = 0; i < a.n; ++i) out[i] = in[i];
}

void touch(KernelContext& c) {
  const auto p = c.args<uint64_t>();
  *c.span<int32_t>(p, 1) = 5;
}

// conditional.cu: set_value(cudaGraphConditionalHandle h, const int* p) and
// countdown(cudaGraphConditionalHandle h, int* counter).
struct CondArgs {
  uint64_t handle;
  uint64_t p;
};

void set_value(KernelContext& c) {
  const auto a = c.args<CondArgs>();
  c.set_conditional(a.handle, uint32_t(*c.span<int32_t>(a.p, 1)));
}

void countdown(KernelContext& c) {
  const auto a = c.args<CondArgs>();
  const int32_t left = --*c.span<int32_t>(a.p, 1);
  c.set_conditional(a.handle, left > 0 ? 1 : 0);
}

}  // namespace

extern "C" void ordo_sim_register(void (*reg)(const char* name, ordo::sim::Kernel fn)) {
  reg("_Z4fillPiii", fill);
  reg("_Z11fill_sharedPiii", fill);  // launch_ex.cu: the same through shared memory
  reg("_Z3addPiii", add);
  reg("_Z5saxpyfPKfPfi", saxpy);
  reg("_Z5mixedcds4PairPx", mixed);
  reg("_Z9slow_copyPKiPiij", slow_copy);
  reg("_Z5touchPi", touch);
  reg("_Z9set_valueyPKi", set_value);
  reg("_Z9countdownyPi", countdown);
}

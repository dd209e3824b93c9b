// Built-in simulator kernels, used by the demo, the tests and the benchmarks.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <thread>

#include "ordo/sim.h"
#include "sim_backend.h"

namespace ordo::sim {
namespace {

// ctx.span<T>() with the checks a kernel owes its caller: count * sizeof(T) must
// not overflow and the address must be aligned for T (host memory is aligned
// like the device address, so checking the device address suffices).
template <class T>
T* checked_span(KernelContext& ctx, uint64_t addr, uint64_t count) {
  if (count > std::numeric_limits<uint64_t>::max() / sizeof(T)) {
    throw KernelError(Status::kInvalidValue, "kernel element count overflows");
  }
  if (addr % alignof(T) != 0) throw KernelError(Status::kMisalignedAddress, "misaligned device address");
  return ctx.span<T>(addr, count);
}

void sleep_us(uint32_t us) {
  if (us != 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void noop(KernelContext&) {}  // accepts any argument size

void fill_u32(KernelContext& ctx) {
  const auto a = ctx.args<FillU32Args>();
  if (a.count == 0) return;
  uint32_t* dst = checked_span<uint32_t>(ctx, a.dst, a.count);
  std::fill_n(dst, a.count, a.value);
}

void slow_copy(KernelContext& ctx) {
  const auto a = ctx.args<SlowCopyArgs>();
  sleep_us(a.sleep_us);  // read the input late
  if (a.bytes == 0) return;
  std::byte* dst = checked_span<std::byte>(ctx, a.dst, a.bytes);
  const std::byte* src = checked_span<std::byte>(ctx, a.src, a.bytes);
  std::memmove(dst, src, a.bytes);
}

void add_u64(KernelContext& ctx) {
  const auto a = ctx.args<AddU64Args>();
  *checked_span<uint64_t>(ctx, a.counter, 1) += a.value;
}

void stamp(KernelContext& ctx) {
  const auto a = ctx.args<StampArgs>();
  Stamp* s = checked_span<Stamp>(ctx, a.stamps, uint64_t{a.index} + 1) + a.index;
  s->start = ctx.tick();
  sleep_us(a.sleep_us);
  s->end = ctx.tick();
}

void vec_add(KernelContext& ctx) {
  const auto a = ctx.args<VecAddArgs>();
  if (a.n == 0) return;
  const float* x = checked_span<float>(ctx, a.a, a.n);
  const float* y = checked_span<float>(ctx, a.b, a.n);
  float* z = checked_span<float>(ctx, a.c, a.n);
  for (uint64_t i = 0; i < a.n; ++i) z[i] = x[i] + y[i];
}

void set_conditional(KernelContext& ctx) {
  const auto a = ctx.args<SetConditionalArgs>();
  ctx.set_conditional(a.handle, *checked_span<uint32_t>(ctx, a.value, 1));
}

void cond_countdown(KernelContext& ctx) {
  const auto a = ctx.args<CondCountdownArgs>();
  uint64_t* c = checked_span<uint64_t>(ctx, a.counter, 1);
  if (*c) --*c;
  ctx.set_conditional(a.handle, *c != 0);
}

}  // namespace

void register_builtin_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_kernel("ordo_noop", &noop);
    register_kernel("ordo_fill_u32", &fill_u32);
    register_kernel("ordo_slow_copy", &slow_copy);
    register_kernel("ordo_add_u64", &add_u64);
    register_kernel("ordo_stamp", &stamp);
    register_kernel("ordo_vec_add", &vec_add);
    register_kernel("ordo_set_conditional", &set_conditional);
    register_kernel("ordo_cond_countdown", &cond_countdown);
  });
}

}  // namespace ordo::sim

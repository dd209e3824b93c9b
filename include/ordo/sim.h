// The CPU simulator backend's kernel API: each stream is a host thread that runs
// its work in order, device memory is host memory behind synthetic device
// addresses, and kernels are host functions registered by name. This header is
// what kernels (built in, in tests, in a --sim-kernels plugin) and guest
// programs (the built-in kernels' argument structs) use; the backend itself is
// src/worker/backends/sim/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ordo/device_info.h"
#include "ordo/status.h"

namespace ordo::sim {

// Thrown by a kernel to fail its launch with `status` (reported as an async error).
struct KernelError : std::runtime_error {
  KernelError(Status s, const char* what) : std::runtime_error(what), status(s) {}
  Status status;
};

class Device;

// What a kernel sees. Device addresses in its arguments must be translated with
// span(), which checks them against live allocations: a kernel never touches
// memory the guest did not allocate. translate() and tick() are virtual so that
// kernels in a plugin (ordo-worker --sim-kernels) reach them through the vtable,
// without the worker exporting symbols.
class KernelContext {
 public:
  KernelContext(Device& dev, Dim3 grid, Dim3 block, std::span<const std::byte> args, uint32_t device = 0)
      : dev_(dev), grid_(grid), block_(block), args_(args), device_(device) {}
  virtual ~KernelContext() = default;

  Dim3 grid() const { return grid_; }
  Dim3 block() const { return block_; }

  // The argument buffer as one trivially copyable struct with the kernel's
  // parameter layout. The packed buffer of a CUDA launch ends with the last
  // parameter (LaunchParams, src/worker/backend.h), so it may lack the
  // struct's tail padding: its size must be sizeof(T) once rounded up to
  // alignof(T). The padding reads as zero.
  template <class T>
  T args() const {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t padded = (args_.size() + alignof(T) - 1) / alignof(T) * alignof(T);
    if (padded != sizeof(T)) throw KernelError(Status::kInvalidValue, "kernel argument size mismatch");
    T t;
    std::memset(static_cast<void*>(&t), 0, sizeof(T));
    std::memcpy(static_cast<void*>(&t), args_.data(), args_.size());
    return t;
  }

  template <class T>
  T* span(uint64_t device_addr, uint64_t count) const {
    return static_cast<T*>(translate(device_addr, count * sizeof(T)));
  }

  // A process-wide counter that orders kernel events across all streams.
  virtual uint64_t tick() const;

  // cudaGraphSetConditional: sets the conditional value behind `handle` for
  // the graph launch this kernel runs in. A handle of no conditional node of
  // that launch (or a kernel outside a graph) fails the launch, as the device
  // would fault.
  virtual void set_conditional(uint64_t handle, uint32_t value) const;

  // The running graph launch's conditional values (the backend's, not a kernel's to call).
  using Conditions = std::vector<std::pair<uint64_t, uint32_t>>;
  void bind_conditions(Conditions* c) { conditions_ = c; }

 private:
  virtual void* translate(uint64_t device_addr, uint64_t bytes) const;
  Device& dev_;
  Dim3 grid_, block_;
  std::span<const std::byte> args_;
  uint32_t device_;  // the launching stream's
  mutable std::vector<std::shared_ptr<const void>> pins_;  // allocations translated so far
  Conditions* conditions_ = nullptr;
};

using Kernel = void (*)(KernelContext&);

// Registers a kernel under `name` (e.g. a mangled device name). Thread-safe;
// re-registering a name replaces it.
void register_kernel(std::string_view name, Kernel fn);

// Built-in kernels (src/worker/backends/sim/sim_kernels.cc) with their
// argument structs, used by the demo, the tests and the benchmarks.
struct NoopArgs {};
struct FillU32Args { uint64_t dst; uint64_t count; uint32_t value; uint32_t pad; };
struct SlowCopyArgs { uint64_t dst; uint64_t src; uint64_t bytes; uint32_t sleep_us; uint32_t pad; };
struct AddU64Args { uint64_t counter; uint64_t value; };
struct Stamp { uint64_t start; uint64_t end; };
struct StampArgs { uint64_t stamps; uint32_t index; uint32_t sleep_us; };
struct VecAddArgs { uint64_t a; uint64_t b; uint64_t c; uint64_t n; };
// ordo_set_conditional: sets `handle` to the uint32 at device address `value`.
struct SetConditionalArgs { uint64_t handle; uint64_t value; };
// ordo_cond_countdown: decrements the uint64 at `counter` and sets `handle` to
// whether it is still nonzero (a WHILE node's body that runs `counter` times).
struct CondCountdownArgs { uint64_t handle; uint64_t counter; };

}  // namespace ordo::sim

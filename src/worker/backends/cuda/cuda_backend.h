// The cuda backend: ordo-worker on a real GPU (cuda_backend_impl.h: the class, and where each part of it is).
// Declared whether or not the worker was built with CUDA (meson -Dcuda): without
// it, probe() says so and make_cuda_backend() returns nullptr.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "transport/handle_table.h"
#include "worker/backend.h"

namespace ordo::cuda {

// Whether this build has the cuda backend at all.
bool built();

// What cudaGetDeviceCount said. `error` is the cudaError_t number (35,
// cudaErrorInsufficientDriver, on a machine without a driver).
struct Probe {
  int count = 0;
  int error = 0;
  std::string error_name;  // "cudaErrorInsufficientDriver"
  bool usable() const { return error == 0 && count > 0; }
  // "no CUDA device (cudaGetDeviceCount: cudaErrorInsufficientDriver (35))"
  std::string why_not() const;
};
Probe probe();

// The backend on host devices `devices` (ordinals, in the order the guest
// numbers them; empty: every visible device), or nullptr and *error saying why
// and what to do.
std::unique_ptr<Backend> make_cuda_backend(const std::vector<int>& devices, std::string* error);

// Whether `image` may go to cuModuleLoadData: a fatbin or 64-bit ELF cubin
// whose own size fields (fatbin header and entries, ELF program and section
// headers) stay inside `image`, or PTX text (printable ASCII and whitespace,
// optionally NUL-terminated; the backend NUL-terminates its copy). Anything
// else, the fatbin wrapper included, is refused; *why says why.
bool check_module_image(std::span<const std::byte> image, std::string* why);

// The cuda backend's kernel ids: a slot (20 bits) and that slot's generation
// above it (12 bits). Unloading a module releases its kernels' slots for
// reuse, so a long-running worker never runs out of ids; the generation makes
// the old ids stop resolving. A stale id resolves again only after its slot
// has been reused 4,095 times, and then it names a kernel of the same guest
// (one worker per guest), checked against that kernel's own parameter size:
// no worse than a stale CUfunction natively.
using KernelIds = HandleTable<20, 32>;

// The fatbin of ordo's built-in kernels (the simulator's, for a GPU) that the
// backend loads as module 0; empty when not built. Benchmarks use it to run the
// same kernels natively.
std::span<const std::byte> builtin_image();

}  // namespace ordo::cuda

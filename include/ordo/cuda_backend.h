// The cuda backend: ordo-worker on a real GPU (src/worker/cuda_backend.cc).
// Declared whether or not the worker was built with CUDA (meson -Dcuda): without
// it, probe() says so and make_cuda_backend() returns nullptr.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ordo/backend.h"

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

// The backend on device 0, or nullptr and *error saying why and what to do.
std::unique_ptr<Backend> make_cuda_backend(std::string* error);

// Whether a module image's own size fields (fatbin header and entries, ELF
// program and section headers) stay inside `image`; *why says what does not.
// Anything else (PTX text) passes: the backend NUL-terminates its copy.
bool check_module_image(std::span<const std::byte> image, std::string* why);

// The fatbin of ordo's built-in kernels (the simulator's, for a GPU) that the
// backend loads as module 0; empty when not built. Benchmarks use it to run the
// same kernels natively.
std::span<const std::byte> builtin_image();

}  // namespace ordo::cuda

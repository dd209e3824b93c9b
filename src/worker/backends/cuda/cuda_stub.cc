// The cuda backend's entry points in a build without the CUDA toolkit
// (meson -Dcuda=disabled, or auto with no nvcc): the worker runs on sim.
#include "cuda_backend.h"

namespace ordo::cuda {

bool built() { return false; }

std::string Probe::why_not() const {
  return "this ordo-worker was built without CUDA (rebuild with the CUDA toolkit installed, meson -Dcuda=enabled)";
}

Probe probe() { return Probe{}; }

std::unique_ptr<Backend> make_cuda_backend(const std::vector<int>&, std::string* error) {
  if (error) *error = probe().why_not() + "; use --backend sim";
  return nullptr;
}

std::span<const std::byte> builtin_image() { return {}; }

bool check_module_image(std::span<const std::byte>, std::string*) { return true; }

}  // namespace ordo::cuda

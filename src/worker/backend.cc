#include <cstdio>

#include "ordo/backend.h"
#include "ordo/cuda_backend.h"
#include "ordo/null_backend.h"
#include "ordo/sim.h"

namespace ordo {

std::unique_ptr<Backend> make_backend(std::string_view name, std::string* error) {
  if (name == "null") return std::make_unique<NullBackend>();  // transport cost only: runs nothing
  if (name == "sim") {
    sim::register_builtin_kernels();
    return sim::make_sim_backend();
  }
  if (name == "cuda") return cuda::make_cuda_backend(error);
  if (name == "auto") {
    // The GPU when there is one; otherwise the simulator, saying why.
    const cuda::Probe p = cuda::probe();
    if (p.usable()) {
      std::string why;
      if (auto b = cuda::make_cuda_backend(&why)) {
        std::fprintf(stderr, "ordo-worker: backend auto: %d CUDA device(s), using cuda\n", p.count);
        return b;
      }
      std::fprintf(stderr, "ordo-worker: backend auto: %s; using sim\n", why.c_str());
    } else {
      std::fprintf(stderr, "ordo-worker: backend auto: %s; using sim\n", p.why_not().c_str());
    }
    return make_backend("sim", error);
  }
  if (error) *error = "unknown backend '" + std::string(name) + "' (choose auto, sim, null or cuda)";
  return nullptr;
}

std::string resolve_backend(std::string_view name, std::string* error) {
  if (name == "null" || name == "sim") return std::string(name);
  const cuda::Probe p = cuda::probe();
  if (name == "cuda") {
    if (p.usable()) return "cuda";
    if (error) *error = p.why_not() + "; use --backend sim";
    return "";
  }
  if (name == "auto") {
    if (p.usable()) {
      std::fprintf(stderr, "ordo-worker: backend auto: %d CUDA device(s), using cuda\n", p.count);
      return "cuda";
    }
    std::fprintf(stderr, "ordo-worker: backend auto: %s; using sim\n", p.why_not().c_str());
    return "sim";
  }
  if (error) *error = "unknown backend '" + std::string(name) + "' (choose auto, sim, null or cuda)";
  return "";
}

}  // namespace ordo

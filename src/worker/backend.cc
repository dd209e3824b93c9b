#include <cstdio>
#include <string>

#include "backend.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/null/null_backend.h"
#include "worker/backends/sim/sim_backend.h"

namespace ordo {

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options, std::string* error) {
  if ((name == "null" || name == "sim") && (options.sim_devices == 0 || options.sim_devices > kMaxDevices)) {
    if (error) *error = "--sim-devices " + std::to_string(options.sim_devices) + ": choose 1 to " + std::to_string(kMaxDevices);
    return nullptr;
  }
  // transport cost only: runs nothing
  if (name == "null") return std::make_unique<NullBackend>(options.sim_devices, options.null_launch_ns);
  if (name == "sim") return sim::make_sim_backend(options.sim_devices);
  if (name == "cuda") return cuda::make_cuda_backend(options.cuda_devices, error);
  if (name == "auto") {
    // The GPU when there is one; otherwise the simulator, saying why.
    const cuda::Probe p = cuda::probe();
    if (p.usable()) {
      std::string why;
      if (auto b = cuda::make_cuda_backend(options.cuda_devices, &why)) {
        std::fprintf(stderr, "ordo-worker: backend auto: %d CUDA device(s), using cuda\n", p.count);
        return b;
      }
      std::fprintf(stderr, "ordo-worker: backend auto: %s; using sim\n", why.c_str());
    } else {
      std::fprintf(stderr, "ordo-worker: backend auto: %s; using sim\n", p.why_not().c_str());
    }
    return make_backend("sim", options, error);
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

#include "ordo/backend.h"
#include "ordo/null_backend.h"
#include "ordo/sim.h"

namespace ordo {

std::unique_ptr<Backend> make_backend(std::string_view name, std::string* error) {
  if (name == "null") return std::make_unique<NullBackend>();  // transport cost only: runs nothing
  if (name == "sim") {
    sim::register_builtin_kernels();
    return sim::make_sim_backend();
  }
  if (error) {
    if (name == "cuda")
      *error = "the cuda backend is not built into this worker yet; use --backend sim";
    else
      *error = "unknown backend '" + std::string(name) + "' (choose sim, null or cuda)";
  }
  return nullptr;
}

}  // namespace ordo

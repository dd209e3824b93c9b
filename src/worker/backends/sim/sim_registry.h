// The sim's kernel registry: host twins by name (register_kernel, ordo/sim.h),
// and the kernels of loaded modules that have none. Process-wide.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <shared_mutex>
#include <string>

#include "ordo/sim.h"

namespace ordo::sim {

constexpr uint32_t kMaxKernels = 65536;

struct Registry {
  std::shared_mutex mu;
  std::map<std::string, uint32_t, std::less<>> ids;  // guarded by mu
  std::array<std::atomic<Kernel>, kMaxKernels> fns{};
  // Kernels of loaded modules with no host twin, by id: found, but launching them fails.
  std::map<uint32_t, std::string> missing;  // guarded by mu
  std::atomic<uint32_t> count{0};
};

Registry& registry();

// The kernel registered under `id`; null if none (yet), or a module's kernel without a twin.
Kernel kernel_by_id(uint32_t id);

}  // namespace ordo::sim

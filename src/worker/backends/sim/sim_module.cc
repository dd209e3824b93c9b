// The sim's modules: it cannot run device code, so a module's kernels are its
// registered host twins (sim_registry.h) found by name, and its variables
// zeroed memory of their own.
#include <mutex>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <vector>

#include "sim_device.h"
#include "sim_registry.h"

namespace ordo::sim {

// The sim cannot run device code: a module's kernels are found by name among
// the registered kernels (host twins, see `ordo-worker --sim-kernels`). Loading
// only records the module id so that lookups in unknown modules fail as on a GPU.
Status Device::module_load(uint32_t module, std::span<const std::byte>) {
  if (module == 0) return Status::kInvalidValue;
  std::lock_guard lk(modules_mu_);
  if (!modules_.insert(module).second) return Status::kInvalidValue;
  return Status::kSuccess;
}

Status Device::module_unload(uint32_t module) {
  std::vector<uint64_t> dead;
  {
    std::lock_guard lk(modules_mu_);
    if (!modules_.erase(module)) return Status::kInvalidResourceHandle;
    for (auto it = globals_.lower_bound({module, 0, {}}); it != globals_.end() && std::get<0>(it->first) == module;) {
      dead.push_back(it->second.first);
      it = globals_.erase(it);
    }
  }
  for (uint64_t a : dead) free(a);
  return Status::kSuccess;
}

// The sim cannot read the image's initial values: a device variable starts
// zeroed, in memory of its own, for the module's lifetime.
Status Device::module_global(uint32_t module, uint32_t device, std::string_view name, uint64_t size_hint, uint64_t* addr,
                             uint64_t* size) {
  if (device >= devices_) return Status::kInvalidValue;
  std::lock_guard lk(modules_mu_);
  if (!modules_.count(module)) return Status::kInvalidResourceHandle;
  GlobalKey key{module, device, std::string(name)};
  if (auto it = globals_.find(key); it != globals_.end()) {
    *addr = it->second.first;
    *size = it->second.second;
    return Status::kSuccess;
  }
  if (size_hint == 0) return Status::kInvalidDeviceFunction;  // not a variable of this module
  if (Status s = malloc(device, size_hint, addr); !ok(s)) return s;
  *size = size_hint;
  globals_.emplace(std::move(key), std::make_pair(*addr, size_hint));
  return Status::kSuccess;
}

Status Device::kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) {
  if (!kernel) return Status::kInvalidValue;
  if (module != 0) {
    std::lock_guard lk(modules_mu_);
    if (!modules_.count(module)) return Status::kInvalidResourceHandle;
  }
  Registry& r = registry();
  {
    std::shared_lock lk(r.mu);
    if (auto it = r.ids.find(name); it != r.ids.end()) {
      *kernel = it->second;
      return Status::kSuccess;
    }
  }
  if (module == 0) return Status::kInvalidDeviceFunction;
  // A loaded module's kernel: it exists on a GPU, so the lookup succeeds, and
  // without a twin its launches fail (kernel_runnable).
  std::unique_lock lk(r.mu);
  if (auto it = r.ids.find(name); it != r.ids.end()) {
    *kernel = it->second;
    return Status::kSuccess;
  }
  const uint32_t id = r.count.load(std::memory_order_relaxed);
  if (id >= kMaxKernels) return Status::kLaunchOutOfResources;
  r.ids.emplace(std::string(name), id);
  r.missing.emplace(id, std::string(name));
  r.count.store(id + 1, std::memory_order_release);
  *kernel = id;
  return Status::kSuccess;
}

}  // namespace ordo::sim

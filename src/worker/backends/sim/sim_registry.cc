// The sim's kernel registry (sim_registry.h).
#include "sim_registry.h"

#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ordo::sim {

Registry& registry() {
  static Registry r;
  return r;
}

Kernel kernel_by_id(uint32_t id) {
  Registry& r = registry();
  if (id >= r.count.load(std::memory_order_acquire)) return nullptr;
  return r.fns[id].load(std::memory_order_acquire);
}

void register_kernel(std::string_view name, Kernel fn) {
  Registry& r = registry();
  std::unique_lock lk(r.mu);
  auto it = r.ids.find(name);
  if (it != r.ids.end()) {
    r.missing.erase(it->second);
    r.fns[it->second].store(fn, std::memory_order_release);
    return;
  }
  const uint32_t id = r.count.load(std::memory_order_relaxed);
  if (id >= kMaxKernels) throw std::length_error("ordo::sim: too many kernels registered");
  r.ids.emplace(std::string(name), id);
  r.fns[id].store(fn, std::memory_order_release);
  r.count.store(id + 1, std::memory_order_release);
}

}  // namespace ordo::sim

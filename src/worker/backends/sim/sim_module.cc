// The sim's modules: it cannot run device code, so a module's kernels are its
// registered host twins (sim_registry.h) found by name, and its variables
// zeroed memory of their own.
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <vector>

#include "sim_device.h"
#include "sim_registry.h"
#include "transport/occupancy.h"

namespace ordo::sim {

// The sim cannot run device code: a module's kernels are found by name among
// the registered kernels (host twins, see `ordo-worker --sim-kernels`). Loading
// records the module id, so that lookups in unknown modules fail as on a GPU,
// and what its cubin for the sim's architecture says each kernel uses.
Status Device::module_load(uint32_t module, std::span<const std::byte> image) {
  if (module == 0) return Status::kInvalidValue;
  DeviceInfo dev;  // the sim's devices are alike
  device_info(0, &dev);
  image::KernelResourceMap resources;
  image::image_resources(image, uint32_t(dev.major * 10 + dev.minor), &resources);  // PTX alone: the kernels use nothing
  std::lock_guard lk(modules_mu_);
  if (!modules_.insert(module).second) return Status::kInvalidValue;
  module_resources_[module] = std::move(resources);
  return Status::kSuccess;
}

Status Device::module_unload(uint32_t module) {
  std::vector<uint64_t> dead;
  {
    std::lock_guard lk(modules_mu_);
    if (!modules_.erase(module)) return Status::kInvalidResourceHandle;
    module_resources_.erase(module);
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
  const Status st = find_kernel(module, name, kernel);
  if (ok(st) && module != 0) {
    // Kernel ids are the sim's by name: the module looked up last speaks for the kernel.
    std::lock_guard lk(modules_mu_);
    if (auto m = module_resources_.find(module); m != module_resources_.end())
      if (auto k = m->second.find(name); k != m->second.end()) kernel_resources_[*kernel] = k->second;
  }
  return st;
}

// What the cubin states of `kernel`, the device, and the occupancy
// calculator's limits with the kernel's own threads per block.
Status Device::kernel_limits(uint32_t kernel, uint32_t device, image::KernelResources* r, DeviceInfo* dev,
                             occupancy::Limits* l) {
  if (device >= devices_) return Status::kInvalidDevice;
  if (kernel >= registry().count.load(std::memory_order_acquire)) return Status::kInvalidResourceHandle;
  {
    std::lock_guard lk(modules_mu_);
    if (auto it = kernel_resources_.find(kernel); it != kernel_resources_.end()) *r = it->second;
  }
  if (Status s = device_info(device, dev); !ok(s)) return s;
  l->warp_size = uint64_t(std::max(1, dev->warp_size));
  l->max_threads_per_block = uint64_t(std::max(1, dev->max_threads_per_block));
  l->regs_per_block = uint64_t(std::max(0, dev->regs_per_block));
  // kernel_resources.h bounds the cubin's numbers: nothing here can overflow.
  l->max_threads_per_block = occupancy::max_threads_per_block(r->registers, r->max_threads, *l);
  l->max_threads_per_sm = uint64_t(std::max(0, dev->max_threads_per_multiprocessor));
  l->max_blocks_per_sm = uint64_t(std::max(0, dev->max_blocks_per_multiprocessor));
  l->regs_per_sm = uint64_t(std::max(0, dev->regs_per_multiprocessor));
  l->shared_per_sm = dev->shared_mem_per_multiprocessor;
  l->reserved_shared_per_block = kReservedSharedPerBlock;
  return Status::kSuccess;
}

// The resources the cubin states, and the limits a device derives from them:
// threads per block bounded by __launch_bounds__ and by the register file
// (transport/occupancy.h). Without a cubin for the sim's architecture (PTX a
// GPU would compile) the nearest one stands in: the sim compiles nothing.
Status Device::kernel_attributes(uint32_t kernel, uint32_t device, int32_t* out) {
  image::KernelResources r;
  DeviceInfo dev;
  occupancy::Limits limits;
  if (Status s = kernel_limits(kernel, device, &r, &dev, &limits); !ok(s)) return s;
  const uint64_t threads = limits.max_threads_per_block;
  const int32_t cc = dev.major * 10 + dev.minor;
  std::fill(out, out + kKernelAttributeCount, 0);
  out[kKernelMaxThreadsPerBlock] = int32_t(threads);
  out[kKernelSharedSizeBytes] = int32_t(r.shared_bytes);
  out[kKernelLocalSizeBytes] = int32_t(r.local_bytes);
  out[kKernelNumRegs] = int32_t(r.registers);
  out[kKernelPtxVersion] = cc;
  out[kKernelBinaryVersion] = cc;
  // What every function allows until cuFuncSetAttribute raises it (libcuda.so.1 keeps that).
  out[kKernelMaxDynamicSharedSizeBytes] = int32_t(48 * 1024 - std::min<uint32_t>(r.shared_bytes, 48 * 1024));
  out[kKernelPreferredSharedMemoryCarveout] = -1;
  return Status::kSuccess;
}

Status Device::kernel_occupancy(uint32_t kernel, uint32_t device, const OccupancyQuery& q, uint32_t* out) {
  const uint32_t cluster = q.shape.blocks_per_cluster();
  if (q.clusters && (cluster > kMaxClusterBlocks || (cluster > kMaxPortableClusterBlocks && !q.non_portable)))
    return Status::kInvalidClusterSize;
  image::KernelResources r;
  DeviceInfo dev;
  occupancy::Limits l;
  if (Status s = kernel_limits(kernel, device, &r, &dev, &l); !ok(s)) return s;
  const uint64_t blocks = occupancy::blocks_per_sm(q.threads, r.registers, uint64_t{r.shared_bytes} + q.smem, l);
  *out = uint32_t(q.clusters ? blocks * uint64_t(std::max(0, dev.multi_processor_count)) / cluster : blocks);
  return Status::kSuccess;
}

Status Device::find_kernel(uint32_t module, std::string_view name, uint32_t* kernel) {
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

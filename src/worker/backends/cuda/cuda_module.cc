// The cuda backend's modules: checking a guest's image, loading it into each
// device's context (device 0 at once, others when first used), its variables
// and its kernels (KernelIds, cuda_backend.h).
#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend_impl.h"
#include "transport/module_image.h"

namespace ordo::cuda {
namespace {

constexpr size_t kMaxParams = 4096;  // the driver allows 32764 bytes of parameters

}  // namespace

// cuModuleLoadData takes a bare pointer and guesses the format from the bytes,
// so only the formats we can check get through: a fatbin container, a 64-bit
// ELF cubin, or PTX text. Anything else is refused, in particular nvcc's
// fatbin wrapper, which holds a pointer to the fatbin: the driver would follow
// an address chosen by the guest. A fatbin or cubin tells the driver its own
// sizes and the driver trusts them, so every stated size must stay inside the
// bytes the guest actually sent. The formats and the checks are
// transport/module_image.h's, the reader libcuda.so.1 walks images with too.
bool check_module_image(std::span<const std::byte> img, std::string* why) {
  return image::validate_module_image(img, why);
}

Status CudaBackend::module_load(uint32_t module, std::span<const std::byte> image) {
  if (module == 0 || image.empty()) return Status::kInvalidValue;  // 0: the built-in kernels
  std::string why;
  if (!check_module_image(image, &why)) {
    log("rejected module image: %s", why.c_str());
    return to_status(CUDA_ERROR_INVALID_IMAGE);  // what the driver answers for an image it cannot parse
  }
  {
    std::lock_guard lk(mu_);
    if (modules_.count(module)) return Status::kInvalidResourceHandle;
    if (modules_.size() > kMaxModules) return Status::kMemoryAllocation;  // ids are the worker's; the count is ours
  }
  return add_module(module, image);
}

Status CudaBackend::module_unload(uint32_t module) {
  if (module == 0) return Status::kInvalidResourceHandle;  // the built-in kernels stay
  std::unique_lock unload(unload_mu_);  // no launch of its kernels is in the driver
  std::lock_guard lk(mu_);
  auto it = modules_.find(module);
  if (it == modules_.end()) return Status::kInvalidResourceHandle;
  Module mod = std::move(it->second);
  modules_.erase(it);
  drop_programs();  // execs hold its functions; built again at their next launch
  // Its kernels' slots are free for reuse; their old ids stop launching (KernelIds).
  auto first = kernel_ids_.lower_bound({module, std::string()}), last = first;
  for (; last != kernel_ids_.end() && last->first.first == module; ++last) {
    uint32_t slot = 0;
    if (!kernel_slots_.find(last->second, &slot)) continue;
    kernels_[slot] = Kernel{};
    kernel_slots_.release(slot);
  }
  kernel_ids_.erase(first, last);
  std::erase_if(globals_, [module](const auto& g) { return g.second.module == module; });
  return unload_everywhere(mod);
}

Status CudaBackend::module_global(uint32_t module, uint32_t device, std::string_view name, uint64_t, uint64_t* addr,
                                  uint64_t* size) {
  if (name.empty() || name.find('\0') != std::string_view::npos) return Status::kInvalidValue;
  if (device >= device_count()) return Status::kInvalidDevice;
  std::lock_guard lk(mu_);
  bind(device);
  CUmodule mod = nullptr;
  if (Status st = module_on(module, device, &mod); !ok(st)) return st;
  CUdeviceptr p = 0;
  size_t n = 0;
  const CUresult r = drv_.module_get_global(&p, &n, mod, std::string(name).c_str());
  if (r == CUDA_ERROR_NOT_FOUND) return Status::kInvalidDeviceFunction;
  if (r != CUDA_SUCCESS) return Status::kInvalidValue;
  // Copies and memsets may target the variable, as they may an allocation.
  if (n) globals_[p] = Global{n, device, module};
  *addr = p;
  *size = n;
  return Status::kSuccess;
}

Status CudaBackend::kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) {
  if (!kernel || name.empty() || name.find('\0') != std::string_view::npos) return Status::kInvalidValue;
  std::lock_guard lk(mu_);
  auto mit = modules_.find(module);
  if (mit == modules_.end()) return module == 0 ? Status::kInvalidDeviceFunction : Status::kInvalidResourceHandle;
  std::pair<uint32_t, std::string> key{module, std::string(name)};
  if (auto it = kernel_ids_.find(key); it != kernel_ids_.end()) {
    *kernel = it->second;  // repeated lookups do not grow the table
    return Status::kSuccess;
  }
  if (kernel_slots_.full()) return Status::kMemoryAllocation;
  // Looked up in device 0's copy, which every module has (add_module); other
  // devices find the function the first time it runs there (function_on).
  bind(0);
  CUfunction fn = nullptr;
  CUresult r = drv_.module_get_function(&fn, mit->second.on[0], key.second.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) return Status::kInvalidDeviceFunction;
  if (r != CUDA_SUCCESS) return to_status(r);
  Kernel k;
  k.module = module;
  k.name = key.second;
  k.fn.assign(device_count(), nullptr);
  k.fn[0] = fn;
  k.smem_allowed.assign(device_count(), 0);
  k.wide_clusters.assign(device_count(), 0);
  if (drv_.func_get_param_info) {
    // The parameter buffer's size: the end of the last parameter.
    size_t i = 0, off = 0, sz = 0;
    for (; i < kMaxParams && drv_.func_get_param_info(fn, i, &off, &sz) == CUDA_SUCCESS; ++i)
      k.param_bytes = std::max(k.param_bytes, off + sz);
    k.param_bytes_known = i < kMaxParams;
  }
  uint32_t id = 0, slot = 0;
  kernel_slots_.acquire(&slot, &id);  // not full(): checked above
  if (slot >= kernels_.size()) kernels_.resize(slot + 1);
  kernels_[slot] = std::move(k);
  kernel_ids_.emplace(std::move(key), id);
  *kernel = id;
  return Status::kSuccess;
}

// `image` in an 8-byte aligned buffer with at least 64 zero bytes past its
// end: PTX text is then NUL-terminated within memory we own, and a
// fixed-size header the driver reads at the very end of a checked image (a
// fatbin entry's 64 bytes) cannot take it past our copy.
std::vector<uint64_t> CudaBackend::padded(std::span<const std::byte> image) {
  std::vector<uint64_t> copy((image.size() + 7) / 8 + 8, 0);
  std::memcpy(copy.data(), image.data(), image.size());
  return copy;
}

// Requires the device current.
Status CudaBackend::load_on(const std::vector<uint64_t>& image, CUmodule* out) {
  if (image.empty()) return Status::kInvalidValue;
  CUresult r = drv_.module_load_data(out, image.data());
  if (r == CUDA_SUCCESS) return Status::kSuccess;
  *out = nullptr;
  return to_status(r);
}

// Loads into device 0 at once, which checks the image and answers kernel
// lookups; other devices load it (and get their own copy of its variables) the
// first time they use it, as CUDA's lazy loading does. The load (a JIT compile
// for PTX) runs without mu_, so launches and copies go on meanwhile; the
// worker never loads one id twice.
Status CudaBackend::add_module(uint32_t id, std::span<const std::byte> image) {
  if (image.empty()) return Status::kInvalidValue;
  std::vector<uint64_t> copy = padded(image);
  Module m;
  m.on.assign(device_count(), nullptr);
  bind(0);
  if (Status st = load_on(copy, &m.on[0]); !ok(st)) return st;
  if (device_count() > 1) m.image = std::move(copy);
  std::lock_guard lk(mu_);
  modules_.emplace(id, std::move(m));
  return Status::kSuccess;
}

// Requires mu_ and `device` current: the module's copy on `device`.
Status CudaBackend::module_on(uint32_t module, uint32_t device, CUmodule* out) {
  auto it = modules_.find(module);
  if (it == modules_.end()) return Status::kInvalidResourceHandle;
  Module& m = it->second;
  if (!m.on[device])
    if (Status st = load_on(m.image, &m.on[device]); !ok(st)) return st;  // e.g. no code for this device (209)
  *out = m.on[device];
  return Status::kSuccess;
}

// The driver's answers for the function on `device` (loading the module there
// first if it never ran there). A number this driver does not know reads 0.
Status CudaBackend::kernel_attributes(uint32_t kernel, uint32_t device, int32_t* out) {
  if (device >= device_count()) return Status::kInvalidDevice;
  std::lock_guard lk(mu_);
  uint32_t slot = 0;
  if (!kernel_slots_.find(kernel, &slot) || kernels_[slot].fn.empty()) return Status::kInvalidResourceHandle;
  bind(device);
  CUfunction fn = nullptr;
  if (Status s = function_on(kernels_[slot], device, &fn); !ok(s)) return s;
  for (uint32_t a = 0; a < kKernelAttributeCount; ++a) {
    int v = 0;
    const CUresult r = drv_.func_get_attribute(&v, CUfunction_attribute(a), fn);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) return to_status(r);
    out[a] = r == CUDA_SUCCESS ? v : 0;
  }
  return Status::kSuccess;
}

// The driver's count, once its function allows what the guest allowed the
// kernel (launch_needs: the dynamic shared memory, a wide cluster).
Status CudaBackend::kernel_occupancy(uint32_t kernel, uint32_t device, const OccupancyQuery& q, uint32_t* out) {
  if (device >= device_count()) return Status::kInvalidDevice;
  std::lock_guard lk(mu_);
  uint32_t slot = 0;
  if (!kernel_slots_.find(kernel, &slot) || kernels_[slot].fn.empty()) return Status::kInvalidResourceHandle;
  Kernel& k = kernels_[slot];
  bind(device);
  CUfunction fn = nullptr;
  if (Status s = function_on(k, device, &fn); !ok(s)) return s;
  LaunchParams p;
  if (q.clusters && (q.non_portable || q.shape.blocks_per_cluster() <= kMaxPortableClusterBlocks)) p.shape = q.shape;
  if (Status s = launch_needs(k, device, fn, p); !ok(s)) return s;
  // The guest allowed q.smem (its opt-in, or 48 KiB less the static): the
  // function is raised to it if it allows less, never lowered.
  int static_smem = 0;
  if (CUresult r = drv_.func_get_attribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn); r != CUDA_SUCCESS)
    return to_status(r);
  const uint32_t allows = std::max<uint32_t>(k.smem_allowed[device], uint32_t(std::max(0, 48 * 1024 - static_smem)));
  if (q.smem > allows) {
    if (CUresult r = drv_.func_set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(q.smem));
        r != CUDA_SUCCESS)
      return to_status(r);
    k.smem_allowed[device] = q.smem;
  }
  int n = 0;
  CUresult r;
  if (q.clusters) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = q.shape.cluster.x;
    attr.value.clusterDim.y = q.shape.cluster.y;
    attr.value.clusterDim.z = q.shape.cluster.z;
    CUlaunchConfig config{};
    config.gridDimX = q.shape.cluster.x, config.gridDimY = q.shape.cluster.y, config.gridDimZ = q.shape.cluster.z;
    config.blockDimX = q.threads, config.blockDimY = 1, config.blockDimZ = 1;
    config.sharedMemBytes = q.smem;
    config.attrs = &attr;
    config.numAttrs = 1;
    r = drv_.occupancy_clusters(&n, fn, &config);
  } else {
    r = drv_.occupancy_blocks(&n, fn, int(q.threads), q.smem, 0);
  }
  if (r != CUDA_SUCCESS) return to_status(r);
  *out = uint32_t(std::max(0, n));
  return Status::kSuccess;
}

// Requires mu_ and `device` current: kernel k's function on `device`.
Status CudaBackend::function_on(Kernel& k, uint32_t device, CUfunction* out) {
  if (!k.fn[device]) {
    CUmodule mod = nullptr;
    if (Status st = module_on(k.module, device, &mod); !ok(st)) return st;
    if (CUresult r = drv_.module_get_function(&k.fn[device], mod, k.name.c_str()); r != CUDA_SUCCESS) {
      k.fn[device] = nullptr;
      return to_status(r);
    }
  }
  *out = k.fn[device];
  return Status::kSuccess;
}

// Every device's copy; the first error, if any.
Status CudaBackend::unload_everywhere(Module& m) {
  Status first = Status::kSuccess;
  for (uint32_t d = 0; d < m.on.size(); ++d) {
    if (!m.on[d]) continue;
    bind(d);
    const Status st = to_status(drv_.module_unload(std::exchange(m.on[d], nullptr)));
    if (ok(first)) first = st;
  }
  return first;
}

}  // namespace ordo::cuda

// The cuda backend's memory: device allocations, the registered (pinned) host
// memory, and the checks every copy and memset operand goes through.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>

#include "cuda_backend_impl.h"
#include "worker/ranges.h"

namespace ordo::cuda {

bool CudaBackend::register_host_memory(void* base, uint64_t size) {
  if (!base || size == 0) return false;
  bind(0);
  // Pinning lets copies DMA straight from the shared region. Without it they
  // still work, but pageable copies are staged by the driver and a D2H copy
  // into pageable memory holds the dispatch thread until it is done.
  // Portable: pinned for every device's context, not only the current one's.
  // Mapped: kernels reach it too, at the same address under unified
  // addressing, which is what lets the guest's pinned pointers be device
  // pointers (ordo's own libcuda.so.1 refuses it: the stacked pair's inner
  // worker registers without).
  cudaError_t e = cudaHostRegister(base, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
  bool mapped = e == cudaSuccess;
  if (!mapped) {
    cudaGetLastError();  // not sticky: clear it so it is not reported later
    e = cudaHostRegister(base, size, cudaHostRegisterPortable);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    log("cudaHostRegister of the shared region failed (%s): copies will be pageable and slower", cudaGetErrorName(e));
  }
  for (uint32_t d = 0; mapped && d < device_count(); ++d) {
    bind(d);
    void* dev = nullptr;
    mapped = cudaHostGetDevicePointer(&dev, base, 0) == cudaSuccess && dev == base;
    cudaGetLastError();
  }
  std::lock_guard lk(mu_);
  host_ranges_.push_back({reinterpret_cast<uintptr_t>(base), size, e == cudaSuccess});
  return mapped;
}

Status CudaBackend::malloc(uint32_t device, uint64_t size, uint64_t* device_addr) {
  if (!device_addr || size == 0) return Status::kInvalidValue;
  if (device >= device_count()) return Status::kInvalidDevice;
  bind(device);
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, size); e != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky
    return to_status(e);
  }
  std::lock_guard lk(mu_);
  allocs_.emplace(reinterpret_cast<uintptr_t>(p), Alloc{size, device});
  *device_addr = reinterpret_cast<uintptr_t>(p);
  return Status::kSuccess;
}

Status CudaBackend::free(uint64_t device_addr) {
  if (device_addr == 0) return Status::kSuccess;  // like cudaFree(nullptr)
  uint32_t d = 0;
  {
    // Not held across cudaFree, which waits for the device: other threads'
    // copies check their operands under mu_ meanwhile (and no longer find this one).
    std::lock_guard lk(mu_);
    auto it = allocs_.find(device_addr);
    if (it == allocs_.end()) return Status::kInvalidDevicePointer;  // only what malloc returned, and only once
    d = it->second.device;
    allocs_.erase(it);
  }
  bind(d);
  return to_status(cudaFree(reinterpret_cast<void*>(uintptr_t(device_addr))));
}

// [addr, addr + size) must lie inside one live allocation or module
// variable, of any device; *device (if asked) says which. Requires mu_.
Status CudaBackend::check_device(uint64_t addr, uint64_t size, uint32_t* device) const {
  if (inside(allocs_, addr, size, device) || inside(globals_, addr, size, device) ||
      inside(ipc_opened_, addr, size, device))
    return Status::kSuccess;
  // Mappings, which a range may cross where they are adjacent (one reservation's).
  if (!covered(vmm_maps_, addr, size, [](const Alloc& a) { return a.size; }, [](const Alloc&) { return true; }))
    return Status::kInvalidDevicePointer;
  if (device) *device = std::prev(vmm_maps_.upper_bound(addr))->second.device;  // the mapping addr is in
  return Status::kSuccess;
}

// Host operands must lie inside registered memory (the shared region). Requires mu_.
Status CudaBackend::check_operand(const MemOperand& m, uint64_t size, uint32_t* device) const {
  if (m.device) return check_device(m.addr, size, device);
  for (const HostRange& r : host_ranges_)
    if (m.addr >= r.base && m.addr - r.base < r.size && size <= r.size - (m.addr - r.base)) return Status::kSuccess;
  return Status::kInvalidValue;
}

}  // namespace ordo::cuda

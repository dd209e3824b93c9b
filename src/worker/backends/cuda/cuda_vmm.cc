// The cuda backend's virtual memory: the host driver's cuMemAddressReserve,
// cuMemCreate, cuMemMap and cuMemSetAccess, at the addresses the guest then
// uses as they are (unified addressing). Mappings join the ranges copies may
// touch (check_device), which may cross from one mapping into the next.
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "cuda_backend_impl.h"

namespace ordo::cuda {

bool CudaBackend::supports_vmm() const {
  if (!drv_.has_vmm()) return false;
  for (const Device& d : devices_)
    if (d.attrs[CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED] != 1) return false;
  return true;
}

Status CudaBackend::vmm_reserve(uint64_t size, uint64_t alignment, uint64_t hint, uint64_t* addr) {
  bind(0);
  CUdeviceptr p = 0;
  if (CUresult r = drv_.mem_address_reserve(&p, size, alignment, hint, 0); r != CUDA_SUCCESS) return to_status(r);
  *addr = p;
  return Status::kSuccess;
}

Status CudaBackend::vmm_address_free(uint64_t addr, uint64_t size) {
  bind(0);
  return to_status(drv_.mem_address_free(addr, size));
}

Status CudaBackend::vmm_create(uint32_t device, uint64_t size, uint64_t* handle) {
  if (device >= device_count()) return Status::kInvalidDevice;
  bind(device);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = devices_[device].ordinal;
  // So that another worker process can import it (ipc_export_vmm).
  if (drv_.mem_export) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  if (CUresult r = drv_.mem_create(&h, size, &prop, 0); r != CUDA_SUCCESS) return to_status(r);
  *handle = h;
  return Status::kSuccess;
}

Status CudaBackend::vmm_release(uint64_t handle) {
  {
    std::lock_guard lk(mu_);
    if (auto it = vmm_exported_fds_.find(handle); it != vmm_exported_fds_.end()) {
      ::close(it->second);
      vmm_exported_fds_.erase(it);
    }
  }
  bind(0);
  return to_status(drv_.mem_release(handle));
}

Status CudaBackend::vmm_map(uint64_t addr, uint64_t size, uint64_t handle, uint32_t device) {
  bind(device);
  if (CUresult r = drv_.mem_map(addr, size, 0, handle, 0); r != CUDA_SUCCESS) return to_status(r);
  std::lock_guard lk(mu_);
  vmm_maps_[addr] = Alloc{size, device};
  return Status::kSuccess;
}

Status CudaBackend::vmm_unmap(uint64_t addr, uint64_t size) {
  {
    std::lock_guard lk(mu_);  // out of check_device's ranges before the memory goes
    vmm_maps_.erase(vmm_maps_.lower_bound(addr), vmm_maps_.lower_bound(addr + size));
  }
  bind(0);
  return to_status(drv_.mem_unmap(addr, size));
}

Status CudaBackend::vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access) {
  std::vector<CUmemAccessDesc> desc;
  for (uint32_t d = 0; d < device_count(); ++d) {
    if (!(devices >> d & 1)) continue;
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = devices_[d].ordinal;
    a.flags = CUmemAccess_flags(vmm_access_of(access, d));
    desc.push_back(a);
  }
  if (desc.empty()) return Status::kSuccess;
  bind(0);
  return to_status(drv_.mem_set_access(addr, size, desc.data(), desc.size()));
}

}  // namespace ordo::cuda

// The cuda backend's interprocess memory and events: the runtime's IPC calls.
// The handle the driver writes goes into the region's IPC table (never to a
// guest), and the other part's worker, a process of its own on the same host,
// opens it in its own context.
#include <cuda_runtime_api.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "cuda_backend_impl.h"

namespace ordo::cuda {

static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof(IpcBlob) && sizeof(cudaIpcEventHandle_t) <= sizeof(IpcBlob));

Status CudaBackend::ipc_export_mem(uint64_t addr, IpcBlob* out, uint32_t* device) {
  uint32_t d = 0;
  {
    std::lock_guard lk(mu_);
    auto it = allocs_.find(addr);
    if (it == allocs_.end()) return Status::kInvalidValue;
    d = it->second.device;
  }
  bind(d);
  cudaIpcMemHandle_t h{};
  if (cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(uintptr_t(addr))); e != cudaSuccess) {
    cudaGetLastError();
    return to_status(e);
  }
  *out = IpcBlob{};
  std::memcpy(out, &h, sizeof h);
  *device = d;
  return Status::kSuccess;
}

Status CudaBackend::ipc_open_mem(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* addr) {
  if (device >= device_count()) return Status::kInvalidDevice;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, &blob, sizeof h);
  bind(device);
  void* p = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    cudaGetLastError();
    return to_status(e);
  }
  std::lock_guard lk(mu_);
  ipc_opened_[uintptr_t(p)] = Alloc{size, device};
  *addr = uintptr_t(p);
  return Status::kSuccess;
}

Status CudaBackend::ipc_close_mem(uint64_t addr) {
  uint32_t d = 0;
  {
    std::lock_guard lk(mu_);
    auto it = ipc_opened_.find(addr);
    if (it == ipc_opened_.end()) return Status::kInvalidValue;
    d = it->second.device;
    ipc_opened_.erase(it);
  }
  bind(d);
  return to_status(cudaIpcCloseMemHandle(reinterpret_cast<void*>(uintptr_t(addr))));
}

Status CudaBackend::ipc_export_event(uint32_t event, IpcBlob* out) {
  std::lock_guard lk(mu_);
  const EventEntry* ev = find_event(event);
  if (!ev) return Status::kInvalidResourceHandle;
  bind(ev->device);
  cudaIpcEventHandle_t h{};
  if (cudaError_t e = cudaIpcGetEventHandle(&h, ev->handle); e != cudaSuccess) {
    cudaGetLastError();
    return to_status(e);
  }
  *out = IpcBlob{};
  std::memcpy(out, &h, sizeof h);
  return Status::kSuccess;
}

Status CudaBackend::ipc_open_event(uint32_t event, uint32_t device, const IpcBlob& blob) {
  if (event >= kMaxBackendEvents) return Status::kInvalidValue;
  if (device >= device_count()) return Status::kInvalidDevice;
  cudaIpcEventHandle_t h;
  std::memcpy(&h, &blob, sizeof h);
  std::lock_guard lk(mu_);
  if (events_.count(event)) return Status::kInvalidResourceHandle;
  bind(device);
  cudaEvent_t ev = nullptr;
  if (cudaError_t e = cudaIpcOpenEventHandle(&ev, h); e != cudaSuccess) {
    cudaGetLastError();
    return to_status(e);
  }
  events_.emplace(event, EventEntry{ev, device});
  return Status::kSuccess;
}

// Physical memory goes to the other worker process as the driver's POSIX
// descriptor. A descriptor of a device file cannot be reopened through /proc
// (that would open the device afresh), so the importer takes a duplicate of
// the exporter's with pidfd_getfd, which Yama's ptrace_scope 1 (Debian's
// default) allows only to CAP_SYS_PTRACE; ordo does not widen it for the
// workers. Without it the import answers 801 and says why once.
Status CudaBackend::ipc_export_vmm(uint64_t handle, IpcBlob* out) {
  if (!drv_.mem_export) return Status::kNotSupported;
  std::lock_guard lk(mu_);
  int fd = -1;
  if (auto it = vmm_exported_fds_.find(handle); it != vmm_exported_fds_.end()) {
    fd = it->second;
  } else {
    bind(0);
    if (CUresult r = drv_.mem_export(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0); r != CUDA_SUCCESS)
      return to_status(r);
    vmm_exported_fds_[handle] = fd;
  }
  *out = IpcBlob{};
  out->words[0] = uint64_t(::getpid());
  out->words[1] = uint64_t(fd);
  return Status::kSuccess;
}

Status CudaBackend::ipc_import_vmm(const IpcBlob& blob, uint32_t device, uint64_t /*size*/, uint64_t* handle) {
  if (!drv_.mem_import) return Status::kNotSupported;
  if (device >= device_count()) return Status::kInvalidDevice;
  const int pidfd = int(::syscall(SYS_pidfd_open, pid_t(blob.words[0]), 0));
  if (pidfd < 0) return Status::kInvalidResourceHandle;  // the exporting worker is gone
  const int fd = int(::syscall(SYS_pidfd_getfd, pidfd, int(blob.words[1]), 0));
  const int err = errno;
  ::close(pidfd);
  if (fd < 0) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log("cannot take the exporting worker's memory descriptor (pidfd_getfd: %s; Yama's ptrace_scope 0, or "
          "CAP_SYS_PTRACE for ordo-worker, allows it): cuMemImportFromShareableHandle answers not supported",
          std::strerror(err));
    return Status::kNotSupported;
  }
  bind(device);
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = drv_.mem_import(&h, reinterpret_cast<void*>(uintptr_t(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ::close(fd);  // the driver holds the memory now
  if (r != CUDA_SUCCESS) return to_status(r);
  *handle = h;
  return Status::kSuccess;
}

}  // namespace ordo::cuda

// The cuda backend's stream work: kernel launches (through the driver API),
// copies and memsets, each checked before it reaches CUDA.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>

#include "cuda_backend_impl.h"

namespace ordo::cuda {
namespace {

constexpr uint64_t kMaxBlockThreads = 1024;

}  // namespace

Status CudaBackend::launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) {
  if (p.grid.x == 0 || p.grid.y == 0 || p.grid.z == 0 || p.block.x == 0 || p.block.y == 0 || p.block.z == 0 ||
      uint64_t{p.block.x} * p.block.y * p.block.z > kMaxBlockThreads)
    return Status::kInvalidConfiguration;
  if (p.args_size != 0 && p.args == nullptr) return Status::kInvalidValue;
  // The driver call runs outside mu_, so that the worker's dispatch threads
  // launch at once on their own streams; unload_mu_ keeps the function's
  // module loaded until the driver has the launch. The stream is this
  // caller's: its ring's dispatch thread alone launches on it or destroys it.
  std::shared_lock unload(unload_mu_);
  StreamEntry* st;
  CUfunction fn = nullptr;
  size_t size = p.args_size;
  {
    std::lock_guard lk(mu_);
    st = find_stream(stream);
    if (!st) return Status::kInvalidResourceHandle;
    uint32_t slot = 0;
    if (!kernel_slots_.find(p.kernel, &slot) || kernels_[slot].fn.empty()) return Status::kInvalidDeviceFunction;
    Kernel& k = kernels_[slot];
    // The driver reads as many parameter bytes as the kernel declares: a short
    // buffer would make it read past the guest's argument bytes.
    if (k.param_bytes_known) {
      if (p.args_size < k.param_bytes) return Status::kInvalidValue;
      size = k.param_bytes;
    }
    bind(st->device);
    if (Status s = function_on(k, st->device, &fn); !ok(s)) return s;
  }
  // The driver copies the parameters before cuLaunchKernel returns, so the
  // staging bytes may be reused as soon as we are back.
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(p.args), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUresult r = drv_.launch_kernel(fn, p.grid.x, p.grid.y, p.grid.z, p.block.x, p.block.y, p.block.z, p.shared_mem,
                                  reinterpret_cast<CUstream>(st->handle), nullptr, size ? extra : nullptr);
  if (r != CUDA_SUCCESS) return to_status(r);
  std::lock_guard lk(mu_);
  st->last_tag = tag;
  return Status::kSuccess;
}

// Copies and memsets also call the runtime outside mu_ (see launch); the
// worker keeps Free from racing them (it holds its memory lock until we return).
Status CudaBackend::memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size, const OpTag& tag) {
  StreamEntry* st;
  uint32_t dst_dev = 0, src_dev = 0;
  {
    std::lock_guard lk(mu_);
    st = find_stream(stream);
    if (!st) return Status::kInvalidResourceHandle;
    if (size == 0) return Status::kSuccess;
    if (Status s = check_operand(dst, size, &dst_dev); !ok(s)) return s;
    if (Status s = check_operand(src, size, &src_dev); !ok(s)) return s;
    bind(st->device);
  }
  void* to = reinterpret_cast<void*>(uintptr_t(dst.addr));
  const void* from = reinterpret_cast<const void*>(uintptr_t(src.addr));
  cudaError_t e;
  if (dst.device && src.device && dst_dev != src_dev) {
    // Between two devices: the driver goes over the peer link where there is
    // one and through the host otherwise, peer access enabled or not.
    e = cudaMemcpyPeerAsync(to, devices_[dst_dev].ordinal, from, devices_[src_dev].ordinal, size, st->handle);
  } else {
    const cudaMemcpyKind kind = dst.device ? (src.device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                           : (src.device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    e = cudaMemcpyAsync(to, from, size, kind, st->handle);
  }
  if (e != cudaSuccess) return to_status(e);
  std::lock_guard lk(mu_);
  st->last_tag = tag;
  return Status::kSuccess;
}

Status CudaBackend::memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size, const OpTag& tag) {
  StreamEntry* st;
  {
    std::lock_guard lk(mu_);
    st = find_stream(stream);
    if (!st) return Status::kInvalidResourceHandle;
    if (size == 0) return Status::kSuccess;
    if (Status s = check_device(dst, size); !ok(s)) return s;
    bind(st->device);
  }
  cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(uintptr_t(dst)), value, size, st->handle);
  if (e != cudaSuccess) return to_status(e);
  std::lock_guard lk(mu_);
  st->last_tag = tag;
  return Status::kSuccess;
}

}  // namespace ordo::cuda

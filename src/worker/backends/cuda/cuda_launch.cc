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

// What a launch needs of its function that the guest's cuFuncSetAttribute
// granted there (libcuda.so.1 checked the launch against it): more than 48 KiB
// of dynamic shared memory, a cluster past the portable 8 blocks. The launch
// carries it, so the driver's function is raised to it here, in launch order,
// and never lowered under a launch issued before.
Status CudaBackend::launch_needs(Kernel& k, uint32_t device, CUfunction fn, const LaunchParams& p) {
  if (p.shared_mem > 48 * 1024 && p.shared_mem > k.smem_allowed[device]) {
    CUresult r = drv_.func_set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(p.shared_mem));
    if (r != CUDA_SUCCESS) return to_status(r);
    k.smem_allowed[device] = p.shared_mem;
  }
  if (p.shape.blocks_per_cluster() > kMaxPortableClusterBlocks && !k.wide_clusters[device]) {
    CUresult r = drv_.func_set_attribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
    if (r != CUDA_SUCCESS) return to_status(r);
    k.wide_clusters[device] = 1;
  }
  return Status::kSuccess;
}

Status CudaBackend::kernel_for_launch(uint32_t device, const LaunchParams& p, CUfunction* fn, size_t* size) {
  uint32_t slot = 0;
  if (!kernel_slots_.find(p.kernel, &slot) || kernels_[slot].fn.empty()) return Status::kInvalidDeviceFunction;
  Kernel& k = kernels_[slot];
  // The driver reads as many parameter bytes as the kernel declares: a short
  // buffer would make it read past the guest's argument bytes.
  *size = p.args_size;
  if (k.param_bytes_known) {
    if (p.args_size < k.param_bytes) return Status::kInvalidValue;
    *size = k.param_bytes;
  }
  if (Status s = function_on(k, device, fn); !ok(s)) return s;
  // Under mu_: what Kernel records the driver has, so a launch that finds it raised finds the driver raised.
  return launch_needs(k, device, *fn, p);
}

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
    bind(st->device);
    if (Status s = kernel_for_launch(st->device, p, &fn, &size); !ok(s)) return s;
  }
  // The driver copies the parameters before cuLaunchKernel returns, so the
  // staging bytes may be reused as soon as we are back.
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(p.args), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUresult r;
  if (p.shape.plain()) {
    r = drv_.launch_kernel(fn, p.grid.x, p.grid.y, p.grid.z, p.block.x, p.block.y, p.block.z, p.shared_mem,
                           reinterpret_cast<CUstream>(st->handle), nullptr, size ? extra : nullptr);
  } else {
    // The driver checks the cluster against the kernel and the cooperative
    // grid against its occupancy (the guest's check is an estimate).
    // Only what differs from a plain launch: devices before Hopper refuse any cluster attribute.
    CUlaunchAttribute attrs[2] = {};
    unsigned n = 0;
    if (p.shape.blocks_per_cluster() > 1) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim.x = p.shape.cluster.x;
      attrs[n].value.clusterDim.y = p.shape.cluster.y;
      attrs[n++].value.clusterDim.z = p.shape.cluster.z;
    }
    if (p.shape.cooperative) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[n++].value.cooperative = 1;
    }
    CUlaunchConfig config{};
    config.gridDimX = p.grid.x, config.gridDimY = p.grid.y, config.gridDimZ = p.grid.z;
    config.blockDimX = p.block.x, config.blockDimY = p.block.y, config.blockDimZ = p.block.z;
    config.sharedMemBytes = p.shared_mem;
    config.hStream = reinterpret_cast<CUstream>(st->handle);
    config.attrs = attrs;
    config.numAttrs = n;
    r = drv_.launch_kernel_ex(&config, fn, nullptr, size ? extra : nullptr);
  }
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

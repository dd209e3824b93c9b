// The cuda backend's devices: their primary contexts (init), what they report
// (device info and attributes), and peer access between them.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "cuda_backend_impl.h"

namespace ordo::cuda {

bool CudaBackend::init(std::string* error) {
  auto fail = [&](const std::string& what, cudaError_t e) {
    if (error)
      *error = what + " failed: " + cudaGetErrorName(e) + " (" + std::to_string(int(e)) + ", " +
               cudaGetErrorString(e) + "); check the driver with nvidia-smi, or use --backend sim";
    return false;
  };
  for (Device& d : devices_) {
    const std::string which = " (device " + std::to_string(d.ordinal) + ")";
    tls_context() = nullptr;  // cudaSetDevice changes the current context behind bind()'s cache
    if (cudaError_t e = cudaSetDevice(d.ordinal); e != cudaSuccess) return fail("cudaSetDevice" + which, e);
    if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) return fail("creating the CUDA context" + which, e);
    if (!drv_.ctx_get_current && !drv_.load(error)) return false;
    if (CUresult r = drv_.ctx_get_current(&d.ctx); r != CUDA_SUCCESS || !d.ctx) {
      d.ctx = nullptr;
      if (error)
        *error = "no current CUDA context after initializing device " + std::to_string(d.ordinal) + " (CUresult " +
                 std::to_string(int(r)) + ")";
      return false;
    }
    tls_context() = d.ctx;
    if (!fill_info(d, error)) return false;
  }
  for (uint32_t i = 0; i < device_count(); ++i) {
    devices_[i].completions = std::make_unique<Completions>([this, i] { bind(i); });
    streams_[i] = {cudaStreamLegacy, i, OpTag{}};  // guest stream d is device d's legacy default stream
  }
  // The simulator's kernels, for programs that launch them by name (module 0).
  if (Status st = add_module(0, builtin_image()); !ok(st)) {
    log("could not load the built-in kernels (status %s): only guest modules can be launched",
        std::to_string(int(st)).c_str());
  }
  return true;
}

bool CudaBackend::fill_info(Device& dev, std::string* error) {
  const int ordinal = dev.ordinal;
  cudaDeviceProp p{};
  if (cudaError_t e = cudaGetDeviceProperties(&p, ordinal); e != cudaSuccess) {
    if (error)
      *error = "cudaGetDeviceProperties (device " + std::to_string(ordinal) + ") failed: " + cudaGetErrorName(e);
    return false;
  }
  // Every attribute as the driver reports it (cudaDeviceAttr numbers are CUdevice_attribute's);
  // numbers this driver does not know stay 0.
  for (uint32_t a = 1; a < kDeviceAttributeCount; ++a)
    if (cudaDeviceGetAttribute(&dev.attrs[a], cudaDeviceAttr(a), ordinal) != cudaSuccess) dev.attrs[a] = 0;
  cudaGetLastError();
  DeviceInfo& d = dev.info;
  d = DeviceInfo{};
  std::memcpy(d.name, p.name, std::min(sizeof d.name, sizeof p.name));
  d.name[sizeof d.name - 1] = 0;
  static_assert(sizeof d.uuid == sizeof p.uuid.bytes);
  std::memcpy(d.uuid, p.uuid.bytes, sizeof d.uuid);
  d.total_global_mem = p.totalGlobalMem;
  d.shared_mem_per_block = p.sharedMemPerBlock;
  d.shared_mem_per_block_optin = p.sharedMemPerBlockOptin;
  d.shared_mem_per_multiprocessor = p.sharedMemPerMultiprocessor;
  d.total_const_mem = p.totalConstMem;
  d.texture_alignment = p.textureAlignment;
  d.mem_pitch = p.memPitch;
  d.major = p.major;
  d.minor = p.minor;
  d.multi_processor_count = p.multiProcessorCount;
  d.warp_size = p.warpSize;
  d.max_threads_per_block = p.maxThreadsPerBlock;
  for (int i = 0; i < 3; ++i) {
    d.max_threads_dim[i] = p.maxThreadsDim[i];
    d.max_grid_size[i] = p.maxGridSize[i];
  }
  d.regs_per_block = p.regsPerBlock;
  d.regs_per_multiprocessor = p.regsPerMultiprocessor;
  d.memory_bus_width = p.memoryBusWidth;
  d.l2_cache_size = p.l2CacheSize;
  d.persisting_l2_cache_max_size = p.persistingL2CacheMaxSize;
  d.max_threads_per_multiprocessor = p.maxThreadsPerMultiProcessor;
  d.max_blocks_per_multiprocessor = p.maxBlocksPerMultiProcessor;
  d.concurrent_kernels = p.concurrentKernels;
  d.async_engine_count = p.asyncEngineCount;
  d.unified_addressing = p.unifiedAddressing;
  d.managed_memory = p.managedMemory;
  d.concurrent_managed_access = p.concurrentManagedAccess;
  d.pci_bus_id = p.pciBusID;
  d.pci_device_id = p.pciDeviceID;
  d.pci_domain_id = p.pciDomainID;
  d.integrated = p.integrated;
  d.can_map_host_memory = p.canMapHostMemory;
  d.ecc_enabled = p.ECCEnabled;
  d.tcc_driver = p.tccDriver;
  d.cooperative_launch = p.cooperativeLaunch;
  d.stream_priorities_supported = p.streamPrioritiesSupported;
  d.global_l1_cache_supported = p.globalL1CacheSupported;
  d.local_l1_cache_supported = p.localL1CacheSupported;
  d.pageable_memory_access = p.pageableMemoryAccess;
  d.host_native_atomic_supported = p.hostNativeAtomicSupported;
  // CUDA 13 dropped these from cudaDeviceProp; the attributes remain.
  auto attr = [&](cudaDeviceAttr a) {
    int v = 0;
    cudaDeviceGetAttribute(&v, a, ordinal);
    return int32_t(v);
  };
  d.clock_rate_khz = attr(cudaDevAttrClockRate);
  d.memory_clock_rate_khz = attr(cudaDevAttrMemoryClockRate);
  d.compute_mode = attr(cudaDevAttrComputeMode);
  d.kernel_exec_timeout_enabled = attr(cudaDevAttrKernelExecTimeout);
  return true;
}

Status CudaBackend::device_info(uint32_t device, DeviceInfo* out) {
  if (!out) return Status::kInvalidValue;
  if (device >= device_count()) return Status::kInvalidDevice;
  *out = devices_[device].info;
  return Status::kSuccess;
}

Status CudaBackend::device_attributes(uint32_t device, uint32_t first, int32_t* out) {
  if (first % kDeviceAttributesPerCall || first >= kDeviceAttributeCount) return Status::kInvalidValue;
  if (device >= device_count()) return Status::kInvalidDevice;
  std::memcpy(out, devices_[device].attrs + first, kDeviceAttributesPerCall * sizeof(int32_t));
  return Status::kSuccess;
}

bool CudaBackend::can_access_peer(uint32_t device, uint32_t peer) {
  if (device >= device_count() || peer >= device_count() || device == peer) return false;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, devices_[device].ordinal, devices_[peer].ordinal) != cudaSuccess) {
    cudaGetLastError();  // not sticky
    return false;
  }
  return can != 0;
}

Status CudaBackend::set_peer_access(uint32_t device, uint32_t peer, bool enable) {
  if (device >= device_count() || peer >= device_count() || device == peer) return Status::kInvalidDevice;
  bind(device);  // CUDA enables access from the current device
  const int to = devices_[peer].ordinal;
  const cudaError_t e = enable ? cudaDeviceEnablePeerAccess(to, 0) : cudaDeviceDisablePeerAccess(to);
  if (e != cudaSuccess) cudaGetLastError();  // already enabled, not enabled, unsupported: none is sticky
  return to_status(e);
}

}  // namespace ordo::cuda

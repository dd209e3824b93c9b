// Backend::device_attributes for backends without a driver to ask: the
// attributes DeviceInfo carries, by CUdevice_attribute number. Apart from
// backend.cc (make_backend) so that builds of the engine alone (the fuzzer)
// link it.
#include <algorithm>
#include <cstring>

#include "backend.h"
#include "ordo/layout.h"

namespace ordo {

namespace {

// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: shown as the device
// has it where the backend serves cuMemCreate and cuMemMap (supports_vmm).
constexpr uint32_t kVmmAttribute = 102;
// CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: likewise where it serves cuIpc* (supports_ipc).
constexpr uint32_t kIpcEventAttribute = 125;

// By CUdevice_attribute number (cuda.h; the numbering is ABI).
constexpr WithheldAttribute kWithheld[] = {
    {83, "managed memory (cuMemAllocManaged)"},
    {88, "pageable memory access from kernels"},
    {89, "concurrent managed access"},
    {91, "registered host memory at the host pointer (CU_MEMHOSTREGISTER_DEVICEMAP)"},
    {92, "stream memory operations (cuStreamWaitValue32, cuStreamBatchMemOp)"},
    {93, "64-bit stream memory operations"},
    {94, "CU_STREAM_WAIT_VALUE_NOR"},
    {96, "cuLaunchCooperativeKernelMultiDevice"},
    {98, "CU_STREAM_WAIT_VALUE_FLUSH"},
    {100, "pageable memory through the host's page tables"},
    {101, "host access to managed memory"},
    {103, "POSIX file descriptor memory handles"},
    {104, "Win32 memory handles"},
    {105, "Win32 KMT memory handles"},
    {107, "compressible memory (cuMemCreate)"},
    {110, "GPUDirect RDMA with virtual memory management"},
    {112, "sparse CUDA arrays"},
    {114, "external timeline semaphores"},
    {116, "GPUDirect RDMA"},
    {117, "GPUDirect RDMA write flushing"},
    {118, "GPUDirect RDMA write ordering"},
    {119, "memory pool IPC handles (cuMemPoolExportToShareableHandle)"},
    {121, "deferred-mapping CUDA arrays"},
    {122, "64-bit stream memory operations"},
    {123, "CU_STREAM_WAIT_VALUE_NOR"},
    {124, "dma_buf memory handles (cuMemGetHandleForAddressRange)"},
    {128, "fabric memory handles"},
    {132, "multicast objects (cuMulticastCreate)"},
    {135, "D3D12 CIG"},
    {136, "memory decompression (cuMemBatchDecompressAsync)"},
    {137, "memory decompression (cuMemBatchDecompressAsync)"},
    {138, "Vulkan CIG"},
    {141, "host NUMA virtual memory management"},
    {142, "host NUMA memory pools"},
    {143, "host NUMA IPC"},
    {144, "host memory pools (CU_MEM_LOCATION_TYPE_HOST)"},
    {145, "host virtual memory management"},
    {146, "dma_buf of page-locked host memory"},
};

}  // namespace

std::span<const WithheldAttribute> withheld_attributes() { return kWithheld; }

Status Backend::guest_attributes(uint32_t device, uint32_t first, int32_t* out) {
  if (Status s = device_attributes(device, first, out); !ok(s)) return s;
  for (const WithheldAttribute& w : kWithheld)
    if (w.attr >= first && w.attr < first + kDeviceAttributesPerCall) out[w.attr - first] = 0;
  if (!supports_vmm() && kVmmAttribute >= first && kVmmAttribute < first + kDeviceAttributesPerCall)
    out[kVmmAttribute - first] = 0;
  if (!supports_ipc() && kIpcEventAttribute >= first && kIpcEventAttribute < first + kDeviceAttributesPerCall)
    out[kIpcEventAttribute - first] = 0;
  return Status::kSuccess;
}

// CUdevice_attribute numbers (cuda.h; the numbering is ABI and never changes) of
// what DeviceInfo carries. Backends that talk to a real driver override this.
Status Backend::device_attributes(uint32_t device, uint32_t first, int32_t* out) {
  if (first % kDeviceAttributesPerCall || first >= kDeviceAttributeCount) return Status::kInvalidValue;
  DeviceInfo d{};
  if (Status s = device_info(device, &d); !ok(s)) return s;
  int32_t a[kDeviceAttributeCount] = {};
  auto clamp = [](uint64_t v) { return int32_t(std::min<uint64_t>(v, INT32_MAX)); };
  a[1] = d.max_threads_per_block;                          // MAX_THREADS_PER_BLOCK
  for (int i = 0; i < 3; ++i) a[2 + i] = d.max_threads_dim[i];  // MAX_BLOCK_DIM_X..Z
  for (int i = 0; i < 3; ++i) a[5 + i] = d.max_grid_size[i];    // MAX_GRID_DIM_X..Z
  a[8] = clamp(d.shared_mem_per_block);                    // MAX_SHARED_MEMORY_PER_BLOCK
  a[9] = clamp(d.total_const_mem);                         // TOTAL_CONSTANT_MEMORY
  a[10] = d.warp_size;                                     // WARP_SIZE
  a[11] = clamp(d.mem_pitch);                              // MAX_PITCH
  a[12] = d.regs_per_block;                                // MAX_REGISTERS_PER_BLOCK
  a[13] = d.clock_rate_khz;                                // CLOCK_RATE
  a[14] = clamp(d.texture_alignment);                      // TEXTURE_ALIGNMENT
  a[15] = d.async_engine_count > 0;                        // GPU_OVERLAP
  a[16] = d.multi_processor_count;                         // MULTIPROCESSOR_COUNT
  a[17] = d.kernel_exec_timeout_enabled;                   // KERNEL_EXEC_TIMEOUT
  a[18] = d.integrated;                                    // INTEGRATED
  a[19] = d.can_map_host_memory;                           // CAN_MAP_HOST_MEMORY
  a[20] = d.compute_mode;                                  // COMPUTE_MODE
  a[30] = 512;                                             // SURFACE_ALIGNMENT
  a[31] = d.concurrent_kernels;                            // CONCURRENT_KERNELS
  a[32] = d.ecc_enabled;                                   // ECC_ENABLED
  a[33] = d.pci_bus_id;                                    // PCI_BUS_ID
  a[34] = d.pci_device_id;                                 // PCI_DEVICE_ID
  a[35] = d.tcc_driver;                                    // TCC_DRIVER
  a[36] = d.memory_clock_rate_khz;                         // MEMORY_CLOCK_RATE
  a[37] = d.memory_bus_width;                              // GLOBAL_MEMORY_BUS_WIDTH
  a[38] = d.l2_cache_size;                                 // L2_CACHE_SIZE
  a[39] = d.max_threads_per_multiprocessor;                // MAX_THREADS_PER_MULTIPROCESSOR
  a[40] = d.async_engine_count;                            // ASYNC_ENGINE_COUNT
  a[41] = d.unified_addressing;                            // UNIFIED_ADDRESSING
  a[50] = d.pci_domain_id;                                 // PCI_DOMAIN_ID
  a[51] = 32;                                              // TEXTURE_PITCH_ALIGNMENT
  a[75] = d.major;                                         // COMPUTE_CAPABILITY_MAJOR
  a[76] = d.minor;                                         // COMPUTE_CAPABILITY_MINOR
  a[78] = d.stream_priorities_supported;                   // STREAM_PRIORITIES_SUPPORTED
  a[79] = d.global_l1_cache_supported;                     // GLOBAL_L1_CACHE_SUPPORTED
  a[80] = d.local_l1_cache_supported;                      // LOCAL_L1_CACHE_SUPPORTED
  a[81] = clamp(d.shared_mem_per_multiprocessor);          // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
  a[82] = d.regs_per_multiprocessor;                       // MAX_REGISTERS_PER_MULTIPROCESSOR
  a[83] = d.managed_memory;                                // MANAGED_MEMORY
  a[86] = d.host_native_atomic_supported;                  // HOST_NATIVE_ATOMIC_SUPPORTED
  a[87] = 2;                                               // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
  a[88] = d.pageable_memory_access;                        // PAGEABLE_MEMORY_ACCESS
  a[89] = d.concurrent_managed_access;                     // CONCURRENT_MANAGED_ACCESS
  a[90] = 1;                                               // COMPUTE_PREEMPTION_SUPPORTED
  a[95] = d.cooperative_launch;                            // COOPERATIVE_LAUNCH
  a[97] = clamp(d.shared_mem_per_block_optin);             // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
  a[102] = 1;                                              // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (guest_attributes: if supports_vmm)
  a[106] = d.max_blocks_per_multiprocessor;                // MAX_BLOCKS_PER_MULTIPROCESSOR
  a[108] = d.persisting_l2_cache_max_size;                 // MAX_PERSISTING_L2_CACHE_SIZE
  a[111] = 1024;                                           // RESERVED_SHARED_MEMORY_PER_BLOCK
  a[125] = 1;                                              // IPC_EVENT_SUPPORTED (guest_attributes: if supports_ipc)
  std::memcpy(out, a + first, kDeviceAttributesPerCall * sizeof(int32_t));
  return Status::kSuccess;
}

}  // namespace ordo

// Wire structs of the protocol that are not part of the region layout itself:
// a launch's grid and block (Dim3), and the device description (DeviceInfo) the
// worker sends the guest in a reply slot. The guest (client.h) and the worker's
// backends (src/worker/backend.h) are both built from these definitions.
#pragma once

#include <cstdint>
#include <type_traits>

namespace ordo {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

// The device a backend drives, as cudaGetDeviceProperties and
// cudaDeviceGetAttribute report it. Trivially copyable, fixed-width fields: the
// worker sends it to the guest as is in a reply slot's payload.
struct DeviceInfo {
  char name[256];  // NUL-terminated
  uint8_t uuid[16];
  uint64_t total_global_mem;
  uint64_t shared_mem_per_block;
  uint64_t shared_mem_per_block_optin;
  uint64_t shared_mem_per_multiprocessor;
  uint64_t total_const_mem;
  uint64_t texture_alignment;
  uint64_t mem_pitch;
  int32_t major, minor;
  int32_t multi_processor_count;
  int32_t warp_size;
  int32_t max_threads_per_block;
  int32_t max_threads_dim[3];
  int32_t max_grid_size[3];
  int32_t regs_per_block;
  int32_t regs_per_multiprocessor;
  int32_t clock_rate_khz;
  int32_t memory_clock_rate_khz;
  int32_t memory_bus_width;
  int32_t l2_cache_size;
  int32_t persisting_l2_cache_max_size;
  int32_t max_threads_per_multiprocessor;
  int32_t max_blocks_per_multiprocessor;
  int32_t compute_mode;
  int32_t concurrent_kernels;
  int32_t async_engine_count;
  int32_t unified_addressing;
  int32_t managed_memory;
  int32_t concurrent_managed_access;
  int32_t pci_bus_id, pci_device_id, pci_domain_id;
  int32_t integrated;
  int32_t can_map_host_memory;
  int32_t ecc_enabled;
  int32_t tcc_driver;
  int32_t cooperative_launch;
  int32_t stream_priorities_supported;
  int32_t global_l1_cache_supported;
  int32_t local_l1_cache_supported;
  int32_t pageable_memory_access;
  int32_t host_native_atomic_supported;
  int32_t kernel_exec_timeout_enabled;
};
static_assert(std::is_trivially_copyable_v<DeviceInfo>);
static_assert(sizeof(DeviceInfo) <= 512, "DeviceInfo must fit a reply slot's payload (kSlotPayload)");

}  // namespace ordo

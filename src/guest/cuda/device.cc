// Devices: every device of the session, ordinals 0 to the worker's count - 1,
// each described once (DeviceCache) and then answered locally.
#include "state.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "dark_api.h"
#include "driver.h"

namespace ordo::driver {

std::atomic<int> g_device_count{0};  // set by cuInit

namespace {
DeviceCache g_devices[ordo::kMaxDevices];  // device d's is g_devices[d]
}  // namespace

CUresult device_cache(CUdevice dev, const DeviceCache** out) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  DeviceCache& d = g_devices[dev];
  std::call_once(d.once, [c, dev, &d] {
    Status s = c->device_info(uint32_t(dev), &d.info);
    for (int first = 0; ok(s) && first < kAttrCount; first += int(ordo::kDeviceAttributesPerCall))
      s = c->device_attributes(uint32_t(dev), uint32_t(first), d.attrs + first);
    d.error = to_cu(s);
  });
  *out = &d;
  return d.error;
}

// ================================================================ for dark_api.cc

static_assert(kMaxHashDevices >= int(ordo::kMaxDevices));

int device_hash_info(DeviceHashInfo* out, int max) {
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(0, &d); e != CUDA_SUCCESS) return -int(e);  // not initialized, worker gone
  const int n = std::min(g_device_count.load(), max);
  for (int i = 0; i < n; ++i) {
    if (CUresult e = device_cache(i, &d); e != CUDA_SUCCESS) return -int(e);
    std::memcpy(out[i].uuid, d->info.uuid, 16);
    out[i].pci_domain = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID];
    out[i].pci_bus = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID];
    out[i].pci_device = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID];
  }
  return std::max(n, 0);
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  *count = g_device_count.load(std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::snprintf(name, size_t(len), "%.*s", int(sizeof d->info.name), d->info.name);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  *bytes = d->info.total_global_mem;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice dev) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  if (int(attr) <= 0 || int(attr) >= CU_DEVICE_ATTRIBUTE_MAX || int(attr) >= kAttrCount)
    return CUDA_ERROR_INVALID_VALUE;
  *value = d->attrs[attr];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::memcpy(uuid->bytes, d->info.uuid, 16);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  *major = d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
  *minor = d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char* id, int len, CUdevice dev) {
  if (!id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::snprintf(id, size_t(len), "%08x:%02x:%02x.0", unsigned(d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]),
                unsigned(d->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]),
                unsigned(d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* id) {
  if (!dev || !id) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  unsigned dom = 0, bus = 0, d = 0;
  if (std::sscanf(id, "%x:%x:%x", &dom, &bus, &d) != 3 && (dom = 0, std::sscanf(id, "%x:%x", &bus, &d) != 2))
    return CUDA_ERROR_INVALID_VALUE;
  for (CUdevice i = 0; i < g_device_count.load(std::memory_order_relaxed); ++i) {
    const DeviceCache* info = nullptr;
    if (CUresult e = device_cache(i, &info); e != CUDA_SUCCESS) return e;
    if (dom == unsigned(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]) &&
        bus == unsigned(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]) &&
        d == unsigned(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID])) {
      *dev = i;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
  if (dev == peer) {
    *can = 0;  // as CUDA: a device is not its own peer
    return CUDA_SUCCESS;
  }
  return to_cu(c->can_access_peer(can, uint32_t(dev), uint32_t(peer)));
}

CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attr, CUdevice src, CUdevice dst) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!valid_device(src) || !valid_device(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
    case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: *value = 0; return CUDA_SUCCESS;
    // A peer the device can reach at all it reaches fully: atomics and arrays included.
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
      return to_cu(c->can_access_peer(value, uint32_t(src), uint32_t(dst)));
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // extern "C"

// ordo's libnvidia-ml.so.1: per-device queries, each answered by the CUDA
// driver API of ordo's libcuda.so.1 for the device of the same ordinal.
// Interconnect queries answer "none" the way NVML does on a PCIe-only GPU:
// a worker's devices have no NVLink, fabric or platform information to give.
#include <strings.h>

#include <cstdio>
#include <cstring>

#include "state.h"

using namespace ordo_nvml;

namespace {

nvmlReturn_t attr(int* v, CUdevice_attribute a, CUdevice d) { return from_cu(cuDeviceGetAttribute(v, a, d)); }

// NVML's form of a UUID: GPU-8-4-4-4-12 hex digits.
nvmlReturn_t uuid_string(CUdevice d, char* out, size_t len) {
  CUuuid u;
  if (nvmlReturn_t r = from_cu(cuDeviceGetUuid(&u, d)); r != NVML_SUCCESS) return r;
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  const int n = std::snprintf(out, len,
                              "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                              b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return n < 0 || size_t(n) >= len ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

// NVML's bus id is upper-case, with an 8-digit domain (the legacy field: 4).
nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t* pci, bool with_bus_id) {
  if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
  ORDINAL(device, d);
  int dom = 0, bus = 0, dev = 0;
  if (nvmlReturn_t r = attr(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d); r != NVML_SUCCESS) return r;
  if (nvmlReturn_t r = attr(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d); r != NVML_SUCCESS) return r;
  if (nvmlReturn_t r = attr(&dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d); r != NVML_SUCCESS) return r;
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", unsigned(dom), unsigned(bus),
                unsigned(dev));
  pci->domain = unsigned(dom);
  pci->bus = unsigned(bus);
  pci->device = unsigned(dev);
  pci->pciDeviceId = 0x10de;  // NVIDIA's vendor id; the worker does not say which device id
  pci->pciSubSystemId = 0;
  // The unversioned call's struct ends in 16 reserved bytes here.
  if (with_bus_id)
    std::snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", unsigned(dom), unsigned(bus), unsigned(dev));
  else
    std::memset(pci->busId, 0, 16);
  return NVML_SUCCESS;
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  return device_count(count);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!device) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned n = 0;
  if (nvmlReturn_t r = nvmlDeviceGetCount_v2(&n); r != NVML_SUCCESS) return r;
  if (index >= n) return NVML_ERROR_INVALID_ARGUMENT;
  *device = handle_of(CUdevice(index));
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

// Any of NVML's spellings (domain or not, either case): the driver parses it.
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvmlDevice_t* device) {
  if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  CUdevice d = 0;
  const CUresult e = cuDeviceGetByPCIBusId(&d, bus_id);
  if (e == CUDA_ERROR_INVALID_DEVICE) return NVML_ERROR_NOT_FOUND;
  if (nvmlReturn_t r = from_cu(e); r != NVML_SUCCESS) return r;
  if (d >= kMaxDevices) return NVML_ERROR_NOT_FOUND;
  *device = handle_of(d);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* bus_id, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned n = 0;
  if (nvmlReturn_t r = nvmlDeviceGetCount_v2(&n); r != NVML_SUCCESS) return r;
  for (unsigned i = 0; i < n; ++i) {
    char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (nvmlReturn_t r = uuid_string(CUdevice(i), s, sizeof s); r != NVML_SUCCESS) return r;
    if (strcasecmp(s, uuid) == 0) {
      *device = handle_of(CUdevice(i));
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  if (!index) return NVML_ERROR_INVALID_ARGUMENT;
  ORDINAL(device, d);
  *index = unsigned(d);
  return NVML_SUCCESS;
}

// No /dev/nvidiaN in the guest: the ordinal stands in for the minor number.
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minor) {
  return nvmlDeviceGetIndex(device, minor);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  if (!name || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
  ORDINAL(device, d);
  char full[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
  if (nvmlReturn_t r = from_cu(cuDeviceGetName(full, sizeof full, d)); r != NVML_SUCCESS) return r;
  if (std::strlen(full) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::strcpy(name, full);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
  ORDINAL(device, d);
  return uuid_string(d, uuid, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t* pci) { return pci_info(device, pci, false); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t* pci) { return pci_info(device, pci, true); }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) { return pci_info(device, pci, true); }

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major, int* minor) {
  if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
  ORDINAL(device, d);
  if (nvmlReturn_t r = attr(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d); r != NVML_SUCCESS) return r;
  return attr(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
}

}  // extern "C"

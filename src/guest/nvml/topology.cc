// ordo's libnvidia-ml.so.1: how devices connect. Peer access is the driver's
// (cuDeviceCanAccessPeer: the worker's answer). There is no NVLink, fabric,
// NVSwitch or platform information: these answer as NVML does on a PCIe GPU
// without them (NOT_SUPPORTED, or success with "not supported" inside), so
// they are real answers and say nothing on stderr, unlike unimplemented calls.
#include <unistd.h>

#include <cstring>

#include "state.h"

using namespace ordo_nvml;

extern "C" {

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuP2PCapsIndex_t index,
                                    nvmlGpuP2PStatus_t* status) {
  if (!status || int(index) < 0 || index >= NVML_P2P_CAPS_INDEX_UNKNOWN) return NVML_ERROR_INVALID_ARGUMENT;
  ORDINAL(device1, a);
  ORDINAL(device2, b);
  if (index == NVML_P2P_CAPS_INDEX_NVLINK) {
    *status = NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_SUCCESS;
  }
  int can = 0;
  if (nvmlReturn_t r = from_cu(cuDeviceCanAccessPeer(&can, a, b)); r != NVML_SUCCESS) return r;
  *status = can ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int, nvmlEnableState_t* active) {
  if (!active) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int, nvmlNvLinkCapability_t,
                                           unsigned int* result) {
  if (!result) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int, unsigned int* version) {
  if (!version) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int, nvmlPciInfo_t* pci) {
  if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t* pci) {
  return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int, int* type) {
  if (!type) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  return NVML_ERROR_NOT_SUPPORTED;
}

// The call succeeds; each field says it is not supported (NVML's per-field
// status), as for fields a GPU lacks.
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t* values) {
  if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  for (int i = 0; i < count; ++i) {
    values[i].timestamp = 0;
    values[i].latencyUsec = 0;
    values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
  }
  return NVML_SUCCESS;
}

// Not part of a multi-node NVLink fabric: success, state "not supported".
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t* info) {
  if (!info) return NVML_ERROR_INVALID_ARGUMENT;
  if (info->version != nvmlGpuFabricInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  CHECK_DEVICE(device);
  std::memset(info, 0, sizeof *info);
  info->version = nvmlGpuFabricInfo_v2;
  info->status = NVML_ERROR_NOT_SUPPORTED;
  info->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPlatformInfo(nvmlDevice_t device, void* info) {
  if (!info) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  return NVML_ERROR_NOT_SUPPORTED;
}

// The guest's CPUs have no fixed relation to the host GPU's: every CPU is
// "near" it, so callers that bind threads to the device keep them anywhere.
nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int words, unsigned long* set) {
  if (!set || words == 0) return NVML_ERROR_INVALID_ARGUMENT;
  CHECK_DEVICE(device);
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  constexpr unsigned kBits = 8 * sizeof(unsigned long);
  for (unsigned w = 0; w < words; ++w) {
    const long first = long(w) * kBits;
    const long n = cpus - first;
    set[w] = n <= 0 ? 0 : n >= long(kBits) ? ~0UL : (1UL << n) - 1;
  }
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int words, unsigned long* set,
                                                 unsigned int) {
  return nvmlDeviceGetCpuAffinity(device, words, set);
}

}  // extern "C"

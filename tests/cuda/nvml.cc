// ordo's libnvidia-ml.so.1 against ordo's libcuda.so.1, both loaded by name
// through LD_LIBRARY_PATH as NCCL and PyTorch load them: every NVML answer
// about a device must be the driver API's answer for the same ordinal.
//
//   nvml DEVICES   (the worker's --sim-devices; run.sh starts it)
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "nvml_abi.h"

namespace {

int g_failures = 0;

#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
      ++g_failures;                                                         \
    }                                                                       \
  } while (0)

void* g_nvml = nullptr;
void* g_cuda = nullptr;

template <typename F>
F sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    std::printf("FAIL: %s is not exported\n", name);
    std::exit(1);
  }
  return reinterpret_cast<F>(p);
}
#define NVML(name) sym<decltype(&name)>(g_nvml, #name)
#define CU(name) sym<decltype(&name)>(g_cuda, #name)

std::string uuid_of(CUdevice d) {
  CUuuid u;
  EXPECT(CU(cuDeviceGetUuid)(&u, d) == CUDA_SUCCESS);
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char s[64];
  std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

// Handles by index, by PCI bus id (NVML's, the driver's and NCCL's spelling)
// and by UUID name the same device.
void check_device(unsigned i, nvmlDevice_t h) {
  unsigned index = 99;
  EXPECT(NVML(nvmlDeviceGetIndex)(h, &index) == NVML_SUCCESS && index == i);
  nvmlPciInfo_t pci;
  EXPECT(NVML(nvmlDeviceGetPciInfo_v3)(h, &pci) == NVML_SUCCESS);
  char cu_bus[32], nccl_bus[32];
  EXPECT(CU(cuDeviceGetPCIBusId)(cu_bus, sizeof cu_bus, CUdevice(i)) == CUDA_SUCCESS);
  std::snprintf(nccl_bus, sizeof nccl_bus, "%04x:%02x:%02x.0", pci.domain, pci.bus, pci.device);
  for (const char* bus : {static_cast<const char*>(pci.busId), static_cast<const char*>(cu_bus),
                          static_cast<const char*>(nccl_bus)}) {
    nvmlDevice_t by_bus = nullptr;
    EXPECT(NVML(nvmlDeviceGetHandleByPciBusId_v2)(bus, &by_bus) == NVML_SUCCESS && by_bus == h);
  }
  char uuid[96];
  EXPECT(NVML(nvmlDeviceGetUUID)(h, uuid, sizeof uuid) == NVML_SUCCESS && uuid_of(CUdevice(i)) == uuid);
  nvmlDevice_t by_uuid = nullptr;
  EXPECT(NVML(nvmlDeviceGetHandleByUUID)(uuid, &by_uuid) == NVML_SUCCESS && by_uuid == h);
  char name[96], cu_name[96];
  EXPECT(NVML(nvmlDeviceGetName)(h, name, sizeof name) == NVML_SUCCESS);
  EXPECT(CU(cuDeviceGetName)(cu_name, sizeof cu_name, CUdevice(i)) == CUDA_SUCCESS && std::strcmp(name, cu_name) == 0);
  int major = 0, minor = 0, cu_major = 0, cu_minor = 0;
  EXPECT(NVML(nvmlDeviceGetCudaComputeCapability)(h, &major, &minor) == NVML_SUCCESS);
  CU(cuDeviceGetAttribute)(&cu_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CUdevice(i));
  CU(cuDeviceGetAttribute)(&cu_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CUdevice(i));
  EXPECT(major == cu_major && minor == cu_minor && major > 0);
  nvmlMemory_t mem;
  size_t total = 0;
  EXPECT(NVML(nvmlDeviceGetMemoryInfo)(h, &mem) == NVML_SUCCESS);
  EXPECT(CU(cuDeviceTotalMem_v2)(&total, CUdevice(i)) == CUDA_SUCCESS && mem.total == total);
  EXPECT(mem.free + mem.used == mem.total);
}

// Peer status is the driver's; interconnects answer "none"; what ordo does
// not implement answers NOT_SUPPORTED.
void check_links(unsigned n, const nvmlDevice_t* h) {
  for (unsigned a = 0; a < n; ++a)
    for (unsigned b = 0; b < n; ++b) {
      int can = -1;
      EXPECT(CU(cuDeviceCanAccessPeer)(&can, CUdevice(a), CUdevice(b)) == CUDA_SUCCESS);
      for (nvmlGpuP2PCapsIndex_t i : {NVML_P2P_CAPS_INDEX_READ, NVML_P2P_CAPS_INDEX_WRITE}) {
        nvmlGpuP2PStatus_t s = NVML_P2P_STATUS_UNKNOWN;
        EXPECT(NVML(nvmlDeviceGetP2PStatus)(h[a], h[b], i, &s) == NVML_SUCCESS);
        EXPECT(s == (can ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED));
      }
    }
  nvmlEnableState_t active;
  EXPECT(NVML(nvmlDeviceGetNvLinkState)(h[0], 0, &active) == NVML_ERROR_NOT_SUPPORTED);
  nvmlFieldValue_t field{};
  field.fieldId = 91;  // NVML_FI_DEV_NVLINK_LINK_COUNT
  EXPECT(NVML(nvmlDeviceGetFieldValues)(h[0], 1, &field) == NVML_SUCCESS);
  EXPECT(field.nvmlReturn == NVML_ERROR_NOT_SUPPORTED);
  nvmlGpuFabricInfoV_t fabric{};
  fabric.version = nvmlGpuFabricInfo_v2;
  EXPECT(NVML(nvmlDeviceGetGpuFabricInfoV)(h[0], &fabric) == NVML_SUCCESS);
  EXPECT(fabric.state == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED);
  using Temperature = int (*)(nvmlDevice_t, int, unsigned*);
  unsigned temp = 0;
  EXPECT(sym<Temperature>(g_nvml, "nvmlDeviceGetTemperature")(h[0], 0, &temp) == NVML_ERROR_NOT_SUPPORTED);
  EXPECT(sym<Temperature>(g_nvml, "nvmlDeviceGetTemperature")(h[0], 0, &temp) == NVML_ERROR_NOT_SUPPORTED);
  unsigned index = 0;
  auto bogus = reinterpret_cast<nvmlDevice_t>(&index);
  EXPECT(NVML(nvmlDeviceGetIndex)(bogus, &index) == NVML_ERROR_INVALID_ARGUMENT);
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned want = argc > 1 ? unsigned(std::atoi(argv[1])) : 1;
  g_nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  g_cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (!g_nvml || !g_cuda) {
    std::printf("FAIL: dlopen: %s\n", dlerror());
    return 1;
  }
  unsigned n = 0;
  EXPECT(NVML(nvmlDeviceGetCount_v2)(&n) == NVML_ERROR_UNINITIALIZED);
  EXPECT(NVML(nvmlInit_v2)() == NVML_SUCCESS);
  int cu_n = 0;
  EXPECT(CU(cuDeviceGetCount)(&cu_n) == CUDA_SUCCESS);
  EXPECT(NVML(nvmlDeviceGetCount_v2)(&n) == NVML_SUCCESS && n == unsigned(cu_n) && n == want);
  nvmlDevice_t handles[64] = {};
  for (unsigned i = 0; i < n && i < 64; ++i) {
    EXPECT(NVML(nvmlDeviceGetHandleByIndex_v2)(i, &handles[i]) == NVML_SUCCESS);
    check_device(i, handles[i]);
  }
  nvmlDevice_t none = nullptr;
  EXPECT(NVML(nvmlDeviceGetHandleByIndex_v2)(n, &none) == NVML_ERROR_INVALID_ARGUMENT);
  if (n > 0) check_links(n, handles);
  int version = 0;
  EXPECT(NVML(nvmlSystemGetCudaDriverVersion)(&version) == NVML_SUCCESS && version > 0);
  EXPECT(NVML(nvmlShutdown)() == NVML_SUCCESS);
  std::printf("%s: NVML over %u device(s)\n", g_failures ? "FAIL" : "ok", n);
  return g_failures ? 1 : 0;
}

// ordo's libnvidia-ml.so.1: library state, system-wide queries and error
// strings. NVML comes with NVIDIA's kernel driver, which a guest of ordo does
// not have; NCCL cannot initialise without it and PyTorch asks it for device
// counts and memory. Every answer here comes from ordo's libcuda.so.1 (the
// driver API, so the worker's devices), never from a kernel driver.
#include <cstdio>
#include <cstring>
#include <mutex>

#include "state.h"

struct nvmlDevice_st {
  int unused;  // only the address matters
};

namespace ordo_nvml {
namespace {

std::mutex g_lock;
int g_init_count = 0;  // NVML counts nvmlInit calls; nvmlShutdown undoes one
nvmlDevice_st g_devices[kMaxDevices];

}  // namespace

bool initialized() {
  std::lock_guard<std::mutex> l(g_lock);
  return g_init_count > 0;
}

nvmlDevice_t handle_of(CUdevice ordinal) { return &g_devices[ordinal]; }

nvmlReturn_t device_count(unsigned* count) {
  int n = 0;
  if (nvmlReturn_t r = from_cu(cuDeviceGetCount(&n)); r != NVML_SUCCESS) return r;
  *count = unsigned(n < kMaxDevices ? n : kMaxDevices);
  return NVML_SUCCESS;
}

nvmlReturn_t ordinal_of(nvmlDevice_t device, CUdevice* ordinal) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (device < g_devices || device >= g_devices + kMaxDevices) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned n = 0;
  if (nvmlReturn_t r = device_count(&n); r != NVML_SUCCESS) return r;
  if (unsigned(device - g_devices) >= n) return NVML_ERROR_INVALID_ARGUMENT;
  *ordinal = CUdevice(device - g_devices);
  return NVML_SUCCESS;
}

nvmlReturn_t from_cu(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return NVML_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_DEVICE: return NVML_ERROR_INVALID_ARGUMENT;
    case CUDA_ERROR_NOT_INITIALIZED: return NVML_ERROR_UNINITIALIZED;
    case CUDA_ERROR_NO_DEVICE: return NVML_ERROR_NOT_FOUND;
    case CUDA_ERROR_NOT_SUPPORTED: return NVML_ERROR_NOT_SUPPORTED;
    case CUDA_ERROR_OUT_OF_MEMORY: return NVML_ERROR_MEMORY;
    default: return NVML_ERROR_UNKNOWN;
  }
}

}  // namespace ordo_nvml

using namespace ordo_nvml;

extern "C" {

// Initialising NVML is initialising the driver: cuInit connects to the worker
// (ORDO_REGION). Without one NVML reports what it does without a kernel
// driver, which NCCL and PyTorch treat as "no NVML".
nvmlReturn_t nvmlInit_v2() {
  if (cuInit(0) != CUDA_SUCCESS) return NVML_ERROR_DRIVER_NOT_LOADED;
  std::lock_guard<std::mutex> l(g_lock);
  ++g_init_count;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit() { return nvmlInit_v2(); }

nvmlReturn_t nvmlInitWithFlags(unsigned int) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown() {
  std::lock_guard<std::mutex> l(g_lock);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  --g_init_count;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  if (!version) return NVML_ERROR_INVALID_ARGUMENT;
  return from_cu(cuDriverGetVersion(version));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) { return nvmlSystemGetCudaDriverVersion(version); }

// There is no kernel driver to name: the version is the driver API's that
// ordo's libcuda.so.1 implements ("13.0" for 13000), which is also what it
// reports as cuDriverGetVersion.
nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  int v = 0;
  if (!version) return NVML_ERROR_INVALID_ARGUMENT;
  if (nvmlReturn_t r = from_cu(cuDriverGetVersion(&v)); r != NVML_SUCCESS) return r;
  const int n = std::snprintf(version, length, "%d.%d", v / 1000, v % 1000 / 10);
  return n < 0 || unsigned(n) >= length ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  return nvmlSystemGetDriverVersion(version, length);
}

// Confidential computing is off: NCCL fails its init if these fail, and a
// guest of ordo has no protected GPU memory to offer.
nvmlReturn_t nvmlSystemGetConfComputeState(nvmlConfComputeSystemState_t* state) {
  if (!state) return NVML_ERROR_INVALID_ARGUMENT;
  *state = {NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE, NVML_CC_SYSTEM_FEATURE_DISABLED, 0};
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetConfComputeSettings(nvmlSystemConfComputeSettings_t* settings) {
  if (!settings) return NVML_ERROR_INVALID_ARGUMENT;
  if (settings->version != nvmlSystemConfComputeSettings_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  *settings = {nvmlSystemConfComputeSettings_v1, NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE,
               NVML_CC_SYSTEM_FEATURE_DISABLED, 0, NVML_CC_SYSTEM_MULTIGPU_NONE};
  return NVML_SUCCESS;
}

}  // extern "C"

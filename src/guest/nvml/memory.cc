// ordo's libnvidia-ml.so.1: device memory. The total is the device's; used
// and free are what ordo's cuMemGetInfo gives for it, that is this process's
// allocations on the device (the worker does not report other guests').
#include "state.h"

using namespace ordo_nvml;

namespace {

// cuMemGetInfo answers for the current context's device: the device's
// primary context is made current for the call, then the caller's restored.
nvmlReturn_t mem_info(CUdevice d, unsigned long long* total, unsigned long long* free) {
  CUcontext ctx = nullptr;
  if (nvmlReturn_t r = from_cu(cuDevicePrimaryCtxRetain(&ctx, d)); r != NVML_SUCCESS) return r;
  size_t f = 0, t = 0;
  CUresult e = cuCtxPushCurrent(ctx);
  if (e == CUDA_SUCCESS) {
    e = cuMemGetInfo(&f, &t);
    CUcontext popped = nullptr;
    cuCtxPopCurrent(&popped);
  }
  cuDevicePrimaryCtxRelease(d);
  *total = t;
  *free = f;
  return from_cu(e);
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
  ORDINAL(device, d);
  unsigned long long total = 0, free = 0;
  if (nvmlReturn_t r = mem_info(d, &total, &free); r != NVML_SUCCESS) return r;
  *memory = {total, free, total - free};
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  ORDINAL(device, d);
  unsigned long long total = 0, free = 0;
  if (nvmlReturn_t r = mem_info(d, &total, &free); r != NVML_SUCCESS) return r;
  *memory = {nvmlMemory_v2, total, 0, free, total - free};
  return NVML_SUCCESS;
}

}  // extern "C"

// Shared by nvml.cc and device.cc: whether nvmlInit has been called, and the
// device handles (one per CUDA device ordinal of ordo's libcuda.so.1).
#pragma once

#include <cuda.h>

#include "nvml_abi.h"

namespace ordo_nvml {

// NVML's device handles are opaque pointers, stable for the process: here
// the address of a slot per ordinal.
constexpr int kMaxDevices = 64;

bool initialized();
// The ordinal behind a handle; NVML_ERROR_INVALID_ARGUMENT for a foreign or
// out-of-range one, NVML_ERROR_UNINITIALIZED before nvmlInit.
nvmlReturn_t ordinal_of(nvmlDevice_t device, CUdevice* ordinal);
// Declares `ord`, the ordinal of `device`, or returns ordinal_of's error.
#define ORDINAL(device, ord) \
  CUdevice ord = 0;          \
  if (nvmlReturn_t r_ = ordo_nvml::ordinal_of(device, &ord); r_ != NVML_SUCCESS) return r_
// Returns ordinal_of's error for a handle that names no device.
#define CHECK_DEVICE(device)                                                                    \
  do {                                                                                          \
    CUdevice unused_ = 0;                                                                       \
    if (nvmlReturn_t r_ = ordo_nvml::ordinal_of(device, &unused_); r_ != NVML_SUCCESS) return r_; \
  } while (0)

nvmlDevice_t handle_of(CUdevice ordinal);
// The driver's device count, capped at kMaxDevices.
nvmlReturn_t device_count(unsigned* count);
// A CUresult as NVML reports it.
nvmlReturn_t from_cu(CUresult r);

}  // namespace ordo_nvml

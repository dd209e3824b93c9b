// Status codes shared by guest and worker. The values are the CUDA runtime's
// own cudaError_t numbers, so guest libraries map them to CUresult by table
// (libcuda.so.1's to_cu) and tests compare them with CUDA's own.
#pragma once

#include <cstdint>
#include <string_view>

namespace ordo {

enum class Status : int32_t {
  kSuccess = 0,
  kInvalidValue = 1,               // cudaErrorInvalidValue
  kMemoryAllocation = 2,           // cudaErrorMemoryAllocation
  kInvalidConfiguration = 9,       // cudaErrorInvalidConfiguration
  kInvalidDevicePointer = 17,      // cudaErrorInvalidDevicePointer
  kInitializationError = 3,        // cudaErrorInitializationError
  kInvalidDevice = 101,            // cudaErrorInvalidDevice
  kInvalidKernelImage = 200,       // cudaErrorInvalidKernelImage
  kNoKernelImage = 209,            // cudaErrorNoKernelImageForDevice: nothing can run this kernel here
  kDevicesUnavailable = 46,        // cudaErrorDevicesUnavailable
  kInvalidDeviceFunction = 98,     // cudaErrorInvalidDeviceFunction
  kInvalidResourceHandle = 400,    // cudaErrorInvalidResourceHandle
  kIllegalState = 401,             // cudaErrorIllegalState
  kNotReady = 600,                 // cudaErrorNotReady
  kIllegalAddress = 700,           // cudaErrorIllegalAddress
  kLaunchOutOfResources = 701,     // cudaErrorLaunchOutOfResources
  kMisalignedAddress = 716,        // cudaErrorMisalignedAddress
  kLaunchFailure = 719,            // cudaErrorLaunchFailure
  kNotSupported = 801,             // cudaErrorNotSupported
};

constexpr bool ok(Status s) { return s == Status::kSuccess; }
// A kernel fault: CUDA's context is unusable afterwards, and every later call
// of every thread returns the same error until the process ends.
constexpr bool sticky(Status s) {
  return s == Status::kIllegalAddress || s == Status::kMisalignedAddress || s == Status::kLaunchFailure;
}

std::string_view status_name(Status s);

}  // namespace ordo

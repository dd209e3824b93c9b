// Status codes shared by guest and worker. The values are the CUDA runtime's
// own cudaError_t numbers, so the libcudart shim returns them unchanged.
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
  kDevicesUnavailable = 46,        // cudaErrorDevicesUnavailable
  kInvalidDeviceFunction = 98,     // cudaErrorInvalidDeviceFunction
  kInvalidResourceHandle = 400,    // cudaErrorInvalidResourceHandle
  kIllegalState = 401,             // cudaErrorIllegalState
  kNotReady = 600,                 // cudaErrorNotReady
  kLaunchOutOfResources = 701,     // cudaErrorLaunchOutOfResources
  kLaunchFailure = 719,            // cudaErrorLaunchFailure
  kNotSupported = 801,             // cudaErrorNotSupported
};

constexpr bool ok(Status s) { return s == Status::kSuccess; }

std::string_view status_name(Status s);

}  // namespace ordo

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
  kInvalidContext = 201,           // cudaErrorDeviceUninitialized, CUDA_ERROR_INVALID_CONTEXT
  kInvalidKernelImage = 200,       // cudaErrorInvalidKernelImage
  kPeerAccessUnsupported = 217,    // cudaErrorPeerAccessUnsupported
  kNoKernelImage = 209,            // cudaErrorNoKernelImageForDevice: nothing can run this kernel here
  kDevicesUnavailable = 46,        // cudaErrorDevicesUnavailable
  kInvalidDeviceFunction = 98,     // cudaErrorInvalidDeviceFunction
  kInvalidResourceHandle = 400,    // cudaErrorInvalidResourceHandle
  kIllegalState = 401,             // cudaErrorIllegalState
  kNotReady = 600,                 // cudaErrorNotReady
  kIllegalAddress = 700,           // cudaErrorIllegalAddress
  kLaunchOutOfResources = 701,     // cudaErrorLaunchOutOfResources
  kLaunchTimeout = 702,            // cudaErrorLaunchTimeout
  kPeerAccessAlreadyEnabled = 704, // cudaErrorPeerAccessAlreadyEnabled
  kPeerAccessNotEnabled = 705,     // cudaErrorPeerAccessNotEnabled
  kAssert = 710,                   // cudaErrorAssert: a device-side assert
  kHardwareStackError = 714,       // cudaErrorHardwareStackError
  kIllegalInstruction = 715,       // cudaErrorIllegalInstruction
  kMisalignedAddress = 716,        // cudaErrorMisalignedAddress
  kInvalidAddressSpace = 717,      // cudaErrorInvalidAddressSpace
  kInvalidPc = 718,                // cudaErrorInvalidPc
  kLaunchFailure = 719,            // cudaErrorLaunchFailure
  kCooperativeLaunchTooLarge = 720,// cudaErrorCooperativeLaunchTooLarge: more blocks than fit the device at once
  kNotSupported = 801,             // cudaErrorNotSupported
  kInvalidClusterSize = 912,       // cudaErrorInvalidClusterSize
};

constexpr bool ok(Status s) { return s == Status::kSuccess; }
// A kernel fault: CUDA's context is unusable afterwards, and every later call
// of every thread returns the same error until the process ends. These are the
// codes CUDA documents so ("the process must be terminated and relaunched").
constexpr bool sticky(Status s) {
  switch (s) {
    case Status::kIllegalAddress:
    case Status::kLaunchTimeout:
    case Status::kAssert:
    case Status::kHardwareStackError:
    case Status::kIllegalInstruction:
    case Status::kMisalignedAddress:
    case Status::kInvalidAddressSpace:
    case Status::kInvalidPc:
    case Status::kLaunchFailure:
      return true;
    default:
      return false;
  }
}

// A short description; codes ordo does not name (a real driver's other errors
// pass through the cuda backend unchanged) read "CUDA error" and need the number.
std::string_view status_name(Status s);

}  // namespace ordo

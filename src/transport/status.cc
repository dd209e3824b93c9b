#include "ordo/status.h"

namespace ordo {

std::string_view status_name(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidValue: return "invalid value";
    case Status::kMemoryAllocation: return "out of memory";
    case Status::kInvalidConfiguration: return "invalid launch configuration";
    case Status::kInvalidDevicePointer: return "invalid device pointer";
    case Status::kInitializationError: return "initialization error";
    case Status::kInvalidDevice: return "invalid device";
    case Status::kInvalidContext: return "invalid device context";
    case Status::kInvalidKernelImage: return "invalid kernel image";
    case Status::kNoKernelImage: return "no kernel image for the device";
    case Status::kDevicesUnavailable: return "worker unavailable";
    case Status::kInvalidDeviceFunction: return "unknown kernel";
    case Status::kInvalidResourceHandle: return "invalid handle";
    case Status::kIllegalState: return "illegal state";
    case Status::kNotReady: return "not ready";
    case Status::kLaunchOutOfResources: return "out of resources";
    case Status::kLaunchFailure: return "launch failure";
    case Status::kIllegalAddress: return "illegal memory access in a kernel";
    case Status::kMisalignedAddress: return "misaligned memory access in a kernel";
    case Status::kLaunchTimeout: return "kernel ran past the watchdog's limit";
    case Status::kAssert: return "device-side assert failed";
    case Status::kHardwareStackError: return "kernel stack overflow or corruption";
    case Status::kIllegalInstruction: return "illegal instruction in a kernel";
    case Status::kInvalidAddressSpace: return "memory access in the wrong address space in a kernel";
    case Status::kInvalidPc: return "kernel jumped to an invalid address";
    case Status::kNotSupported: return "not supported";
    case Status::kCooperativeLaunchTooLarge: return "cooperative launch of more blocks than fit the device at once";
    case Status::kInvalidClusterSize: return "cluster dimensions do not divide the grid or exceed the device's cluster size";
    case Status::kPeerAccessUnsupported: return "peer access is not supported between these devices";
    case Status::kPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case Status::kPeerAccessNotEnabled: return "peer access has not been enabled";
  }
  return "CUDA error";
}

}  // namespace ordo

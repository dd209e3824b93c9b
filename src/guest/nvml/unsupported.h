// What an NVML function ordo does not answer does: says so once, like
// libcuda.so.1's stubs, and returns NVML_ERROR_NOT_SUPPORTED, the answer a
// GPU without the feature gives.
#pragma once

#include <atomic>
#include <cstdio>

#include "nvml_abi.h"

namespace ordo_nvml {

inline int unsupported(const char* name, std::atomic<bool>* said) {
  if (!said->exchange(true))
    std::fprintf(stderr, "ordo: %s is not supported by the ordo guest library\n", name);
  return NVML_ERROR_NOT_SUPPORTED;
}

}  // namespace ordo_nvml

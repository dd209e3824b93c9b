// Modules and their functions (module.cc), for the launch area (launch.cc).
#pragma once

#include "state.h"  // first: it includes cuda.h

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "fatbin.h"

namespace ordo::driver {

struct Module;
struct Function {
  Module* module = nullptr;
  std::string name;
  const KernelLayout* layout = nullptr;
  uint32_t id = 0;  // the worker's kernel id
  std::atomic<int> max_dynamic_smem{-1};  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as set; -1: never set
  std::atomic<bool> non_portable_cluster{false};  // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
  std::atomic<int> carveout{-1};                   // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (a hint)
  std::atomic<int> cluster_policy{0};              // CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE (a hint)
  // What each device reports of the kernel (Op::KernelAttributes), fetched once per device.
  std::mutex attrs_mu;
  std::map<CUdevice, std::array<int32_t, ordo::kKernelAttributeCount>> attrs;  // under attrs_mu
  // The device's occupancy counts asked so far (Op::KernelOccupancy), by
  // device, threads, shared memory and shape|mode.
  std::mutex occupancy_mu;
  std::map<std::array<uint64_t, 4>, int> occupancy;  // under occupancy_mu
};

// One loaded image: CUmodule and CUlibrary are both this.
struct Module {
  uint64_t key = 0;  // of its Image
  uint32_t id = 0;   // the worker's module id
  CUdevice device = 0;  // the device current at load: a CUmodule's variables are its context's
  KernelLayouts layouts;
  GlobalSizes global_sizes;
  std::string parse_error;
  std::mutex mu;
  std::map<std::string, std::unique_ptr<Function>, std::less<>> functions;
};

// The live module or library behind handle `h`; null if none.
Module* module_of(const void* h);
// The function or kernel behind handle `h` (a function of a live module); null if none.
Function* function_of(const void* h);

}  // namespace ordo::driver

// The cuda backend's way to CUDA: the driver API functions it calls, found
// through cudaGetDriverEntryPointByVersion (ordo-worker does not link
// libcuda), CUDA's error numbers as ordo::Status, and its log line.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "ordo/status.h"

namespace ordo::cuda {

// cudaError_t and CUresult share their numbers for everything a backend returns
// (400 invalid handle, 700 illegal address, 719 launch failure, ...), and
// ordo::Status uses CUDA's numbers, so the value passes through unchanged.
inline Status to_status(cudaError_t e) { return static_cast<Status>(int32_t(e)); }
inline Status to_status(CUresult r) { return static_cast<Status>(int32_t(r)); }
static_assert(int(Status::kPeerAccessUnsupported) == cudaErrorPeerAccessUnsupported &&
              int(Status::kPeerAccessAlreadyEnabled) == cudaErrorPeerAccessAlreadyEnabled &&
              int(Status::kPeerAccessNotEnabled) == cudaErrorPeerAccessNotEnabled &&
              int(Status::kInvalidDevice) == cudaErrorInvalidDevice);


// One line on stderr: "ordo-worker: cuda: " and fmt with up to two strings.
void log(const char* fmt, const char* a = "", const char* b = "");

// The driver functions we use, at the ABI version these typedefs describe.
struct Driver {
  PFN_cuModuleLoadData_v2000 module_load_data = nullptr;
  PFN_cuModuleUnload_v2000 module_unload = nullptr;
  PFN_cuModuleGetFunction_v2000 module_get_function = nullptr;
  PFN_cuModuleGetGlobal_v3020 module_get_global = nullptr;
  PFN_cuLaunchKernel_v4000 launch_kernel = nullptr;
  PFN_cuLaunchKernelEx_v11060 launch_kernel_ex = nullptr;  // clusters and cooperative launches
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuFuncSetAttribute_v9000 func_set_attribute = nullptr;
  PFN_cuFuncGetAttribute_v2020 func_get_attribute = nullptr;
  PFN_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_v7000 occupancy_blocks = nullptr;
  PFN_cuOccupancyMaxActiveClusters_v11070 occupancy_clusters = nullptr;
  PFN_cuFuncGetParamInfo_v12040 func_get_param_info = nullptr;  // optional: drivers before 12.4 lack it
  // Tensor maps (optional: a driver without them answers guests 801).
  PFN_cuTensorMapEncodeTiled_v12000 tensor_map_tiled = nullptr;
  PFN_cuTensorMapEncodeIm2col_v12000 tensor_map_im2col = nullptr;
  PFN_cuTensorMapEncodeIm2colWide_v12080 tensor_map_im2col_wide = nullptr;
  PFN_cuTensorMapReplaceAddress_v12000 tensor_map_replace_address = nullptr;

  // Virtual memory management (optional: without it guests read the device
  // attribute as 0 and get 801).
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  // Exporting physical memory to another worker process (optional).
  PFN_cuMemExportToShareableHandle_v10020 mem_export = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 mem_import = nullptr;
  // Graphs with conditional nodes (optional: without them guests get 801 at
  // cuGraphConditionalHandleCreate).
  PFN_cuGraphCreate_v10000 graph_create = nullptr;
  PFN_cuGraphDestroy_v10000 graph_destroy = nullptr;
  PFN_cuGraphConditionalHandleCreate_v12030 graph_cond_handle = nullptr;
  PFN_cuGraphAddNode_v12030 graph_add_node = nullptr;
  PFN_cuGraphInstantiateWithFlags_v11040 graph_instantiate = nullptr;
  PFN_cuGraphLaunch_v10000 graph_launch = nullptr;
  PFN_cuGraphExecDestroy_v10000 graph_exec_destroy = nullptr;
  PFN_cuGraphKernelNodeSetAttribute_v11000 graph_kernel_node_set_attribute = nullptr;  // clusters in programs
  bool has_conditionals() const {
    return graph_create && graph_destroy && graph_cond_handle && graph_add_node && graph_instantiate &&
           graph_launch && graph_exec_destroy;
  }
  bool has_vmm() const {
    return mem_address_reserve && mem_address_free && mem_create && mem_release && mem_map && mem_unmap &&
           mem_set_access;
  }

  template <class F>
  static bool get(const char* name, unsigned version, F* out, bool required, std::string* error) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableLegacyStream, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
      if (required && error) {
        *error = std::string("the CUDA driver has no ") + name + " (cudaGetDriverEntryPointByVersion: " +
                 cudaGetErrorName(e) + ", query result " + std::to_string(int(q)) +
                 "); update the NVIDIA driver or use --backend sim";
      }
      return !required;
    }
    *out = reinterpret_cast<F>(fn);
    return true;
  }

  bool load(std::string* error);
};

}  // namespace ordo::cuda

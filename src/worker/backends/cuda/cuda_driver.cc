// The cuda backend's driver entry points and log (cuda_driver.h).
#include "cuda_driver.h"

#include <cstdio>

namespace ordo::cuda {

void log(const char* fmt, const char* a, const char* b) {
  std::fprintf(stderr, "ordo-worker: cuda: ");
  std::fprintf(stderr, fmt, a, b);
  std::fprintf(stderr, "\n");
}

bool Driver::load(std::string* error) {
  // Asked for as of CUDA 12.0 (12.4 for cuFuncGetParamInfo, 12.8 for
  // cuTensorMapEncodeIm2colWide): none of these
  // changed its ABI since the version in its typedef's name.
  return get("cuModuleLoadData", 12000, &module_load_data, true, error) &&
         get("cuModuleUnload", 12000, &module_unload, true, error) &&
         get("cuModuleGetFunction", 12000, &module_get_function, true, error) &&
         get("cuModuleGetGlobal", 12000, &module_get_global, true, error) &&
         get("cuLaunchKernel", 12000, &launch_kernel, true, error) &&
         get("cuLaunchKernelEx", 12000, &launch_kernel_ex, true, error) &&
         get("cuCtxGetCurrent", 12000, &ctx_get_current, true, error) &&
         get("cuCtxSetCurrent", 12000, &ctx_set_current, true, error) &&
         get("cuFuncSetAttribute", 12000, &func_set_attribute, true, error) &&
         get("cuFuncGetAttribute", 12000, &func_get_attribute, true, error) &&
         get("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 12000, &occupancy_blocks, true, error) &&
         get("cuOccupancyMaxActiveClusters", 12000, &occupancy_clusters, true, error) &&
         get("cuFuncGetParamInfo", 12040, &func_get_param_info, false, error) &&
         get("cuTensorMapEncodeTiled", 12000, &tensor_map_tiled, false, error) &&
         get("cuTensorMapEncodeIm2col", 12000, &tensor_map_im2col, false, error) &&
         get("cuTensorMapEncodeIm2colWide", 12080, &tensor_map_im2col_wide, false, error) &&
         get("cuTensorMapReplaceAddress", 12000, &tensor_map_replace_address, false, error) &&
         get("cuMemAddressReserve", 10020, &mem_address_reserve, false, error) &&
         get("cuMemAddressFree", 10020, &mem_address_free, false, error) &&
         get("cuMemCreate", 10020, &mem_create, false, error) &&
         get("cuMemRelease", 10020, &mem_release, false, error) &&
         get("cuMemMap", 10020, &mem_map, false, error) &&
         get("cuMemUnmap", 10020, &mem_unmap, false, error) &&
         get("cuMemSetAccess", 10020, &mem_set_access, false, error) &&
         get("cuMemExportToShareableHandle", 10020, &mem_export, false, error) &&
         get("cuMemImportFromShareableHandle", 10020, &mem_import, false, error) &&
         get("cuGraphCreate", 10000, &graph_create, false, error) &&
         get("cuGraphDestroy", 10000, &graph_destroy, false, error) &&
         get("cuGraphConditionalHandleCreate", 12030, &graph_cond_handle, false, error) &&
         get("cuGraphAddNode", 12030, &graph_add_node, false, error) &&
         get("cuGraphInstantiateWithFlags", 11040, &graph_instantiate, false, error) &&
         get("cuGraphLaunch", 10000, &graph_launch, false, error) &&
         get("cuGraphExecDestroy", 10000, &graph_exec_destroy, false, error) &&
         get("cuGraphKernelNodeSetAttribute", 11000, &graph_kernel_node_set_attribute, false, error);
}

}  // namespace ordo::cuda

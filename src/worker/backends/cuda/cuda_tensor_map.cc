// The cuda backend's tensor maps: the host driver encodes them, in the
// device's context, from the guest's checked request. The global address is
// the guest's device address, which is the driver's own (allocations are
// not translated).
#include <cuda.h>

#include <cstring>

#include "cuda_backend_impl.h"

namespace ordo::cuda {

Status CudaBackend::tensor_map_encode(uint32_t device, const TensorMapRequest& r, std::byte* out) {
  if (device >= device_count()) return Status::kInvalidDevice;
  CUtensorMap map;
  static_assert(sizeof map == kTensorMapBytes);
  void* addr = reinterpret_cast<void*>(uintptr_t(r.global_address));
  const auto type = CUtensorMapDataType(r.data_type);
  const auto interleave = CUtensorMapInterleave(r.interleave);
  const auto swizzle = CUtensorMapSwizzle(r.swizzle);
  const auto l2 = CUtensorMapL2promotion(r.l2_promotion);
  const auto fill = CUtensorMapFloatOOBfill(r.oob_fill);
  CUresult e = CUDA_ERROR_NOT_SUPPORTED;
  bind(device);  // this thread's context: encoding needs one
  switch (TensorMapKind(r.kind)) {
    case TensorMapKind::kTiled:
      if (drv_.tensor_map_tiled)
        e = drv_.tensor_map_tiled(&map, type, r.rank, addr, r.global_dim, r.global_strides, r.box_dim,
                                  r.element_strides, interleave, swizzle, l2, fill);
      break;
    case TensorMapKind::kIm2col:
      if (drv_.tensor_map_im2col)
        e = drv_.tensor_map_im2col(&map, type, r.rank, addr, r.global_dim, r.global_strides, r.lower_corner,
                                   r.upper_corner, r.channels_per_pixel, r.pixels_per_column, r.element_strides,
                                   interleave, swizzle, l2, fill);
      break;
    case TensorMapKind::kIm2colWide:
      if (drv_.tensor_map_im2col_wide)
        e = drv_.tensor_map_im2col_wide(&map, type, r.rank, addr, r.global_dim, r.global_strides, r.lower_corner[0],
                                        r.upper_corner[0], r.channels_per_pixel, r.pixels_per_column,
                                        r.element_strides, interleave, CUtensorMapIm2ColWideMode(r.im2col_wide_mode),
                                        swizzle, l2, fill);
      break;
    case TensorMapKind::kReplaceAddress:
      std::memcpy(&map, r.map, sizeof map);
      if (drv_.tensor_map_replace_address) e = drv_.tensor_map_replace_address(&map, addr);
      break;
  }
  if (e != CUDA_SUCCESS) return to_status(e);
  std::memcpy(out, &map, sizeof map);
  return Status::kSuccess;
}

}  // namespace ordo::cuda

// A tensor map (CUtensorMap, Hopper's TMA descriptor) as the guest asks the
// worker for one: the arguments of cuTensorMapEncodeTiled, Im2col,
// Im2colWide or ReplaceAddress, in a TensorMapEncode slot's payload. The
// descriptor itself is 128 opaque bytes whose format is the host driver's, so
// only the worker's backend can make it (docs/CUDA.md, "Tensor maps").
//
// The request comes from the guest: the worker copies it out of the payload
// and check_tensor_map holds it to the rules cuda.h documents for each call
// before any backend sees it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ordo {

inline constexpr uint32_t kTensorMapBytes = 128;
inline constexpr uint32_t kMaxTensorRank = 5;

enum class TensorMapKind : uint32_t { kTiled = 0, kIm2col = 1, kIm2colWide = 2, kReplaceAddress = 3 };

// Field for field the arguments of the cuTensorMapEncode* call `kind`; enums
// by their cuda.h values. Unused fields are zero.
struct TensorMapRequest {
  uint32_t kind;  // TensorMapKind
  uint32_t data_type, rank, interleave, swizzle, l2_promotion, oob_fill;
  uint32_t im2col_wide_mode;             // kIm2colWide
  uint64_t global_address;               // also kReplaceAddress's new address
  uint64_t global_dim[kMaxTensorRank];
  uint64_t global_strides[kMaxTensorRank - 1];  // bytes, of dimensions 1..rank-1
  uint32_t box_dim[kMaxTensorRank];      // kTiled
  uint32_t element_strides[kMaxTensorRank];
  int32_t lower_corner[3], upper_corner[3];  // kIm2col: rank - 2 of each; kIm2colWide: [0]
  uint32_t channels_per_pixel, pixels_per_column;  // kIm2col, kIm2colWide
  alignas(8) std::byte map[kTensorMapBytes];  // kReplaceAddress: the map to change
};
static_assert(sizeof(TensorMapRequest) == 312 && sizeof(TensorMapRequest) <= 512);

// Bytes per element of CUtensorMapDataType `t`, in bits (the packed 4- and
// 6-bit types); 0 for a value cuda.h does not define.
uint32_t tensor_element_bits(uint32_t t);

// Whether `r` follows cuda.h's rules for its call (rank, alignment of the
// address and strides, dimension and box limits, the combinations of
// interleave, swizzle and data type); *why says which it breaks. CUDA answers
// every such request CUDA_ERROR_INVALID_VALUE.
bool check_tensor_map(const TensorMapRequest& r, std::string* why);

}  // namespace ordo

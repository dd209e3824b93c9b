#include "transport/tensor_map.h"

namespace ordo {
namespace {

// cuda.h's CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle values.
constexpr uint32_t kU4Align8 = 13, kU4Align16 = 14, kU6Align16 = 15;
constexpr uint32_t kInterleaveNone = 0, kInterleave32 = 2;
constexpr uint32_t kSwizzleNone = 0, kSwizzle32 = 1, kSwizzle64 = 2, kSwizzleLast = 6;

bool fail(std::string* why, const char* msg) {
  *why = msg;
  return false;
}

bool is_float(uint32_t t) { return t >= 6 && t <= 12; }  // FLOAT16 .. TFLOAT32_FTZ

// The widest inner box a swizzle mode takes, in bytes.
uint32_t swizzle_span(uint32_t s) {
  switch (s) {
    case kSwizzle32: return 32;
    case kSwizzle64: return 64;
    default: return 128;  // the 128-byte modes
  }
}

}  // namespace

uint32_t tensor_element_bits(uint32_t t) {
  switch (t) {
    case 0: return 8;                                  // UINT8
    case 1: case 6: case 9: return 16;                 // UINT16, FLOAT16, BFLOAT16
    case 2: case 3: case 7: case 10: case 11: case 12: return 32;
    case 4: case 5: case 8: return 64;                 // UINT64, INT64, FLOAT64
    case kU4Align8: case kU4Align16: return 4;
    case kU6Align16: return 6;
    default: return 0;
  }
}

bool check_tensor_map(const TensorMapRequest& r, std::string* why) {
  const auto kind = TensorMapKind(r.kind);
  if (kind == TensorMapKind::kReplaceAddress) {
    if (r.global_address % 16) return fail(why, "tensor map address not 16-byte aligned");
    return true;  // the map's own bytes are the driver's to judge
  }
  if (kind != TensorMapKind::kTiled && kind != TensorMapKind::kIm2col && kind != TensorMapKind::kIm2colWide)
    return fail(why, "unknown tensor map call");
  const uint32_t bits = tensor_element_bits(r.data_type);
  if (!bits) return fail(why, "unknown tensor map data type");
  const bool packed16 = r.data_type == kU4Align16 || r.data_type == kU6Align16;
  const bool tiled = kind == TensorMapKind::kTiled;
  if (r.rank == 0 || r.rank > kMaxTensorRank) return fail(why, "tensor rank not 1 to 5");
  if (!tiled && r.rank < 3) return fail(why, "im2col tensor rank not 3 to 5");
  if (r.interleave > kInterleave32 || r.swizzle > kSwizzleLast || r.l2_promotion > 3 || r.oob_fill > 1)
    return fail(why, "unknown interleave, swizzle, L2 promotion or fill mode");
  if (r.interleave != kInterleaveNone && r.rank < 3) return fail(why, "an interleaved tensor of rank below 3");
  if (r.oob_fill && (!is_float(r.data_type))) return fail(why, "NaN fill of a tensor that is not floating point");
  if (r.interleave == kInterleave32 && r.swizzle != kSwizzle32) return fail(why, "32-byte interleave without 32-byte swizzle");
  if (r.data_type == kU6Align16 && r.interleave != kInterleaveNone) return fail(why, "interleaved 16U6 data");
  const uint64_t align = r.interleave == kInterleave32 || packed16 ? 32 : 16;
  if (r.global_address % align) return fail(why, "tensor address not aligned to 16 (32 interleaved or packed) bytes");
  for (uint32_t i = 0; i < r.rank; ++i)
    if (r.global_dim[i] == 0 || r.global_dim[i] > (uint64_t{1} << 32)) return fail(why, "tensor dimension 0 or past 2^32");
  if (packed16 && r.global_dim[0] % 128) return fail(why, "packed 16-byte data with dimension 0 not a multiple of 128");
  if (r.data_type == kU4Align8 && r.global_dim[0] % 2) return fail(why, "16U4 data with an odd dimension 0");
  for (uint32_t i = 0; i + 1 < r.rank; ++i)
    if (r.global_strides[i] % align || r.global_strides[i] >= (uint64_t{1} << 40))
      return fail(why, "tensor stride not a multiple of 16 (32) bytes or past 2^40");
  for (uint32_t i = 0; i < r.rank; ++i)
    if (r.element_strides[i] == 0 || r.element_strides[i] > 8) return fail(why, "element stride not 1 to 8");
  uint64_t inner_bytes = 0;  // the box's innermost extent
  if (tiled) {
    for (uint32_t i = 0; i < r.rank; ++i)
      if (r.box_dim[i] == 0 || r.box_dim[i] > 256) return fail(why, "box dimension not 1 to 256");
    inner_bytes = uint64_t{r.box_dim[0]} * bits / 8;
    if (r.interleave == kInterleaveNone && inner_bytes % 16) return fail(why, "box row not a multiple of 16 bytes");
    if (packed16 && r.box_dim[0] != 128) return fail(why, "packed 16-byte data with box dimension 0 not 128");
  } else {
    if (r.channels_per_pixel == 0 || r.channels_per_pixel > 256) return fail(why, "channels per pixel not 1 to 256");
    if (packed16 && r.channels_per_pixel != 128) return fail(why, "packed 16-byte data with channels per pixel not 128");
    if (r.pixels_per_column == 0 || r.pixels_per_column > 1024) return fail(why, "pixels per column not 1 to 1024");
    inner_bytes = uint64_t{r.channels_per_pixel} * bits / 8;
    if (kind == TensorMapKind::kIm2col) {
      const int32_t limit = r.rank == 3 ? 32768 : r.rank == 4 ? 128 : 16;
      for (uint32_t i = 0; i < r.rank - 2; ++i)
        for (int32_t c : {r.lower_corner[i], r.upper_corner[i]})
          if (c < -limit || c >= limit) return fail(why, "im2col box corner out of range for the rank");
    } else if (r.im2col_wide_mode > 1) {
      return fail(why, "unknown im2col wide mode");
    }
  }
  if (r.interleave == kInterleaveNone && r.swizzle != kSwizzleNone && inner_bytes > swizzle_span(r.swizzle))
    return fail(why, "box row wider than the swizzle span");
  return true;
}

}  // namespace ordo

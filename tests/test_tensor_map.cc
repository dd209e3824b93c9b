// Tensor maps (transport/tensor_map.h, Op::TensorMapEncode): the worker holds
// a request to cuda.h's rules (each rule refused with a reason, random
// requests accepted only when they keep the rules a backend relies on), and
// a session gets the backend's descriptor: equal for equal requests, another
// for another address, and CUDA's error for what the rules or the backend
// refuse, after which the session goes on.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "harness.h"
#include "transport/tensor_map.h"

namespace ordo::test {
namespace {

constexpr uint64_t kAddr = 0x7000'0000'1000ull;

// A 64x64 float tensor, 32x8 boxes: what cuda.h's rules allow.
TensorMapRequest tiled() {
  TensorMapRequest r{};
  r.kind = uint32_t(TensorMapKind::kTiled);
  r.data_type = 7;  // FLOAT32
  r.rank = 2;
  r.global_address = kAddr;
  r.global_dim[0] = r.global_dim[1] = 64;
  r.global_strides[0] = 256;
  r.box_dim[0] = 32;
  r.box_dim[1] = 8;
  r.element_strides[0] = r.element_strides[1] = 1;
  return r;
}

TensorMapRequest im2col() {
  TensorMapRequest r = tiled();
  r.kind = uint32_t(TensorMapKind::kIm2col);
  r.rank = 4;
  r.data_type = 6;  // FLOAT16
  r.global_dim[2] = 16;
  r.global_dim[3] = 2;
  r.global_strides[1] = r.global_strides[2] = 4096;
  r.element_strides[2] = r.element_strides[3] = 1;
  r.lower_corner[0] = r.lower_corner[1] = -1;
  r.upper_corner[0] = r.upper_corner[1] = -1;
  r.channels_per_pixel = 64;
  r.pixels_per_column = 128;
  return r;
}

TEST(TensorMap, RequestsByCudasRules) {
  std::string why;
  EXPECT_TRUE(check_tensor_map(tiled(), &why)) << why;
  EXPECT_TRUE(check_tensor_map(im2col(), &why)) << why;
  struct Case {
    const char* what;
    void (*change)(TensorMapRequest&);
  } cases[] = {
      {"an unknown call", [](TensorMapRequest& r) { r.kind = 9; }},
      {"an unknown data type", [](TensorMapRequest& r) { r.data_type = 16; }},
      {"rank 0", [](TensorMapRequest& r) { r.rank = 0; }},
      {"rank 6", [](TensorMapRequest& r) { r.rank = 6; }},
      {"an address off 16 bytes", [](TensorMapRequest& r) { r.global_address += 8; }},
      {"a zero dimension", [](TensorMapRequest& r) { r.global_dim[1] = 0; }},
      {"a dimension past 2^32", [](TensorMapRequest& r) { r.global_dim[0] = (uint64_t{1} << 32) + 1; }},
      {"a stride off 16 bytes", [](TensorMapRequest& r) { r.global_strides[0] = 264; }},
      {"a stride past 2^40", [](TensorMapRequest& r) { r.global_strides[0] = uint64_t{1} << 40; }},
      {"a zero box", [](TensorMapRequest& r) { r.box_dim[1] = 0; }},
      {"a box past 256", [](TensorMapRequest& r) { r.box_dim[1] = 257; }},
      {"a box row of 8 bytes", [](TensorMapRequest& r) { r.box_dim[0] = 2; }},
      {"an element stride of 9", [](TensorMapRequest& r) { r.element_strides[1] = 9; }},
      {"a box row wider than its swizzle", [](TensorMapRequest& r) { r.swizzle = 1; }},
      {"an unknown swizzle", [](TensorMapRequest& r) { r.swizzle = 7; }},
      {"an unknown L2 promotion", [](TensorMapRequest& r) { r.l2_promotion = 4; }},
      {"NaN fill of integers", [](TensorMapRequest& r) { r.data_type = 3, r.oob_fill = 1; }},
      {"interleave at rank 2", [](TensorMapRequest& r) { r.interleave = 1; }},
      {"32-byte interleave without 32-byte swizzle",
       [](TensorMapRequest& r) { r.rank = 3, r.global_dim[2] = 4, r.global_strides[1] = 1 << 14, r.box_dim[2] = 1,
                                 r.element_strides[2] = 1, r.interleave = 2; }},
      {"an im2col rank of 2", [](TensorMapRequest& r) { r.kind = 1, r.rank = 2, r.channels_per_pixel = 8,
                                                        r.pixels_per_column = 8; }},
  };
  for (const Case& c : cases) {
    TensorMapRequest r = tiled();
    c.change(r);
    why.clear();
    EXPECT_FALSE(check_tensor_map(r, &why)) << c.what;
    EXPECT_FALSE(why.empty()) << c.what;
  }
  struct Im2colCase {
    const char* what;
    void (*change)(TensorMapRequest&);
  } im2col_cases[] = {
      {"no channels", [](TensorMapRequest& r) { r.channels_per_pixel = 0; }},
      {"257 channels", [](TensorMapRequest& r) { r.channels_per_pixel = 257; }},
      {"1025 pixels per column", [](TensorMapRequest& r) { r.pixels_per_column = 1025; }},
      {"a corner past rank 4's range", [](TensorMapRequest& r) { r.lower_corner[1] = -129; }},
  };
  for (const Im2colCase& c : im2col_cases) {
    TensorMapRequest r = im2col();
    c.change(r);
    EXPECT_FALSE(check_tensor_map(r, &why)) << c.what;
  }
}

// Whatever the bytes, an accepted request indexes its arrays within their
// bounds and keeps the alignment a descriptor needs.
TEST(TensorMap, RandomRequestsThatPassKeepTheRules) {
  std::mt19937_64 rng(7);
  int passed = 0;
  for (int i = 0; i < 200000; ++i) {
    TensorMapRequest r = rng() % 2 ? tiled() : im2col();
    auto* words = reinterpret_cast<uint32_t*>(&r);
    for (int k = 0; k < 1 + int(rng() % 4); ++k) {  // a few fields changed, so that some still pass
      const size_t at = rng() % (offsetof(TensorMapRequest, map) / 4);
      words[at] = rng() % 3 ? uint32_t(rng() % 300) : uint32_t(rng());
    }
    std::string why;
    if (!check_tensor_map(r, &why)) continue;
    ++passed;
    if (TensorMapKind(r.kind) == TensorMapKind::kReplaceAddress) {
      ASSERT_EQ(r.global_address % 16, 0u);
      continue;
    }
    ASSERT_GE(r.rank, 1u);
    ASSERT_LE(r.rank, kMaxTensorRank);
    ASSERT_EQ(r.global_address % 16, 0u);
    for (uint32_t d = 0; d < r.rank; ++d) {
      ASSERT_GE(r.global_dim[d], 1u);
      ASSERT_GE(r.element_strides[d], 1u);
      ASSERT_LE(r.element_strides[d], 8u);
    }
    for (uint32_t d = 0; d + 1 < r.rank; ++d) ASSERT_EQ(r.global_strides[d] % 16, 0u);
  }
  EXPECT_GT(passed, 1000);
}

TEST(TensorMap, SessionsGetTheBackendsDescriptor) {
  InProcessWorker w;
  auto c = w.attach();
  alignas(64) std::byte a[kTensorMapBytes], b[kTensorMapBytes], moved[kTensorMapBytes];
  ASSERT_EQ(c->tensor_map_encode(0, tiled(), a), Status::kSuccess);
  ASSERT_EQ(c->tensor_map_encode(0, tiled(), b), Status::kSuccess);
  EXPECT_EQ(std::memcmp(a, b, sizeof a), 0) << "equal requests, equal maps";
  TensorMapRequest other = tiled();
  other.global_address += 4096;
  ASSERT_EQ(c->tensor_map_encode(0, other, b), Status::kSuccess);
  EXPECT_NE(std::memcmp(a, b, sizeof a), 0) << "another address, another map";
  TensorMapRequest replace{};
  replace.kind = uint32_t(TensorMapKind::kReplaceAddress);
  replace.global_address = kAddr + 4096;
  std::memcpy(replace.map, a, sizeof a);
  ASSERT_EQ(c->tensor_map_encode(0, replace, moved), Status::kSuccess);
  EXPECT_EQ(std::memcmp(moved, b, sizeof b), 0) << "a replaced address is a map of the new one";
  ASSERT_EQ(c->tensor_map_encode(0, im2col(), b), Status::kSuccess);

  // Refused: against the rules, a map the backend never made, a device it lacks.
  TensorMapRequest bad = tiled();
  bad.box_dim[0] = 1000;
  EXPECT_EQ(c->tensor_map_encode(0, bad, b), Status::kInvalidValue);
  std::memset(replace.map, 0x5a, sizeof replace.map);
  EXPECT_EQ(c->tensor_map_encode(0, replace, b), Status::kInvalidValue);
  EXPECT_EQ(c->tensor_map_encode(7, tiled(), b), Status::kInvalidDevice);
  EXPECT_EQ(c->tensor_map_encode(0, tiled(), nullptr), Status::kInvalidValue);
  ASSERT_EQ(c->tensor_map_encode(0, tiled(), b), Status::kSuccess) << "the session goes on";
  EXPECT_EQ(std::memcmp(a, b, sizeof a), 0);
}

}  // namespace
}  // namespace ordo::test

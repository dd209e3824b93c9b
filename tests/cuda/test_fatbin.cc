// The fatbin parser against real nvcc output: basic.cu built as a plain
// fatbin (cubin + zstd-compressed PTX, nvcc's default), with every entry
// compressed, as PTX only, and as PTX text. Paths come from the environment
// (meson test sets them).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fatbin.h"
#include "kernels.h"

namespace ordo::driver {
namespace {

std::vector<std::byte> load(const char* env) {
  const char* path = std::getenv(env);
  if (!path) {
    ADD_FAILURE() << env << " is not set: run through meson test";
    return {};
  }
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(c.empty()) << path;
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

bool have_zstd() {
  // The parser loads libzstd.so.1 itself; a PTX-only fatbin needs it.
  KernelLayouts k;
  std::string e;
  return !(parse_fatbin(load("FATBIN_PTX"), &k, &e) == false && e.find("libzstd") != std::string::npos);
}

// What the device compiler laid out, checked against the structs the twins use.
void expect_basic_layouts(const KernelLayouts& k) {
  ASSERT_TRUE(k.count("_Z5mixedcds4PairPx")) << "mixed missing";
  const KernelLayout& m = k.at("_Z5mixedcds4PairPx");
  ASSERT_EQ(m.params.size(), 5u);
  const uint32_t off[] = {offsetof(MixedArgs, c), offsetof(MixedArgs, d), offsetof(MixedArgs, s),
                          offsetof(MixedArgs, pair), offsetof(MixedArgs, out)};
  const uint32_t size[] = {1, 8, 2, sizeof(Pair), 8};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(m.params[i].offset, off[i]) << "param " << i;
    EXPECT_EQ(m.params[i].size, size[i]) << "param " << i;
  }
  EXPECT_EQ(m.size, sizeof(MixedArgs));

  const KernelLayout& s = k.at("_Z5saxpyfPKfPfi");
  ASSERT_EQ(s.params.size(), 4u);
  EXPECT_EQ(s.params[0].offset, 0u);
  EXPECT_EQ(s.params[0].size, 4u);
  EXPECT_EQ(s.params[1].offset, 8u);  // a pointer after a float: aligned up
  EXPECT_EQ(s.params[3].offset, offsetof(SaxpyArgs, n));
  EXPECT_EQ(s.size, offsetof(SaxpyArgs, n) + 4);  // packed: no tail padding

  const KernelLayout& f = k.at("_Z4fillPiii");
  ASSERT_EQ(f.params.size(), 3u);
  EXPECT_EQ(f.size, sizeof(FillArgs));
}

TEST(Fatbin, DefaultNvccOutput) {
  const auto img = load("FATBIN_DEFAULT");
  ASSERT_EQ(fatbin_size(img.data()), img.size());
  KernelLayouts k;
  std::string e;
  ASSERT_TRUE(parse_fatbin(img, &k, &e)) << e;
  EXPECT_EQ(k.size(), 3u);
  expect_basic_layouts(k);
}

// Every cubin of the cuda backend's built-ins gives every kernel's layout.
// Some of them carry valueless .nv.info records, 4 bytes each as nvcc writes
// them: read as 2, the walk lost its place and the cubin its layouts.
TEST(Fatbin, CubinsWithValuelessRecords) {
  if (!std::getenv("CUDA_BUILTINS_FATBIN")) GTEST_SKIP() << "no cuda backend built";
  const auto img = load("CUDA_BUILTINS_FATBIN");
  image::FatbinReader r(img);
  int cubins = 0;
  for (image::FatbinEntry e; r.next(&e);) {
    if (!e.is(image::EntryKind::kElf) || e.compressed()) continue;
    ++cubins;
    KernelLayouts k;
    std::string err;
    ASSERT_TRUE(parse_cubin(e.payload, &k, &err)) << "sm_" << e.arch << ": " << err;
    EXPECT_GE(k.size(), 5u) << "sm_" << e.arch;
    EXPECT_TRUE(k.count("ordo_fill_u32")) << "sm_" << e.arch;
  }
  EXPECT_GE(cubins, 5);
}

TEST(Fatbin, EveryEntryCompressed) {
  if (!have_zstd()) GTEST_SKIP() << "no libzstd.so.1";
  KernelLayouts k;
  std::string e;
  ASSERT_TRUE(parse_fatbin(load("FATBIN_COMPRESSED"), &k, &e)) << e;
  expect_basic_layouts(k);
}

TEST(Fatbin, PtxOnlyGivesTheSameLayouts) {
  if (!have_zstd()) GTEST_SKIP() << "no libzstd.so.1";
  KernelLayouts k;
  std::string e;
  ASSERT_TRUE(parse_fatbin(load("FATBIN_PTX"), &k, &e)) << e;
  expect_basic_layouts(k);
}

TEST(Fatbin, PtxText) {
  const auto ptx = load("PTX_TEXT");
  KernelLayouts k;
  std::string e;
  ASSERT_TRUE(parse_ptx({reinterpret_cast<const char*>(ptx.data()), ptx.size()}, &k, &e)) << e;
  expect_basic_layouts(k);
}

TEST(Fatbin, GarbageIsRejectedWithoutReadingOutOfBounds) {
  std::vector<std::byte> junk(64, std::byte{0x41});
  EXPECT_EQ(fatbin_size(junk.data()), 0u);
  KernelLayouts k;
  std::string e;
  EXPECT_FALSE(parse_fatbin(junk, &k, &e));
  EXPECT_NE(e.find("magic"), std::string::npos) << e;
  EXPECT_FALSE(parse_cubin(junk, &k, &e));

  // Every truncation of a real fatbin, in its own heap block so ASan sees overreads.
  const auto img = load("FATBIN_DEFAULT");
  for (size_t n = 0; n < img.size(); n += (n < 256 ? 1 : 61)) {
    std::vector<std::byte> cut(img.begin(), img.begin() + ptrdiff_t(n));
    KernelLayouts out;
    std::string err;
    if (parse_fatbin(cut, &out, &err)) {
      EXPECT_LE(out.size(), 3u);
    }
  }
  // Random corruption: parse or fail, never crash.
  std::mt19937 rng(1);
  for (int round = 0; round < 2000; ++round) {
    auto bad = img;
    for (int i = 0; i < 4; ++i) bad[rng() % bad.size()] = std::byte(rng());
    KernelLayouts out;
    std::string err;
    parse_fatbin(bad, &out, &err);
  }
}

TEST(Fatbin, PtxLayoutArithmeticIsBounded) {
  KernelLayouts k;
  std::string e;
  // A 2^31 alignment used to wrap the 32-bit layout and put a parameter far
  // outside the launch buffer.
  EXPECT_FALSE(parse_ptx(".entry f(.param .align 2147483648 .b8 a[1], .param .align 2147483648 .b8 b[1],"
                         " .param .align 2147483648 .b8 c[1]) {}",
                         &k, &e));
  EXPECT_FALSE(parse_ptx(".entry g(.param .align 8 .b8 a[40000]) {}", &k, &e)) << "over CUDA's 32764 bytes";
  EXPECT_FALSE(parse_ptx(".entry h(.param .align 8 .b8 a[30000], .param .align 8 .b8 b[30000]) {}", &k, &e));
  // After .ptr, .align is the pointee's alignment: the parameter stays 8-aligned.
  KernelLayouts ok_layouts;
  ASSERT_TRUE(parse_ptx(".entry p(.param .u32 n, .param .u64 .ptr .global .align 16 x) {}", &ok_layouts, &e)) << e;
  const KernelLayout& l = ok_layouts.at("p");
  ASSERT_EQ(l.params.size(), 2u);
  EXPECT_EQ(l.params[1].offset, 8u);
  EXPECT_EQ(l.size, 16u);
}

// LZ4 instead of zstd (--compress-mode=speed): built in, no library needed.
TEST(Fatbin, Lz4EntriesGiveTheSameLayouts) {
  const auto img = load("FATBIN_LZ4");
  KernelLayouts k;
  std::string e;
  ASSERT_TRUE(parse_fatbin(img, &k, &e)) << e;
  EXPECT_EQ(k.size(), 3u);
  expect_basic_layouts(k);
}

// Each LZ4 entry of `img` through `spoil` (the image, the entry's offset).
template <class F>
std::string parse_spoiled_lz4(std::vector<std::byte> img, F spoil) {
  image::FatbinReader r(img);
  std::vector<image::FatbinEntry> entries;
  for (image::FatbinEntry en; r.next(&en);)
    if (en.flags & image::kEntryLz4) entries.push_back(en);
  EXPECT_EQ(entries.size(), 2u);
  for (const image::FatbinEntry& en : entries) spoil(img, en);
  KernelLayouts k;
  std::string e;
  EXPECT_FALSE(parse_fatbin(img, &k, &e)) << "nothing readable is left";
  EXPECT_TRUE(k.empty());
  return e;
}

TEST(Fatbin, MalformedLz4EntriesAreRefusedWithAReason) {
  const auto img = load("FATBIN_LZ4");
  // A match before the start of the output.
  EXPECT_EQ(parse_spoiled_lz4(img,
                              [](std::vector<std::byte>& b, const image::FatbinEntry& en) {
                                const size_t p = en.offset + en.header_size;
                                b[p] = std::byte{0x00};  // no literals, then a match at offset 1 of nothing
                                b[p + 1] = std::byte{0x01};
                                b[p + 2] = std::byte{0x00};
                              }),
            "LZ4-compressed fatbin entry: LZ4 match offset outside the output");
  // A stated size the block does not fill.
  EXPECT_EQ(parse_spoiled_lz4(img,
                              [](std::vector<std::byte>& b, const image::FatbinEntry& en) {
                                const uint64_t more = en.uncompressed_size + 100;
                                std::memcpy(b.data() + en.offset + 56, &more, 8);
                              }),
            "LZ4-compressed fatbin entry: LZ4 block decompresses short of its stated size");
  // A stated size no image has: refused before anything is allocated.
  EXPECT_EQ(parse_spoiled_lz4(img,
                              [](std::vector<std::byte>& b, const image::FatbinEntry& en) {
                                const uint64_t huge = uint64_t{1} << 60;
                                std::memcpy(b.data() + en.offset + 56, &huge, 8);
                              }),
            "compressed fatbin entry with an implausible size");
}

// Module-scope variables of PTX, for cuModuleGetGlobal's size hint (cuFFT's
// lut_sp lives in LZ4-compressed PTX, with no cubin to give its size).
TEST(Fatbin, PtxGlobalsGetTheirSizes) {
  const char* ptx = R"(
.version 8.0
.target sm_52
.address_size 64
.global .align 8 .u64 lut_sp;
.visible .global .align 4 .b8 table[123];
.global .align 4 .f32 grid[4][8] = {1.0, 2.0};
.const .align 16 .v4 .u32 quad;
.visible .const .align 4 .b8 banked[64] =
    {0, 1, 2, 3};
.global .u32 a, b[3];
.extern .global .align 4 .b8 elsewhere[];
.global .align 1 .b8 unsized[];
.global .texref tex;
.visible .entry k(
.param .u64 .ptr .global .align 4 k_param_0
)
{
ld.global.u32 %r1, [lut_sp];
}
)";
  KernelLayouts k;
  GlobalSizes g;
  std::string e;
  ASSERT_TRUE(parse_ptx(ptx, &k, &e, &g)) << e;
  const GlobalSizes want = {{"lut_sp", 8}, {"table", 123}, {"grid", 128}, {"quad", 16}, {"banked", 64},
                            {"a", 4},      {"b", 12}};
  EXPECT_EQ(g, want);
  EXPECT_EQ(k.size(), 1u);
  // Nonsense sizes are no variables.
  GlobalSizes bad;
  ASSERT_TRUE(parse_ptx(".global .b8 x[0];\n.global .b8 y[99999999999999999999];\n.global .u64 z[1099511627776];\n"
                        ".global .b8 w[12x];\n.global .align 8 .u64 no_semicolon",
                        &k, &e, &bad));
  EXPECT_TRUE(bad.empty()) << bad.begin()->first;
}

}  // namespace
}  // namespace ordo::driver

TEST(Fatbin, PackParamsPlacesEachArgumentAndChecksTheLayout) {
  using ordo::driver::PackError;
  ordo::driver::KernelLayout l;
  l.params = {{0, 4}, {8, 8}};
  l.size = 16;
  int32_t a = 0x11223344;
  int64_t b = 0x0102030405060708;
  void* args[] = {&a, &b};
  ordo::driver::ParamBuffer out;
  ASSERT_EQ(ordo::driver::pack_params(l, args, &out), PackError::kNone);
  ASSERT_EQ(out.size(), 16u);
  int32_t ga;
  int64_t gb;
  std::memcpy(&ga, out.data(), 4);
  std::memcpy(&gb, out.data() + 8, 8);
  EXPECT_EQ(ga, a);
  EXPECT_EQ(gb, b);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(out[i], std::byte{0}) << i;  // padding is zeroed
  void* missing[] = {&a, nullptr};
  EXPECT_EQ(ordo::driver::pack_params(l, missing, &out), PackError::kMissingArgument);
  EXPECT_EQ(ordo::driver::pack_params(l, nullptr, &out), PackError::kMissingArgument);
  l.params[1].offset = 12;  // runs past the buffer's end: a layout not to trust
  EXPECT_EQ(ordo::driver::pack_params(l, args, &out), PackError::kBadLayout);
  l.params = {};
  l.size = ordo::driver::kMaxParamBytes + 1;
  EXPECT_EQ(ordo::driver::pack_params(l, nullptr, &out), PackError::kBadLayout);
}

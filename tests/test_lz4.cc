// The LZ4 block decompressor (src/transport/lz4.h) libcuda.so.1 reads
// LZ4-compressed fatbin entries with (cuFFT's PTX; nvcc --compress-mode=speed):
// hand-made blocks for each rule of the format, malformed ones refused without
// a write past the output, and nvcc's own output, whose cubin must come back
// byte for byte as the uncompressed fatbin has it (FATBIN_LZ4 and
// FATBIN_DEFAULT from tests/cuda, set by meson test; skipped without nvcc).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "nvcc_output.h"
#include "transport/lz4.h"
#include "transport/module_image.h"

namespace ordo::image {
namespace {

using Bytes = std::vector<std::byte>;

Bytes bytes(std::initializer_list<int> v) {
  Bytes b;
  for (int x : v) b.push_back(std::byte(x));
  return b;
}

Bytes text(std::string_view s) {
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// Decompresses into a heap block of exactly `size` bytes (ASan sees any
// overrun); the text on success, else the error's.
std::string inflate(const Bytes& in, size_t size) {
  std::unique_ptr<std::byte[]> out(new std::byte[size + 1]);
  const Lz4Error e = lz4_decompress(in, {out.get(), size});
  if (e != Lz4Error::kNone) return std::string("error: ") + describe(e);
  return std::string(reinterpret_cast<const char*>(out.get()), size);
}

TEST(Lz4, LiteralsAlone) {
  Bytes in = bytes({0x50});
  const Bytes lit = text("hello");
  in.insert(in.end(), lit.begin(), lit.end());
  EXPECT_EQ(inflate(in, 5), "hello");
  EXPECT_EQ(inflate({}, 0), "");
}

TEST(Lz4, OverlappingMatchRepeats) {
  // "ab", then a match at offset 2 of length 4 + 4: "ab" five times.
  EXPECT_EQ(inflate(bytes({0x24, 'a', 'b', 0x02, 0x00, 0x00}), 10), "ababababab");
  // Offset 1: run-length.
  EXPECT_EQ(inflate(bytes({0x10, 'x', 0x01, 0x00}), 5), "xxxxx");
}

TEST(Lz4, LongLengthsContinueInExtraBytes) {
  // 15 + 255 + 10 = 280 literals, then a match of 4 + 15 + 255 + 1 = 275.
  Bytes in = bytes({0xff, 255, 10});
  for (int i = 0; i < 280; ++i) in.push_back(std::byte('a' + i % 26));
  in.insert(in.end(), {std::byte(26), std::byte(0), std::byte(255), std::byte(1)});
  in.push_back(std::byte(0x30));  // the last sequence: three literals
  in.insert(in.end(), {std::byte('x'), std::byte('y'), std::byte('z')});
  const std::string out = inflate(in, 280 + 275 + 3);
  ASSERT_EQ(out.size(), 558u) << out;
  for (size_t i = 0; i < 555; ++i) ASSERT_EQ(out[i], char('a' + i % 26)) << i;
  EXPECT_EQ(out.substr(555), "xyz");
}

TEST(Lz4, MalformedBlocksAreRefused) {
  EXPECT_EQ(inflate({}, 1), "error: LZ4 block decompresses short of its stated size");
  EXPECT_EQ(inflate(bytes({0x50, 'a', 'b'}), 5), "error: LZ4 block truncated") << "literals past the input";
  EXPECT_EQ(inflate(bytes({0xf0, 255}), 300), "error: LZ4 block truncated") << "length bytes past the input";
  EXPECT_EQ(inflate(bytes({0x10, 'a', 0x01}), 8), "error: LZ4 block truncated") << "half an offset";
  EXPECT_EQ(inflate(bytes({0x1f, 'a', 0x01, 0x00}), 100), "error: LZ4 block truncated") << "match length runs out";
  EXPECT_EQ(inflate(bytes({0x10, 'a', 0x00, 0x00}), 8), "error: LZ4 match offset outside the output");
  EXPECT_EQ(inflate(bytes({0x10, 'a', 0x02, 0x00}), 8), "error: LZ4 match offset outside the output");
  EXPECT_EQ(inflate(bytes({0x00, 0x01, 0x00}), 8), "error: LZ4 match offset outside the output") << "nothing yet";
  EXPECT_EQ(inflate(bytes({0x50, 'h', 'e', 'l', 'l', 'o'}), 4), "error: LZ4 block decompresses past its stated size");
  EXPECT_EQ(inflate(bytes({0x1f, 'a', 0x01, 0x00, 200}), 50), "error: LZ4 block decompresses past its stated size");
  EXPECT_EQ(inflate(bytes({0x10, 'x', 0x01, 0x00}), 6), "error: LZ4 block decompresses short of its stated size");
  // 2^64 / 255 extension bytes cannot be in memory; a long run is bounded by its input.
  Bytes run(100000, std::byte(255));
  run.insert(run.begin(), std::byte(0xf0));
  EXPECT_EQ(inflate(run, 16), "error: LZ4 block truncated");
}

// ---------------------------------------------------------------- nvcc's output


// The LZ4 entries of a fatbin: (entry, its compressed bytes).
std::vector<std::pair<FatbinEntry, Bytes>> lz4_entries(const Bytes& img) {
  std::vector<std::pair<FatbinEntry, Bytes>> out;
  FatbinReader r(img);
  for (FatbinEntry e; r.next(&e);) {
    if (!(e.flags & kEntryLz4)) continue;
    EXPECT_TRUE(e.compressed_fits());
    const auto c = e.payload.first(e.compressed_size);
    out.emplace_back(e, Bytes(c.begin(), c.end()));
  }
  EXPECT_EQ(r.error(), FatbinError::kNone);
  return out;
}

TEST(Lz4, NvccEntriesComeBackAsTheUncompressedFatbinHasThem) {
  LOAD_OR_SKIP(lz4, "FATBIN_LZ4");
  LOAD_OR_SKIP(plain, "FATBIN_DEFAULT");
  Bytes cubin;  // the uncompressed fatbin's
  FatbinReader r(plain);
  for (FatbinEntry e; r.next(&e);)
    if (e.is(EntryKind::kElf) && !e.compressed()) cubin.assign(e.payload.begin(), e.payload.end());
  const auto entries = lz4_entries(lz4);
  ASSERT_EQ(entries.size(), 2u) << "a cubin and PTX, both LZ4 (--compress-mode=speed)";
  for (const auto& [e, packed] : entries) {
    Bytes out(e.uncompressed_size);
    ASSERT_EQ(lz4_decompress(packed, out), Lz4Error::kNone);
    if (e.is(EntryKind::kElf)) {
      EXPECT_EQ(ElfReader(out).check(), ElfError::kNone);
      EXPECT_EQ(out, Bytes(cubin.begin(), cubin.begin() + ptrdiff_t(std::min(cubin.size(), out.size()))));
    } else {
      EXPECT_TRUE(is_ptx_text(out));
      const std::string_view ptx(reinterpret_cast<const char*>(out.data()), out.size());
      EXPECT_NE(ptx.find(".entry _Z5saxpyfPKfPfi"), std::string_view::npos);
    }
  }
}

TEST(Lz4, CorruptNvccEntriesFailCleanly) {
  LOAD_OR_SKIP(lz4, "FATBIN_LZ4");
  std::mt19937 rng(7);
  for (const auto& [e, packed] : lz4_entries(lz4)) {
    // Every truncation: short of the stated size, never a write past it.
    for (size_t n = 0; n < packed.size(); n += (n < 64 ? 1 : 17)) {
      const Bytes cut(packed.begin(), packed.begin() + ptrdiff_t(n));
      std::unique_ptr<std::byte[]> out(new std::byte[e.uncompressed_size]);
      EXPECT_NE(lz4_decompress(cut, {out.get(), e.uncompressed_size}), Lz4Error::kNone) << n;
    }
    // Random bytes changed: whatever comes out, it stays inside the output.
    for (int round = 0; round < 2000; ++round) {
      Bytes bad = packed;
      for (int i = 0; i < 3; ++i) bad[rng() % bad.size()] = std::byte(rng());
      std::unique_ptr<std::byte[]> out(new std::byte[e.uncompressed_size]);
      (void)lz4_decompress(bad, {out.get(), e.uncompressed_size});
    }
  }
}

}  // namespace
}  // namespace ordo::image

// The module-image reader (src/transport/module_image.h): classification, the
// fatbin walk and the validator the cuda backend runs on every image a guest
// sends, on images built here byte by byte and, where nvcc is found, on real
// nvcc output (paths from the environment, set by meson test; those tests skip
// without it). The validator's texts are checked word for word: the worker
// logs them, and tests/gpu matches some. The ELF walk (cubins) is tested in
// test_module_image_elf.cc, the .nv.info records in test_kernel_resources.cc.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "image_bytes.h"
#include "nvcc_output.h"
#include "transport/module_image.h"

namespace ordo::image {
namespace {

// ---------------------------------------------------------------- fatbin images

struct EntrySpec {
  uint16_t kind;
  uint32_t arch;
  std::string payload;
  uint64_t flags = 0;
  uint32_t compressed = 0;
  uint64_t uncompressed = 0;
  uint32_t header_size = 64;
};

// A fatbin as nvcc lays it out (the header's version 1, header_size 16).
Bytes fatbin(const std::vector<EntrySpec>& entries) {
  Bytes body;
  for (const EntrySpec& e : entries) {
    const size_t at = body.size();
    body.resize(at + e.header_size + e.payload.size());
    put<uint16_t>(body, at, e.kind);
    put<uint16_t>(body, at + 2, 0x101);
    put<uint32_t>(body, at + 4, e.header_size);
    put<uint64_t>(body, at + 8, e.payload.size());
    put<uint32_t>(body, at + 16, e.compressed);
    put<uint32_t>(body, at + 28, e.arch);
    put<uint64_t>(body, at + 40, e.flags);
    put<uint64_t>(body, at + 56, e.uncompressed);
    std::memcpy(body.data() + at + e.header_size, e.payload.data(), e.payload.size());
  }
  Bytes img(16 + body.size());
  put<uint32_t>(img, 0, kFatbinMagic);
  put<uint16_t>(img, 4, 1);
  put<uint16_t>(img, 6, 16);
  put<uint64_t>(img, 8, body.size());
  if (!body.empty()) std::memcpy(img.data() + 16, body.data(), body.size());
  return img;
}

const std::vector<EntrySpec> kThree = {
    {2, 90, std::string(40, 'c')},                                    // a cubin (not a real one)
    {1, 75, ".version 8.0\n.target sm_75\n", 0, 0, 0, 80},           // PTX, a longer entry header
    {1, 75, std::string(24, 'z'), kEntryZstd, 20, 4096},              // compressed PTX
};

TEST(ModuleImage, FatbinWalkFindsEveryEntry) {
  const Bytes img = fatbin(kThree);
  EXPECT_EQ(classify(img), Format::kFatbin);
  EXPECT_EQ(validate(img), "ok");
  FatbinReader r(img);
  ASSERT_EQ(r.error(), FatbinError::kNone);
  EXPECT_EQ(r.header().version, 1);
  EXPECT_EQ(r.header().header_size, 16);
  EXPECT_EQ(r.header().total_size(), img.size());
  std::vector<FatbinEntry> got;
  for (FatbinEntry e; r.next(&e);) got.push_back(e);
  EXPECT_EQ(r.error(), FatbinError::kNone);
  EXPECT_EQ(r.offset(), img.size());
  ASSERT_EQ(got.size(), 3u);

  EXPECT_TRUE(got[0].is(EntryKind::kElf));
  EXPECT_EQ(got[0].offset, 16u);
  EXPECT_EQ(got[0].arch, 90u);
  EXPECT_EQ(got[0].version, 0x101);
  EXPECT_EQ(got[0].header_size, 64u);
  EXPECT_EQ(got[0].header.data(), img.data() + 16);
  EXPECT_EQ(text(got[0].payload), std::string(40, 'c'));
  EXPECT_FALSE(got[0].compressed());

  EXPECT_TRUE(got[1].is(EntryKind::kPtx));
  EXPECT_EQ(got[1].offset, 16u + 64 + 40);
  EXPECT_EQ(got[1].header_size, 80u);
  EXPECT_EQ(got[1].header.size(), 80u);
  EXPECT_EQ(text(got[1].payload), ".version 8.0\n.target sm_75\n");
  EXPECT_TRUE(is_ptx_text(got[1].payload));

  EXPECT_TRUE(got[2].is(EntryKind::kPtx));
  EXPECT_TRUE(got[2].compressed());
  EXPECT_TRUE(got[2].compressed_fits());
  EXPECT_EQ(got[2].flags, kEntryZstd);
  EXPECT_EQ(got[2].compressed_size, 20u);
  EXPECT_EQ(got[2].uncompressed_size, 4096u);
  EXPECT_EQ(got[2].payload_size, 24u);
  EXPECT_EQ(got[2].payload.data() + got[2].payload.size(), img.data() + img.size());
}

TEST(ModuleImage, FatbinEntriesOfOtherKindsAreWalkedToo) {
  const Bytes img = fatbin({{4, 90, "lto ir"}, {2, 90, "elf"}});  // e.g. LTO IR first
  FatbinReader r(img);
  FatbinEntry e;
  ASSERT_TRUE(r.next(&e));
  EXPECT_EQ(e.kind, 4);
  EXPECT_FALSE(e.is(EntryKind::kPtx) || e.is(EntryKind::kElf));
  ASSERT_TRUE(r.next(&e));
  EXPECT_TRUE(e.is(EntryKind::kElf));
  EXPECT_FALSE(r.next(&e));
  EXPECT_EQ(validate(img), "ok");
  EXPECT_EQ(validate(fatbin({})), "ok");  // no entries at all
}

TEST(ModuleImage, BytesAfterTheFatbinAreNotWalked) {
  Bytes img = fatbin(kThree);
  const size_t n = img.size();
  img.resize(n + 100, std::byte{0xff});
  EXPECT_EQ(validate(img), "ok");
  FatbinReader r(img);
  int entries = 0;
  for (FatbinEntry e; r.next(&e);) ++entries;
  EXPECT_EQ(entries, 3);
  EXPECT_EQ(r.offset(), n);
}

TEST(ModuleImage, MalformedFatbinsAreRefusedWithTheBackendsTexts) {
  const Bytes good = fatbin(kThree);
  Bytes img(good.begin(), good.begin() + 15);
  EXPECT_EQ(validate(img), "fatbin header truncated");
  EXPECT_EQ(FatbinReader(img).error(), FatbinError::kHeaderTruncated);
  EXPECT_EQ(validate(Bytes(good.begin(), good.begin() + 4)), "fatbin header truncated");

  img = good;
  put<uint64_t>(img, 8, ~uint64_t{0});
  EXPECT_EQ(validate(img), "fatbin size runs past the image");
  img = good;
  put<uint16_t>(img, 6, 8);  // a header smaller than itself
  EXPECT_EQ(validate(img), "fatbin size runs past the image");
  EXPECT_EQ(FatbinReader(img).error(), FatbinError::kSizeRunsPast);
  for (size_t n : {size_t{16}, size_t{17}, good.size() / 2, good.size() - 1}) {
    EXPECT_EQ(validate(Bytes(good.begin(), good.begin() + ptrdiff_t(n))), "fatbin size runs past the image") << n;
  }

  img = good;
  put<uint64_t>(img, 8, 40);  // the body ends inside the first entry's header
  EXPECT_EQ(validate(img), "fatbin entry header truncated");

  img = good;
  put<uint32_t>(img, 16 + 4, 16);  // a 16-byte entry header
  put<uint64_t>(img, 16 + 8, 40 + 48);  // whose payload ends where the real one did
  EXPECT_EQ(validate(img), "fatbin entry header smaller than 64 bytes");

  img = good;
  put<uint64_t>(img, 16 + 8, uint64_t{1} << 62);  // the first entry's payload
  EXPECT_EQ(validate(img), "fatbin entry runs past the image");
  img = good;
  put<uint32_t>(img, 16 + 4, 0xffffffffu);  // the first entry's header
  EXPECT_EQ(validate(img), "fatbin entry runs past the image");

  img = good;
  put<uint32_t>(img, 16 + 16, 41);  // a compressed size beyond the payload (flags or not)
  EXPECT_EQ(validate(img), "fatbin entry's compressed size runs past its payload");
}

TEST(ModuleImage, AWalkStopsAtTheBadEntryAndSaysWhere) {
  Bytes img = fatbin(kThree);
  const size_t third = 16 + (64 + kThree[0].payload.size()) + (80 + kThree[1].payload.size());
  put<uint64_t>(img, third + 8, 25);  // one byte more than is left
  EXPECT_EQ(validate(img), "fatbin entry runs past the image");
  FatbinReader r(img);
  FatbinEntry e;
  EXPECT_TRUE(r.next(&e));
  EXPECT_TRUE(r.next(&e));
  EXPECT_FALSE(r.next(&e));
  EXPECT_EQ(r.error(), FatbinError::kEntryRunsPast);
  EXPECT_EQ(r.offset(), third);
  EXPECT_FALSE(r.next(&e)) << "stays stopped";
  EXPECT_STREQ(describe(r.error()), "fatbin entry runs past the image");
}

TEST(ModuleImage, FatbinHeaderAlone) {
  const Bytes img = fatbin(kThree);
  FatbinHeader h;
  ASSERT_TRUE(read_fatbin_header(img, &h));
  EXPECT_EQ(h.total_size(), img.size());
  EXPECT_FALSE(read_fatbin_header(std::span(img).first(15), &h));
  EXPECT_FALSE(read_fatbin_header(bytes(std::string(16, 'x')), &h));
  EXPECT_EQ(FatbinReader(bytes("xxxxxxxxxxxxxxxxxxxx")).error(), FatbinError::kNotFatbin);
  EXPECT_EQ(FatbinReader(Bytes{}).error(), FatbinError::kNotFatbin);
}

// ---------------------------------------------------------------- PTX, the wrapper, the rest

TEST(ModuleImage, PtxAndWhatIsNot) {
  const std::string ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\t// a comment\r\n";
  EXPECT_EQ(classify(bytes(ptx)), Format::kPtx);
  EXPECT_EQ(validate(bytes(ptx)), "ok");
  EXPECT_EQ(validate(bytes(ptx + '\0')), "ok");  // NUL-terminated
  const std::string binary = "not a fatbin, a 64-bit ELF cubin or PTX text (binary bytes in what would be PTX)";
  EXPECT_EQ(validate(bytes(std::string_view(".version 8.0\0.target sm_90\n", 27))), binary);
  EXPECT_EQ(validate(bytes(ptx + "\x01\x02")), binary);
  EXPECT_EQ(validate(bytes(ptx + "\xb1")), binary);
  EXPECT_EQ(validate(bytes(ptx + std::string(2, '\0'))), binary);
  EXPECT_EQ(classify(bytes(ptx + "\xb1")), Format::kUnknown);
  EXPECT_EQ(validate(Bytes{}), "empty module image");
  EXPECT_EQ(validate(bytes(std::string(1, '\0'))), "empty module image");
  EXPECT_EQ(classify(Bytes{}), Format::kUnknown);
  EXPECT_EQ(validate(bytes("ab")), "ok");  // shorter than any magic: text
}

TEST(ModuleImage, FatbinWrapperIsRefused) {
  Bytes img(24);
  put<uint32_t>(img, 0, kFatbinWrapperMagic);
  put<uint32_t>(img, 4, 1);
  put<uint64_t>(img, 8, 0x7f0000001000u);
  EXPECT_EQ(classify(img), Format::kFatbinWrapper);
  EXPECT_EQ(validate(img),
            "fatbin wrapper (__fatBinC_Wrapper_t): it points at memory outside the image; send the fatbin itself");
}

TEST(ModuleImage, FormatNames) {
  EXPECT_STREQ(format_name(Format::kFatbin), "fatbin");
  EXPECT_STREQ(format_name(Format::kElf), "ELF");
  EXPECT_STREQ(format_name(Format::kPtx), "PTX");
  EXPECT_STREQ(format_name(Format::kFatbinWrapper), "fatbin wrapper");
  EXPECT_STREQ(format_name(Format::kUnknown), "unknown");
}

// ---------------------------------------------------------------- nvcc output

// The cubins of a fatbin have sections .nv.info.<kernel> (SHT_CUDA_INFO).
int kernels_in(std::span<const std::byte> cubin) {
  const ElfReader r(cubin);
  EXPECT_EQ(r.check(), ElfError::kNone);
  if (r.section_count() == 0 || r.header().shstrndx >= r.section_count()) return 0;
  const ElfSection names = r.section(r.header().shstrndx);
  if (!names.inside) return 0;
  int n = 0;
  for (uint16_t i = 0; i < r.section_count(); ++i) {
    const ElfSection s = r.section(i);
    if (s.type == kShtCudaInfo && s.name < names.size &&
        text(names.data).substr(s.name).starts_with(".nv.info."))
      ++n;
  }
  return n;
}

TEST(ModuleImage, NvccFatbinIsWalkedAndAccepted) {
  LOAD_OR_SKIP(img, "FATBIN_DEFAULT");
  EXPECT_EQ(validate(img), "ok");
  FatbinReader r(img);
  int cubins = 0, ptx = 0;
  for (FatbinEntry e; r.next(&e);) {
    EXPECT_GT(e.arch, 0u);
    if (e.is(EntryKind::kElf) && !e.compressed()) {
      ++cubins;
      EXPECT_EQ(classify(e.payload), Format::kElf);
      EXPECT_EQ(kernels_in(e.payload), 3) << "basic.cu has three kernels";
    }
    if (e.is(EntryKind::kPtx)) {
      ++ptx;
      EXPECT_TRUE(e.compressed()) << "nvcc 13 compresses PTX by default";
      EXPECT_TRUE(e.compressed_fits());
      EXPECT_GT(e.uncompressed_size, e.compressed_size);
    }
  }
  EXPECT_EQ(r.error(), FatbinError::kNone);
  EXPECT_EQ(r.offset(), img.size());
  EXPECT_GE(cubins, 1);
  EXPECT_EQ(ptx, 1);
}

TEST(ModuleImage, NvccVariantsAreAccepted) {
  for (const char* env : {"FATBIN_DEFAULT", "FATBIN_COMPRESSED", "FATBIN_LZ4", "FATBIN_PTX", "CUDA_BUILTINS_FATBIN"}) {
    const Bytes img = ordo::test::load_nvcc_output(env);
    if (img.empty()) continue;
    EXPECT_EQ(classify(img), Format::kFatbin) << env;
    EXPECT_EQ(validate(img), "ok") << env;
    FatbinReader r(img);
    int entries = 0;
    for (FatbinEntry e; r.next(&e);) ++entries;
    EXPECT_EQ(r.error(), FatbinError::kNone) << env;
    EXPECT_GE(entries, 1) << env;
  }
  LOAD_OR_SKIP(ptx, "PTX_TEXT");
  EXPECT_EQ(classify(ptx), Format::kPtx);
  EXPECT_EQ(validate(ptx), "ok");
}

TEST(ModuleImage, EveryTruncationOfAnNvccFatbinIsRefused) {
  LOAD_OR_SKIP(img, "FATBIN_DEFAULT");
  // Each in a heap block of its own size, so ASan (sanitizer builds) sees any overread.
  for (size_t n = 0; n < img.size(); n += (n < 256 ? 1 : 37)) {
    if (n == 1) continue;  // "P" (the magic's first byte) is one character of text: PTX to the validator
    const Bytes cut(img.begin(), img.begin() + ptrdiff_t(n));
    std::string why;
    EXPECT_FALSE(validate_module_image(cut, &why)) << n;
  }
}

}  // namespace
}  // namespace ordo::image

// The module-image reader (src/transport/module_image.h): classification, the
// fatbin and ELF walks and the validator the cuda backend runs on every image
// a guest sends, on images built here byte by byte and, where nvcc is found,
// on real nvcc output (paths from the environment, set by meson test; those
// tests skip without it). The validator's texts are checked word for word:
// the worker logs them, and tests/gpu matches some.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "nvcc_output.h"
#include "transport/kernel_resources.h"
#include "transport/module_image.h"

namespace ordo::image {
namespace {

using Bytes = std::vector<std::byte>;

template <class T>
void put(Bytes& v, size_t off, T value) {
  if (v.size() < off + sizeof value) v.resize(off + sizeof value);
  std::memcpy(v.data() + off, &value, sizeof value);
}

template <class T>
T get(const Bytes& v, size_t off) {
  T t;
  std::memcpy(&t, v.data() + off, sizeof t);
  return t;
}

Bytes bytes(std::string_view s) {
  Bytes v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

std::string validate(const Bytes& img) {
  std::string why;
  return validate_module_image(img, &why) ? "ok" : why;
}

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

std::string text(std::span<const std::byte> s) { return {reinterpret_cast<const char*>(s.data()), s.size()}; }

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

// ---------------------------------------------------------------- ELF images

// A 64-bit little-endian ELF: sections null, .shstrtab, .nv.info.k (SHT_CUDA_INFO,
// 8 bytes), .bss (NOBITS, larger than the file), then the section table.
struct Elf {
  Bytes img;
  size_t shoff = 0;
  size_t section(int i) const { return shoff + size_t(i) * 64; }
};

Elf elf() {
  Elf e;
  Bytes& b = e.img;
  b.resize(64);
  std::memcpy(b.data(), "\x7f" "ELF", 4);
  b[4] = std::byte{2};
  b[5] = std::byte{1};
  b[6] = std::byte{1};
  const std::string names = std::string("\0.shstrtab\0.nv.info.k\0.bss\0", 27);
  const size_t names_at = b.size();
  b.resize(names_at + names.size());
  std::memcpy(b.data() + names_at, names.data(), names.size());
  const size_t info_at = b.size();
  b.resize(info_at + 8, std::byte{0x11});
  b.resize((b.size() + 7) / 8 * 8);
  e.shoff = b.size();
  b.resize(e.shoff + 4 * 64);
  put<uint64_t>(b, 0x28, e.shoff);
  put<uint16_t>(b, 0x34, 64);   // e_ehsize
  put<uint16_t>(b, 0x3a, 64);   // e_shentsize
  put<uint16_t>(b, 0x3c, 4);    // e_shnum
  put<uint16_t>(b, 0x3e, 1);    // e_shstrndx
  auto sh = [&](int i, uint32_t name, uint32_t type, uint64_t off, uint64_t size) {
    put<uint32_t>(b, e.section(i), name);
    put<uint32_t>(b, e.section(i) + 4, type);
    put<uint64_t>(b, e.section(i) + 24, off);
    put<uint64_t>(b, e.section(i) + 32, size);
    put<uint32_t>(b, e.section(i) + 40, 7);
    put<uint64_t>(b, e.section(i) + 48, 4);
  };
  sh(1, 1, 3 /* SHT_STRTAB */, names_at, names.size());
  sh(2, 11, kShtCudaInfo, info_at, 8);
  sh(3, 22, kShtNobits, b.size() + 4096, 1 << 20);
  return e;
}

TEST(ModuleImage, ElfWalkReadsTheSectionTable) {
  const Elf e = elf();
  EXPECT_EQ(classify(e.img), Format::kElf);
  EXPECT_EQ(validate(e.img), "ok");
  const ElfReader r(e.img);
  ASSERT_TRUE(r.is_elf64());
  EXPECT_EQ(r.header().data, kElfLittleEndian);
  EXPECT_EQ(r.header().shstrndx, 1);
  EXPECT_TRUE(r.program_headers_inside());  // none
  ASSERT_EQ(r.section_count(), 4);
  const ElfSection names = r.section(1);
  ASSERT_TRUE(names.inside);
  const std::string n = text(names.data);
  const ElfSection info = r.section(2);
  EXPECT_EQ(info.type, kShtCudaInfo);
  EXPECT_STREQ(n.c_str() + info.name, ".nv.info.k");
  ASSERT_TRUE(info.inside);
  EXPECT_EQ(text(info.data), std::string(8, '\x11'));
  EXPECT_EQ(info.link, 7u);
  EXPECT_EQ(info.addralign, 4u);
  const ElfSection bss = r.section(3);
  EXPECT_EQ(bss.type, kShtNobits);
  EXPECT_FALSE(bss.inside);  // and that is fine: it has no bytes in the file
  EXPECT_TRUE(bss.data.empty());
  EXPECT_EQ(r.check(), ElfError::kNone);
  EXPECT_EQ(r.section(4).type, 0u) << "past the table: an empty section";
}

// libcuda sizes a bare ELF pointer from its headers: the section table here is
// last, and the NOBITS section past it does not count.
TEST(ModuleImage, ElfExtentIsWhereTheFurthestTableOrSectionEnds) {
  Elf e = elf();
  EXPECT_EQ(elf_extent(e.img.data()), e.img.size());
  // A section placed after the table extends the image; so do program headers.
  Bytes& b = e.img;
  put<uint64_t>(b, e.section(2) + 24, b.size() + 100);
  EXPECT_EQ(elf_extent(b.data()), b.size() + 108);
  put<uint64_t>(b, 0x20, b.size() + 500);  // e_phoff
  put<uint16_t>(b, 0x36, 56);              // e_phentsize
  put<uint16_t>(b, 0x38, 2);               // e_phnum
  EXPECT_EQ(elf_extent(b.data()), b.size() + 500 + 112);
  // No ELF64 with 64-byte section headers: no size.
  Bytes other = b;
  put<uint16_t>(other, 0x3a, 40);
  EXPECT_EQ(elf_extent(other.data()), 0u);
  other = b;
  other[4] = std::byte{1};
  EXPECT_EQ(elf_extent(other.data()), 0u);
  other = b;
  put<uint64_t>(other, 0x28, ~uint64_t{0} - 10);  // a table that wraps around
  EXPECT_EQ(elf_extent(other.data()), 0u);
}

TEST(ModuleImage, MalformedElfsAreRefusedWithTheBackendsTexts) {
  const Elf good = elf();
  Bytes img = good.img;
  img[4] = std::byte{1};  // ELFCLASS32
  EXPECT_EQ(validate(img), "not a 64-bit ELF cubin");
  EXPECT_FALSE(ElfReader(img).is_elf64());
  EXPECT_EQ(validate(Bytes(good.img.begin(), good.img.begin() + 40)), "not a 64-bit ELF cubin");

  img = good.img;
  put<uint64_t>(img, 0x20, ~uint64_t{0} - 8);  // program headers wrap around
  put<uint16_t>(img, 0x36, 56);
  put<uint16_t>(img, 0x38, 1);
  EXPECT_EQ(validate(img), "ELF program headers run past the image");

  img = good.img;
  put<uint64_t>(img, 0x28, img.size());  // the section table starts at the end
  EXPECT_EQ(validate(img), "ELF section headers run past the image");
  EXPECT_EQ(ElfReader(img).section_count(), 0);
  img = good.img;
  put<uint16_t>(img, 0x3c, 0xffff);
  EXPECT_EQ(validate(img), "ELF section headers run past the image");

  img = good.img;
  put<uint16_t>(img, 0x3a, 32);
  EXPECT_EQ(validate(img), "ELF section header size too small");
  put<uint16_t>(img, 0x3c, 0);  // ... which matters only with sections
  EXPECT_EQ(validate(img), "ok");

  img = good.img;
  put<uint64_t>(img, good.section(2) + 32, img.size());  // .nv.info.k's bytes run past the end
  EXPECT_EQ(validate(img), "ELF section runs past the image");
  EXPECT_FALSE(ElfReader(img).section(2).inside);
  EXPECT_EQ(ElfReader(img).check(), ElfError::kSectionRunsPast);
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

TEST(ModuleImage, NvccCubinsStandAlone) {
  LOAD_OR_SKIP(img, "FATBIN_DEFAULT");
  FatbinReader r(img);
  for (FatbinEntry e; r.next(&e);) {
    if (!e.is(EntryKind::kElf) || e.compressed()) continue;
    const Bytes cubin(e.payload.begin(), e.payload.end());
    EXPECT_EQ(validate(cubin), "ok");
    const ElfReader elf(cubin);
    ASSERT_TRUE(elf.is_elf64());
    // What libcuda sends of a bare cubin pointer: all of it but the entry's padding.
    const uint64_t extent = elf_extent(cubin.data());
    EXPECT_LE(extent, cubin.size());
    EXPECT_GT(extent, cubin.size() - 64);
    EXPECT_EQ(validate(Bytes(cubin.begin(), cubin.begin() + ptrdiff_t(extent))), "ok");
    EXPECT_EQ(elf.header().data, kElfLittleEndian);
    // Cut inside the section table: refused (by the program headers first where they follow it).
    const Bytes cut(cubin.begin(), cubin.begin() + ptrdiff_t(elf.header().shoff + 1));
    const std::string why = validate(cut);
    EXPECT_TRUE(why == "ELF section headers run past the image" || why == "ELF program headers run past the image")
        << why;
  }
}

// ---------------------------------------------------------------- kernel resources

TEST(KernelResources, NvInfoRecordsAreWalkedAndTruncationsRefused) {
  // REGCOUNT {symbol 3, 40 registers}, a u16 record, a valueless one (4 bytes,
  // as nvcc writes them: read as 2 once, they failed every kernel that reads
  // blockIdx.z), a byte.
  const Bytes b = {std::byte{4}, std::byte{0x2f}, std::byte{8}, std::byte{0}, std::byte{3}, std::byte{0},
                   std::byte{0}, std::byte{0}, std::byte{40}, std::byte{0}, std::byte{0}, std::byte{0},
                   std::byte{3}, std::byte{0x19}, std::byte{0x10}, std::byte{0x01}, std::byte{1}, std::byte{0x04},
                   std::byte{0}, std::byte{0}, std::byte{2}, std::byte{0x4c}, std::byte{7}, std::byte{0}};
  std::vector<NvInfoRecord> seen;
  ASSERT_TRUE(walk_nv_info(b, [&](const NvInfoRecord& r) { seen.push_back(r); }));
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].attr, 0x2f);
  EXPECT_EQ(seen[0].value.size(), 8u);
  EXPECT_EQ(seen[1].hval, 0x110);
  EXPECT_EQ(seen[2].format, kNvFmtNval);
  EXPECT_EQ(seen[3].hval, 7);
  // Every cut inside a record with a value is refused; the value never reaches past the cut.
  for (size_t n : {3, 4, 5, 11, 15, 23}) {  // (a lone trailing byte is no record: ignored)
    const Bytes cut(b.begin(), b.begin() + ptrdiff_t(n));
    EXPECT_FALSE(walk_nv_info(cut, [&](const NvInfoRecord& r) {
      if (!r.value.empty()) {
        EXPECT_LE(r.value.data() + r.value.size(), cut.data() + cut.size());
      }
    })) << n;
  }
  const Bytes unknown = {std::byte{9}, std::byte{1}, std::byte{0}, std::byte{0}};
  EXPECT_FALSE(walk_nv_info(unknown, [](const NvInfoRecord&) {}));
}

TEST(KernelResources, NvccCubinsStateEachKernelsRegisters) {
  LOAD_OR_SKIP(img, "FATBIN_DEFAULT");
  KernelResourceMap m;
  ASSERT_TRUE(image_resources(img, 90, &m));
  EXPECT_EQ(m.size(), 3u) << "basic.cu has three kernels";
  for (const auto& [name, r] : m) {
    EXPECT_GT(r.registers, 0u) << name;
    EXPECT_LE(r.registers, 255u) << name;
    EXPECT_EQ(r.max_threads, 0u) << name << ": no launch bound";
  }
  // PTX alone: what the device compiles is its own.
  LOAD_OR_SKIP(ptx, "PTX_TEXT");
  KernelResourceMap none;
  EXPECT_FALSE(image_resources(ptx, 90, &none));
  EXPECT_TRUE(none.empty());
}

// A cubin made of `sections` (name, type, bytes, sh_link, NOBITS size), after
// the null section and .shstrtab (section 1).
struct Section {
  std::string name;
  uint32_t type;
  Bytes data;
  uint32_t link = 0;
  uint64_t nobits_size = 0;
};
Bytes cubin_of(const std::vector<Section>& sections) {
  Bytes b(64);
  std::memcpy(b.data(), "\x7f" "ELF", 4);
  b[4] = std::byte{2};
  b[5] = std::byte{1};
  std::string names(1, '\0');
  std::vector<uint32_t> name_at;
  for (const Section& s : sections) {
    name_at.push_back(uint32_t(names.size()));
    names += s.name + '\0';
  }
  const uint32_t shstrtab_name = uint32_t(names.size());
  names += ".shstrtab";
  names += '\0';
  std::vector<std::pair<uint64_t, uint64_t>> at;  // offset, size of each section's bytes
  auto append = [&b](const void* p, size_t n) {
    const size_t o = b.size();
    b.resize(o + n);
    if (n) std::memcpy(b.data() + o, p, n);
    return o;
  };
  const size_t names_off = append(names.data(), names.size());
  for (const Section& s : sections) at.push_back({append(s.data.data(), s.data.size()), s.data.size()});
  b.resize((b.size() + 7) / 8 * 8);
  const size_t shoff = b.size();
  const uint16_t shnum = uint16_t(sections.size() + 2);
  b.resize(shoff + size_t(shnum) * 64);
  put<uint64_t>(b, 0x28, shoff);
  put<uint16_t>(b, 0x3a, 64);
  put<uint16_t>(b, 0x3c, shnum);
  put<uint16_t>(b, 0x3e, 1);
  auto sh = [&](size_t i, uint32_t name, uint32_t type, uint64_t off, uint64_t size, uint32_t link) {
    put<uint32_t>(b, shoff + i * 64, name);
    put<uint32_t>(b, shoff + i * 64 + 4, type);
    put<uint64_t>(b, shoff + i * 64 + 24, off);
    put<uint64_t>(b, shoff + i * 64 + 32, size);
    put<uint32_t>(b, shoff + i * 64 + 40, link);
  };
  sh(1, shstrtab_name, 3, names_off, names.size(), 0);
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    sh(i + 2, name_at[i], s.type, at[i].first, s.type == kShtNobits ? s.nobits_size : at[i].second, s.link);
  }
  return b;
}

Bytes sval(uint8_t attr, std::initializer_list<uint32_t> words) {
  Bytes r = {std::byte{4}, std::byte{attr}, std::byte(words.size() * 4), std::byte{0}};
  for (uint32_t w : words)
    for (int i = 0; i < 4; ++i) r.push_back(std::byte(w >> (8 * i)));
  return r;
}

Bytes symtab(size_t count, uint32_t name_step) {
  Bytes t(24 * count);  // Elf64_Sym: st_name first
  for (size_t i = 0; i < count; ++i) put<uint32_t>(t, i * 24, uint32_t(i) * name_step);
  return t;
}

// What an image claims is bounded before anyone computes with it: a device
// has 255 registers per thread at most, a block 1024 threads.
TEST(KernelResources, ClaimsAreBounded) {
  Bytes info = sval(0x2f, {1, 0x08000000});  // REGCOUNT of symbol 1
  const Bytes frame = sval(0x11, {1, 0xffffffff});
  info.insert(info.end(), frame.begin(), frame.end());
  const std::string strtab = std::string("\0k\0", 3);
  const Bytes img = cubin_of({
      {".strtab", 3, Bytes(reinterpret_cast<const std::byte*>(strtab.data()),
                           reinterpret_cast<const std::byte*>(strtab.data()) + strtab.size())},
      {".symtab", kShtSymtab, symtab(2, 1), 2},  // links .strtab (section 2)
      {".nv.info", kShtCudaInfo, info},
      {".nv.info.k", kShtCudaInfo, sval(0x05, {0xffffffff, 0xffffffff, 0xffffffff})},
      {".nv.shared.k", kShtNobits, {}, 0, uint64_t{1} << 40},
  });
  KernelResourceMap m;
  ASSERT_TRUE(cubin_resources(img, &m));
  ASSERT_EQ(m.count("k"), 1u);
  const KernelResources& k = m.at("k");
  EXPECT_EQ(k.registers, 255u);
  EXPECT_EQ(k.local_bytes, 1u << 30);
  EXPECT_EQ(k.shared_bytes, 1u << 30);
  EXPECT_EQ(k.max_threads, 1025u);
}

// From sm_90 on, each kernel's shared section starts with the 1 KiB the
// device reserves per block: not the kernel's own.
TEST(KernelResources, TheReservedSharedMemoryIsNotTheKernels) {
  const Bytes with = cubin_of({
      {".nv.shared.reserved.0", kShtNobits, {}, 0, 0},
      {".nv.shared.k", kShtNobits, {}, 0, 0x590},
      {".nv.shared.none", kShtNobits, {}, 0, 0x400},
  });
  KernelResourceMap m;
  ASSERT_TRUE(cubin_resources(with, &m));
  EXPECT_EQ(m.at("k").shared_bytes, 0x190u);
  EXPECT_EQ(m.at("none").shared_bytes, 0u);
  EXPECT_EQ(m.count("reserved.0"), 0u);
  const Bytes without = cubin_of({{".nv.shared.k", kShtNobits, {}, 0, 0x190}});
  KernelResourceMap old;
  ASSERT_TRUE(cubin_resources(without, &old));
  EXPECT_EQ(old.at("k").shared_bytes, 0x190u);
}

// A symbol table whose names never end would make every symbol a name as
// long as the table: names are bounded, and one without its NUL is none.
TEST(KernelResources, NamesWithoutEndsAreNoNames) {
  const Bytes strtab(1 << 16, std::byte{'a'});
  Bytes info;
  for (uint32_t i = 0; i < 2000; ++i) {
    const Bytes r = sval(0x2f, {i, 32});
    info.insert(info.end(), r.begin(), r.end());
  }
  const Bytes img = cubin_of({
      {".strtab", 3, strtab},
      {".symtab", kShtSymtab, symtab(2000, 7), 2},
      {".nv.info", kShtCudaInfo, info},
  });
  KernelResourceMap m;
  EXPECT_TRUE(cubin_resources(img, &m));
  EXPECT_TRUE(m.empty());
}

// The cuda backend's built-ins carry a cubin per architecture: the one a
// device would load is read (the highest up to its own, else the lowest).
TEST(KernelResources, TheCubinForTheDevicesArchitectureIsRead) {
  LOAD_OR_SKIP(img, "CUDA_BUILTINS_FATBIN");
  std::map<uint32_t, KernelResourceMap> by_arch;
  FatbinReader r(img);
  for (FatbinEntry e; r.next(&e);)
    if (e.is(EntryKind::kElf) && !e.compressed()) {
      ASSERT_TRUE(cubin_resources(e.payload, &by_arch[e.arch]));
    }
  ASSERT_GE(by_arch.size(), 3u);
  const uint32_t lowest = by_arch.begin()->first;
  for (uint32_t arch : {lowest - 5, lowest, lowest + 1, 90u, 91u, 200u}) {
    KernelResourceMap m;
    ASSERT_TRUE(image_resources(img, arch, &m)) << arch;
    auto want = by_arch.upper_bound(arch);
    want = want == by_arch.begin() ? by_arch.begin() : std::prev(want);
    ASSERT_EQ(m.size(), want->second.size()) << arch;
    for (const auto& [name, res] : m) {
      EXPECT_EQ(res.registers, want->second.at(name).registers) << arch << " " << name;
      EXPECT_EQ(res.shared_bytes, want->second.at(name).shared_bytes) << arch << " " << name;
    }
  }
  // Any prefix of a cubin reads without reading past it (ASan builds check).
  const auto sm90 = by_arch.find(90);
  if (sm90 == by_arch.end()) return;
  FatbinReader again(img);
  for (FatbinEntry e; again.next(&e);) {
    if (!e.is(EntryKind::kElf) || e.arch != 90 || e.compressed()) continue;
    for (size_t n = 0; n < e.payload.size(); n += 61) {
      const Bytes cut(e.payload.begin(), e.payload.begin() + ptrdiff_t(n));
      KernelResourceMap m;
      cubin_resources(cut, &m);
    }
  }
}

}  // namespace
}  // namespace ordo::image

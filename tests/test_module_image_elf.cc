// The module-image reader's ELF walk (src/transport/module_image.h): the
// section table of a cubin, the extent libcuda reads a bare ELF pointer to,
// and the validator's refusals, word for word (the worker logs them), on ELFs
// built here byte by byte and, where nvcc is found, on the cubins of nvcc's
// fatbin (FATBIN_DEFAULT, set by meson test; skipped without it). The fatbin
// walk and PTX are tested in test_module_image.cc.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "image_bytes.h"
#include "nvcc_output.h"
#include "transport/module_image.h"

namespace ordo::image {
namespace {

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

// ---------------------------------------------------------------- nvcc output

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

}  // namespace
}  // namespace ordo::image

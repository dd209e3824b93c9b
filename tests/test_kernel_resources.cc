// The kernel resources read from an image (src/transport/kernel_resources.h):
// the .nv.info records' walk, each kernel's registers, shared and local memory
// and launch bound from a cubin's sections, bounded before anyone computes with
// them, and the cubin a device of a given architecture would load, on cubins
// built here byte by byte and, where nvcc is found, on nvcc's (FATBIN_DEFAULT,
// PTX_TEXT, CUDA_BUILTINS_FATBIN, set by meson test; those tests skip without it).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "image_bytes.h"
#include "nvcc_output.h"
#include "transport/kernel_resources.h"
#include "transport/module_image.h"

namespace ordo::image {
namespace {

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

// Compressed cubins (-Xfatbin -compress-all: zstd, and LZ4 with
// --compress-mode=speed; NVIDIA's libraries ship theirs compressed) state the
// same resources once decompressed.
TEST(KernelResources, CompressedCubinsAreRead) {
  LOAD_OR_SKIP(plain, "FATBIN_DEFAULT");
  KernelResourceMap want;
  ASSERT_TRUE(image_resources(plain, 90, &want));
  for (const char* var : {"FATBIN_COMPRESSED", "FATBIN_LZ4"}) {
    LOAD_OR_SKIP(img, var);
    bool compressed = false;
    FatbinReader r(img);
    for (FatbinEntry e; r.next(&e);) compressed |= e.is(EntryKind::kElf) && e.compressed();
    ASSERT_TRUE(compressed) << var << " has no compressed cubin to read";
    KernelResourceMap m;
    ASSERT_TRUE(image_resources(img, 90, &m)) << var;
    ASSERT_EQ(m.size(), want.size()) << var;
    for (const auto& [name, res] : want) {
      ASSERT_TRUE(m.count(name)) << var << " " << name;
      EXPECT_EQ(m.at(name).registers, res.registers) << var << " " << name;
      EXPECT_EQ(m.at(name).shared_bytes, res.shared_bytes) << var << " " << name;
      EXPECT_EQ(m.at(name).max_threads, res.max_threads) << var << " " << name;
    }
  }
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

// libFuzzer target for the module-image reader (src/transport/module_image.h),
// what the cuda backend runs on every image a guest sends before the driver
// sees it: arbitrary bytes through classify, the validator and both walkers
// (fatbin entries, ELF sections, and the ELF inside each fatbin entry).
// The input is copied into a heap block of its exact size, so ASan reports
// any read past it; the invariants below trap if a walker hands out a span
// outside the image, or if the validator accepts what the walkers refuse (or
// the other way round).
//
// Built by scripts/fuzz.sh (clang, libFuzzer, ASan, UBSan); its corpus,
// tests/fuzz/corpus_module_image, is replayed by `meson test
// fuzz_corpus_module_image` through replay_main.cc with any compiler.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "transport/lz4.h"
#include "transport/module_image.h"

namespace {

using namespace ordo::image;

#define CHECK(c)                                                                   \
  do {                                                                             \
    if (!(c)) {                                                                    \
      std::fprintf(stderr, "fuzz_module_image: %s:%d: %s\n", __FILE__, __LINE__, #c); \
      std::abort();                                                                \
    }                                                                              \
  } while (0)

// `part` lies inside `whole` (an empty part anywhere up to its end).
bool within(std::span<const std::byte> part, std::span<const std::byte> whole) {
  const auto* b = whole.data();
  const auto* p = part.data();
  if (part.empty()) return p == nullptr || (p >= b && p <= b + whole.size());
  return p >= b && part.size() <= whole.size() && uint64_t(p - b) <= whole.size() - part.size();
}

// Walks an ELF's sections; returns whether every non-NOBITS one is inside.
bool walk_elf(std::span<const std::byte> img) {
  const ElfReader r(img);
  if (!r.is_elf64()) {
    CHECK(r.section_count() == 0);
    CHECK(r.check() == ElfError::kNotElf64);
    return false;
  }
  const ElfHeader& h = r.header();
  CHECK(h.elf_class == kElfClass64);
  const bool table = r.section_table_error() == ElfError::kNone;
  CHECK(r.section_count() == (table ? h.shnum : 0));
  if (table && h.shnum != 0) {
    CHECK(h.shentsize >= kElfSectionHeaderSize);
    CHECK(h.shoff + uint64_t{h.shnum} * h.shentsize <= img.size());
  }
  bool sections_inside = true;
  for (uint16_t i = 0; i < r.section_count(); ++i) {
    const ElfSection s = r.section(i);
    if (s.inside) {
      CHECK(s.offset <= img.size() && s.size <= img.size() - s.offset);
      CHECK(s.data.size() == s.size);
      CHECK(s.data.empty() || s.data.data() == img.data() + s.offset);
      CHECK(within(s.data, img));
    } else {
      CHECK(s.data.empty());
      if (s.type != kShtNobits) sections_inside = false;
    }
  }
  const ElfError e = r.check();
  CHECK((e == ElfError::kNone) ==
        (r.program_headers_inside() && r.section_table_error() == ElfError::kNone && sections_inside));
  if (e == ElfError::kNone && h.phnum != 0) CHECK(h.phoff + uint64_t{h.phnum} * h.phentsize <= img.size());
  return e == ElfError::kNone;
}

// What libcuda.so.1 does with an LZ4 entry: decompress it into a heap block
// of the stated size (ASan sees any write past it), then read what came out.
void inflate_lz4(const FatbinEntry& e) {
  constexpr uint64_t kMaxOut = uint64_t{1} << 22;  // the guest allows more; the fuzzer has no use for it
  if (!(e.flags & kEntryLz4) || !e.compressed_fits() || e.uncompressed_size > kMaxOut) return;
  std::vector<std::byte> out(e.uncompressed_size);
  const Lz4Error err = lz4_decompress(e.payload.first(e.compressed_size), out);
  CHECK(describe(err)[0] != '\0' || err == Lz4Error::kNone);
  if (err != Lz4Error::kNone) return;
  if (e.is(EntryKind::kElf)) walk_elf(out);
  if (e.is(EntryKind::kPtx)) is_ptx_text(out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> copy(size);
  if (size) std::memcpy(copy.data(), data, size);
  const std::span<const std::byte> img(copy);

  std::string why;
  const bool ok = validate_module_image(img, &why);
  CHECK(ok || !why.empty());
  const Format f = classify(img);
  CHECK(format_name(f)[0] != '\0');

  // The fatbin walk: every entry inside the body, back to back, in order.
  FatbinReader r(img);
  bool all_fit = true;  // of the entries walked: the validator stops at the first that is not
  uint64_t entries = 0;
  if (r.error() == FatbinError::kNone) {
    CHECK(f == Format::kFatbin);
    const FatbinHeader& h = r.header();
    CHECK(h.header_size >= kFatbinHeaderSize && h.total_size() <= img.size());
    uint64_t next = h.header_size;
    for (FatbinEntry e; r.next(&e); ++entries) {
      CHECK(e.offset == next);
      CHECK(e.header_size >= kFatbinEntryHeaderSize && e.header.size() == e.header_size);
      CHECK(e.payload.size() == e.payload_size);
      CHECK(e.header.data() == img.data() + e.offset);
      CHECK(e.payload.data() == e.header.data() + e.header_size);
      CHECK(within(e.header, img) && within(e.payload, img));
      next = e.offset + e.header_size + e.payload_size;
      CHECK(next <= h.total_size());
      all_fit = all_fit && e.compressed_fits();
      // What libcuda.so.1 reads inside an entry: a cubin's sections, or PTX.
      if (e.is(EntryKind::kElf) && !e.compressed()) walk_elf(e.payload);
      if (e.is(EntryKind::kPtx) && !e.compressed()) is_ptx_text(e.payload);
      inflate_lz4(e);
    }
    CHECK(!r.next(nullptr));  // stays at its end (or error): next() must not touch the entry
    if (r.error() == FatbinError::kNone) CHECK(next == h.total_size());
  } else {
    CHECK(!r.next(nullptr));
  }

  const bool elf_ok = walk_elf(img);

  // The validator says what the walkers found.
  switch (f) {
    case Format::kFatbin:
      CHECK(ok == (r.error() == FatbinError::kNone && all_fit));
      if (!all_fit) CHECK(why == "fatbin entry's compressed size runs past its payload");
      else if (!ok) CHECK(why == describe(r.error()));
      break;
    case Format::kElf:
      CHECK(ok == elf_ok);
      if (!ok) CHECK(why == describe(ElfReader(img).check()));
      break;
    case Format::kPtx:
      CHECK(ok && is_ptx_text(img));
      break;
    case Format::kFatbinWrapper:
    case Format::kUnknown:
      CHECK(!ok);
      break;
  }
  if (f != Format::kFatbin) CHECK(r.error() == FatbinError::kNotFatbin && entries == 0);
  if (f != Format::kElf) CHECK(!elf_ok);
  return 0;
}

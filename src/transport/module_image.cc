#include "transport/module_image.h"

#include <algorithm>
#include <cstring>

namespace ordo::image {
namespace {

// A little-endian T at `off`; the caller has checked that it lies in `b`.
template <class T>
T load(std::span<const std::byte> b, uint64_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

uint32_t magic_of(std::span<const std::byte> b) { return b.size() >= 4 ? load<uint32_t>(b, 0) : 0; }

}  // namespace

Format classify(std::span<const std::byte> image) {
  switch (magic_of(image)) {
    case kFatbinMagic:
      return Format::kFatbin;
    case kElfMagic:
      return Format::kElf;
    case kFatbinWrapperMagic:
      return Format::kFatbinWrapper;
    default:
      return is_ptx_text(image) ? Format::kPtx : Format::kUnknown;
  }
}

const char* format_name(Format f) {
  switch (f) {
    case Format::kFatbin:
      return "fatbin";
    case Format::kFatbinWrapper:
      return "fatbin wrapper";
    case Format::kElf:
      return "ELF";
    case Format::kPtx:
      return "PTX";
    case Format::kUnknown:
      break;
  }
  return "unknown";
}

bool is_ptx_text(std::span<const std::byte> image) {
  const uint64_t n = image.size();
  const uint64_t text = n > 0 && image[n - 1] == std::byte{0} ? n - 1 : n;
  if (text == 0) return false;
  for (uint64_t i = 0; i < text; ++i) {
    const uint8_t c = uint8_t(image[i]);
    if ((c < 0x20 || c > 0x7e) && !(c >= '\t' && c <= '\r')) return false;
  }
  return true;
}

// ---------------------------------------------------------------- fatbin

bool read_fatbin_header(std::span<const std::byte> b, FatbinHeader* out) {
  if (b.size() < kFatbinHeaderSize || magic_of(b) != kFatbinMagic) return false;
  out->version = load<uint16_t>(b, 4);
  out->header_size = load<uint16_t>(b, 6);
  out->body_size = load<uint64_t>(b, 8);
  return true;
}

const char* describe(FatbinError e) {
  switch (e) {
    case FatbinError::kNone:
      return "";
    case FatbinError::kNotFatbin:
      return "not a fatbin (bad magic)";
    case FatbinError::kHeaderTruncated:
      return "fatbin header truncated";
    case FatbinError::kSizeRunsPast:
      return "fatbin size runs past the image";
    case FatbinError::kEntryHeaderTruncated:
      return "fatbin entry header truncated";
    case FatbinError::kEntryHeaderTooSmall:
      return "fatbin entry header smaller than 64 bytes";
    case FatbinError::kEntryRunsPast:
      return "fatbin entry runs past the image";
  }
  return "fatbin error";
}

FatbinReader::FatbinReader(std::span<const std::byte> image) : image_(image) {
  const uint64_t n = image.size();
  if (magic_of(image) != kFatbinMagic) {
    error_ = FatbinError::kNotFatbin;
  } else if (!read_fatbin_header(image, &header_)) {
    error_ = FatbinError::kHeaderTruncated;
  } else if (header_.header_size < kFatbinHeaderSize || header_.header_size > n ||
             header_.body_size > n - header_.header_size) {
    error_ = FatbinError::kSizeRunsPast;
  } else {
    off_ = header_.header_size;
    end_ = header_.total_size();  // <= n
  }
}

bool FatbinReader::next(FatbinEntry* e) {
  if (error_ != FatbinError::kNone || off_ >= end_) return false;
  // off_ < end_ <= image size from here on.
  const uint64_t left = end_ - off_;
  if (left < kFatbinEntryHeaderSize) {
    error_ = FatbinError::kEntryHeaderTruncated;
    return false;
  }
  const uint64_t eh = load<uint32_t>(image_, off_ + 4);
  const uint64_t ep = load<uint64_t>(image_, off_ + 8);
  if (eh < kFatbinEntryHeaderSize) {
    error_ = FatbinError::kEntryHeaderTooSmall;
    return false;
  }
  if (eh > left || ep > left - eh) {
    error_ = FatbinError::kEntryRunsPast;
    return false;
  }
  e->offset = off_;
  e->kind = load<uint16_t>(image_, off_);
  e->version = load<uint16_t>(image_, off_ + 2);
  e->header_size = uint32_t(eh);
  e->payload_size = ep;
  e->compressed_size = load<uint32_t>(image_, off_ + 16);
  e->arch = load<uint32_t>(image_, off_ + 28);
  e->flags = load<uint64_t>(image_, off_ + 40);
  e->uncompressed_size = load<uint64_t>(image_, off_ + 56);
  e->header = image_.subspan(off_, eh);
  e->payload = image_.subspan(off_ + eh, ep);
  off_ += eh + ep;
  return true;
}

// ---------------------------------------------------------------- ELF

const char* describe(ElfError e) {
  switch (e) {
    case ElfError::kNone:
      return "";
    case ElfError::kNotElf64:
      return "not a 64-bit ELF cubin";
    case ElfError::kProgramHeadersRunPast:
      return "ELF program headers run past the image";
    case ElfError::kSectionHeadersRunPast:
      return "ELF section headers run past the image";
    case ElfError::kSectionHeaderTooSmall:
      return "ELF section header size too small";
    case ElfError::kSectionRunsPast:
      return "ELF section runs past the image";
  }
  return "ELF error";
}

ElfReader::ElfReader(std::span<const std::byte> image) : image_(image) {
  if (image.size() < kElfHeaderSize || magic_of(image) != kElfMagic || uint8_t(image[4]) != kElfClass64) return;
  elf64_ = true;
  header_.elf_class = uint8_t(image[4]);
  header_.data = uint8_t(image[5]);
  header_.phoff = load<uint64_t>(image, 0x20);
  header_.shoff = load<uint64_t>(image, 0x28);
  header_.phentsize = load<uint16_t>(image, 0x36);
  header_.phnum = load<uint16_t>(image, 0x38);
  header_.shentsize = load<uint16_t>(image, 0x3a);
  header_.shnum = load<uint16_t>(image, 0x3c);
  header_.shstrndx = load<uint16_t>(image, 0x3e);
}

bool ElfReader::program_headers_inside() const {
  const uint64_t n = image_.size();
  return elf64_ && header_.phoff <= n && uint64_t{header_.phentsize} * header_.phnum <= n - header_.phoff;
}

ElfError ElfReader::section_table_error() const {
  const uint64_t n = image_.size();
  if (!elf64_) return ElfError::kNotElf64;
  if (header_.shoff > n || uint64_t{header_.shentsize} * header_.shnum > n - header_.shoff)
    return ElfError::kSectionHeadersRunPast;
  if (header_.shnum != 0 && header_.shentsize < kElfSectionHeaderSize) return ElfError::kSectionHeaderTooSmall;
  return ElfError::kNone;
}

ElfSection ElfReader::section(uint16_t i) const {
  ElfSection s;
  if (i >= section_count()) return s;
  // Inside: i < shnum, shentsize >= 64 and shnum * shentsize <= size - shoff.
  const uint64_t h = header_.shoff + uint64_t{i} * header_.shentsize;
  s.name = load<uint32_t>(image_, h);
  s.type = load<uint32_t>(image_, h + 4);
  s.flags = load<uint64_t>(image_, h + 8);
  s.addr = load<uint64_t>(image_, h + 16);
  s.offset = load<uint64_t>(image_, h + 24);
  s.size = load<uint64_t>(image_, h + 32);
  s.link = load<uint32_t>(image_, h + 40);
  s.info = load<uint32_t>(image_, h + 44);
  s.addralign = load<uint64_t>(image_, h + 48);
  s.entsize = load<uint64_t>(image_, h + 56);
  s.inside = s.offset <= image_.size() && s.size <= image_.size() - s.offset;
  if (s.inside) s.data = image_.subspan(s.offset, s.size);
  return s;
}

ElfError ElfReader::check() const {
  if (!elf64_) return ElfError::kNotElf64;
  if (!program_headers_inside()) return ElfError::kProgramHeadersRunPast;
  if (const ElfError e = section_table_error(); e != ElfError::kNone) return e;
  for (uint16_t i = 0; i < section_count(); ++i) {
    const ElfSection s = section(i);
    if (s.type != kShtNobits && !s.inside) return ElfError::kSectionRunsPast;
  }
  return ElfError::kNone;
}

uint64_t elf_extent(const std::byte* p) {
  const ElfReader head({p, kElfHeaderSize});
  const ElfHeader& h = head.header();
  if (!head.is_elf64() || h.shentsize != kElfSectionHeaderSize) return 0;
  const uint64_t table_end = h.shoff + uint64_t{h.shnum} * h.shentsize;
  const uint64_t program_end = h.phoff + uint64_t{h.phnum} * h.phentsize;
  if (table_end < h.shoff || program_end < h.phoff) return 0;  // wrapped: no real image says that
  uint64_t end = std::max({kElfHeaderSize, table_end, program_end});
  const ElfReader whole({p, table_end});
  for (uint16_t i = 0; i < whole.section_count(); ++i) {
    const ElfSection s = whole.section(i);
    if (s.type != kShtNobits) end = std::max(end, s.offset + s.size);
  }
  return end;
}

// ---------------------------------------------------------------- validation

bool validate_module_image(std::span<const std::byte> img, std::string* why) {
  auto fail = [&](const char* w) {
    *why = w;
    return false;
  };
  switch (classify(img)) {
    case Format::kFatbin: {
      FatbinReader r(img);
      for (FatbinEntry e; r.next(&e);)
        if (!e.compressed_fits()) return fail("fatbin entry's compressed size runs past its payload");
      return r.error() == FatbinError::kNone || fail(describe(r.error()));
    }
    case Format::kElf: {
      const ElfError e = ElfReader(img).check();
      return e == ElfError::kNone || fail(describe(e));
    }
    case Format::kFatbinWrapper:
      return fail("fatbin wrapper (__fatBinC_Wrapper_t): it points at memory outside the image; send the fatbin itself");
    case Format::kPtx:
      return true;  // load_module terminates its copy
    case Format::kUnknown:
      break;
  }
  const bool empty = img.empty() || (img.size() == 1 && img[0] == std::byte{0});
  return fail(empty ? "empty module image"
                    : "not a fatbin, a 64-bit ELF cubin or PTX text (binary bytes in what would be PTX)");
}

}  // namespace ordo::image

// Module images: the bytes a CUDA program hands cuModuleLoadData or
// __cudaRegisterFatBinary, which libcuda.so.1 sends the worker to load. One
// reader of their formats for both sides: the cuda backend validates every
// image with it before the driver sees the bytes (validate_module_image), and
// libcuda.so.1 walks fatbins and cubins with it for kernel parameter layouts
// (src/guest/cuda/fatbin.cc). The bytes come from the guest: every read is
// checked against the span given, never against a size the image states.
// It needs nothing but the C++ standard library (no Boost, no liburing), so
// the guest's libcuda.so.1 and a fuzzer link it alone (module_image_dep).
//
// Formats (little-endian):
//   fatbin container (nvcc -fatbin; what nvcc's wrapper points at)
//     header  +0 u32 magic 0xBA55ED50  +4 u16 version  +6 u16 header_size  +8 u64 body_size
//     entries, back to back over body_size bytes after the header, each:
//       +0  u16 kind (EntryKind; others, e.g. LTO IR, are skipped)  +2 u16 version
//       +4  u32 header_size               +8  u64 payload_size (padded)
//       +16 u32 compressed_size (0: not compressed)                +28 u32 sm arch
//       +40 u64 flags (0x8000: zstd-compressed, 0x2000: LZ4)      +56 u64 uncompressed size
//       payload at entry + header_size. The driver reads every entry header up
//       to +63, whatever size it states, so a header has at least 64 bytes.
//     nvcc 13 compresses PTX by default and cubins only with -Xfatbin -compress-all
//     (zstd; LZ4 with --compress-mode=speed, decompressed by lz4.h).
//   fatbin wrapper (__fatBinC_Wrapper_t, magic 0x466243b1): int magic, int
//     version, then a pointer to the fatbin. Only meaningful in the process
//     that made it: the driver would follow an address chosen by the guest.
//   ELF cubin: a 64-bit ELF (Elf64_Ehdr, Elf64_Shdr); kernel attributes in
//     SHT_CUDA_INFO sections (.nv.info.<kernel>).
//   PTX: text, optionally NUL-terminated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ordo::image {

inline constexpr uint32_t kFatbinMagic = 0xBA55ED50;
inline constexpr uint32_t kFatbinWrapperMagic = 0x466243b1;  // __fatDeviceText
inline constexpr uint32_t kElfMagic = 0x464c457f;            // "\x7f" "ELF", read as a u32
inline constexpr uint64_t kFatbinHeaderSize = 16;            // the smallest fatbin header
inline constexpr uint64_t kFatbinEntryHeaderSize = 64;       // what the driver reads of each entry header
inline constexpr uint64_t kElfHeaderSize = 64;               // Elf64_Ehdr
inline constexpr uint64_t kElfSectionHeaderSize = 64;        // Elf64_Shdr

// What a fatbin entry holds (its u16 kind).
enum class EntryKind : uint16_t { kPtx = 1, kElf = 2 };
// A fatbin entry's flags.
inline constexpr uint64_t kEntryZstd = 0x8000;
inline constexpr uint64_t kEntryLz4 = 0x2000;

// ELF constants read here.
inline constexpr uint8_t kElfClass64 = 2;          // e_ident[EI_CLASS]
inline constexpr uint8_t kElfLittleEndian = 1;     // e_ident[EI_DATA]
inline constexpr uint32_t kShtSymtab = 2;
inline constexpr uint32_t kShtNobits = 8;          // no bytes in the file
inline constexpr uint32_t kShtCudaInfo = 0x70000000;

// What an image is, from its first bytes (and, for PTX, all of them): a
// fatbin or an ELF by magic (whether well-formed or not: see the readers),
// the wrapper by magic, PTX if it is text (is_ptx_text). Anything else,
// including an empty image, is kUnknown.
enum class Format { kUnknown, kFatbin, kFatbinWrapper, kElf, kPtx };
Format classify(std::span<const std::byte> image);
const char* format_name(Format f);

// Printable ASCII and whitespace (\t..\r), at least one character, optionally
// followed by one NUL.
bool is_ptx_text(std::span<const std::byte> image);

// ---------------------------------------------------------------- fatbin

struct FatbinHeader {
  uint16_t version = 0;
  uint16_t header_size = 0;
  uint64_t body_size = 0;
  uint64_t total_size() const { return uint64_t{header_size} + body_size; }
};

// Reads a fatbin header from the first 16 bytes of `b`: false if `b` is
// shorter or has no fatbin magic. The sizes are the image's, unchecked.
bool read_fatbin_header(std::span<const std::byte> b, FatbinHeader* out);

// One entry of a fatbin, as FatbinReader::next found it: its fields and spans
// lie inside the body (the compressed size is only read, see compressed_fits).
struct FatbinEntry {
  uint64_t offset = 0;  // of the entry header, in the image
  uint16_t kind = 0;    // EntryKind, or another to skip
  uint16_t version = 0;
  uint32_t header_size = 0;
  uint64_t payload_size = 0;
  uint32_t compressed_size = 0;
  uint32_t arch = 0;  // e.g. 90 for sm_90
  uint64_t flags = 0;
  uint64_t uncompressed_size = 0;
  std::span<const std::byte> header;   // header_size bytes at offset
  std::span<const std::byte> payload;  // payload_size bytes after the header

  bool is(EntryKind k) const { return kind == uint16_t(k); }
  bool compressed() const { return (flags & (kEntryZstd | kEntryLz4)) != 0; }
  bool compressed_fits() const { return compressed_size <= payload_size; }
};

// What stops a walk over a fatbin, in the order it is checked.
enum class FatbinError : uint8_t {
  kNone,
  kNotFatbin,             // fewer than 4 bytes, or another magic
  kHeaderTruncated,       // fewer than 16 bytes
  kSizeRunsPast,          // header_size below 16, or header and body past the image
  kEntryHeaderTruncated,  // fewer than 64 bytes left in the body for an entry header
  kEntryHeaderTooSmall,   // an entry header states fewer than 64 bytes
  kEntryRunsPast,         // an entry's header or payload runs past the body
};
// The cuda backend's texts for these (validate_module_image); "" for kNone.
const char* describe(FatbinError e);

// A bounds-checked walk over the entries of a fatbin:
//   FatbinReader r(image);
//   for (FatbinEntry e; r.next(&e);) ...
//   if (r.error() != FatbinError::kNone) ... (r.offset(): where)
class FatbinReader {
 public:
  explicit FatbinReader(std::span<const std::byte> image);

  // The header's error (kNotFatbin, kHeaderTruncated, kSizeRunsPast) from the
  // start; after next() returned false, that of the entry at offset(), or kNone
  // at the end of the body.
  FatbinError error() const { return error_; }
  const FatbinHeader& header() const { return header_; }  // as read, when the magic was there
  // The next entry; false at the end of the body or at a malformed entry, and
  // from then on.
  bool next(FatbinEntry* out);
  // Where the next entry starts (the failing one, after an entry error).
  uint64_t offset() const { return off_; }

 private:
  std::span<const std::byte> image_;
  FatbinHeader header_;
  FatbinError error_ = FatbinError::kNone;
  uint64_t off_ = 0, end_ = 0;
};

// ---------------------------------------------------------------- ELF

// The fields of Elf64_Ehdr read here.
struct ElfHeader {
  uint8_t elf_class = 0;  // e_ident[EI_CLASS]: 2 for 64-bit
  uint8_t data = 0;       // e_ident[EI_DATA]: 1 for little-endian
  uint64_t phoff = 0, shoff = 0;
  uint16_t phentsize = 0, phnum = 0, shentsize = 0, shnum = 0, shstrndx = 0;
};

// One Elf64_Shdr, and its bytes in the image.
struct ElfSection {
  uint32_t name = 0, type = 0;
  uint64_t flags = 0, addr = 0, offset = 0, size = 0;
  uint32_t link = 0, info = 0;
  uint64_t addralign = 0, entsize = 0;
  bool inside = false;              // [offset, offset + size) lies in the image
  std::span<const std::byte> data;  // those bytes when inside (whatever the type), else empty
};

// What is wrong with an ELF image, in the order validate_module_image checks.
enum class ElfError : uint8_t {
  kNone,
  kNotElf64,                // no ELF magic, fewer than 64 bytes, or not ELFCLASS64
  kProgramHeadersRunPast,   // phoff + phnum * phentsize past the image
  kSectionHeadersRunPast,   // shoff + shnum * shentsize past the image
  kSectionHeaderTooSmall,   // sections, with shentsize below 64
  kSectionRunsPast,         // a section other than SHT_NOBITS runs past the image
};
const char* describe(ElfError e);  // the cuda backend's texts; "" for kNone

// A bounds-checked view of a 64-bit ELF's header and section table.
class ElfReader {
 public:
  explicit ElfReader(std::span<const std::byte> image);

  // ELF magic, at least a header's 64 bytes, and ELFCLASS64; header() is read only then.
  bool is_elf64() const { return elf64_; }
  const ElfHeader& header() const { return header_; }
  bool program_headers_inside() const;
  // kNone when the section table can be walked (section_count() sections);
  // else kNotElf64, kSectionHeadersRunPast or kSectionHeaderTooSmall.
  ElfError section_table_error() const;
  uint16_t section_count() const { return section_table_error() == ElfError::kNone ? header_.shnum : 0; }
  ElfSection section(uint16_t i) const;  // i < section_count()
  // Everything validate_module_image checks of an ELF: the first error, or kNone.
  ElfError check() const;
  std::span<const std::byte> image() const { return image_; }

 private:
  std::span<const std::byte> image_;
  ElfHeader header_;
  bool elf64_ = false;
};

// The size of a 64-bit ELF whose extent nobody states (cuModuleLoadData's bare
// pointer into the program's own memory, which the driver sizes the same way):
// the end of its furthest header table or section, read from the header and
// then from the section table it names. 0 when `p` is no ELF64 image with
// 64-byte section headers. Only for memory the caller trusts: it reads where
// the headers point.
uint64_t elf_extent(const std::byte* p);

// ---------------------------------------------------------------- validation

// Whether `image` may go to cuModuleLoadData, which takes a bare pointer and
// guesses the format from the bytes: a fatbin or 64-bit ELF cubin whose own
// size fields (fatbin header and entries, ELF program and section headers and
// sections) stay inside `image` (the driver trusts them), or PTX text.
// Anything else, the fatbin wrapper in particular, is refused; *why says why.
bool validate_module_image(std::span<const std::byte> image, std::string* why);

}  // namespace ordo::image

#include "transport/kernel_resources.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "transport/decompress.h"
#include "transport/module_image.h"

namespace ordo::image {
namespace {

constexpr uint8_t kAttrMaxThreads = 0x05;
constexpr uint8_t kAttrReqntid = 0x10;
constexpr uint8_t kAttrFrameSize = 0x11;
constexpr uint8_t kAttrRegcount = 0x2f;

// What a hostile image can make the reader keep: names are bounded (a table
// without a NUL names nothing), and so is the number of kernels.
constexpr size_t kMaxName = 4096;
constexpr size_t kMaxKernels = 1 << 16;
// Bounds of the values themselves (a device has at most 255 registers per
// thread), so that what a device derives from them cannot overflow.
constexpr uint32_t kMaxRegisters = 255;
constexpr uint32_t kMaxBytes = 1u << 30;
constexpr uint64_t kMaxBlockDim = 1024;
constexpr std::string_view kReservedShared = ".nv.shared.reserved.0";
// A compressed cubin states its size: no module image is larger (kMaxModuleImage).
constexpr uint64_t kMaxCubinBytes = uint64_t{256} << 20;
constexpr uint32_t kReservedSharedBytes = 1024;

uint32_t u32_at(std::span<const std::byte> b, size_t off) {
  uint32_t v = 0;
  if (off + 4 <= b.size()) std::memcpy(&v, b.data() + off, 4);
  return v;
}

std::string_view section_name(std::string_view names, uint32_t at) {
  if (at >= names.size()) return {};
  const std::string_view n = names.substr(at, kMaxName + 1);
  const size_t end = n.find('\0');
  return end == std::string_view::npos ? std::string_view{} : n.substr(0, end);
}

// The kernel's entry, made if there is room; null if not.
KernelResources* entry(KernelResourceMap* out, std::string_view name) {
  if (name.empty()) return nullptr;
  if (auto it = out->find(name); it != out->end()) return &it->second;
  if (out->size() >= kMaxKernels) return nullptr;
  return &out->emplace(std::string(name), KernelResources{}).first->second;
}

}  // namespace

bool walk_nv_info(std::span<const std::byte> b, const std::function<void(const NvInfoRecord&)>& fn) {
  for (uint64_t i = 0; i + 2 <= b.size();) {
    NvInfoRecord r;
    r.format = uint8_t(b[i]);
    r.attr = uint8_t(b[i + 1]);
    switch (r.format) {
      case kNvFmtNval:  // its u16 unused, as nvcc writes it; a section may end without it
        i += std::min<uint64_t>(4, b.size() - i);
        break;
      case kNvFmtBval:
      case kNvFmtHval:
        if (b.size() - i < 4) return false;
        r.hval = r.format == kNvFmtBval ? uint16_t(b[i + 2]) : uint16_t(uint16_t(b[i + 2]) | uint16_t(b[i + 3]) << 8);
        i += 4;
        break;
      case kNvFmtSval: {
        if (b.size() - i < 4) return false;
        const uint16_t len = uint16_t(uint16_t(b[i + 2]) | uint16_t(b[i + 3]) << 8);
        if (len > b.size() - i - 4) return false;
        r.value = b.subspan(i + 4, len);
        i += 4 + len;
        break;
      }
      default:
        return false;
    }
    fn(r);
  }
  return true;
}

bool cubin_resources(std::span<const std::byte> elf, KernelResourceMap* out) {
  const ElfReader r(elf);
  if (!r.is_elf64() || r.section_table_error() != ElfError::kNone || r.header().shstrndx >= r.section_count())
    return false;
  const ElfSection strtab = r.section(r.header().shstrndx);
  if (!strtab.inside) return false;
  const std::string_view names(reinterpret_cast<const char*>(strtab.data.data()), strtab.data.size());
  static constexpr std::string_view kInfo = ".nv.info.", kShared = ".nv.shared.";

  // Symbol names by index, for the .nv.info records keyed by symbol.
  std::span<const std::byte> symtab;
  std::string_view symnames;
  for (uint16_t i = 0; i < r.section_count(); ++i) {
    const ElfSection s = r.section(i);
    if (s.type != kShtSymtab || !s.inside || s.link >= r.section_count()) continue;
    const ElfSection str = r.section(uint16_t(s.link));
    if (!str.inside) continue;
    symtab = s.data;
    symnames = {reinterpret_cast<const char*>(str.data.data()), str.data.size()};
    break;
  }
  auto symbol = [&](uint32_t index) -> std::string_view {
    constexpr uint64_t kSymSize = 24;  // Elf64_Sym; st_name first
    if (index >= symtab.size() / kSymSize) return {};
    return section_name(symnames, u32_at(symtab, index * kSymSize));
  };

  // nvcc 13's cubins for sm_90 and later put the 1 KiB the device reserves
  // per block (.nv.shared.reserved.0) at the start of every kernel's shared
  // section; the kernel's own static shared memory is what follows.
  uint32_t reserved = 0;
  for (uint16_t i = 0; i < r.section_count(); ++i)
    if (section_name(names, r.section(i).name) == kReservedShared) reserved = kReservedSharedBytes;
  bool good = true;
  for (uint16_t i = 0; i < r.section_count(); ++i) {
    const ElfSection s = r.section(i);
    const std::string_view name = section_name(names, s.name);
    if (name.starts_with(kShared) && s.type == kShtNobits) {
      if (name == kReservedShared) continue;
      if (KernelResources* k = entry(out, name.substr(kShared.size())))
        k->shared_bytes = uint32_t(std::min<uint64_t>(s.size - std::min<uint64_t>(s.size, reserved), kMaxBytes));
      continue;
    }
    if (s.type != kShtCudaInfo || !name.starts_with(".nv.info")) continue;
    if (!s.inside) return false;
    if (name == ".nv.info") {
      good &= walk_nv_info(s.data, [&](const NvInfoRecord& rec) {
        if (rec.format != kNvFmtSval || rec.value.size() < 8) return;
        if (rec.attr != kAttrRegcount && rec.attr != kAttrFrameSize) return;
        KernelResources* k = entry(out, symbol(u32_at(rec.value, 0)));
        if (!k) return;
        if (rec.attr == kAttrRegcount) k->registers = std::min(u32_at(rec.value, 4), kMaxRegisters);
        else k->local_bytes = std::min(u32_at(rec.value, 4), kMaxBytes);
      });
    } else if (name.starts_with(kInfo)) {
      KernelResources* k = entry(out, name.substr(kInfo.size()));
      if (!k) continue;
      good &= walk_nv_info(s.data, [&](const NvInfoRecord& rec) {
        if (rec.format != kNvFmtSval || rec.value.size() < 12) return;
        if (rec.attr != kAttrMaxThreads && rec.attr != kAttrReqntid) return;
        uint64_t n = 1;
        for (size_t d = 0; d < 3; ++d) n *= std::min<uint64_t>(u32_at(rec.value, 4 * d), kMaxBlockDim + 1);
        k->max_threads = uint32_t(std::min<uint64_t>(n, kMaxBlockDim + 1));
      });
    }
  }
  return good;
}

bool image_resources(std::span<const std::byte> image, uint32_t arch, KernelResourceMap* out) {
  switch (classify(image)) {
    case Format::kElf: return cubin_resources(image, out);
    case Format::kFatbin: break;
    default: return false;
  }
  // The cubin to read: the highest architecture <= arch, else the lowest.
  FatbinEntry best;
  bool have = false, best_fits = false;
  FatbinReader r(image);
  for (FatbinEntry e; r.next(&e);) {
    if (!e.is(EntryKind::kElf)) continue;
    const bool fits = e.arch <= arch;
    const bool better = !have || (fits && (!best_fits || e.arch > best.arch)) ||
                        (!fits && !best_fits && e.arch < best.arch);
    if (!better) continue;
    best = e;
    have = true;
    best_fits = fits;
  }
  if (!have) return false;
  if (!best.compressed()) return cubin_resources(best.payload, out);
  // Compressed (-Xfatbin -compress-all, NVIDIA's libraries): only the one read.
  std::vector<std::byte> plain;
  std::string error;
  return decompress_entry(best, kMaxCubinBytes, &plain, &error) && cubin_resources(plain, out);
}

}  // namespace ordo::image

#include "fatbin.h"
#include "transport/decompress.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "transport/kernel_resources.h"
#include "transport/lz4.h"

namespace ordo::driver {
namespace {

template <class T>
bool read(std::span<const std::byte> b, uint64_t off, T* out) {
  if (off > b.size() || sizeof(T) > b.size() - off) return false;
  std::memcpy(out, b.data() + off, sizeof(T));
  return true;
}

constexpr uint64_t kMaxFatbin = uint64_t{1} << 32;

// The nv.info attributes read here (transport/kernel_resources.h walks the records).
constexpr uint8_t kAttrKparamInfo = 0x17;
constexpr uint8_t kAttrCbankParamSize = 0x19;

// One .nv.info.<kernel> section body.
bool parse_nv_info(std::span<const std::byte> b, KernelLayout* k) {
  uint16_t cbank_size = 0;
  bool have_cbank = false, good = true;
  const bool walked = image::walk_nv_info(b, [&](const image::NvInfoRecord& r) {
    if (r.format == image::kNvFmtHval && r.attr == kAttrCbankParamSize) {
      cbank_size = r.hval;
      have_cbank = true;
    }
    if (r.format != image::kNvFmtSval || r.attr != kAttrKparamInfo || r.value.size() < 12) return;
    uint16_t ordinal = 0, offset = 0;
    uint32_t word = 0;
    read(r.value, 4, &ordinal);
    read(r.value, 6, &offset);
    read(r.value, 8, &word);
    const uint32_t size = (word >> 18) & 0x3fff;
    if (ordinal >= 4096) {
      good = false;
      return;
    }
    if (k->params.size() <= ordinal) k->params.resize(ordinal + 1);
    k->params[ordinal] = {offset, size};
    k->size = std::max(k->size, uint32_t{offset} + size);
  });
  if (!walked || !good) return false;
  // The constant bank's parameter size is the same number, when present.
  if (have_cbank && cbank_size != k->size) return false;
  for (const KernelParam& p : k->params)
    if (p.size == 0) return false;  // an ordinal without a record
  return true;
}

bool parse_fatbin_body(std::span<const std::byte> fatbin, KernelLayouts* cubin, KernelLayouts* ptx,
                       std::string* error, GlobalSizes* globals) {
  image::FatbinReader r(fatbin);
  if (r.error() == image::FatbinError::kNotFatbin) {
    *error = "not a fatbin (bad magic)";
    return false;
  }
  if (r.error() != image::FatbinError::kNone) {
    *error = "fatbin header sizes run past the image";
    return false;
  }
  std::string first_error;
  for (image::FatbinEntry entry; r.next(&entry);) {
    if (!entry.is(image::EntryKind::kElf) && !entry.is(image::EntryKind::kPtx)) continue;  // e.g. LTO IR
    std::span<const std::byte> payload = entry.payload;
    std::vector<std::byte> plain;
    if (entry.compressed()) {
      // Worth the work only where a cubin is missing.
      std::string e;
      if (!image::decompress_entry(entry, kMaxFatbin, &plain, &e)) {
        if (first_error.empty()) first_error = e.empty() ? "bad compressed entry" : e;
        continue;
      }
      payload = plain;
    }
    std::string e;
    const bool ok = entry.is(image::EntryKind::kElf)
                        ? parse_cubin(payload, cubin, &e, globals)
                        : parse_ptx(std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()),
                                    ptx, &e, globals);
    if (!ok && first_error.empty()) first_error = e;
  }
  if (r.error() != image::FatbinError::kNone) {
    *error = "fatbin entry at offset " + std::to_string(r.offset()) + " runs past the image";
    return false;
  }
  if (cubin->empty() && ptx->empty() && !first_error.empty()) {
    *error = first_error;
    return false;
  }
  return true;
}

}  // namespace

PackError pack_params(const KernelLayout& l, void* const* args, ParamBuffer* out) {
  if (!l.params.empty() && !args) return PackError::kMissingArgument;
  if (l.size > kMaxParamBytes) return PackError::kBadLayout;
  for (const KernelParam& p : l.params)
    if (uint64_t{p.offset} + p.size > l.size) return PackError::kBadLayout;
  for (size_t i = 0; i < l.params.size(); ++i)
    if (!args[i]) return PackError::kMissingArgument;
  out->assign(l.size, std::byte{0});
  for (size_t i = 0; i < l.params.size(); ++i) std::memcpy(out->data() + l.params[i].offset, args[i], l.params[i].size);
  return PackError::kNone;
}

uint64_t fatbin_size(const void* data) {
  if (!data) return 0;
  const auto* p = static_cast<const std::byte*>(data);
  if (image::classify({p, 4}) != image::Format::kFatbin) return 0;  // the rest only after the magic
  image::FatbinHeader h;
  image::read_fatbin_header({p, image::kFatbinHeaderSize}, &h);
  if (h.header_size < image::kFatbinHeaderSize || h.body_size > kMaxFatbin) return 0;
  return h.total_size();
}

bool parse_cubin(std::span<const std::byte> elf, KernelLayouts* out, std::string* error, GlobalSizes* globals) {
  const image::ElfReader r(elf);
  if (!r.is_elf64() || r.header().data != image::kElfLittleEndian) {
    *error = "cubin is not a 64-bit little-endian ELF";
    return false;
  }
  const uint16_t shnum = r.header().shnum;
  if (r.section_table_error() != image::ElfError::kNone || r.header().shstrndx >= shnum) {
    *error = "cubin section table runs past the image";
    return false;
  }
  const image::ElfSection strtab = r.section(r.header().shstrndx);
  if (!strtab.inside) {
    *error = "cubin section names run past the image";
    return false;
  }
  const std::string_view names(reinterpret_cast<const char*>(strtab.data.data()), strtab.data.size());
  static constexpr std::string_view kPrefix = ".nv.info.";
  for (uint16_t i = 0; i < shnum; ++i) {
    const image::ElfSection s = r.section(i);
    if (s.type != image::kShtCudaInfo || s.name >= names.size()) continue;
    std::string_view name = names.substr(s.name);
    name = name.substr(0, name.find('\0'));
    if (!name.starts_with(kPrefix)) continue;
    if (!s.inside) {
      *error = "cubin section " + std::string(name) + " runs past the image";
      return false;
    }
    KernelLayout k;
    if (!parse_nv_info(s.data, &k)) {
      *error = "cannot read the parameter layout in cubin section " + std::string(name);
      return false;
    }
    out->emplace(std::string(name.substr(kPrefix.size())), std::move(k));
  }
  for (uint16_t i = 0; globals && i < shnum; ++i) {
    const image::ElfSection s = r.section(i);
    if (s.type != image::kShtSymtab || !s.inside || s.link >= shnum) continue;
    const image::ElfSection str = r.section(uint16_t(s.link));
    if (!str.inside) continue;
    const std::string_view symnames(reinterpret_cast<const char*>(str.data.data()), str.data.size());
    for (uint64_t off = 0; off + 24 <= s.data.size(); off += 24) {  // Elf64_Sym
      uint32_t name = 0;
      uint8_t info = 0;
      uint64_t size = 0;
      read(s.data, off, &name);
      read(s.data, off + 4, &info);
      read(s.data, off + 16, &size);
      if ((info & 0xf) != 1 /* STT_OBJECT */ || name >= symnames.size()) continue;
      std::string_view n = symnames.substr(name);
      globals->emplace(std::string(n.substr(0, n.find('\0'))), size);
    }
  }
  return true;
}

namespace {

// Whitespace-separated tokens of a PTX statement.
class Tokens {
 public:
  explicit Tokens(std::string_view s) : s_(s) {}
  std::string_view next() {
    while (i_ < s_.size() && space(s_[i_])) ++i_;
    const size_t b = i_;
    while (i_ < s_.size() && !space(s_[i_])) ++i_;
    return s_.substr(b, i_ - b);
  }
  std::string_view rest() const { return s_.substr(i_); }
  static bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && Tokens::space(s.front())) s.remove_prefix(1);
  while (!s.empty() && Tokens::space(s.back())) s.remove_suffix(1);
  return s;
}

// Bytes of a scalar type token (".u64", ".b8", ".f32"), or 0 for another token.
uint32_t scalar_bytes(std::string_view t) {
  if (t.size() < 3 || t[0] != '.' || (t[1] != 'b' && t[1] != 'u' && t[1] != 's' && t[1] != 'f')) return 0;
  if (!std::all_of(t.begin() + 2, t.end(), [](char c) { return c >= '0' && c <= '9'; })) return 0;
  const auto bits = std::strtoul(std::string(t.substr(2)).c_str(), nullptr, 10);
  return bits % 8 == 0 && bits <= 1024 ? uint32_t(bits / 8) : 0;
}

// Size and alignment of a PTX parameter from its declaration tokens, e.g.
// ".param .u64 .ptr .global .align 1 x", ".param .align 8 .b8 x[24]".
bool ptx_param(std::string_view decl, KernelParam* p, uint32_t* align) {
  uint32_t elem = 0, explicit_align = 0, count = 1;
  Tokens tokens(decl);
  bool after_ptr = false;
  for (std::string_view t = tokens.next(); !t.empty(); t = tokens.next()) {
    if (t == ".ptr") {
      after_ptr = true;  // a later ".align N" is the pointee's alignment, not the parameter's
    } else if (t == ".align") {
      const auto a = uint32_t(std::strtoul(std::string(tokens.next()).c_str(), nullptr, 10));
      if (!after_ptr) explicit_align = a;
    } else if (const uint32_t b = scalar_bytes(t)) {
      elem = b;
    } else if (t[0] != '.') {
      if (const size_t lb = t.find('['); lb != std::string_view::npos)
        count = uint32_t(std::strtoul(std::string(t.substr(lb + 1)).c_str(), nullptr, 10));
    }
  }
  if (elem == 0 || count == 0 || count > (1u << 16) || uint64_t{elem} * count > kMaxParamBytes) return false;
  p->size = elem * count;
  *align = explicit_align ? explicit_align : elem;
  return *align && *align <= 256 && (*align & (*align - 1)) == 0;
}

// The largest variable believed: anything larger is a corrupt image, and the
// worker sizes an allocation by it.
constexpr uint64_t kMaxGlobalBytes = uint64_t{1} << 40;

// One declarator, "lut_sp" or "table[4][256]": its name and element count;
// false for an unsized array ("x[]") or nonsense.
bool ptx_declarator(std::string_view d, std::string_view* name, uint64_t* count) {
  const size_t lb = d.find('[');
  *name = d.substr(0, lb);
  *count = 1;
  if (name->empty()) return false;
  for (size_t i = lb; i != std::string_view::npos && i < d.size(); i = d.find('[', i)) {
    const size_t rb = d.find(']', i);
    if (rb == std::string_view::npos || rb == i + 1) return false;
    const std::string digits(d.substr(i + 1, rb - i - 1));
    char* end = nullptr;
    const unsigned long long n = std::strtoull(digits.c_str(), &end, 10);
    if (*end != '\0' || n == 0 || n > kMaxGlobalBytes || *count > kMaxGlobalBytes / n) return false;
    *count *= n;
    i = rb + 1;
  }
  return true;
}

// A module-scope ".global" or ".const" statement (`stmt` starts after that
// word and ends before its ';'): e.g. " .align 8 .u64 lut_sp",
// " .align 4 .b8 name[123] = {...}". Adds each variable it declares.
void ptx_variable(std::string_view stmt, GlobalSizes* globals) {
  stmt = stmt.substr(0, stmt.find('='));  // the initializer says nothing the type does not
  Tokens t(stmt);
  uint64_t elem = 0, lanes = 1;
  for (std::string_view tok = t.next(); !tok.empty(); tok = t.next()) {
    if (tok == ".align") {
      t.next();
    } else if (tok == ".v2" || tok == ".v4" || tok == ".v8") {
      lanes = uint64_t(tok[2] - '0');
    } else if (const uint32_t b = scalar_bytes(tok)) {
      elem = b;
    } else if (tok[0] != '.') {
      // The declarators: "a", "b[4]" (comma-separated, maybe spaced).
      std::string_view rest(tok.data(), size_t(stmt.data() + stmt.size() - tok.data()));
      while (!rest.empty() && elem) {
        const size_t comma = rest.find(',');
        const std::string_view d = trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        std::string_view name;
        uint64_t count = 0;
        if (ptx_declarator(d, &name, &count) && count <= kMaxGlobalBytes / (elem * lanes))
          globals->emplace(std::string(name), elem * lanes * count);
      }
      return;
    } else {
      return;  // .texref, .samplerref, .surfref, .pred: no bytes of their own to size
    }
  }
}

// The device variables PTX defines at module scope, by line: a statement
// starting (after its linkage) with .global or .const. Inside entries those
// words only follow others (".param .u64 .ptr .global", "ld.global").
void ptx_globals(std::string_view ptx, GlobalSizes* globals) {
  for (size_t pos = 0; pos < ptx.size();) {
    size_t eol = ptx.find('\n', pos);
    if (eol == std::string_view::npos) eol = ptx.size();
    Tokens t(ptx.substr(pos, eol - pos));
    std::string_view tok = t.next();
    while (tok == ".visible" || tok == ".weak" || tok == ".common") tok = t.next();
    if (tok == ".global" || tok == ".const") {  // .extern ones are defined elsewhere: skipped above
      const size_t start = size_t(t.rest().data() - ptx.data());
      const size_t semi = ptx.find(';', start);
      if (semi == std::string_view::npos) return;
      ptx_variable(ptx.substr(start, semi - start), globals);
      eol = std::max(eol, semi);
    }
    pos = eol + 1;
  }
}

}  // namespace

bool parse_ptx(std::string_view ptx, KernelLayouts* out, std::string* error, GlobalSizes* globals) {
  if (globals) ptx_globals(ptx, globals);
  for (size_t pos = 0; (pos = ptx.find(".entry", pos)) != std::string_view::npos;) {
    pos += 6;
    const size_t open = ptx.find('(', pos), brace = ptx.find('{', pos);
    size_t name_end = std::min(open, brace);
    if (name_end == std::string_view::npos) break;
    const std::string_view name = trim(ptx.substr(pos, name_end - pos));
    KernelLayout k;
    if (open < brace) {  // a parameter list
      const size_t close = ptx.find(')', open);
      if (close == std::string_view::npos) {
        *error = "unterminated parameter list of PTX entry " + std::string(name);
        return false;
      }
      std::string_view list = ptx.substr(open + 1, close - open - 1);
      while (!list.empty()) {
        const size_t comma = list.find(',');
        std::string_view decl = list.substr(0, comma);
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
        if (decl.find(".param") == std::string_view::npos) continue;
        KernelParam p;
        uint32_t align = 1;
        if (!ptx_param(decl, &p, &align)) {
          *error = "cannot read a parameter of PTX entry " + std::string(name);
          return false;
        }
        p.offset = (k.size + align - 1) / align * align;
        k.size = p.offset + p.size;
        if (k.size > kMaxParamBytes) {  // each term is bounded, so this cannot have wrapped
          *error = "parameters of PTX entry " + std::string(name) + " exceed CUDA's 32764-byte limit";
          return false;
        }
        k.params.push_back(p);
      }
      pos = close;
    }
    out->emplace(std::string(name), std::move(k));
  }
  return true;
}

bool parse_fatbin(std::span<const std::byte> image, KernelLayouts* out, std::string* error, GlobalSizes* globals) {
  KernelLayouts cubin, ptx;
  if (!parse_fatbin_body(image, &cubin, &ptx, error, globals)) return false;
  for (auto& [name, k] : ptx) cubin.emplace(name, std::move(k));  // keeps the cubin's where both exist
  out->merge(cubin);
  return true;
}

}  // namespace ordo::driver

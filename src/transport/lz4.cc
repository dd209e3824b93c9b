#include "transport/lz4.h"

#include <cstdint>
#include <cstring>

namespace ordo::image {
namespace {

// A length nibble of 15 continues in the bytes after it. Bounded by the input
// (each byte adds at most 255), so 64 bits cannot wrap.
bool extend_length(std::span<const std::byte> in, size_t* pos, uint64_t* len) {
  if (*len != 15) return true;
  for (;;) {
    if (*pos >= in.size()) return false;
    const uint8_t b = uint8_t(in[(*pos)++]);
    *len += b;
    if (b != 255) return true;
  }
}

}  // namespace

const char* describe(Lz4Error e) {
  switch (e) {
    case Lz4Error::kNone:
      return "";
    case Lz4Error::kTruncated:
      return "LZ4 block truncated";
    case Lz4Error::kBadOffset:
      return "LZ4 match offset outside the output";
    case Lz4Error::kOverrun:
      return "LZ4 block decompresses past its stated size";
    case Lz4Error::kShort:
      return "LZ4 block decompresses short of its stated size";
  }
  return "LZ4 error";
}

Lz4Error lz4_decompress(std::span<const std::byte> in, std::span<std::byte> out) {
  size_t ip = 0, op = 0;
  while (ip < in.size()) {
    const uint8_t token = uint8_t(in[ip++]);
    uint64_t literals = token >> 4;
    if (!extend_length(in, &ip, &literals)) return Lz4Error::kTruncated;
    if (literals > in.size() - ip) return Lz4Error::kTruncated;
    if (literals > out.size() - op) return Lz4Error::kOverrun;
    if (literals) std::memcpy(out.data() + op, in.data() + ip, literals);
    ip += literals;
    op += literals;
    if (ip == in.size()) break;  // the last sequence: literals alone
    if (in.size() - ip < 2) return Lz4Error::kTruncated;
    const size_t offset = size_t(uint8_t(in[ip])) | size_t(uint8_t(in[ip + 1])) << 8;
    ip += 2;
    if (offset == 0 || offset > op) return Lz4Error::kBadOffset;
    uint64_t match = token & 15;
    if (!extend_length(in, &ip, &match)) return Lz4Error::kTruncated;
    match += 4;
    if (match > out.size() - op) return Lz4Error::kOverrun;
    // Byte by byte: a match may overlap what it is writing (offset < length
    // repeats the last `offset` bytes).
    const std::byte* from = out.data() + (op - offset);
    std::byte* to = out.data() + op;
    for (uint64_t i = 0; i < match; ++i) to[i] = from[i];
    op += match;
  }
  return op == out.size() ? Lz4Error::kNone : Lz4Error::kShort;
}

}  // namespace ordo::image

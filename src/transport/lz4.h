// LZ4 block decompression (the raw block format, no frame), for fatbin
// entries nvcc compressed with it: flag 0x2000 (module_image.h), what
// `nvcc --compress-mode=speed` produces and how cuFFT ships its PTX. The input
// comes from the guest program's image: every read is checked against `in`,
// every write against `out`.
//
// Block format (https://github.com/lz4/lz4/blob/dev/doc/lz4_Block_format.md):
// sequences of
//   token (hi 4 bits: literal length, lo 4 bits: match length - 4; 15 means
//   "add the following bytes, each 255 meaning one more"), the literals,
//   u16 offset (back into the output, 1..written), extra match-length bytes,
// the last sequence being literals alone.
#pragma once

#include <cstddef>
#include <span>

namespace ordo::image {

enum class Lz4Error {
  kNone,
  kTruncated,   // the input ends inside a sequence
  kBadOffset,   // a match refers to offset 0 or before the start of the output
  kOverrun,     // literals or a match would write past `out`
  kShort,       // the input ended with fewer than out.size() bytes written
};
const char* describe(Lz4Error e);

// Decompresses the block `in` into exactly out.size() bytes (the size the
// fatbin entry states). Never writes past `out`; on an error the contents of
// `out` are unspecified.
Lz4Error lz4_decompress(std::span<const std::byte> in, std::span<std::byte> out);

}  // namespace ordo::image

// A compressed fatbin entry's payload, decompressed: LZ4 built in (lz4.h),
// zstd through libzstd.so.1 where the process has it (nvcc's default for
// compressed entries; not a build dependency). Both libcuda.so.1's fatbin
// walk and the sim's reading of kernel resources take compressed cubins this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/module_image.h"

namespace ordo::image {

// `e` must be compressed(). The stated size bounds the output, and a stated
// size past `max_size` is refused: a hostile image cannot make the reader
// allocate what it claims. On failure *error says why.
bool decompress_entry(const FatbinEntry& e, uint64_t max_size, std::vector<std::byte>* out, std::string* error);

}  // namespace ordo::image

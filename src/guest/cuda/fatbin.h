// Kernel parameter layouts from an nvcc fat binary, for libcuda.so.1.
//
// A CUDA program hands the runtime pointers to each kernel argument; the
// packed parameter buffer a Launch carries (LaunchParams,
// src/worker/backend.h) needs each parameter's offset and size, which only the
// device code knows. nvcc records them in the cubin: section
// `.nv.info.<kernel>`, attribute EIATTR_KPARAM_INFO, one per parameter.
// Without a cubin the PTX `.entry` declaration gives the same layout.
//
// The formats (fatbin container, entry kinds and flags, ELF) and the
// bounds-checked walks over them are transport/module_image.h's, shared with
// the worker's validator; this file keeps what only the guest needs: the
// .nv.info attributes and PTX declarations, decompression (LZ4 entries with
// transport/lz4.h; zstd entries with libzstd.so.1, loaded at run time when
// present) and the parameter packing.
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/module_image.h"

namespace ordo::driver {

using image::kFatbinMagic;
using image::kFatbinWrapperMagic;

struct KernelParam {
  uint32_t offset = 0;
  uint32_t size = 0;
};

// CUDA's limit on a kernel's parameter bytes (since 12.1; 4 KiB before).
inline constexpr uint32_t kMaxParamBytes = 32764;

struct KernelLayout {
  std::vector<KernelParam> params;  // by ordinal
  uint32_t size = 0;                // end of the last parameter: the packed buffer's size
};

using KernelLayouts = std::map<std::string, KernelLayout, std::less<>>;
// Device variables (__device__, __constant__) by name: their sizes, for
// cuModuleGetGlobal (the worker's hint), from a cubin's symbol table (STT_OBJECT)
// or PTX's .global and .const declarations.
using GlobalSizes = std::map<std::string, uint64_t, std::less<>>;

// The packed parameter buffer of one launch (LaunchParams,
// src/worker/backend.h). Most kernels' fit the inline bytes, so a launch
// allocates nothing.
using ParamBuffer = boost::container::small_vector<std::byte, 256>;
enum class PackError { kNone, kMissingArgument, kBadLayout };

// Copies the arguments a launch hands over (one pointer per parameter) to
// their offsets in `out` (layout.size bytes, gaps zeroed). The layout comes from
// the program's image: checked (kBadLayout), not trusted.
PackError pack_params(const KernelLayout& layout, void* const* args, ParamBuffer* out);

// Total size of the fatbin starting at `data` (header included), or 0 if it
// does not start with a fatbin header or claims an absurd size.
uint64_t fatbin_size(const void* data);

// Parses every kernel's parameter layout out of the fatbin `image`. Kernels found
// in any cubin win over PTX. Returns false with a message when no layout at all
// could be read (e.g. only zstd-compressed images and no libzstd).
bool parse_fatbin(std::span<const std::byte> image, KernelLayouts* out, std::string* error,
                  GlobalSizes* globals = nullptr);

// The pieces, for tests.
bool parse_cubin(std::span<const std::byte> elf, KernelLayouts* out, std::string* error,
                 GlobalSizes* globals = nullptr);
// PTX also gives its module-scope .global and .const variables' sizes.
bool parse_ptx(std::string_view ptx, KernelLayouts* out, std::string* error, GlobalSizes* globals = nullptr);

}  // namespace ordo::driver

#include "transport/decompress.h"

#include <dlfcn.h>

#include <mutex>

#include "transport/lz4.h"

namespace ordo::image {
namespace {

struct Zstd {
  size_t (*decompress)(void*, size_t, const void*, size_t) = nullptr;
  unsigned (*is_error)(size_t) = nullptr;
};

const Zstd& zstd() {
  static Zstd z;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    z.decompress = reinterpret_cast<size_t (*)(void*, size_t, const void*, size_t)>(dlsym(h, "ZSTD_decompress"));
    z.is_error = reinterpret_cast<unsigned (*)(size_t)>(dlsym(h, "ZSTD_isError"));
    if (!z.decompress || !z.is_error) z = Zstd{};
  });
  return z;
}

}  // namespace

bool decompress_entry(const FatbinEntry& e, uint64_t max_size, std::vector<std::byte>* out, std::string* error) {
  if (!e.compressed_fits()) {
    *error = "compressed fatbin entry's size runs past its payload";
    return false;
  }
  if (e.uncompressed_size == 0 || e.uncompressed_size > max_size) {
    *error = "compressed fatbin entry with an implausible size";
    return false;
  }
  const std::span<const std::byte> in = e.payload.first(e.compressed_size);
  if (e.flags & kEntryLz4) {  // NVIDIA's libraries (cuFFT) ship their PTX this way
    out->resize(e.uncompressed_size);
    const Lz4Error r = lz4_decompress(in, *out);
    if (r != Lz4Error::kNone) *error = std::string("LZ4-compressed fatbin entry: ") + describe(r);
    return r == Lz4Error::kNone;
  }
  const Zstd& z = zstd();
  if (!z.decompress) {
    *error = "compressed fatbin entry and no libzstd.so.1 to read it; install libzstd or build with "
             "-Xfatbin -compress=false";
    return false;
  }
  out->resize(e.uncompressed_size);
  const size_t n = z.decompress(out->data(), out->size(), in.data(), in.size());
  if (z.is_error(n) || n != e.uncompressed_size) {
    *error = "compressed fatbin entry does not decompress";
    return false;
  }
  return true;
}

}  // namespace ordo::image

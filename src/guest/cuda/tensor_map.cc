// Tensor maps (Hopper's TMA descriptors). Their 128 bytes are in the host
// driver's format, which the guest cannot know: each call is a round trip to
// the worker, whose backend encodes it (Op::TensorMapEncode). The descriptor
// holds the device address as the program gave it, which is the host
// driver's own. Calls on an identical request (a launcher that encodes its
// descriptors before every launch) are answered from a small cache.
#include "state.h"  // first: it includes cuda.h

#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "transport/tensor_map.h"

namespace ordo::driver {
namespace {

constexpr size_t kCached = 64;

// The last kCached requests and their maps, by the request's bytes and device.
class MapCache {
 public:
  bool find(const std::string& key, CUtensorMap* out) {
    std::lock_guard l(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    order_.splice(order_.begin(), order_, it->second);
    std::memcpy(out, &it->second->second, sizeof *out);
    return true;
  }
  void add(const std::string& key, const CUtensorMap& map) {
    std::lock_guard l(mu_);
    if (index_.count(key)) return;
    order_.emplace_front(key, map);
    index_[key] = order_.begin();
    if (order_.size() > kCached) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, CUtensorMap>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, CUtensorMap>>::iterator> index_;
};

MapCache& cache() {
  static MapCache c;
  return c;
}

CUresult encode(CUtensorMap* map, TensorMapRequest& r) {
  if (!map || reinterpret_cast<uintptr_t>(map) % 64) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const CUdevice dev = this_device();
  std::string key(reinterpret_cast<const char*>(&r), sizeof r);
  key.append(reinterpret_cast<const char*>(&dev), sizeof dev);
  if (cache().find(key, map)) return CUDA_SUCCESS;
  CUtensorMap out;
  if (CUresult e = to_cu(c->tensor_map_encode(uint32_t(dev), r, &out)); e != CUDA_SUCCESS) return e;
  cache().add(key, out);
  *map = out;
  return CUDA_SUCCESS;
}

// The request's common fields; false if an array a call needs is missing or
// the rank cannot index them.
bool common(TensorMapRequest* r, TensorMapKind kind, CUtensorMapDataType type, cuuint32_t rank, void* address,
            const cuuint64_t* dim, const cuuint64_t* strides, const cuuint32_t* element_strides,
            CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
            CUtensorMapFloatOOBfill fill) {
  std::memset(r, 0, sizeof *r);  // the cache keys on every byte
  if (rank == 0 || rank > kMaxTensorRank || !dim || !element_strides || (rank > 1 && !strides)) return false;
  r->kind = uint32_t(kind);
  r->data_type = uint32_t(type);
  r->rank = rank;
  r->global_address = reinterpret_cast<uintptr_t>(address);
  std::memcpy(r->global_dim, dim, rank * sizeof *dim);
  if (rank > 1) std::memcpy(r->global_strides, strides, (rank - 1) * sizeof *strides);
  std::memcpy(r->element_strides, element_strides, rank * sizeof *element_strides);
  r->interleave = uint32_t(interleave);
  r->swizzle = uint32_t(swizzle);
  r->l2_promotion = uint32_t(l2);
  r->oob_fill = uint32_t(fill);
  return true;
}

}  // namespace
}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation
using ordo::kMaxTensorRank;
using ordo::TensorMapKind;
using ordo::TensorMapRequest;

extern "C" {

CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                        const cuuint64_t* dim, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill fill) {
  TensorMapRequest r;
  if (!common(&r, TensorMapKind::kTiled, type, rank, address, dim, strides, element_strides, interleave, swizzle, l2,
              fill) ||
      !box)
    return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(r.box_dim, box, rank * sizeof *box);
  return encode(map, r);
}

CUresult CUDAAPI cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                         const cuuint64_t* dim, const cuuint64_t* strides, const int* lower,
                                         const int* upper, cuuint32_t channels, cuuint32_t pixels,
                                         const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                         CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                         CUtensorMapFloatOOBfill fill) {
  TensorMapRequest r;
  if (!common(&r, TensorMapKind::kIm2col, type, rank, address, dim, strides, element_strides, interleave, swizzle, l2,
              fill) ||
      rank < 3 || !lower || !upper)
    return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(r.lower_corner, lower, (rank - 2) * sizeof *lower);
  std::memcpy(r.upper_corner, upper, (rank - 2) * sizeof *upper);
  r.channels_per_pixel = channels;
  r.pixels_per_column = pixels;
  return encode(map, r);
}

CUresult CUDAAPI cuTensorMapEncodeIm2colWide(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                             void* address, const cuuint64_t* dim, const cuuint64_t* strides,
                                             int lower_width, int upper_width, cuuint32_t channels, cuuint32_t pixels,
                                             const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                             CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle,
                                             CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  TensorMapRequest r;
  if (!common(&r, TensorMapKind::kIm2colWide, type, rank, address, dim, strides, element_strides, interleave, swizzle,
              l2, fill))
    return CUDA_ERROR_INVALID_VALUE;
  r.lower_corner[0] = lower_width;
  r.upper_corner[0] = upper_width;
  r.channels_per_pixel = channels;
  r.pixels_per_column = pixels;
  r.im2col_wide_mode = uint32_t(mode);
  return encode(map, r);
}

CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* map, void* address) {
  if (!map) return CUDA_ERROR_INVALID_VALUE;
  TensorMapRequest r;
  std::memset(&r, 0, sizeof r);
  r.kind = uint32_t(TensorMapKind::kReplaceAddress);
  r.global_address = reinterpret_cast<uintptr_t>(address);
  std::memcpy(r.map, map, sizeof r.map);
  return encode(map, r);
}

}  // extern "C"

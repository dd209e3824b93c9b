// Memory: device and page-locked host allocations, registered host memory,
// pointer attributes, and memsets.
#include "forwarded.h"
#include "graph.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <mutex>
#include <vector>

namespace ordo::driver {

AddressRanges& device_allocs() {
  static auto* r = new AddressRanges;  // never destroyed: used from atexit handlers
  return *r;
}

CUresult free_device_memory(CUdeviceptr ptr) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Status s = c->free(ptr);
  if (ok(s)) device_allocs().erase(ptr);
  return to_cu(s);
}

namespace {

// Host memory the program registered or allocated page-locked, with its flags.
struct HostRanges : AddressRanges {
  std::mutex flags_mu;
  std::map<uint64_t, unsigned> flags;  // base -> flags
};
HostRanges& host_allocs() {
  static auto* r = new HostRanges;
  return *r;
}

// A memset of `count` elements of `width` bytes; `value` repeats per element.
CUresult memset_n(CUdeviceptr dst, uint32_t value, int width, size_t count, CUstream stream, bool sync,
                  bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (count == 0) return CUDA_SUCCESS;
  if (!dst) return CUDA_ERROR_INVALID_VALUE;
  if (width > 1 && dst % unsigned(width)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Stream s = ordo::kLegacyStream;
  if (sync) s = per_thread ? c->per_thread_stream() : ordo::kLegacyStream;
  else if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture()) {
    NodeWork w;
    w.type = CU_GRAPH_NODE_TYPE_MEMSET;
    w.set = {dst, count * width, value, unsigned(width), count, 1};
    if (CUresult r; sync ? capture_forbids_wait(c, s, &r) : capture_work(c, s, std::move(w), &r)) return r;
  }
  if (mapped_host(c, dst, uint64_t(count) * width)) {
    // Mapped pinned memory is the guest's own: filled here once the stream gets there.
    if (Status st = c->stream_order_wait(s); !ok(st)) return to_cu(st);
    auto* p = reinterpret_cast<std::byte*>(dst);
    for (size_t i = 0; i < count; ++i) std::memcpy(p + i * width, &value, width);
    return CUDA_SUCCESS;
  }
  const uint8_t b = uint8_t(value);
  bool uniform = true;
  for (int i = 1; i < width; ++i) uniform &= uint8_t(value >> (8 * i)) == b;
  Status st;
  if (uniform) {
    st = c->memset_async(dst, b, uint64_t(count) * width, s);
  } else {
    // A pattern the byte memset cannot express: the pattern is copied in, in stream order.
    std::vector<uint8_t> pattern(count * width);
    for (size_t i = 0; i < count; ++i) std::memcpy(&pattern[i * width], &value, width);
    st = c->memcpy_h2d_async(dst, pattern.data(), pattern.size(), s);
  }
  if (ok(st) && sync) st = c->stream_synchronize(s);
  return to_cu(st);
}

CUresult memset_2d(CUdeviceptr dst, size_t pitch, uint32_t value, int width, size_t w, size_t h, CUstream stream,
                   bool sync, bool per_thread) {
  if (h > 1 && pitch < w * width) return CUDA_ERROR_INVALID_VALUE;
  for (size_t row = 0; row < h; ++row)
    if (CUresult e = memset_n(dst + row * pitch, value, width, w, stream, sync && row + 1 == h, per_thread);
        e != CUDA_SUCCESS)
      return e;
  return CUDA_SUCCESS;
}

}  // namespace

bool mapped_host(ordo::Client* c, uint64_t p, uint64_t n) {
  return c->is_pinned(reinterpret_cast<const void*>(p), n ? n : 1) && c->pinned_is_mapped();
}

// ================================================================ behind the exports (forwarders.txt)

CUresult memset_d8(CUdeviceptr d, unsigned char v, size_t n, bool per_thread) {
  return memset_n(d, v, 1, n, nullptr, true, per_thread);
}
CUresult memset_d16(CUdeviceptr d, unsigned short v, size_t n, bool per_thread) {
  return memset_n(d, v, 2, n, nullptr, true, per_thread);
}
CUresult memset_d32(CUdeviceptr d, unsigned int v, size_t n, bool per_thread) {
  return memset_n(d, v, 4, n, nullptr, true, per_thread);
}
CUresult memset_d8_async(CUdeviceptr d, unsigned char v, size_t n, CUstream s, bool per_thread) {
  return memset_n(d, v, 1, n, s, false, per_thread);
}
CUresult memset_d16_async(CUdeviceptr d, unsigned short v, size_t n, CUstream s, bool per_thread) {
  return memset_n(d, v, 2, n, s, false, per_thread);
}
CUresult memset_d32_async(CUdeviceptr d, unsigned int v, size_t n, CUstream s, bool per_thread) {
  return memset_n(d, v, 4, n, s, false, per_thread);
}
CUresult memset_d2d8(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, bool per_thread) {
  return memset_2d(d, pitch, v, 1, w, h, nullptr, true, per_thread);
}
CUresult memset_d2d8_async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s,
                           bool per_thread) {
  return memset_2d(d, pitch, v, 1, w, h, s, false, per_thread);
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation
using ordo::Status;

extern "C" {

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* ptr, size_t size) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = capture_check_unsafe(); e != CUDA_SUCCESS) return e;
  uint64_t addr = 0;
  const Status s = c->malloc(&addr, size);
  if (!ok(s)) return s == Status::kInvalidValue ? CUDA_ERROR_OUT_OF_MEMORY : to_cu(s);
  device_allocs().add(addr, size, this_device());
  *ptr = addr;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* ptr, size_t* pitch, size_t width, size_t height,
                                    unsigned int element) {
  if (!ptr || !pitch || !width || !height || (element != 4 && element != 8 && element != 16))
    return CUDA_ERROR_INVALID_VALUE;
  constexpr size_t kAlign = 512;  // CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT of every current GPU
  const size_t p = (width + kAlign - 1) / kAlign * kAlign;
  if (CUresult e = cuMemAlloc_v2(ptr, p * height); e != CUDA_SUCCESS) return e;
  *pitch = p;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr ptr) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!ptr) return CUDA_SUCCESS;
  if (CUresult e = capture_check_unsafe(); e != CUDA_SUCCESS) return e;
  if (CUresult r; graph_memory_free(ptr, nullptr, false, false, &r)) return r;
  return free_device_memory(ptr);
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  const uint64_t used = device_allocs().total(this_device());
  *total = d->info.total_global_mem;
  *free = used < *total ? *total - used : 0;  // this program's view only
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  uint64_t b, n;
  if (!device_allocs().find(ptr, &b, &n)) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = b;
  if (size) *size = n;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void** ptr, size_t size, unsigned int flags) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned kKnown = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (CUresult e = capture_check_unsafe(); e != CUDA_SUCCESS) return e;
  // Under unified addressing every pinned allocation is mapped, DEVICEMAP or
  // not; it takes the region mapped where the worker maps it (Client::pinned_is_mapped).
  std::string why;
  if ((flags & CU_MEMHOSTALLOC_DEVICEMAP) && !c->pinned_is_mapped(&why)) {
    static std::atomic<bool> said;
    if (!said.exchange(true))
      std::fprintf(stderr, "ordo: cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP) is not supported in this session: %s\n",
                   why.c_str());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const Status s = c->malloc_host(ptr, size);
  if (!ok(s)) return to_cu(s);
  HostRanges& h = host_allocs();
  h.add(reinterpret_cast<uintptr_t>(*ptr), size, this_device());
  std::lock_guard lock(h.flags_mu);
  h.flags[reinterpret_cast<uintptr_t>(*ptr)] = flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocHost_v2(void** ptr, size_t size) { return cuMemHostAlloc(ptr, size, 0); }

CUresult CUDAAPI cuMemFreeHost(void* ptr) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (CUresult e = capture_check_unsafe(); e != CUDA_SUCCESS) return e;
  const Status s = c->free_host(ptr);
  if (ok(s)) host_allocs().erase(reinterpret_cast<uintptr_t>(ptr));
  return to_cu(s);
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* out, void* ptr, unsigned int flags) {
  if (!out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  // Unified addressing: the device pointer is the host pointer.
  if (!mapped_host(c, reinterpret_cast<uintptr_t>(ptr), 1)) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<uintptr_t>(ptr);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostGetFlags(unsigned int* flags, void* ptr) {
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  HostRanges& h = host_allocs();
  uint64_t base;
  if (!h.find(reinterpret_cast<uintptr_t>(ptr), &base, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(h.flags_mu);
  *flags = h.flags[base];
  return CUDA_SUCCESS;
}

// Registering host memory: copies from it behave as from pageable memory (a
// pageable D2H returns once the data is there, which a registered one's
// caller waits for anyway), so the program's results are the same.
CUresult CUDAAPI cuMemHostRegister_v2(void* ptr, size_t size, unsigned int flags) {
  if (!ptr || !size) return CUDA_ERROR_INVALID_VALUE;
  if (flags & CU_MEMHOSTREGISTER_DEVICEMAP) return CUDA_ERROR_NOT_SUPPORTED;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  HostRanges& h = host_allocs();
  if (h.find(reinterpret_cast<uintptr_t>(ptr), nullptr, nullptr)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  h.add(reinterpret_cast<uintptr_t>(ptr), size, this_device());
  std::lock_guard lock(h.flags_mu);
  h.flags[reinterpret_cast<uintptr_t>(ptr)] = flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void* ptr) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  return host_allocs().erase(reinterpret_cast<uintptr_t>(ptr)) ? CUDA_SUCCESS
                                                                : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  uint64_t base = 0, size = 0;
  int device = 0;  // the one it was allocated on (host memory: the allocating thread's)
  const bool dev = device_allocs().find(ptr, &base, &size, &device);
  const bool host = !dev && host_allocs().find(ptr, &base, &size, &device);
  if (!dev && !host) return CUDA_ERROR_INVALID_VALUE;  // memory CUDA does not know
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = handle(primary_ctx(device)); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (!dev && !mapped_host(c, ptr, 1)) return CUDA_ERROR_INVALID_VALUE;  // registered memory is not mapped
      *static_cast<CUdeviceptr*>(data) = ptr;
      break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (dev) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(data) = 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = device; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data) = base; break;
    // Of mapped memory: the reserved range it lies in (cuMemGetAddressRange gives the mapping).
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      if (dev) vmm_reservation_of(ptr, &base, &size);
      *static_cast<CUdeviceptr*>(data) = base;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      if (dev) vmm_reservation_of(ptr, &base, &size);
      *static_cast<size_t*>(data) = size;
      break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<unsigned*>(data) = dev || mapped_host(c, ptr, 1); break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *static_cast<unsigned*>(data) = 1; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  const bool known = device_allocs().find(ptr, nullptr, nullptr) || host_allocs().find(ptr, nullptr, nullptr);
  for (unsigned i = 0; i < n; ++i) {
    if (!data[i]) continue;
    if (!known) {
      // Unknown memory is not an error here: CUDA reports it as unregistered host memory.
      switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data[i]) = 0; break;
        case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data[i]) = nullptr; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = -2; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data[i]) = nullptr; break;
        default: *static_cast<unsigned*>(data[i]) = 0; break;
      }
      continue;
    }
    if (CUresult e = cuPointerGetAttribute(data[i], attrs[i], ptr); e != CUDA_SUCCESS && e != CUDA_ERROR_INVALID_VALUE)
      return e;
  }
  return CUDA_SUCCESS;
}

// The 16- and 32-bit 2D memsets have no per-thread twins here: their _ptds/_ptsz
// exports are stubs.
CUresult CUDAAPI cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, 2, w, h, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, 4, w, h, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s) {
  return memset_2d(d, pitch, v, 2, w, h, s, false, false);
}
CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s) {
  return memset_2d(d, pitch, v, 4, w, h, s, false, false);
}

}  // extern "C"

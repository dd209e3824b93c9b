// Copies: host to device, device to host, device to device (cuMemcpy tells
// which from the allocations it knows), between devices, and 2D copies.
#include "forwarded.h"
#include "graph.h"

#include <cstring>

namespace ordo::driver {
namespace {

enum class Side { kHost, kDevice };

Side side_of(CUdeviceptr p) { return device_allocs().find(p, nullptr, nullptr) ? Side::kDevice : Side::kHost; }

// A copy as a graph's memcpy node: one row.
NodeWork copy_node(uint64_t dst, Side ds, uint64_t src, Side ss, size_t n) {
  NodeWork w;
  w.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  CUDA_MEMCPY3D& p = w.copy;
  p.srcMemoryType = ss == Side::kHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  if (ss == Side::kHost) p.srcHost = reinterpret_cast<const void*>(src);
  else p.srcDevice = src;
  p.dstMemoryType = ds == Side::kHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  if (ds == Side::kHost) p.dstHost = reinterpret_cast<void*>(dst);
  else p.dstDevice = dst;
  p.srcPitch = p.dstPitch = p.WidthInBytes = n;
  p.srcHeight = p.dstHeight = p.Height = p.Depth = 1;
  return w;
}

// One copy in stream order; `sync`: the call returns once it is done (the synchronous API).
CUresult copy(uint64_t dst, Side ds, uint64_t src, Side ss, size_t n, CUstream stream, bool sync, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  ordo::Stream s = ordo::kLegacyStream;
  if (sync) s = per_thread ? c->per_thread_stream() : ordo::kLegacyStream;
  else if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  // A mapped pinned pointer passed as device memory is still the guest's host memory.
  if (ds == Side::kDevice && mapped_host(c, dst, n)) ds = Side::kHost;
  if (ss == Side::kDevice && mapped_host(c, src, n)) ss = Side::kHost;
  if (any_capture()) {
    CUresult r;
    if (sync ? capture_forbids_wait(c, s, &r) : capture_work(c, s, copy_node(dst, ds, src, ss, n), &r)) return r;
  }
  Status st;
  if (ds == Side::kDevice && ss == Side::kHost) {
    const void* from = reinterpret_cast<const void*>(src);
    if (sync) return to_cu(c->memcpy_h2d(dst, from, n, s));  // waits first when `from` is pageable
    st = c->memcpy_h2d_async(dst, from, n, s);
  } else if (ds == Side::kHost && ss == Side::kDevice) {
    st = c->memcpy_d2h_async(reinterpret_cast<void*>(dst), src, n, s);
  } else if (ds == Side::kDevice) {
    st = c->memcpy_d2d_async(dst, src, n, s);
  } else {
    st = c->stream_order_wait(s);  // host to host, in stream order
    if (ok(st)) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return to_cu(st);
  }
  if (ok(st) && sync) st = c->stream_synchronize(s);
  return to_cu(st);
}

// cuMemcpyPeer: device memory of one context's device to another's.
CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n, CUstream stream,
                   bool sync, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Context* dc = context_of(dst_ctx);
  const Context* sc = context_of(src_ctx);
  if (!dc || !sc) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  ordo::Stream s = ordo::kLegacyStream;
  if (sync) {
    s = per_thread ? c->per_thread_stream() : ordo::kLegacyStream;
    // The synchronous copy also follows the work of both devices, not only
    // the current one's (whose legacy stream it goes on).
    for (const CUdevice d : {device_of(sc), device_of(dc)})
      if (d != this_device())
        if (const Status st = on_device(c, d, [c] { return c->stream_order_wait(ordo::kLegacyStream); }); !ok(st))
          return to_cu(st);
  } else if (!from_handle(c, stream, per_thread, &s)) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (any_capture()) {
    CUresult r;
    if (sync ? capture_forbids_wait(c, s, &r)
             : capture_work(c, s, copy_node(dst, Side::kDevice, src, Side::kDevice, n), &r))
      return r;
  }
  Status st = c->memcpy_peer_async(dst, uint32_t(device_of(dc)), src, uint32_t(device_of(sc)), n, s);
  if (ok(st) && sync) st = c->stream_synchronize(s);
  return to_cu(st);
}

CUresult copy_2d(const CUDA_MEMCPY2D* p, CUstream stream, bool sync, bool per_thread) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  auto side = [](CUmemorytype t, CUdeviceptr dev, const void* host, uint64_t* addr, Side* s) {
    switch (t) {
      case CU_MEMORYTYPE_HOST: *addr = reinterpret_cast<uintptr_t>(host); *s = Side::kHost; return true;
      case CU_MEMORYTYPE_DEVICE: *addr = dev; *s = Side::kDevice; return true;
      case CU_MEMORYTYPE_UNIFIED: *addr = dev; *s = side_of(dev); return true;
      default: return false;  // arrays: not supported
    }
  };
  uint64_t src, dst;
  Side ss, ds;
  if (!side(p->srcMemoryType, p->srcDevice, p->srcHost, &src, &ss) ||
      !side(p->dstMemoryType, p->dstDevice, p->dstHost, &dst, &ds))
    return CUDA_ERROR_NOT_SUPPORTED;
  src += p->srcXInBytes + p->srcY * p->srcPitch;
  dst += p->dstXInBytes + p->dstY * p->dstPitch;
  const size_t w = p->WidthInBytes, h = p->Height;
  if (p->Height > 1 && (p->srcPitch < w || p->dstPitch < w)) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcPitch == w && p->dstPitch == w) return copy(dst, ds, src, ss, w * h, stream, sync, per_thread);
  for (size_t row = 0; row < h; ++row)
    if (CUresult e = copy(dst + row * p->dstPitch, ds, src + row * p->srcPitch, ss, w, stream, sync && row + 1 == h,
                          per_thread);
        e != CUDA_SUCCESS)
      return e;
  return CUDA_SUCCESS;
}

uintptr_t host(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

// ================================================================ behind the exports (forwarders.txt)

// H = host, D = device.
CUresult memcpy_htod(CUdeviceptr d, const void* h, size_t n, bool per_thread) {
  return copy(d, Side::kDevice, host(h), Side::kHost, n, nullptr, true, per_thread);
}
CUresult memcpy_dtoh(void* h, CUdeviceptr d, size_t n, bool per_thread) {
  return copy(host(h), Side::kHost, d, Side::kDevice, n, nullptr, true, per_thread);
}
CUresult memcpy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, bool per_thread) {
  return copy(dst, Side::kDevice, src, Side::kDevice, n, nullptr, true, per_thread);
}
CUresult memcpy_htod_async(CUdeviceptr d, const void* h, size_t n, CUstream s, bool per_thread) {
  return copy(d, Side::kDevice, host(h), Side::kHost, n, s, false, per_thread);
}
CUresult memcpy_dtoh_async(void* h, CUdeviceptr d, size_t n, CUstream s, bool per_thread) {
  return copy(host(h), Side::kHost, d, Side::kDevice, n, s, false, per_thread);
}
CUresult memcpy_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool per_thread) {
  return copy(dst, Side::kDevice, src, Side::kDevice, n, s, false, per_thread);
}
CUresult memcpy_unified(CUdeviceptr dst, CUdeviceptr src, size_t n, bool per_thread) {
  return copy(dst, side_of(dst), src, side_of(src), n, nullptr, true, per_thread);
}
CUresult memcpy_unified_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool per_thread) {
  return copy(dst, side_of(dst), src, side_of(src), n, s, false, per_thread);
}
CUresult memcpy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                     bool per_thread) {
  return copy_peer(dst, dst_ctx, src, src_ctx, n, nullptr, true, per_thread);
}
CUresult memcpy_peer_async(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                           CUstream s, bool per_thread) {
  return copy_peer(dst, dst_ctx, src, src_ctx, n, s, false, per_thread);
}
CUresult memcpy_2d(const CUDA_MEMCPY2D* p, bool per_thread) { return copy_2d(p, nullptr, true, per_thread); }
CUresult memcpy_2d_async(const CUDA_MEMCPY2D* p, CUstream s, bool per_thread) {
  return copy_2d(p, s, false, per_thread);
}

}  // namespace ordo::driver

// Streams: creation and queries, waits on events, host functions and
// callbacks in stream order (capture.cc has the stream-capture calls).
#include "dark_api.h"
#include "forwarded.h"
#include "graph.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <utility>

namespace ordo::driver {
namespace {

struct StreamMeta {
  std::atomic<unsigned> flags{0};
  std::atomic<int> priority{0};
  std::atomic<Context*> ctx{nullptr};  // current when it was created; none: its device's primary
};
StreamMeta* stream_meta() {
  static auto* m = new StreamMeta[ordo::kMaxStreams];  // never freed: used from atexit handlers
  return m;
}

CUstream to_handle(ordo::Stream s) { return reinterpret_cast<CUstream>(stream_handle(s)); }

// cuStreamGetId's answer: unique over the process's life, as a slot's generation changes on reuse.
uint64_t public_id(ordo::Stream s) { return uint64_t(s.generation) << 32 | s.id; }

// `node`: what a capture records instead (a host node); null: the call
// cannot be captured, and is refused during capture.
CUresult host_func(CUstream stream, bool per_thread, std::function<void()> fn, const CUDA_HOST_NODE_PARAMS* node) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture()) {
    CUresult r;
    NodeWork w;
    w.type = CU_GRAPH_NODE_TYPE_HOST;
    if (node) w.host = *node;
    if (node ? capture_work(c, s, std::move(w), &r) : capture_forbids_wait(c, s, &r)) return r;
  }
  return to_cu(c->host_func(s, std::move(fn)));
}

CUresult stream_create(CUstream* out, unsigned flags, int priority) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~unsigned(CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  priority = std::max(-5, std::min(0, priority));
  ordo::Stream s;
  const Status st = c->stream_create(&s, (flags & CU_STREAM_NON_BLOCKING) ? ordo::kStreamNonBlocking : 0, priority);
  if (!ok(st)) return to_cu(st);
  stream_meta()[s.id].flags.store(flags, std::memory_order_relaxed);
  stream_meta()[s.id].priority.store(priority, std::memory_order_relaxed);
  stream_meta()[s.id].ctx.store(current(), std::memory_order_relaxed);
  *out = to_handle(s);
  return CUDA_SUCCESS;
}

CUresult stream_flags(CUstream stream, bool per_thread, unsigned* flags, int* priority) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (flags) *flags = s.id == ordo::kLegacyStreamId ? 0 : stream_meta()[s.id].flags.load();
  if (priority) *priority = s.id == ordo::kLegacyStreamId ? 0 : stream_meta()[s.id].priority.load();
  return CUDA_SUCCESS;
}

// The context and device of a stream. The special handles (0, CU_STREAM_LEGACY,
// CU_STREAM_PER_THREAD) name the current context's default streams.
CUresult stream_home(CUstream h, bool per_thread, Context** ctx, CUdevice* dev) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  const auto raw = reinterpret_cast<uintptr_t>(h);
  if (raw == 0 || raw == kLegacyHandle || raw == kPerThreadHandle) {
    *ctx = current();
    if (!*ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = device_of(*ctx);
    return CUDA_SUCCESS;
  }
  uint32_t d = 0;
  if (!c->device_of(s, &d)) return CUDA_ERROR_INVALID_HANDLE;
  *dev = CUdevice(d);
  *ctx = stream_meta()[s.id].ctx.load(std::memory_order_relaxed);
  if (!*ctx || device_of(*ctx) != *dev) *ctx = primary_ctx(*dev);  // made where no context was current
  return CUDA_SUCCESS;
}

// A stream callback gets CUDA_SUCCESS or the context's persistent error, as
// CUDA documents: a kernel fault before it is reported to it (the cuda backend
// learns of faults only this way).
CUresult callback_status() {
  ordo::Client* c = attached_client();
  return c ? to_cu(c->sticky_error()) : CUDA_SUCCESS;
}

}  // namespace

bool stream_non_blocking(ordo::Stream s) {
  return s.id != ordo::kLegacyStreamId && s.id < ordo::kMaxStreams &&
         (stream_meta()[s.id].flags.load(std::memory_order_relaxed) & CU_STREAM_NON_BLOCKING);
}

// ================================================================ behind the exports (forwarders.txt)

CUresult stream_synchronize(CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture())
    if (CUresult r; capture_forbids_wait(c, s, &r)) return r;
  return to_cu(c->stream_synchronize(s));
}

CUresult stream_query(CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture())
    if (CUresult r; capture_forbids_wait(c, s, &r)) return r;
  return to_cu(c->stream_query(s));
}

CUresult stream_wait_event(CUstream stream, CUevent event, unsigned flags, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (flags & ~unsigned(CU_EVENT_WAIT_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture())
    if (CUresult r; capture_stream_wait(c, s, event, flags, &r)) return r;
  return to_cu(c->stream_wait_event(s, to_event(event)));
}

CUresult stream_get_flags(CUstream h, unsigned* flags, bool per_thread) {
  return flags ? stream_flags(h, per_thread, flags, nullptr) : CUDA_ERROR_INVALID_VALUE;
}

CUresult stream_get_priority(CUstream h, int* priority, bool per_thread) {
  return priority ? stream_flags(h, per_thread, nullptr, priority) : CUDA_ERROR_INVALID_VALUE;
}

CUresult stream_get_id(CUstream h, unsigned long long* id, bool per_thread) {
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  *id = public_id(s);
  return CUDA_SUCCESS;
}

CUresult stream_get_ctx(CUstream h, CUcontext* ctx, bool per_thread) {
  return ctx ? stream_get_ctx_v2(h, ctx, nullptr, per_thread) : CUDA_ERROR_INVALID_VALUE;
}

// The context a stream was made in. No green contexts here: *green is always NULL.
CUresult stream_get_ctx_v2(CUstream h, CUcontext* ctx, CUgreenCtx* green, bool per_thread) {
  if (!ctx && !green) return CUDA_ERROR_INVALID_VALUE;
  Context* x = nullptr;
  CUdevice d = 0;
  if (CUresult e = stream_home(h, per_thread, &x, &d); e != CUDA_SUCCESS) return e;
  if (ctx) *ctx = handle(x);
  if (green) *green = nullptr;
  return CUDA_SUCCESS;
}

CUresult stream_get_device(CUstream h, CUdevice* dev, bool per_thread) {
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  Context* x = nullptr;
  return stream_home(h, per_thread, &x, dev);
}

CUresult launch_host_func(CUstream stream, CUhostFn fn, void* data, bool per_thread) {
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_HOST_NODE_PARAMS node{fn, data};
  return host_func(stream, per_thread, [fn, data] { fn(data); }, &node);
}

CUresult stream_add_callback(CUstream stream, CUstreamCallback cb, void* data, unsigned flags, bool per_thread) {
  if (!cb || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  // The callback is handed the stream as the program named it (0 stays 0).
  return host_func(stream, per_thread, [cb, stream, data] { cb(stream, callback_status(), data); }, nullptr);
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuStreamCreate(CUstream* out, unsigned int flags) { return stream_create(out, flags, 0); }
CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* out, unsigned int flags, int priority) {
  return stream_create(out, flags, priority);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream stream) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, false, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture()) capture_stream_destroyed(s);
  const CUresult r = to_cu(c->stream_destroy(s));
  if (r == CUDA_SUCCESS) forget_stream_token(public_id(s));
  return r;
}

}  // extern "C"

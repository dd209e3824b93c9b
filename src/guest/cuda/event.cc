// Events: created, recorded and waited for in the worker; a handle is the
// worker's event handle.
#include "forwarded.h"
#include "graph.h"

namespace ordo::driver {

// ================================================================ behind the exports (forwarders.txt)

CUresult event_record(CUevent event, CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture())
    if (CUresult r; capture_event_record(c, s, event, &r)) return r;
  return to_cu(c->event_record(to_event(event), s));
}

CUresult event_record_with_flags(CUevent event, CUstream stream, unsigned flags, bool per_thread) {
  if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CU_EVENT_RECORD_EXTERNAL) && any_capture() && event) {
    // In a capture, an external record is a node of the graph, recorded when it runs.
    ordo::Client* c = nullptr;
    if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
    ordo::Stream s;
    if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
    NodeWork w;
    w.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
    w.event = event;
    if (CUresult r; capture_work(c, s, std::move(w), &r)) return r;
  }
  return event_record(event, stream, per_thread);
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation
using ordo::Status;

extern "C" {

CUresult CUDAAPI cuEventCreate(CUevent* out, unsigned int flags) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned kKnown = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  // CUDA's rule: an interprocess event keeps no time.
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Event e;
  const Status s = c->event_create(&e, flags);
  if (ok(s)) *out = reinterpret_cast<CUevent>(uintptr_t(e.handle));
  return to_cu(s);
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent event) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture()) capture_event_destroyed(event);
  return to_cu(c->event_destroy(to_event(event)));
}

CUresult CUDAAPI cuEventSynchronize(CUevent event) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture())
    if (CUresult r; capture_forbids_event_wait(event, &r)) return r;
  return to_cu(c->event_synchronize(to_event(event)));
}

CUresult CUDAAPI cuEventQuery(CUevent event) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (any_capture())
    if (CUresult r; capture_forbids_event_wait(event, &r)) return r;
  return to_cu(c->event_query(to_event(event)));
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->event_elapsed(ms, to_event(start), to_event(end)));
}

}  // extern "C"

// Stream capture: between cuStreamBeginCapture and cuStreamEndCapture a
// stream's work becomes nodes of a graph instead of running. Other streams
// join the capture by waiting on an event recorded in it (fork) and must be
// waited for by the origin stream before the end (join). The calls CUDA
// forbids during capture fail as CUDA's do and invalidate the capture.
#include "forwarded.h"
#include "graph.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

namespace ordo::driver {

std::atomic<int> g_captures{0};

namespace {

struct Capture {
  uint64_t id = 0;
  Graph* graph = nullptr;
  bool owns_graph = true;  // false: cuStreamBeginCaptureToGraph's
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  uint64_t origin = 0;  // stream key
  uint32_t device = 0;
  bool invalidated = false;
  // Each member stream's dependencies: what its next node will follow.
  std::map<uint64_t, std::vector<GraphNode*>> streams;
  bool any_blocking = false;  // a member stream syncs with the legacy stream
  std::vector<CUgraphEdgeData> zero_edges;  // cuStreamGetCaptureInfo's edge data (all default)
};

struct CapturedEvent {
  Capture* capture = nullptr;
  std::vector<GraphNode*> deps;
};

// All under graph_mutex().
std::map<uint64_t, Capture*>& by_stream() {
  static auto* m = new std::map<uint64_t, Capture*>;
  return *m;
}
std::map<uintptr_t, CapturedEvent>& captured_events() {
  static auto* m = new std::map<uintptr_t, CapturedEvent>;
  return *m;
}
uint64_t g_next_capture_id = 1;

thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

uint64_t key(ordo::Stream s) { return uint64_t(s.generation) << 32 | s.id; }

Capture* capture_of(ordo::Stream s) {
  auto it = by_stream().find(key(s));
  return it == by_stream().end() ? nullptr : it->second;
}

// The captures the legacy stream's implicit synchronization would reach on `device`.
void invalidate_blocking(uint32_t device) {
  for (auto& [k, cap] : by_stream())
    if (cap->any_blocking && cap->device == device) cap->invalidated = true;
}

bool legacy_conflict(ordo::Client* c, ordo::Stream s, CUresult* r) {
  if (s.id != ordo::kLegacyStreamId) return false;
  const uint32_t device = c->current_device();
  for (auto& [k, cap] : by_stream())
    if (cap->any_blocking && cap->device == device) {
      invalidate_blocking(device);
      *r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      return true;
    }
  return false;
}

void end(Capture* cap) {
  for (auto it = by_stream().begin(); it != by_stream().end();)
    it = it->second == cap ? by_stream().erase(it) : std::next(it);
  for (auto it = captured_events().begin(); it != captured_events().end();)
    it = it->second.capture == cap ? captured_events().erase(it) : std::next(it);
  g_captures.fetch_sub(1, std::memory_order_relaxed);
}

// Every stream that joined must have been waited for by the origin: each of
// its dependencies is one of the origin's or comes before one.
bool joined(const Capture& cap) {
  std::set<const GraphNode*> before;
  std::vector<const GraphNode*> todo;
  if (auto it = cap.streams.find(cap.origin); it != cap.streams.end())
    todo.assign(it->second.begin(), it->second.end());
  while (!todo.empty()) {
    const GraphNode* n = todo.back();
    todo.pop_back();
    if (!before.insert(n).second) continue;
    todo.insert(todo.end(), n->deps.begin(), n->deps.end());
  }
  for (const auto& [k, deps] : cap.streams)
    for (const GraphNode* d : deps)
      if (!before.count(d)) return false;
  return true;
}

CUresult begin_capture(CUstream h, CUgraph into, const CUgraphNode* deps, size_t n, CUstreamCaptureMode mode,
               bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  ordo::Stream s;
  if (!from_handle(c, h, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  // The legacy stream synchronizes with every blocking stream: it cannot be captured.
  if (s.id == ordo::kLegacyStreamId) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  uint32_t device = 0;
  if (!c->device_of(s, &device)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lock(graph_mutex());
  if (capture_of(s)) return CUDA_ERROR_ILLEGAL_STATE;
  Graph* g = reinterpret_cast<Graph*>(into);
  if (into && !live_graph(g)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<GraphNode*> start;
  for (size_t i = 0; i < n; ++i) {
    GraphNode* d = live_node(deps[i]);
    if (!d || d->graph != g) return CUDA_ERROR_INVALID_VALUE;
    start.push_back(d);
  }
  auto* cap = new Capture;
  cap->id = g_next_capture_id++;
  cap->graph = into ? g : new_graph();
  cap->owns_graph = !into;
  cap->mode = mode;
  cap->thread = std::this_thread::get_id();
  cap->origin = key(s);
  cap->device = device;
  cap->streams[key(s)] = std::move(start);
  cap->any_blocking = !stream_non_blocking(s);
  by_stream()[key(s)] = cap;
  g_captures.fetch_add(1, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

}  // namespace

// ================================================================ hooks for the stream work

Graph* capturing_graph(ordo::Stream s) {
  Capture* cap = capture_of(s);
  return cap && !cap->invalidated ? cap->graph : nullptr;
}

bool capture_work(ordo::Client* c, ordo::Stream s, NodeWork&& w, CUresult* r) {
  std::lock_guard lock(graph_mutex());
  if (legacy_conflict(c, s, r)) return true;
  Capture* cap = capture_of(s);
  if (!cap) return false;
  if (cap->invalidated) {
    *r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  auto& deps = cap->streams[key(s)];
  GraphNode* node = add_node(cap->graph, std::move(w), deps);
  deps.assign(1, node);
  *r = CUDA_SUCCESS;
  return true;
}

bool capture_event_record(ordo::Client* c, ordo::Stream s, CUevent e, CUresult* r) {
  std::lock_guard lock(graph_mutex());
  if (legacy_conflict(c, s, r)) return true;
  Capture* cap = capture_of(s);
  if (!cap) {
    // A record outside capture replaces one made in a capture.
    captured_events().erase(reinterpret_cast<uintptr_t>(e));
    return false;
  }
  if (cap->invalidated) {
    *r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  captured_events()[reinterpret_cast<uintptr_t>(e)] = {cap, cap->streams[key(s)]};
  *r = CUDA_SUCCESS;
  return true;
}

bool capture_stream_wait(ordo::Client* c, ordo::Stream s, CUevent e, unsigned flags, CUresult* r) {
  std::lock_guard lock(graph_mutex());
  Capture* cap = capture_of(s);
  auto ev = captured_events().find(reinterpret_cast<uintptr_t>(e));
  if (ev == captured_events().end()) {
    if (!cap) return legacy_conflict(c, s, r);
    if (cap->invalidated) {
      *r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
      return true;
    }
    if (!(flags & CU_EVENT_WAIT_EXTERNAL)) {
      // Work outside the capture cannot be a dependency of the graph.
      cap->invalidated = true;
      *r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
      return true;
    }
    NodeWork w;
    w.type = CU_GRAPH_NODE_TYPE_WAIT_EVENT;
    w.event = e;
    auto& deps = cap->streams[key(s)];
    GraphNode* node = add_node(cap->graph, std::move(w), deps);
    deps.assign(1, node);
    *r = CUDA_SUCCESS;
    return true;
  }
  Capture* from = ev->second.capture;
  if (cap && cap != from) {
    cap->invalidated = from->invalidated = true;
    *r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    return true;
  }
  if (from->invalidated) {
    *r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  if (!cap) {
    // A fork: `s` joins the capture, its work follows the event's.
    if (s.id == ordo::kLegacyStreamId) {
      from->invalidated = true;
      *r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      return true;
    }
    by_stream()[key(s)] = from;
    from->streams[key(s)] = ev->second.deps;
    from->any_blocking |= !stream_non_blocking(s);
  } else {
    auto& deps = cap->streams[key(s)];
    for (GraphNode* d : ev->second.deps)
      if (std::find(deps.begin(), deps.end(), d) == deps.end()) deps.push_back(d);
  }
  *r = CUDA_SUCCESS;
  return true;
}

bool capture_refuses_legacy(ordo::Client* c, ordo::Stream s, CUresult* r) {
  std::lock_guard lock(graph_mutex());
  return legacy_conflict(c, s, r);
}

void capture_stream_destroyed(ordo::Stream s) {
  std::lock_guard lock(graph_mutex());
  Capture* cap = capture_of(s);
  if (!cap) return;
  if (cap->origin != key(s)) {
    // A joined stream: what it captured stays in the graph; the end still needs its join.
    cap->invalidated = true;
    return;
  }
  end(cap);
  if (cap->owns_graph) delete_graph(cap->graph);
  delete cap;
}

void capture_graph_forgotten(Graph* g) {
  for (auto& [k, cap] : by_stream()) {
    if (cap->graph != g) continue;
    // Its nodes are gone with it: nothing may follow them, and the end makes no graph.
    cap->invalidated = true;
    cap->owns_graph = false;
    cap->graph = nullptr;
    for (auto& [stream, deps] : cap->streams) deps.clear();
  }
  for (auto& [e, ce] : captured_events())
    if (ce.capture && ce.capture->graph == nullptr) ce.deps.clear();
}

void capture_event_destroyed(CUevent e) {
  std::lock_guard lock(graph_mutex());
  captured_events().erase(reinterpret_cast<uintptr_t>(e));
}

bool capture_forbids_wait(ordo::Client* c, ordo::Stream s, CUresult* r) {
  std::lock_guard lock(graph_mutex());
  if (legacy_conflict(c, s, r)) return true;
  Capture* cap = capture_of(s);
  if (!cap) return false;
  cap->invalidated = true;
  *r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return true;
}

bool capture_forbids_event_wait(CUevent e, CUresult* r) {
  std::lock_guard lock(graph_mutex());
  auto ev = captured_events().find(reinterpret_cast<uintptr_t>(e));
  if (ev == captured_events().end()) return false;
  ev->second.capture->invalidated = true;
  *r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return true;
}

CUresult capture_check_unsafe() {
  if (!any_capture() || t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  std::lock_guard lock(graph_mutex());
  const auto me = std::this_thread::get_id();
  bool forbidden = false;
  for (auto& [k, cap] : by_stream()) {
    const bool mine = cap->thread == me && cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool global = t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (mine || global) {
      cap->invalidated = true;
      forbidden = true;
    }
  }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// ================================================================ behind the exports (forwarders.txt)

CUresult stream_begin_capture(CUstream h, CUstreamCaptureMode mode, bool per_thread) {
  return begin_capture(h, nullptr, nullptr, 0, mode, per_thread);
}

CUresult stream_begin_capture_to_graph(CUstream h, CUgraph g, const CUgraphNode* deps,
                                       const CUgraphEdgeData* edges, size_t n, CUstreamCaptureMode mode,
                                       bool per_thread) {
  if (!g || (n && !deps)) return CUDA_ERROR_INVALID_VALUE;
  // Edge data other than the default (port 0, full dependency) is for programmatic launches.
  for (size_t i = 0; edges && i < n; ++i)
    if (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || edges[i].from_port || edges[i].to_port)
      return CUDA_ERROR_NOT_SUPPORTED;
  return begin_capture(h, g, deps, n, mode, per_thread);
}

CUresult stream_end_capture(CUstream h, CUgraph* out, bool per_thread) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lock(graph_mutex());
  Capture* cap = capture_of(s);
  if (!cap) return CUDA_ERROR_ILLEGAL_STATE;
  if (cap->origin != key(s)) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && cap->thread != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  CUresult r = CUDA_SUCCESS;
  if (cap->invalidated) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  else if (!joined(*cap)) r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  end(cap);
  if (r == CUDA_SUCCESS) {
    *out = reinterpret_cast<CUgraph>(cap->graph);
  } else {
    *out = nullptr;
    if (cap->owns_graph) delete_graph(cap->graph);
  }
  delete cap;
  return r;
}

CUresult stream_is_capturing(CUstream h, CUstreamCaptureStatus* status, bool per_thread) {
  return stream_get_capture_info_v3(h, status, nullptr, nullptr, nullptr, nullptr, nullptr, per_thread);
}

CUresult stream_get_capture_info_v3(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                    const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* n,
                                    bool per_thread) {
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (n) *n = 0;
  if (!any_capture()) return CUDA_SUCCESS;
  std::lock_guard lock(graph_mutex());
  if (s.id == ordo::kLegacyStreamId) {
    const uint32_t device = c->current_device();
    for (auto& [k, cap] : by_stream())
      if (cap->any_blocking && cap->device == device) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return CUDA_SUCCESS;
  }
  Capture* cap = capture_of(s);
  if (!cap) return CUDA_SUCCESS;
  *status = cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id) *id = cap->id;
  if (cap->invalidated) return CUDA_SUCCESS;
  const auto& d = cap->streams[key(s)];
  if (graph) *graph = reinterpret_cast<CUgraph>(cap->graph);
  // Valid until the stream's next captured call, as CUDA's.
  if (deps) *deps = reinterpret_cast<const CUgraphNode*>(d.data());
  if (edges) {
    cap->zero_edges.assign(std::max<size_t>(d.size(), 1), CUgraphEdgeData{});
    *edges = cap->zero_edges.data();
  }
  if (n) *n = d.size();
  return CUDA_SUCCESS;
}

CUresult stream_get_capture_info_v2(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                    const CUgraphNode** deps, size_t* n, bool per_thread) {
  return stream_get_capture_info_v3(h, status, id, graph, deps, nullptr, n, per_thread);
}

CUresult stream_get_capture_info(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, bool per_thread) {
  return stream_get_capture_info_v3(h, status, id, nullptr, nullptr, nullptr, nullptr, per_thread);
}

CUresult stream_update_capture_dependencies_v2(CUstream h, CUgraphNode* deps, const CUgraphEdgeData* edges, size_t n,
                                               unsigned flags, bool per_thread) {
  if ((n && !deps) || flags > CU_STREAM_SET_CAPTURE_DEPENDENCIES) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; edges && i < n; ++i)
    if (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || edges[i].from_port || edges[i].to_port)
      return CUDA_ERROR_NOT_SUPPORTED;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lock(graph_mutex());
  Capture* cap = capture_of(s);
  if (!cap) return CUDA_ERROR_ILLEGAL_STATE;
  if (cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  std::vector<GraphNode*> next;
  for (size_t i = 0; i < n; ++i) {
    GraphNode* d = live_node(deps[i]);
    if (!d || d->graph != cap->graph) return CUDA_ERROR_INVALID_VALUE;
    next.push_back(d);
  }
  auto& cur = cap->streams[key(s)];
  if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) cur.clear();
  for (GraphNode* d : next)
    if (std::find(cur.begin(), cur.end(), d) == cur.end()) cur.push_back(d);
  return CUDA_SUCCESS;
}

CUresult stream_update_capture_dependencies(CUstream h, CUgraphNode* deps, size_t n, unsigned flags,
                                            bool per_thread) {
  return stream_update_capture_dependencies_v2(h, deps, nullptr, n, flags, per_thread);
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuStreamBeginCapture(CUstream h) { return begin_capture(h, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, false); }
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream h) {
  return begin_capture(h, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

}  // extern "C"

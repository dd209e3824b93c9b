// CUDA graphs: building them node by node (and by capture, capture.cc),
// their queries and edges, clones, kernel node attributes. Execs are exec.cc's.
#include "graph.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_set>

#include "forwarded.h"
#include "module.h"
#include "transport/graph_steps.h"

namespace ordo::driver {

std::unordered_set<const void*>& live_handles() {
  static auto* s = new std::unordered_set<const void*>;
  return *s;
}
uint32_t next_graph_id() {
  static uint32_t next = 1;
  return next++;
}

Graph* graph_of(CUgraph h) {
  auto* g = reinterpret_cast<Graph*>(h);
  return live_graph(g) ? g : nullptr;
}

void forget(Graph* g) {
  for (auto& n : g->nodes) {
    live_handles().erase(n.get());
    if (n->work.child) forget(n->work.child.get());
  }
  live_handles().erase(g);
}

Graph* clone_graph(const Graph& from, std::map<const GraphNode*, GraphNode*>* map) {
  Graph* g = new_graph();
  std::map<const GraphNode*, GraphNode*> local;
  auto& m = map ? *map : local;
  for (const auto& n : from.nodes) {
    std::vector<GraphNode*> deps;
    for (const GraphNode* d : n->deps) deps.push_back(m.at(d));
    GraphNode* c = add_node(g, n->work.clone(), deps);
    c->enabled = n->enabled;
    c->origin = n.get();
    m[n.get()] = c;
  }
  for (auto [o, count] : from.user_objects) retain_user_object(o, count);
  g->user_objects = from.user_objects;
  return g;
}

namespace {

const char* node_type_name(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "KERNEL";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "MEMCPY";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "MEMSET";
    case CU_GRAPH_NODE_TYPE_HOST: return "HOST";
    case CU_GRAPH_NODE_TYPE_GRAPH: return "GRAPH";
    case CU_GRAPH_NODE_TYPE_EMPTY: return "EMPTY";
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return "WAIT_EVENT";
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return "EVENT_RECORD";
    default: return "OTHER";
  }
}

CUresult check_copy(const CUDA_MEMCPY3D& p) {
  for (CUmemorytype t : {p.srcMemoryType, p.dstMemoryType})
    if (t == CU_MEMORYTYPE_ARRAY) return CUDA_ERROR_NOT_SUPPORTED;  // no arrays here (cuArrayCreate)
    else if (t != CU_MEMORYTYPE_HOST && t != CU_MEMORYTYPE_DEVICE && t != CU_MEMORYTYPE_UNIFIED)
      return CUDA_ERROR_INVALID_VALUE;
  if (!p.WidthInBytes || !p.Height || !p.Depth) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult check_memset(const CUDA_MEMSET_NODE_PARAMS& p) {
  if (p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4) return CUDA_ERROR_INVALID_VALUE;
  if (!p.dst || !p.width || !p.height || (p.height > 1 && p.pitch < p.width * p.elementSize))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

}  // namespace

// The work a generic node's parameters describe (cuGraphAddNode, cuGraphNodeSetParams).
CUresult work_of(const CUgraphNodeParams* p, NodeWork* w) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  w->type = p->type;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const auto& k = p->kernel;
      return kernel_node_work(k.func ? k.func : reinterpret_cast<CUfunction>(k.kern),
                              {k.gridDimX, k.gridDimY, k.gridDimZ},
                              {k.blockDimX, k.blockDimY, k.blockDimZ}, k.sharedMemBytes, k.kernelParams, k.extra, w);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: w->copy = p->memcpy.copyParams; return check_copy(w->copy);
    case CU_GRAPH_NODE_TYPE_MEMSET:
      w->set = {p->memset.dst, p->memset.pitch, p->memset.value, p->memset.elementSize, p->memset.width,
                p->memset.height};
      return check_memset(w->set);
    case CU_GRAPH_NODE_TYPE_HOST:
      if (!p->host.fn) return CUDA_ERROR_INVALID_VALUE;
      w->host = {p->host.fn, p->host.userData};
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      const Graph* child = graph_of(p->graph.graph);
      if (!child) return CUDA_ERROR_INVALID_VALUE;
      w->child.reset(clone_graph(*child, nullptr));
      return CUDA_SUCCESS;
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      w->event = p->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? p->eventRecord.event : p->eventWait.event;
      return w->event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_GRAPH_NODE_TYPE_EMPTY: return CUDA_SUCCESS;
    default:
      // Memory, conditional, batch memory-op and external-semaphore nodes.
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

namespace {

CUresult add(CUgraphNode* out, CUgraph h, const CUgraphNode* deps, size_t n, NodeWork w) {
  if (!out || (n && !deps)) return CUDA_ERROR_INVALID_VALUE;
  Graph* g = graph_of(h);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<GraphNode*> d;
  for (size_t i = 0; i < n; ++i) {
    GraphNode* x = live_node(deps[i]);
    if (!x || x->graph != g || std::find(d.begin(), d.end(), x) != d.end()) return CUDA_ERROR_INVALID_VALUE;
    d.push_back(x);
  }
  *out = reinterpret_cast<CUgraphNode>(add_node(g, std::move(w), d));
  return CUDA_SUCCESS;
}

// A node of type `type`, or null.
GraphNode* node_of(CUgraphNode h, CUgraphNodeType type) {
  GraphNode* n = live_node(h);
  return n && n->work.type == type ? n : nullptr;
}

template <typename T>
CUresult list(const std::vector<T>& items, T* out, size_t* n) {
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  if (!out) {
    *n = items.size();
    return CUDA_SUCCESS;
  }
  const size_t k = std::min(*n, items.size());
  std::copy_n(items.begin(), k, out);
  for (size_t i = k; i < *n; ++i) out[i] = T{};
  *n = k;
  return CUDA_SUCCESS;
}

CUgraphNode node_handle(const GraphNode* n) { return reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(n)); }

CUresult edges(CUgraph hg, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data, size_t* n) {
  if (!n || (!from) != (!to)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<CUgraphNode, CUgraphNode>> all;
  for (const auto& x : g->nodes)
    for (const GraphNode* d : x->deps) all.push_back({node_handle(d), node_handle(x.get())});
  if (!from) {
    *n = all.size();
    return CUDA_SUCCESS;
  }
  const size_t k = std::min(*n, all.size());
  for (size_t i = 0; i < *n; ++i) {
    from[i] = i < k ? all[i].first : nullptr;
    to[i] = i < k ? all[i].second : nullptr;
    if (data) data[i] = CUgraphEdgeData{};
  }
  *n = k;
  return CUDA_SUCCESS;
}

CUresult neighbours(CUgraphNode hn, bool dependents, CUgraphNode* out, CUgraphEdgeData* data, size_t* n) {
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const GraphNode* x = live_node(hn);
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> v;
  if (dependents) {
    for (const auto& o : x->graph->nodes)
      if (std::find(o->deps.begin(), o->deps.end(), x) != o->deps.end()) v.push_back(node_handle(o.get()));
  } else {
    for (const GraphNode* d : x->deps) v.push_back(node_handle(d));
  }
  if (data && out)
    for (size_t i = 0; i < std::min(*n, v.size()); ++i) data[i] = CUgraphEdgeData{};
  return list(v, out, n);
}

CUresult dependencies(CUgraph hg, const CUgraphNode* from, const CUgraphNode* to, const CUgraphEdgeData* data,
                      size_t n, bool add_them) {
  if (n && (!from || !to)) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; data && i < n; ++i)
    if (data[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || data[i].from_port || data[i].to_port)
      return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard lock(graph_mutex());
  Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    GraphNode* a = live_node(from[i]);
    GraphNode* b = live_node(to[i]);
    if (!a || !b || a->graph != g || b->graph != g || a == b) return CUDA_ERROR_INVALID_VALUE;
    auto it = std::find(b->deps.begin(), b->deps.end(), a);
    if (add_them == (it != b->deps.end())) return CUDA_ERROR_INVALID_VALUE;  // already there / not there
  }
  for (size_t i = 0; i < n; ++i) {
    GraphNode* a = live_node(from[i]);
    GraphNode* b = live_node(to[i]);
    if (add_them) b->deps.push_back(a);
    else b->deps.erase(std::find(b->deps.begin(), b->deps.end(), a));
  }
  return CUDA_SUCCESS;
}

template <typename F>
CUresult with_node(CUgraphNode hn, CUgraphNodeType type, F f) {
  std::lock_guard lock(graph_mutex());
  GraphNode* n = node_of(hn, type);
  return n ? f(n) : CUDA_ERROR_INVALID_VALUE;
}

void kernel_params_out(GraphNode* n, CUfunction* func, CUkernel* kern, unsigned* g, unsigned* b, unsigned* smem,
                       void*** params, void*** extra) {
  // A kernel is its function here (cuKernelGetFunction): cudart finds its
  // host stub by the CUkernel, a driver-API program uses the CUfunction.
  *func = n->work.fn;
  if (kern) *kern = reinterpret_cast<CUkernel>(n->work.fn);
  g[0] = n->work.grid.x, g[1] = n->work.grid.y, g[2] = n->work.grid.z;
  b[0] = n->work.block.x, b[1] = n->work.block.y, b[2] = n->work.block.z;
  *smem = n->work.smem;
  kernel_arg_pointers(n);
  *params = nullptr;
  *extra = nullptr;
  if (!n->arg_ptrs.empty() || n->work.args.empty()) {
    *params = n->arg_ptrs.data();
  } else {
    n->extra_size = n->work.args.size();
    n->extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    n->extra[1] = n->work.args.data();
    n->extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    n->extra[3] = &n->extra_size;
    n->extra[4] = CU_LAUNCH_PARAM_END;
    *extra = n->extra;
  }
}

// The calls of one node type whose parameters are one field of NodeWork:
// add, get, set, and set in an exec. `Check` refuses bad parameters.
template <CUgraphNodeType Type, typename P, P NodeWork::*Field, CUresult (*Check)(const P&)>
struct FieldNode {
  static NodeWork work(const P& p) {
    NodeWork w;
    w.type = Type;
    w.*Field = p;
    return w;
  }
  static CUresult add(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n, const P* p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult e = Check(*p); e != CUDA_SUCCESS) return e;
    std::lock_guard lock(graph_mutex());
    return ::ordo::driver::add(out, g, deps, n, work(*p));
  }
  static CUresult get(CUgraphNode hn, P* p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return with_node(hn, Type, [p](GraphNode* n) {
      *p = n->work.*Field;
      return CUDA_SUCCESS;
    });
  }
  static CUresult set(CUgraphNode hn, const P* p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult e = Check(*p); e != CUDA_SUCCESS) return e;
    return with_node(hn, Type, [p](GraphNode* n) {
      n->work.*Field = *p;
      return CUDA_SUCCESS;
    });
  }
  static CUresult exec_set(CUgraphExec x, CUgraphNode hn, const P* p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult e = Check(*p); e != CUDA_SUCCESS) return e;
    return ::ordo::driver::exec_set(x, hn, work(*p));
  }
};

CUresult check_host(const CUDA_HOST_NODE_PARAMS& p) { return p.fn ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult check_event(const CUevent& e) { return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

using CopyNode = FieldNode<CU_GRAPH_NODE_TYPE_MEMCPY, CUDA_MEMCPY3D, &NodeWork::copy, check_copy>;
using MemsetNode = FieldNode<CU_GRAPH_NODE_TYPE_MEMSET, CUDA_MEMSET_NODE_PARAMS, &NodeWork::set, check_memset>;
using HostNode = FieldNode<CU_GRAPH_NODE_TYPE_HOST, CUDA_HOST_NODE_PARAMS, &NodeWork::host, check_host>;
using RecordNode = FieldNode<CU_GRAPH_NODE_TYPE_EVENT_RECORD, CUevent, &NodeWork::event, check_event>;
using WaitNode = FieldNode<CU_GRAPH_NODE_TYPE_WAIT_EVENT, CUevent, &NodeWork::event, check_event>;

}  // namespace

// ================================================================ shared with capture.cc

std::mutex& graph_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

NodeWork NodeWork::clone() const {
  NodeWork w;
  w.type = type;
  w.fn = fn;
  w.grid = grid;
  w.block = block;
  w.smem = smem;
  w.args = args;
  w.copy = copy;
  w.set = set;
  w.host = host;
  w.event = event;
  w.attrs = attrs;
  if (child) w.child.reset(clone_graph(*child, nullptr));
  return w;
}

GraphNode* add_node(Graph* g, NodeWork work, const std::vector<GraphNode*>& deps) {
  static uint64_t serials = 0;  // under graph_mutex()
  auto n = std::make_unique<GraphNode>();
  n->graph = g;
  n->serial = ++serials;
  n->work = std::move(work);
  n->deps = deps;
  live_handles().insert(n.get());
  g->nodes.push_back(std::move(n));
  return g->nodes.back().get();
}

Graph* new_graph() {
  auto* g = new Graph;
  g->id = next_graph_id();
  live_handles().insert(g);
  return g;
}

void delete_graph(Graph* g) {
  forget(g);
  delete g;
}

bool live_graph(const Graph* g) { return g && live_handles().count(g); }

GraphNode* live_node(CUgraphNode hn) {
  auto* n = reinterpret_cast<GraphNode*>(hn);
  return hn && live_handles().count(n) ? n : nullptr;
}

// ================================================================ behind the exports (forwarders.txt)

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

// ---------------------------------------------------------------- graphs

CUresult CUDAAPI cuGraphCreate(CUgraph* out, unsigned int flags) {
  if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  std::lock_guard lock(graph_mutex());
  *out = reinterpret_cast<CUgraph>(new_graph());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hg) {
  std::lock_guard lock(graph_mutex());
  Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  delete_graph(g);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphClone(CUgraph* out, CUgraph hg) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraph>(clone_graph(*g, nullptr));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* out, CUgraphNode original, CUgraph clone) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(clone);
  const GraphNode* o = live_node(original);
  if (!g || !o) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& n : g->nodes)
    if (n->origin == o) {
      *out = node_handle(n.get());
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hg, CUgraphNode* nodes, size_t* n) {
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> v;
  for (const auto& x : g->nodes) v.push_back(node_handle(x.get()));
  return list(v, nodes, n);
}

CUresult CUDAAPI cuGraphGetRootNodes(CUgraph hg, CUgraphNode* nodes, size_t* n) {
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> v;
  for (const auto& x : g->nodes)
    if (x->deps.empty()) v.push_back(node_handle(x.get()));
  return list(v, nodes, n);
}

CUresult CUDAAPI cuGraphGetEdges(CUgraph g, CUgraphNode* from, CUgraphNode* to, size_t* n) {
  return edges(g, from, to, nullptr, n);
}
CUresult CUDAAPI cuGraphGetEdges_v2(CUgraph g, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                                    size_t* n) {
  return edges(g, from, to, data, n);
}
CUresult CUDAAPI cuGraphNodeGetDependencies(CUgraphNode n, CUgraphNode* deps, size_t* count) {
  return neighbours(n, false, deps, nullptr, count);
}
CUresult CUDAAPI cuGraphNodeGetDependencies_v2(CUgraphNode n, CUgraphNode* deps, CUgraphEdgeData* data,
                                               size_t* count) {
  return neighbours(n, false, deps, data, count);
}
CUresult CUDAAPI cuGraphNodeGetDependentNodes(CUgraphNode n, CUgraphNode* out, size_t* count) {
  return neighbours(n, true, out, nullptr, count);
}
CUresult CUDAAPI cuGraphNodeGetDependentNodes_v2(CUgraphNode n, CUgraphNode* out, CUgraphEdgeData* data,
                                                 size_t* count) {
  return neighbours(n, true, out, data, count);
}
CUresult CUDAAPI cuGraphAddDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to, size_t n) {
  return dependencies(g, from, to, nullptr, n, true);
}
CUresult CUDAAPI cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                           const CUgraphEdgeData* data, size_t n) {
  return dependencies(g, from, to, data, n, true);
}
CUresult CUDAAPI cuGraphRemoveDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to, size_t n) {
  return dependencies(g, from, to, nullptr, n, false);
}
CUresult CUDAAPI cuGraphRemoveDependencies_v2(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                              const CUgraphEdgeData* data, size_t n) {
  return dependencies(g, from, to, data, n, false);
}

CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hn) {
  std::lock_guard lock(graph_mutex());
  GraphNode* n = live_node(hn);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  Graph* g = n->graph;
  for (auto& o : g->nodes) o->deps.erase(std::remove(o->deps.begin(), o->deps.end(), n), o->deps.end());
  live_handles().erase(n);
  if (n->work.child) forget(n->work.child.get());
  g->nodes.erase(std::find_if(g->nodes.begin(), g->nodes.end(), [n](const auto& p) { return p.get() == n; }));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hn, CUgraphNodeType* type) {
  if (!type) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const GraphNode* n = live_node(hn);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *type = n->work.type;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- nodes

CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* out, CUgraph g, const CUgraphNode* deps,
                                   const CUgraphEdgeData* data, size_t n, CUgraphNodeParams* params) {
  for (size_t i = 0; data && i < n; ++i)
    if (data[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || data[i].from_port || data[i].to_port)
      return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard lock(graph_mutex());
  NodeWork w;
  if (CUresult e = work_of(params, &w); e != CUDA_SUCCESS) return e;
  return add(out, g, deps, n, std::move(w));
}
CUresult CUDAAPI cuGraphAddNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                CUgraphNodeParams* params) {
  return cuGraphAddNode_v2(out, g, deps, nullptr, n, params);
}

CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hn, CUgraphNodeParams* params) {
  std::lock_guard lock(graph_mutex());
  GraphNode* n = live_node(hn);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  NodeWork w;
  if (CUresult e = work_of(params, &w); e != CUDA_SUCCESS) return e;
  if (w.type != n->work.type) return CUDA_ERROR_INVALID_VALUE;
  if (n->work.child) forget(n->work.child.get());
  w.attrs = std::move(n->work.attrs);
  n->work = std::move(w);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                         const CUDA_KERNEL_NODE_PARAMS* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  NodeWork w;
  if (CUresult e = kernel_node_work(p->func ? p->func : reinterpret_cast<CUfunction>(p->kern),
                                    {p->gridDimX, p->gridDimY, p->gridDimZ}, {p->blockDimX, p->blockDimY, p->blockDimZ},
                                    p->sharedMemBytes, p->kernelParams, p->extra, &w);
      e != CUDA_SUCCESS)
    return e;
  std::lock_guard lock(graph_mutex());
  return add(out, g, deps, n, std::move(w));
}
CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                      const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2{};
  std::memcpy(&v2, p, sizeof *p);  // v1 is v2's prefix
  return cuGraphAddKernelNode_v2(out, g, deps, n, &v2);
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hn, CUDA_KERNEL_NODE_PARAMS* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  return with_node(hn, CU_GRAPH_NODE_TYPE_KERNEL, [p](GraphNode* n) {
    *p = {};
    unsigned g[3], b[3];
    kernel_params_out(n, &p->func, &p->kern, g, b, &p->sharedMemBytes, &p->kernelParams, &p->extra);
    p->ctx = handle(current());
    p->gridDimX = g[0], p->gridDimY = g[1], p->gridDimZ = g[2];
    p->blockDimX = b[0], p->blockDimY = b[1], p->blockDimZ = b[2];
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphKernelNodeGetParams(CUgraphNode hn, CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2{};
  const CUresult e = cuGraphKernelNodeGetParams_v2(hn, &v2);
  if (e == CUDA_SUCCESS) std::memcpy(p, &v2, sizeof *p);
  return e;
}

CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  NodeWork w;
  if (CUresult e = kernel_node_work(p->func ? p->func : reinterpret_cast<CUfunction>(p->kern),
                                    {p->gridDimX, p->gridDimY, p->gridDimZ}, {p->blockDimX, p->blockDimY, p->blockDimZ},
                                    p->sharedMemBytes, p->kernelParams, p->extra, &w);
      e != CUDA_SUCCESS)
    return e;
  return with_node(hn, CU_GRAPH_NODE_TYPE_KERNEL, [&w](GraphNode* n) {
    w.attrs = std::move(n->work.attrs);  // new parameters, the same attributes
    n->work = std::move(w);
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphKernelNodeSetParams(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2{};
  std::memcpy(&v2, p, sizeof *p);
  return cuGraphKernelNodeSetParams_v2(hn, &v2);
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                      const CUDA_MEMCPY3D* p, CUcontext) {
  return CopyNode::add(out, g, deps, n, p);
}
CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode hn, CUDA_MEMCPY3D* p) { return CopyNode::get(hn, p); }
CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode hn, const CUDA_MEMCPY3D* p) { return CopyNode::set(hn, p); }
CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec x, CUgraphNode hn, const CUDA_MEMCPY3D* p, CUcontext) {
  return CopyNode::exec_set(x, hn, p);
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                      const CUDA_MEMSET_NODE_PARAMS* p, CUcontext) {
  return MemsetNode::add(out, g, deps, n, p);
}
CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode hn, CUDA_MEMSET_NODE_PARAMS* p) {
  return MemsetNode::get(hn, p);
}
CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS* p) {
  return MemsetNode::set(hn, p);
}
CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec x, CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS* p,
                                                CUcontext) {
  return MemsetNode::exec_set(x, hn, p);
}

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                    const CUDA_HOST_NODE_PARAMS* p) {
  return HostNode::add(out, g, deps, n, p);
}
CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode hn, CUDA_HOST_NODE_PARAMS* p) { return HostNode::get(hn, p); }
CUresult CUDAAPI cuGraphHostNodeSetParams(CUgraphNode hn, const CUDA_HOST_NODE_PARAMS* p) {
  return HostNode::set(hn, p);
}
CUresult CUDAAPI cuGraphExecHostNodeSetParams(CUgraphExec x, CUgraphNode hn, const CUDA_HOST_NODE_PARAMS* p) {
  return HostNode::exec_set(x, hn, p);
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n) {
  std::lock_guard lock(graph_mutex());
  return add(out, g, deps, n, NodeWork{});
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                          CUgraph child) {
  std::lock_guard lock(graph_mutex());
  const Graph* c = graph_of(child);
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  NodeWork w;
  w.type = CU_GRAPH_NODE_TYPE_GRAPH;
  w.child.reset(clone_graph(*c, nullptr));
  return add(out, g, deps, n, std::move(w));
}
CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hn, CUgraph* out) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  return with_node(hn, CU_GRAPH_NODE_TYPE_GRAPH, [out](GraphNode* n) {
    *out = reinterpret_cast<CUgraph>(n->work.child.get());
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                           CUevent e) {
  return RecordNode::add(out, g, deps, n, &e);
}
CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n, CUevent e) {
  return WaitNode::add(out, g, deps, n, &e);
}
CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode hn, CUevent* e) { return RecordNode::get(hn, e); }
CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode hn, CUevent* e) { return WaitNode::get(hn, e); }
CUresult CUDAAPI cuGraphEventRecordNodeSetEvent(CUgraphNode hn, CUevent e) { return RecordNode::set(hn, &e); }
CUresult CUDAAPI cuGraphEventWaitNodeSetEvent(CUgraphNode hn, CUevent e) { return WaitNode::set(hn, &e); }
CUresult CUDAAPI cuGraphExecEventRecordNodeSetEvent(CUgraphExec x, CUgraphNode hn, CUevent e) {
  return RecordNode::exec_set(x, hn, &e);
}
CUresult CUDAAPI cuGraphExecEventWaitNodeSetEvent(CUgraphExec x, CUgraphNode hn, CUevent e) {
  return WaitNode::exec_set(x, hn, &e);
}

// ---------------------------------------------------------------- execs

// ---------------------------------------------------------------- kernel node attributes, debugging

CUresult CUDAAPI cuGraphKernelNodeSetAttribute(CUgraphNode hn, CUkernelNodeAttrID attr,
                                               const CUkernelNodeAttrValue* value) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  // What a launch accepts (launch.cc), a node accepts.
  CUlaunchAttribute a{};
  a.id = attr;
  a.value = *value;
  CUlaunchConfig config{};
  config.attrs = &a;
  config.numAttrs = 1;
  if (CUresult e = check_launch_attributes(&config); e != CUDA_SUCCESS) return e;
  return with_node(hn, CU_GRAPH_NODE_TYPE_KERNEL, [&](GraphNode* n) {
    n->work.attrs[int(attr)] = *value;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphKernelNodeGetAttribute(CUgraphNode hn, CUkernelNodeAttrID attr,
                                               CUkernelNodeAttrValue* value) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  return with_node(hn, CU_GRAPH_NODE_TYPE_KERNEL, [&](GraphNode* n) {
    auto it = n->work.attrs.find(int(attr));
    *value = it == n->work.attrs.end() ? CUkernelNodeAttrValue{} : it->second;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  std::lock_guard lock(graph_mutex());
  GraphNode* d = node_of(dst, CU_GRAPH_NODE_TYPE_KERNEL);
  const GraphNode* s = node_of(src, CU_GRAPH_NODE_TYPE_KERNEL);
  if (!d || !s) return CUDA_ERROR_INVALID_VALUE;
  d->work.attrs = s->work.attrs;
  return CUDA_SUCCESS;
}

// The graph in Graphviz's DOT language: one box per node (its type, and a
// kernel's name), one arrow per edge; child graphs as clusters.
CUresult CUDAAPI cuGraphDebugDotPrint(CUgraph hg, const char* path, unsigned int) {
  if (!path) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  FILE* f = std::fopen(path, "w");
  if (!f) return CUDA_ERROR_OPERATING_SYSTEM;
  std::fprintf(f, "digraph ordo_graph_%u {\n", g->id);
  auto print = [f](const Graph& graph, auto& self) -> void {
    for (const auto& n : graph.nodes) {
      const Function* fn = n->work.type == CU_GRAPH_NODE_TYPE_KERNEL ? function_of(n->work.fn) : nullptr;
      std::fprintf(f, "  n%p [shape=box label=\"%s%s%s\"];\n", static_cast<const void*>(n.get()),
                   node_type_name(n->work.type), fn ? "\\n" : "", fn ? fn->name.c_str() : "");
      for (const GraphNode* d : n->deps)
        std::fprintf(f, "  n%p -> n%p;\n", static_cast<const void*>(d), static_cast<const void*>(n.get()));
      if (n->work.child) {
        std::fprintf(f, "  subgraph cluster_%p {\n", static_cast<const void*>(n.get()));
        self(*n->work.child, self);
        std::fprintf(f, "  }\n");
      }
    }
  };
  print(*g, print);
  std::fprintf(f, "}\n");
  return std::fclose(f) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

}  // extern "C"

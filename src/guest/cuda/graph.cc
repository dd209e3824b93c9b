// CUDA graphs: building them node by node, instantiating, updating and
// launching them. An exec is the graph's nodes in an order their edges allow
// (child graphs inlined); a launch replays them as stream work on the launch
// stream, after the exec's previous launch, as CUDA orders launches of one exec.
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

namespace {

struct ExecStep {
  const GraphNode* top = nullptr;   // the node of the instantiated graph it comes from
  const GraphNode* node = nullptr;  // itself, or the node of a child graph inside `top`
  std::vector<size_t> deps;         // steps it follows, for cuGraphExecUpdate's topology check
  NodeWork work;
  bool enabled = true;
};

// What a launch does, in order: runs of device steps the worker holds
// (`graph`, one GraphLaunch entry each), and the other steps replayed one by
// one (`step`).
struct PlanItem {
  uint32_t graph = 0;  // a worker graph, or 0: replay steps[step]
  size_t step = 0;
};

struct GraphExec {
  std::vector<ExecStep> steps;
  std::vector<PlanItem> plan;
  bool planned = false;  // false: (re)made by the next launch (instantiate, updates, enable)
  unsigned long long flags = 0;
  // Launches of one exec run one after another, on any streams: each launch
  // records `done`, and a launch on another stream than the last waits for it.
  CUevent done = nullptr;
  uint64_t last_stream = 0;
  CUstream last_handle = nullptr;  // that stream: the exec's user objects go after its last launch
  std::map<UserObject*, unsigned> user_objects;  // the graph's, retained at instantiate
  bool launched = false;
  uint32_t id = 0;
};

std::unordered_set<const void*>& live() {  // graphs, nodes and execs
  static auto* s = new std::unordered_set<const void*>;
  return *s;
}
uint32_t g_next_id = 1;

GraphExec* live_exec(CUgraphExec h) {
  auto* x = reinterpret_cast<GraphExec*>(h);
  return h && live().count(x) ? x : nullptr;
}
Graph* graph_of(CUgraph h) {
  auto* g = reinterpret_cast<Graph*>(h);
  return live_graph(g) ? g : nullptr;
}

void forget(Graph* g) {
  for (auto& n : g->nodes) {
    live().erase(n.get());
    if (n->work.child) forget(n->work.child.get());
  }
  live().erase(g);
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

// The nodes of `g` with every node after those it depends on, child graphs
// inlined; false if the edges have a cycle.
bool flatten(const Graph& g, const GraphNode* top, std::vector<ExecStep>* out) {
  std::map<const GraphNode*, size_t> waiting;
  std::map<const GraphNode*, std::vector<const GraphNode*>> after;
  for (const auto& n : g.nodes) {
    waiting[n.get()] = n->deps.size();
    for (const GraphNode* d : n->deps) after[d].push_back(n.get());
  }
  std::vector<const GraphNode*> ready;
  for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it)
    if ((*it)->deps.empty()) ready.push_back(it->get());
  std::map<const GraphNode*, size_t> last_step;  // a node's last step in *out
  size_t done = 0;
  while (!ready.empty()) {
    const GraphNode* n = ready.back();
    ready.pop_back();
    ++done;
    std::vector<size_t> deps;
    for (const GraphNode* d : n->deps) deps.push_back(last_step.at(d));
    const size_t first = out->size();
    if (n->work.type == CU_GRAPH_NODE_TYPE_GRAPH) {
      if (!flatten(*n->work.child, top ? top : n, out)) return false;
      if (out->size() > first) (*out)[first].deps.insert((*out)[first].deps.end(), deps.begin(), deps.end());
    }
    if (out->size() == first) {  // not a child graph, or an empty one
      ExecStep st;
      st.top = top ? top : n;
      st.node = n;
      st.deps = std::move(deps);
      st.work = n->work.type == CU_GRAPH_NODE_TYPE_GRAPH ? NodeWork{} : n->work.clone();
      st.enabled = n->enabled;
      out->push_back(std::move(st));
    }
    last_step[n] = out->size() - 1;
    for (const GraphNode* a : after[n])
      if (--waiting[a] == 0) ready.push_back(a);
  }
  return done == g.nodes.size();
}

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

CUstream to_stream(ordo::Stream s) { return reinterpret_cast<CUstream>(stream_handle(s)); }

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

CUresult instantiate(CUgraphExec* out, CUgraph h, unsigned long long flags, CUgraphNode* err_node) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (err_node) *err_node = nullptr;
  constexpr unsigned long long kKnown = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                        CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD | CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                        CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  // Graphs launched by kernels: the device cannot reach the guest's graphs.
  if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) return CUDA_ERROR_NOT_SUPPORTED;
  auto x = std::make_unique<GraphExec>();
  {
    std::lock_guard lock(graph_mutex());
    const Graph* g = graph_of(h);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    if (!flatten(*g, nullptr, &x->steps)) return CUDA_ERROR_INVALID_VALUE;  // a cycle
    x->id = g_next_id++;
    for (auto [o, count] : g->user_objects) retain_user_object(o, count);
    x->user_objects = g->user_objects;
  }
  x->flags = flags;
  if (CUresult e = cuEventCreate(&x->done, CU_EVENT_DISABLE_TIMING); e != CUDA_SUCCESS) return e;
  std::lock_guard lock(graph_mutex());
  live().insert(x.get());
  *out = reinterpret_cast<CUgraphExec>(x.release());
  return CUDA_SUCCESS;
}

// Whether `b`'s steps can take the place of `a`'s: the same nodes in the same
// order with the same edges, each of the same type (cuGraphExecUpdate's rules,
// in short).
CUgraphExecUpdateResult same_shape(const std::vector<ExecStep>& a, const std::vector<ExecStep>& b, size_t* at) {
  if (a.size() != b.size()) {
    *at = std::min(a.size(), b.size());
    return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    *at = i;
    if (a[i].work.type != b[i].work.type) return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
    if (a[i].deps != b[i].deps) return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  }
  return CU_GRAPH_EXEC_UPDATE_SUCCESS;
}

CUresult exec_update(CUgraphExec hx, CUgraph h, CUgraphNode* err_node, CUgraphExecUpdateResult* result) {
  std::lock_guard lock(graph_mutex());
  GraphExec* x = live_exec(hx);
  const Graph* g = graph_of(h);
  if (!x || !g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<ExecStep> steps;
  size_t at = 0;
  CUgraphExecUpdateResult r = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  if (flatten(*g, nullptr, &steps)) r = same_shape(x->steps, steps, &at);
  if (result) *result = r;
  if (r != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
    if (err_node) *err_node = at < steps.size() ? reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(steps[at].top)) : nullptr;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  if (err_node) *err_node = nullptr;
  for (size_t i = 0; i < steps.size(); ++i) {
    x->steps[i].work = std::move(steps[i].work);
    x->steps[i].enabled = steps[i].enabled;
  }
  x->planned = false;
  return CUDA_SUCCESS;
}

// Replaces the work of an exec's steps that come from `node` (not a child
// graph's) with `w`, which must be of the same type.
CUresult exec_set(CUgraphExec hx, CUgraphNode node, NodeWork w) {
  std::lock_guard lock(graph_mutex());
  GraphExec* x = live_exec(hx);
  const GraphNode* n = live_node(node);
  if (!x || !n || n->work.type != w.type) return CUDA_ERROR_INVALID_VALUE;
  for (ExecStep& st : x->steps)
    if (st.node == n) {
      st.work = std::move(w);
      x->planned = false;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;  // not a node of the graph this exec was made from
}

CUresult exec_set_child(CUgraphExec hx, CUgraphNode node, CUgraph child) {
  std::lock_guard lock(graph_mutex());
  GraphExec* x = live_exec(hx);
  const GraphNode* n = live_node(node);
  const Graph* g = graph_of(child);
  if (!x || !n || !g || n->work.type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
  std::vector<ExecStep> steps;
  if (!flatten(*g, n, &steps)) return CUDA_ERROR_INVALID_VALUE;
  auto first = std::find_if(x->steps.begin(), x->steps.end(), [n](const ExecStep& s) { return s.top == n; });
  const size_t at = size_t(first - x->steps.begin());
  if (first == x->steps.end() || at + steps.size() > x->steps.size()) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < steps.size(); ++i) {
    ExecStep& st = x->steps[at + i];
    if (st.top != n || st.work.type != steps[i].work.type) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  for (size_t i = 0; i < steps.size(); ++i) x->steps[at + i].work = std::move(steps[i].work);
  x->planned = false;
  return CUDA_SUCCESS;
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
  *params = n->arg_ptrs.empty() && !n->work.args.empty() ? nullptr : n->arg_ptrs.data();
  *extra = nullptr;
}

// Appends `w`'s device work to `out` if the worker can run all of it without
// the guest: a kernel with a plain launch configuration, a byte-pattern memset
// or a copy between device allocations. False leaves `out` as it was.
bool device_steps(ordo::Client* c, const NodeWork& w, GraphStepWriter* out) {
  switch (w.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const Function* f = function_of(w.fn);
      const uint64_t threads = uint64_t{w.block.x} * w.block.y * w.block.z;
      // What Client::launch would refuse, or check against the device, is left to it.
      if (!f || threads > 1024 || w.block.z > 64 || w.grid.x > 0x7fffffffu || w.grid.y > 65535 ||
          w.grid.z > 65535 || w.smem > 48 * 1024 || w.args.size() > kMaxGraphParamBytes)
        return false;
      out->kernel({f->id, w.smem, w.grid, w.block, uint32_t(w.args.size()), 0}, w.args.data());
      return true;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS& p = w.set;
      const uint8_t b = uint8_t(p.value);
      for (unsigned i = 1; i < p.elementSize; ++i)
        if (uint8_t(p.value >> (8 * i)) != b) return false;
      const uint64_t row = uint64_t(p.width) * p.elementSize;
      for (size_t r = 0; r < p.height; ++r)
        if (!device_allocs().find(p.dst + r * p.pitch, nullptr, nullptr) || mapped_host(c, p.dst + r * p.pitch, row))
          return false;
      for (size_t r = 0; r < p.height; ++r) out->memset({p.dst + r * p.pitch, b, row});
      return true;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      const CUDA_MEMCPY3D& p = w.copy;
      auto device = [](CUmemorytype t) { return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED; };
      if (!device(p.srcMemoryType) || !device(p.dstMemoryType)) return false;
      std::vector<CopyStep> rows;
      for (size_t z = 0; z < p.Depth; ++z)
        for (size_t y = 0; y < p.Height; ++y) {
          const uint64_t src = p.srcDevice + p.srcXInBytes + (p.srcY + y) * p.srcPitch +
                               (p.srcZ + z) * p.srcHeight * p.srcPitch;
          const uint64_t dst = p.dstDevice + p.dstXInBytes + (p.dstY + y) * p.dstPitch +
                               (p.dstZ + z) * p.dstHeight * p.dstPitch;
          for (uint64_t a : {src, dst})
            if (!device_allocs().find(a, nullptr, nullptr) || mapped_host(c, a, p.WidthInBytes)) return false;
          rows.push_back({dst, src, p.WidthInBytes});
        }
      for (const CopyStep& r : rows) out->copy(r);
      return true;
    }
    default: return false;
  }
}

// The exec's plan: consecutive device steps become one worker graph each;
// the rest, and device steps the worker would not take, are replayed.
void make_plan(ordo::Client* c, GraphExec* x) {
  for (const PlanItem& p : x->plan)
    if (p.graph) c->graph_destroy(p.graph);
  x->plan.clear();
  GraphStepWriter run;
  std::vector<size_t> in_run;  // the steps in `run`: replayed if the worker does not take it
  auto flush = [&] {
    if (in_run.empty()) return;
    uint32_t id = 0;
    if (run.bytes().size() <= kMaxGraphBytes && ok(c->graph_create(run.bytes().data(), run.bytes().size(), &id)))
      x->plan.push_back({id, 0});
    else
      for (size_t i : in_run) x->plan.push_back({0, i});
    run = {};
    in_run.clear();
  };
  for (size_t i = 0; i < x->steps.size(); ++i) {
    const ExecStep& st = x->steps[i];
    if (!st.enabled || st.work.type == CU_GRAPH_NODE_TYPE_EMPTY) continue;
    if (device_steps(c, st.work, &run)) {
      in_run.push_back(i);
    } else {
      flush();
      x->plan.push_back({0, i});
    }
  }
  flush();
  x->planned = true;
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
  auto n = std::make_unique<GraphNode>();
  n->graph = g;
  n->work = std::move(work);
  n->deps = deps;
  live().insert(n.get());
  g->nodes.push_back(std::move(n));
  return g->nodes.back().get();
}

Graph* new_graph() {
  auto* g = new Graph;
  g->id = g_next_id++;
  live().insert(g);
  return g;
}

void delete_graph(Graph* g) {
  forget(g);
  delete g;
}

bool live_graph(const Graph* g) { return g && live().count(g); }

GraphNode* live_node(CUgraphNode hn) {
  auto* n = reinterpret_cast<GraphNode*>(hn);
  return hn && live().count(n) ? n : nullptr;
}

CUresult run_work(const NodeWork& w, CUstream stream, bool per_thread) {
  switch (w.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      size_t size = w.args.size();
      void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(w.args.data()),
                       CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
      return launch_kernel(w.fn, w.grid.x, w.grid.y, w.grid.z, w.block.x, w.block.y, w.block.z, w.smem, stream,
                           nullptr, extra, per_thread);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      const CUDA_MEMCPY3D& p = w.copy;
      for (size_t z = 0; z < p.Depth; ++z) {
        CUDA_MEMCPY2D q{};
        const size_t src_slice = (p.srcZ + z) * p.srcHeight * p.srcPitch;
        const size_t dst_slice = (p.dstZ + z) * p.dstHeight * p.dstPitch;
        q.srcXInBytes = p.srcXInBytes, q.srcY = p.srcY, q.srcMemoryType = p.srcMemoryType;
        q.srcHost = static_cast<const char*>(p.srcHost) + (p.srcHost ? src_slice : 0);
        q.srcDevice = p.srcDevice + (p.srcDevice ? src_slice : 0);
        q.srcPitch = p.srcPitch;
        q.dstXInBytes = p.dstXInBytes, q.dstY = p.dstY, q.dstMemoryType = p.dstMemoryType;
        q.dstHost = static_cast<char*>(p.dstHost) + (p.dstHost ? dst_slice : 0);
        q.dstDevice = p.dstDevice + (p.dstDevice ? dst_slice : 0);
        q.dstPitch = p.dstPitch;
        q.WidthInBytes = p.WidthInBytes;
        q.Height = p.Height;
        if (CUresult e = memcpy_2d_async(&q, stream, per_thread); e != CUDA_SUCCESS) return e;
      }
      return CUDA_SUCCESS;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS& p = w.set;
      for (size_t row = 0; row < p.height; ++row) {
        const CUdeviceptr d = p.dst + row * p.pitch;
        CUresult e = CUDA_SUCCESS;
        switch (p.elementSize) {
          case 1: e = memset_d8_async(d, uint8_t(p.value), p.width, stream, per_thread); break;
          case 2: e = memset_d16_async(d, uint16_t(p.value), p.width, stream, per_thread); break;
          default: e = memset_d32_async(d, p.value, p.width, stream, per_thread); break;
        }
        if (e != CUDA_SUCCESS) return e;
      }
      return CUDA_SUCCESS;
    }
    case CU_GRAPH_NODE_TYPE_HOST: return launch_host_func(stream, w.host.fn, w.host.userData, per_thread);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return event_record(w.event, stream, per_thread);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return stream_wait_event(stream, w.event, 0, per_thread);
    default: return CUDA_SUCCESS;  // empty
  }
}

// ================================================================ behind the exports (forwarders.txt)

CUresult graph_launch(CUgraphExec hx, CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  GraphExec* x = nullptr;
  {
    std::lock_guard lock(graph_mutex());
    x = live_exec(hx);
  }
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t key = uint64_t(s.generation) << 32 | s.id;
  // Launched into a capture, the launches are ordered by the graph being captured.
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  if (any_capture()) stream_is_capturing(to_stream(s), &capturing, false);
  if (capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
    for (const ExecStep& st : x->steps)
      if (st.enabled)
        if (CUresult e = run_work(st.work, to_stream(s), false); e != CUDA_SUCCESS) return e;
    return CUDA_SUCCESS;
  }
  if (x->launched && x->last_stream != key)
    if (CUresult e = stream_wait_event(to_stream(s), x->done, 0, false); e != CUDA_SUCCESS) return e;
  if (!x->planned) make_plan(c, x);
  for (const PlanItem& p : x->plan) {
    const CUresult e = p.graph ? to_cu(c->graph_launch(p.graph, s)) : run_work(x->steps[p.step].work, to_stream(s), false);
    if (e != CUDA_SUCCESS) return e;
  }
  if (CUresult e = event_record(x->done, to_stream(s), false); e != CUDA_SUCCESS) return e;
  x->launched = true;
  x->last_stream = key;
  x->last_handle = to_stream(s);
  return CUDA_SUCCESS;
}

CUresult graph_upload(CUgraphExec hx, CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lock(graph_mutex());
  return live_exec(hx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;  // nothing to upload: the guest keeps the exec
}

CUresult graph_instantiate_with_params(CUgraphExec* out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p,
                                       bool per_thread) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUresult e = instantiate(out, g, p->flags, &p->hErrNode_out);
  if (e == CUDA_SUCCESS && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD))
    e = graph_upload(*out, p->hUploadStream, per_thread);
  p->result_out = e == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return e;
}

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
  live().erase(n);
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
  n->work = std::move(w);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec x, CUgraphNode hn, CUgraphNodeParams* params) {
  if (params && params->type == CU_GRAPH_NODE_TYPE_GRAPH) return cuGraphExecChildGraphNodeSetParams(x, hn, params->graph.graph);
  NodeWork w;
  {
    std::lock_guard lock(graph_mutex());
    if (CUresult e = work_of(params, &w); e != CUDA_SUCCESS) return e;
  }
  return exec_set(x, hn, std::move(w));
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

CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  NodeWork w;
  if (CUresult e = kernel_node_work(p->func ? p->func : reinterpret_cast<CUfunction>(p->kern),
                                    {p->gridDimX, p->gridDimY, p->gridDimZ}, {p->blockDimX, p->blockDimY, p->blockDimZ},
                                    p->sharedMemBytes, p->kernelParams, p->extra, &w);
      e != CUDA_SUCCESS)
    return e;
  return exec_set(x, hn, std::move(w));
}
CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec x, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2{};
  std::memcpy(&v2, p, sizeof *p);
  return cuGraphExecKernelNodeSetParams_v2(x, hn, &v2);
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
CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec x, CUgraphNode hn, CUgraph child) {
  return exec_set_child(x, hn, child);
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

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph g, unsigned long long flags) {
  return instantiate(out, g, flags, nullptr);
}
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* out, CUgraph g, CUgraphNode* err_node, char* log, size_t log_size) {
  if (log && log_size) log[0] = '\0';
  return instantiate(out, g, 0, err_node);
}
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* out, CUgraph g, CUgraphNode* err_node, char* log,
                                       size_t log_size) {
  return cuGraphInstantiate(out, g, err_node, log, log_size);
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hx) {
  GraphExec* x = nullptr;
  {
    std::lock_guard lock(graph_mutex());
    x = live_exec(hx);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    live().erase(x);
  }
  // Neither waits for the exec's launches: CUDA lets a launched exec be
  // destroyed, and its work still runs (Client::graph_destroy, cuEventDestroy).
  if (ordo::Client* c = attached_client())
    for (const PlanItem& p : x->plan)
      if (p.graph) c->graph_destroy(p.graph);
  cuEventDestroy_v2(x->done);
  if (!x->user_objects.empty()) {
    // Released once the last launch ran: its stream's host function, or now.
    using Held = std::map<UserObject*, unsigned>;
    auto* held = new Held(std::move(x->user_objects));
    CUhostFn release = [](void* p) {
      auto* h = static_cast<Held*>(p);
      for (auto [o, n] : *h) release_user_object(o, n);
      delete h;
    };
    if (!x->launched || launch_host_func(x->last_handle, release, held, false) != CUDA_SUCCESS) release(held);
  }
  delete x;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec hx, cuuint64_t* flags) {
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const GraphExec* x = live_exec(hx);
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  *flags = x->flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec x, CUgraph g, CUgraphExecUpdateResultInfo* info) {
  if (info) *info = {};
  CUgraphNode err = nullptr;
  CUgraphExecUpdateResult r = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  const CUresult e = exec_update(x, g, &err, &r);
  if (info) {
    info->result = r;
    info->errorNode = err;
  }
  return e;
}
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec x, CUgraph g, CUgraphNode* err_node, CUgraphExecUpdateResult* result) {
  return exec_update(x, g, err_node, result);
}

CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec hx, CUgraphNode hn, unsigned int enabled) {
  std::lock_guard lock(graph_mutex());
  GraphExec* x = live_exec(hx);
  const GraphNode* n = live_node(hn);
  if (!x || !n) return CUDA_ERROR_INVALID_VALUE;
  const CUgraphNodeType t = n->work.type;
  if (t != CU_GRAPH_NODE_TYPE_KERNEL && t != CU_GRAPH_NODE_TYPE_MEMCPY && t != CU_GRAPH_NODE_TYPE_MEMSET)
    return CUDA_ERROR_INVALID_VALUE;
  for (ExecStep& st : x->steps)
    if (st.node == n) {
      st.enabled = enabled != 0;
      x->planned = false;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec hx, CUgraphNode hn, unsigned int* enabled) {
  if (!enabled) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const GraphExec* x = live_exec(hx);
  const GraphNode* n = live_node(hn);
  if (!x || !n) return CUDA_ERROR_INVALID_VALUE;
  for (const ExecStep& st : x->steps)
    if (st.node == n) {
      *enabled = st.enabled;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

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

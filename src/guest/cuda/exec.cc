// Execs: a graph instantiated (its nodes in an order the edges allow, child
// graphs inlined), updated in place, and launched: runs of device nodes as
// worker graphs (one GraphLaunch entry each), the other nodes as the calls they
// stand for, after the exec's previous launch, as CUDA orders launches of one exec.
#include "graph.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

#include "forwarded.h"
#include "module.h"
#include "transport/graph_steps.h"

namespace ordo::driver {

namespace {

// Nodes are named by serial (GraphNode::serial): the graph an exec was made
// from may be gone, and its nodes' addresses reused.
struct ExecStep {
  uint64_t top = 0;   // the node of the instantiated graph it comes from
  uint64_t node = 0;  // itself, or the node of a child graph inside `top`
  const GraphNode* report = nullptr;  // `top`, for an update's error node (while that graph lives)
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
  // Conditional nodes: the graph's handles, and whether the worker took the
  // whole exec as one program (a conditional cannot be replayed by the guest).
  std::vector<HandleStep> handles;
  bool conditional = false;
  bool plan_failed = false;
  unsigned long long flags = 0;
  // Launches of one exec run one after another, on any streams: each launch
  // records `done`, and a launch on another stream than the last waits for it.
  CUevent done = nullptr;
  uint64_t last_stream = 0;
  CUstream last_handle = nullptr;  // that stream: the exec's user objects go after its last launch
  std::map<UserObject*, unsigned> user_objects;  // the graph's, retained at instantiate
  bool launched = false;
  uint32_t id = 0;
  // The graph it was made from (Graph::live_execs counts it), compared by id
  // before use: it may be gone, and its address reused.
  Graph* source = nullptr;
  uint32_t source_id = 0;
  // Its memory nodes' steps, in launch order (graph_memory_launch).
  std::vector<const NodeWork*> memory_steps() const {
    std::vector<const NodeWork*> out;
    for (const ExecStep& st : steps)
      if (st.work.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || st.work.type == CU_GRAPH_NODE_TYPE_MEM_FREE)
        out.push_back(&st.work);
    return out;
  }
};

// The exec's copy of node `serial` in a conditional's body, or null.
GraphNode* body_node(GraphExec* x, uint64_t serial) {
  for (ExecStep& st : x->steps)
    if (st.work.type == CU_GRAPH_NODE_TYPE_CONDITIONAL)
      if (GraphNode* n = node_in_bodies(st.work, serial)) return n;
  return nullptr;
}

GraphExec* live_exec(CUgraphExec h) {
  auto* x = reinterpret_cast<GraphExec*>(h);
  return h && live_handles().count(x) ? x : nullptr;
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
      st.report = top ? top : n;
      st.top = st.report->serial;
      st.node = n->serial;
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

// Whether every free node of an allocation made in the same exec comes after
// its allocation node (CUDA requires the free to be ordered after it).
bool frees_follow_allocs(const std::vector<ExecStep>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].work.free) continue;
    const GraphAllocation* a = freed_allocation(steps[i].work);
    size_t at = steps.size();
    for (size_t j = 0; j < steps.size(); ++j)
      if (steps[j].work.alloc.get() == a) at = j;
    if (at == steps.size()) continue;  // another graph's allocation
    std::vector<size_t> todo = steps[i].deps;
    std::vector<bool> seen(steps.size());
    bool found = false;
    while (!todo.empty() && !found) {
      const size_t k = todo.back();
      todo.pop_back();
      if (seen[k]) continue;
      seen[k] = true;
      found = k == at;
      todo.insert(todo.end(), steps[k].deps.begin(), steps[k].deps.end());
    }
    if (!found) return false;
  }
  return true;
}

// The handle that names `s` again: the legacy stream has one of its own.
CUstream to_stream(ordo::Stream s) {
  return reinterpret_cast<CUstream>(s.id == ordo::kLegacyStreamId ? kLegacyHandle : stream_handle(s));
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
    if (!frees_follow_allocs(x->steps)) return CUDA_ERROR_INVALID_VALUE;
    if (has_conditional_nodes(*g)) {
      if (CUresult e = check_conditionals(*g); e != CUDA_SUCCESS) return e;
      x->conditional = true;
      x->handles = conditional_handles(*g);
    }
    x->id = next_graph_id();
    // The graph's user objects, its child graphs' too: the exec outlives them.
    auto hold = [&x](const Graph& graph, auto& self) -> void {
      for (auto [o, count] : graph.user_objects) {
        retain_user_object(o, count);
        x->user_objects[o] += count;
      }
      for (const auto& n : graph.nodes)
        if (n->work.child) self(*n->work.child, self);
    };
    hold(*g, hold);
  }
  x->flags = flags;
  if (CUresult e = cuEventCreate(&x->done, CU_EVENT_DISABLE_TIMING); e != CUDA_SUCCESS) return e;
  std::lock_guard lock(graph_mutex());
  Graph* g = graph_of(h);
  // A graph with memory nodes has one exec at a time: its allocations are the
  // exec's. So has one with conditional nodes (CUDA's rule).
  if (!g || (g->live_execs && (has_memory_nodes(*g) || x->conditional))) {
    cuEventDestroy_v2(x->done);
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++g->live_execs;
  x->source = g;
  x->source_id = g->id;
  live_handles().insert(x.get());
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
    // Memory nodes keep their allocation: another graph's cannot take their place.
    if (a[i].work.alloc != b[i].work.alloc || a[i].work.free != b[i].work.free)
      return CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED;
    if (a[i].work.type == CU_GRAPH_NODE_TYPE_CONDITIONAL && !same_bodies(a[i].work, b[i].work))
      return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
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
  if (r == CU_GRAPH_EXEC_UPDATE_SUCCESS && x->conditional && check_conditionals(*g) != CUDA_SUCCESS)
    r = CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED;
  if (result) *result = r;
  if (r != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
    if (err_node) *err_node = at < steps.size() ? reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(steps[at].report)) : nullptr;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  if (err_node) *err_node = nullptr;
  for (size_t i = 0; i < steps.size(); ++i) {
    x->steps[i].work = std::move(steps[i].work);
    x->steps[i].enabled = steps[i].enabled;
  }
  if (x->conditional) x->handles = conditional_handles(*g);
  x->planned = false;
  return CUDA_SUCCESS;
}

CUresult exec_set_child(CUgraphExec hx, CUgraphNode node, CUgraph child) {
  std::lock_guard lock(graph_mutex());
  GraphExec* x = live_exec(hx);
  const GraphNode* n = live_node(node);
  const Graph* g = graph_of(child);
  if (!x || !n || !g || n->work.type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
  std::vector<ExecStep> steps;
  if (!flatten(*g, n, &steps)) return CUDA_ERROR_INVALID_VALUE;
  auto first = std::find_if(x->steps.begin(), x->steps.end(), [n](const ExecStep& s) { return s.top == n->serial; });
  const size_t at = size_t(first - x->steps.begin());
  if (first == x->steps.end()) return CUDA_ERROR_INVALID_VALUE;
  const size_t had = size_t(std::count_if(x->steps.begin(), x->steps.end(), [n](const ExecStep& s) { return s.top == n->serial; }));
  if (had != steps.size()) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;  // another shape
  for (size_t i = 0; i < steps.size(); ++i) {
    ExecStep& st = x->steps[at + i];
    if (st.top != n->serial || st.work.type != steps[i].work.type) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  for (size_t i = 0; i < steps.size(); ++i) x->steps[at + i].work = std::move(steps[i].work);
  x->planned = false;
  return CUDA_SUCCESS;
}

// An exec with conditional nodes is one worker program: its handles, then
// every step. A handle's value lives for the whole launch, so the steps
// cannot be split around work the guest replays. False if a step is not
// device work (or the worker refuses the program).
bool plan_program(ordo::Client* c, GraphExec* x) {
  GraphStepWriter run;
  for (const HandleStep& h : x->handles) run.handle(h);
  for (const ExecStep& st : x->steps) {
    if (!st.enabled || st.work.type == CU_GRAPH_NODE_TYPE_EMPTY || st.work.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
        st.work.type == CU_GRAPH_NODE_TYPE_MEM_FREE)
      continue;
    if (!device_steps(c, st.work, &run)) return false;
  }
  uint32_t id = 0;
  if (run.bytes().size() > kMaxGraphBytes || !ok(c->graph_create(run.bytes().data(), run.bytes().size(), &id)))
    return false;
  x->plan.push_back({id, 0});
  return true;
}

// The exec's plan: consecutive device steps become one worker graph each;
// the rest, and device steps the worker would not take, are replayed.
void make_plan(ordo::Client* c, GraphExec* x) {
  for (const PlanItem& p : x->plan)
    if (p.graph) c->graph_destroy(p.graph);
  x->plan.clear();
  x->planned = true;
  if (x->conditional) {
    x->plan_failed = !plan_program(c, x);
    return;
  }
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
    // Memory nodes are the launch's bookkeeping (graph_memory_launch), no stream work.
    if (!st.enabled || st.work.type == CU_GRAPH_NODE_TYPE_EMPTY || st.work.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
        st.work.type == CU_GRAPH_NODE_TYPE_MEM_FREE)
      continue;
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

}  // namespace

// Replaces the work of an exec's steps that come from `node` (not a child
// graph's) with `w`, which must be of the same type.
CUresult exec_set(CUgraphExec hx, CUgraphNode node, NodeWork w) {
  std::lock_guard lock(graph_mutex());
  GraphExec* x = live_exec(hx);
  const GraphNode* n = live_node(node);
  if (!x || !n || n->work.type != w.type) return CUDA_ERROR_INVALID_VALUE;
  for (ExecStep& st : x->steps)
    if (st.node == n->serial) {
      st.work = std::move(w);
      x->planned = false;
      return CUDA_SUCCESS;
    }
  // A node of a conditional's body (XLA updates those through the parent's exec).
  if (GraphNode* in = body_node(x, n->serial)) {
    w.attrs = std::move(in->work.attrs);
    in->work = std::move(w);
    x->planned = false;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;  // not a node of the graph this exec was made from
}

CUresult run_work(const NodeWork& w, CUstream stream, bool per_thread) {
  switch (w.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return launch_node_kernel(w, stream, per_thread);
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
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return CUDA_ERROR_NOT_SUPPORTED;  // only the device decides it (plan_program)
    default: return CUDA_SUCCESS;  // empty
  }
}

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
  if (any_capture()) {
    // Launched into a capture, its nodes become the capture's (in an order
    // their edges allow), and the graph being captured orders its launches.
    CUresult r = CUDA_SUCCESS;
    if (capture_refuses_legacy(c, s, &r)) return r;
    {
      // Its memory nodes would become a second graph's: CUDA nests such graphs only by moving them.
      std::lock_guard lock(graph_mutex());
      if (capturing_graph(s) && !x->memory_steps().empty()) return CUDA_ERROR_NOT_SUPPORTED;
      // Its conditional nodes would need handles of the graph being captured.
      if (capturing_graph(s) && x->conditional) return CUDA_ERROR_NOT_SUPPORTED;
    }
    bool captured = false;
    for (const ExecStep& st : x->steps)
      if (st.enabled && capture_work(c, s, st.work.clone(), &r)) {
        captured = true;
        if (r != CUDA_SUCCESS) return r;
      }
    if (captured) return CUDA_SUCCESS;
  }
  if (CUresult e = graph_memory_launch(x->memory_steps(), x->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
      e != CUDA_SUCCESS)
    return e;
  if (x->launched && x->last_stream != key)
    if (CUresult e = stream_wait_event(to_stream(s), x->done, 0, false); e != CUDA_SUCCESS) return e;
  if (!x->planned) make_plan(c, x);
  if (x->plan_failed) {
    static std::once_flag said;
    std::call_once(said, [] {
      std::fprintf(stderr,
                   "ordo: cuGraphLaunch: a graph with conditional nodes runs on the worker as one program, and this "
                   "one has work the worker cannot run there (host or event nodes, or copies of host memory); "
                   "CUDA_ERROR_NOT_SUPPORTED (docs/CUDA.md, CUDA graphs)\n");
    });
    return CUDA_ERROR_NOT_SUPPORTED;
  }
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

CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec x, CUgraphNode hn, CUgraphNodeParams* params) {
  if (params && params->type == CU_GRAPH_NODE_TYPE_GRAPH) return cuGraphExecChildGraphNodeSetParams(x, hn, params->graph.graph);
  NodeWork w;
  {
    std::lock_guard lock(graph_mutex());
    if (CUresult e = work_of(params, &w); e != CUDA_SUCCESS) return e;
  }
  return exec_set(x, hn, std::move(w));
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  NodeWork w;
  if (CUresult e = kernel_params_work(*p, &w); e != CUDA_SUCCESS) return e;
  return exec_set(x, hn, std::move(w));
}
CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec x, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2{};
  std::memcpy(&v2, p, sizeof *p);
  return cuGraphExecKernelNodeSetParams_v2(x, hn, &v2);
}

CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec x, CUgraphNode hn, CUgraph child) {
  return exec_set_child(x, hn, child);
}

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
    live_handles().erase(x);
    if (live_graph(x->source) && x->source->id == x->source_id) --x->source->live_execs;
  }
  // Neither waits for the exec's launches: CUDA lets a launched exec be
  // destroyed, and its work still runs (Client::graph_destroy, cuEventDestroy).
  if (ordo::Client* c = attached_client())
    for (const PlanItem& p : x->plan)
      if (p.graph) c->graph_destroy(p.graph);
  // Its allocations' cached memory is reused once its last launch is done.
  if (!x->launched || !graph_memory_retire(x->memory_steps(), x->done)) cuEventDestroy_v2(x->done);
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
    if (st.node == n->serial) {
      st.enabled = enabled != 0;
      x->planned = false;
      return CUDA_SUCCESS;
    }
  if (GraphNode* in = body_node(x, n->serial)) {
    in->enabled = enabled != 0;
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
    if (st.node == n->serial) {
      *enabled = st.enabled;
      return CUDA_SUCCESS;
    }
  if (const GraphNode* in = body_node(const_cast<GraphExec*>(x), n->serial)) {
    *enabled = in->enabled;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // extern "C"

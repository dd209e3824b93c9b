// Conditional graph nodes (IF, WHILE, SWITCH): handles, the node and its body
// graphs, the checks CUDA makes at instantiation, and the graph steps that
// carry them to the worker. Which body runs is decided on the device, from
// the value a kernel of the same launch set (cudaGraphSetConditional), so a
// graph with conditionals goes to the worker as one program (exec.cc) whose
// handles the worker's backend issued (Op::GraphCondHandle).
#include <algorithm>
#include <cstdio>
#include <map>

#include "graph.h"

namespace ordo::driver {
namespace {

bool allowed_in_body(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
    case CU_GRAPH_NODE_TYPE_EMPTY:
    case CU_GRAPH_NODE_TYPE_GRAPH:
    case CU_GRAPH_NODE_TYPE_MEMSET:
    case CU_GRAPH_NODE_TYPE_MEMCPY:
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return true;
    default: return false;
  }
}

// g's nodes with each after those it depends on; false on a cycle.
bool ordered(const Graph& g, std::vector<const GraphNode*>* out) {
  std::map<const GraphNode*, size_t> waiting;
  std::map<const GraphNode*, std::vector<const GraphNode*>> after;
  std::vector<const GraphNode*> ready;
  for (const auto& n : g.nodes) {
    waiting[n.get()] = n->deps.size();
    for (const GraphNode* d : n->deps) after[d].push_back(n.get());
  }
  for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it)
    if ((*it)->deps.empty()) ready.push_back(it->get());
  while (!ready.empty()) {
    const GraphNode* n = ready.back();
    ready.pop_back();
    out->push_back(n);
    for (const GraphNode* a : after[n])
      if (--waiting[a] == 0) ready.push_back(a);
  }
  return out->size() == g.nodes.size();
}

// A copy of `g` that is no handle: an exec's, which the program cannot name.
std::unique_ptr<Graph> snapshot(const Graph& g) {
  auto c = std::make_unique<Graph>();
  c->cond_handles = g.cond_handles;
  c->embedded = true;
  std::map<const GraphNode*, GraphNode*> map;
  for (const auto& n : g.nodes) {
    auto x = std::make_unique<GraphNode>();
    x->graph = c.get();
    x->serial = n->serial;
    x->enabled = n->enabled;
    if (n->work.type == CU_GRAPH_NODE_TYPE_GRAPH) {  // clone() would register a copy of the child
      x->work.type = CU_GRAPH_NODE_TYPE_GRAPH;
      if (n->work.child) x->work.child = snapshot(*n->work.child);
    } else {
      x->work = n->work.clone();
    }
    map[n.get()] = x.get();
    c->nodes.push_back(std::move(x));
  }
  // Edges after every node: one may come from a node added later (cuGraphAddDependencies).
  for (const auto& n : g.nodes)
    for (const GraphNode* d : n->deps) map.at(n.get())->deps.push_back(map.at(d));
  return c;
}

bool handle_reachable(const Graph* g, CUgraphConditionalHandle h) {
  for (; g; g = g->parent)
    if (g->cond_handles.count(h)) return true;
  return false;
}

CUresult check_graph(const Graph& g, bool in_body) {
  if (in_body) {
    std::vector<const GraphNode*> nodes;
    if (!ordered(g, &nodes)) return CUDA_ERROR_INVALID_VALUE;  // a cycle
  }
  for (const auto& n : g.nodes) {
    if (in_body && !allowed_in_body(n->work.type)) return CUDA_ERROR_INVALID_VALUE;
    if (n->work.child)
      if (CUresult e = check_graph(*n->work.child, in_body); e != CUDA_SUCCESS) return e;
    if (n->work.type != CU_GRAPH_NODE_TYPE_CONDITIONAL) continue;
    if (!handle_reachable(&g, n->work.cond)) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& b : n->work.bodies)
      if (CUresult e = check_graph(*b, true); e != CUDA_SUCCESS) return e;
  }
  return CUDA_SUCCESS;
}

void collect_handles(const Graph& g, std::vector<HandleStep>* out) {
  for (auto& [h, v] : g.cond_handles) out->push_back({uint64_t(h), v.first, v.second});
  for (const auto& n : g.nodes) {
    if (n->work.child) collect_handles(*n->work.child, out);
    for (const auto& b : n->work.bodies) collect_handles(*b, out);
  }
}

// A body's nodes as steps, child graphs inlined; false if one is not device work.
bool body_steps(ordo::Client* c, const Graph& g, GraphStepWriter* out) {
  std::vector<const GraphNode*> nodes;
  if (!ordered(g, &nodes)) return false;
  for (const GraphNode* n : nodes) {
    if (!n->enabled || n->work.type == CU_GRAPH_NODE_TYPE_EMPTY) continue;
    if (n->work.type == CU_GRAPH_NODE_TYPE_GRAPH) {
      if (!n->work.child || !body_steps(c, *n->work.child, out)) return false;
      continue;
    }
    if (!device_steps(c, n->work, out)) return false;
  }
  return true;
}

// What cuGraphExecUpdate compares: each node's type and edges, in order, bodies too.
void shape_of_graph(const Graph& g, std::vector<uint64_t>* out) {
  std::map<const GraphNode*, uint64_t> index;
  for (const auto& n : g.nodes) {
    index[n.get()] = index.size();
    out->push_back(uint64_t(n->work.type) << 32 | n->deps.size());
    for (const GraphNode* d : n->deps) out->push_back(index.count(d) ? index[d] : ~uint64_t{0});
    if (n->work.child) shape_of_graph(*n->work.child, out);
    for (const auto& b : n->work.bodies) {
      out->push_back(~uint64_t{1});  // a body begins
      shape_of_graph(*b, out);
    }
  }
}

}  // namespace

CUresult conditional_node_work(Graph* g, CUDA_CONDITIONAL_NODE_PARAMS* p, NodeWork* w) {
  if (!p || !g) return CUDA_ERROR_INVALID_VALUE;
  const bool fits = p->type == CU_GRAPH_COND_TYPE_IF      ? p->size == 1 || p->size == 2
                    : p->type == CU_GRAPH_COND_TYPE_WHILE ? p->size == 1
                    : p->type == CU_GRAPH_COND_TYPE_SWITCH && p->size >= 1 && p->size <= kMaxGraphSteps / 2;
  if (!fits) return CUDA_ERROR_INVALID_VALUE;
  if (p->ctx && p->ctx != handle(current())) return CUDA_ERROR_INVALID_CONTEXT;
  // The handle must be the graph's, or an enclosing graph's (the node may sit in a body).
  if (!handle_reachable(g, p->handle)) return CUDA_ERROR_INVALID_VALUE;
  w->type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  w->cond = p->handle;
  w->cond_type = p->type;
  for (unsigned i = 0; i < p->size; ++i) {
    auto b = std::make_unique<Graph>();
    b->id = next_graph_id();
    b->parent = g;
    b->embedded = true;  // no memory nodes; the node owns it (cuGraphDestroy refuses it)
    live_handles().insert(b.get());
    w->body_handles.push_back(reinterpret_cast<CUgraph>(b.get()));
    w->bodies.push_back(std::move(b));
  }
  p->phGraph_out = w->body_handles.data();
  return CUDA_SUCCESS;
}

NodeWork conditional_snapshot(const NodeWork& w) {
  NodeWork c;
  c.type = w.type;
  c.cond = w.cond;
  c.cond_type = w.cond_type;
  for (const auto& b : w.bodies) {
    c.bodies.push_back(snapshot(*b));
    c.body_handles.push_back(reinterpret_cast<CUgraph>(c.bodies.back().get()));
  }
  return c;
}

bool has_conditional_nodes(const Graph& g) {
  for (const auto& n : g.nodes)
    if (n->work.type == CU_GRAPH_NODE_TYPE_CONDITIONAL || (n->work.child && has_conditional_nodes(*n->work.child)))
      return true;
  return false;
}

CUresult check_conditionals(const Graph& g) { return check_graph(g, false); }

std::vector<HandleStep> conditional_handles(const Graph& g) {
  std::vector<HandleStep> out;
  collect_handles(g, &out);
  return out;
}

bool conditional_steps(ordo::Client* c, const NodeWork& w, GraphStepWriter* out) {
  out->cond({uint64_t(w.cond), uint32_t(w.cond_type), uint32_t(w.bodies.size())});
  for (const auto& b : w.bodies) {
    const size_t at = out->begin_body();
    if (!body_steps(c, *b, out)) return false;
    out->end_body(at);
  }
  return true;
}

GraphNode* node_in_bodies(NodeWork& w, uint64_t serial) {
  for (auto& b : w.bodies)
    for (auto& n : b->nodes) {
      if (n->serial == serial) return n.get();
      if (n->work.child)
        for (auto& c : n->work.child->nodes)
          if (c->serial == serial) return c.get();
      if (GraphNode* in = node_in_bodies(n->work, serial)) return in;
    }
  return nullptr;
}

bool same_bodies(const NodeWork& a, const NodeWork& b) {
  if (a.cond_type != b.cond_type || a.bodies.size() != b.bodies.size()) return false;
  for (size_t i = 0; i < a.bodies.size(); ++i) {
    std::vector<uint64_t> x, y;
    shape_of_graph(*a.bodies[i], &x);
    shape_of_graph(*b.bodies[i], &y);
    if (x != y) return false;
  }
  return true;
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph hg, CUcontext ctx,
                                                unsigned int default_value, unsigned int flags) {
  if (!out || (flags & ~CU_GRAPH_COND_ASSIGN_DEFAULT)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (ctx && ctx != handle(current())) return CUDA_ERROR_INVALID_CONTEXT;
  {
    std::lock_guard lock(graph_mutex());
    if (!graph_of(hg)) return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t h = 0;
  if (const ordo::Status s = c->graph_cond_handle(uint32_t(this_device()), &h); !ok(s)) {
    if (s == ordo::Status::kNotSupported) {
      static std::once_flag said;
      std::call_once(said, [] {
        std::fprintf(stderr,
                     "ordo: cuGraphConditionalHandleCreate: the worker's backend cannot run conditional graph "
                     "nodes; CUDA_ERROR_NOT_SUPPORTED (docs/CUDA.md, CUDA graphs)\n");
      });
    }
    return to_cu(s);
  }
  std::lock_guard lock(graph_mutex());
  Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;  // destroyed meanwhile
  g->cond_handles[h] = {default_value, flags};
  *out = h;
  return CUDA_SUCCESS;
}

}  // extern "C"

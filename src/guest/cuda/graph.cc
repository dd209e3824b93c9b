// CUDA graphs: the graph objects (made node by node, graph_nodes.cc, or by
// capture, capture.cc), their edges and queries, clones, node destruction and
// the DOT print. Each node kind's parameters are graph_nodes.cc's; execs are exec.cc's.
#include "graph.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_set>

#include "forwarded.h"
#include "module.h"

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
  for (auto& n : g->nodes) forget_node_graphs(n.get());
  live_handles().erase(g);
  if (any_capture()) capture_graph_forgotten(g);
}

void forget_node_graphs(GraphNode* n) {
  live_handles().erase(n);
  if (n->work.child) forget(n->work.child.get());
  for (auto& b : n->work.bodies) forget(b.get());
}

Graph* clone_graph(const Graph& from, std::map<const GraphNode*, GraphNode*>* map) {
  Graph* g = new_graph();
  std::map<const GraphNode*, GraphNode*> local;
  auto& m = map ? *map : local;
  // Nodes first, edges after: an edge may come from a node added later (cuGraphAddDependencies).
  for (const auto& n : from.nodes) {
    GraphNode* c = add_node(g, n->work.clone(), {});
    c->enabled = n->enabled;
    c->origin = n.get();
    m[n.get()] = c;
  }
  for (const auto& n : from.nodes)
    for (const GraphNode* d : n->deps) m.at(n.get())->deps.push_back(m.at(d));
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
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return "MEM_ALLOC";
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return "MEM_FREE";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return "CONDITIONAL";
    default: return "OTHER";
  }
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
  if (!add_them && n && has_memory_nodes(*g)) return CUDA_ERROR_NOT_SUPPORTED;  // CUDA: its edges stay
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

}  // namespace


// ================================================================ shared with capture.cc

std::mutex& graph_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::unique_ptr<Graph> embedded_clone(const Graph& g) {
  std::unique_ptr<Graph> c(clone_graph(g, nullptr));
  c->embedded = true;
  return c;
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
  w.alloc = alloc;
  w.free = free;
  if (child) w.child = embedded_clone(*child);
  if (type == CU_GRAPH_NODE_TYPE_CONDITIONAL) return conditional_snapshot(*this);
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
  // A child graph node's graph, or a conditional node's body, goes with its node.
  if (!g || g->embedded) return CUDA_ERROR_INVALID_VALUE;
  delete_graph(g);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphClone(CUgraph* out, CUgraph hg) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  if (has_memory_nodes(*g)) return CUDA_ERROR_NOT_SUPPORTED;  // an allocation belongs to one graph
  if (has_conditional_nodes(*g)) return CUDA_ERROR_NOT_SUPPORTED;  // CUDA: such a graph cannot be cloned
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
  if (has_memory_nodes(*g)) return CUDA_ERROR_NOT_SUPPORTED;  // CUDA: its nodes stay
  for (auto& o : g->nodes) o->deps.erase(std::remove(o->deps.begin(), o->deps.end(), n), o->deps.end());
  forget_node_graphs(n);
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
      for (const auto& b : n->work.bodies) {
        std::fprintf(f, "  subgraph cluster_%p {\n", static_cast<const void*>(b.get()));
        self(*b, self);
        std::fprintf(f, "  }\n");
      }
    }
  };
  print(*g, print);
  std::fprintf(f, "}\n");
  return std::fclose(f) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

}  // extern "C"

// CUDA graph nodes: each kind's parameters (kernel, memcpy, memset, host,
// event, child graph, empty), checked and kept; adding, reading and setting
// them, generically (cuGraphAddNode, cuGraphNodeSetParams) and per kind;
// kernel node attributes. The graph they belong to is graph.cc's.
#include "graph.h"

#include <algorithm>
#include <cstring>

namespace ordo::driver {
namespace {

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

namespace {

// Under graph_mutex(): a child graph node's work, its own copy of `child`.
CUresult child_graph_work(CUgraph child, NodeWork* w) {
  const Graph* c = graph_of(child);
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  if (has_memory_nodes(*c)) return CUDA_ERROR_NOT_SUPPORTED;  // CUDA nests those only by moving them
  if (has_conditional_nodes(*c)) return CUDA_ERROR_INVALID_VALUE;  // CUDA: such a graph cannot be a child
  w->type = CU_GRAPH_NODE_TYPE_GRAPH;
  w->child = embedded_clone(*c);
  return CUDA_SUCCESS;
}

}  // namespace

// The work a generic node's parameters describe (cuGraphAddNode, cuGraphNodeSetParams).
CUresult work_of(const CUgraphNodeParams* p, NodeWork* w) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  w->type = p->type;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return kernel_params_work(p->kernel, w);
    case CU_GRAPH_NODE_TYPE_MEMCPY: w->copy = p->memcpy.copyParams; return check_copy(w->copy);
    case CU_GRAPH_NODE_TYPE_MEMSET:
      w->set = {p->memset.dst, p->memset.pitch, p->memset.value, p->memset.elementSize, p->memset.width,
                p->memset.height};
      return check_memset(w->set);
    case CU_GRAPH_NODE_TYPE_HOST:
      if (!p->host.fn) return CUDA_ERROR_INVALID_VALUE;
      w->host = {p->host.fn, p->host.userData};
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_GRAPH: return child_graph_work(p->graph.graph, w);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      w->event = p->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? p->eventRecord.event : p->eventWait.event;
      return w->event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_GRAPH_NODE_TYPE_EMPTY: return CUDA_SUCCESS;
    default:
      // Memory and conditional nodes (cuGraphAddNode makes them: they need
      // their graph), batch memory-op and external-semaphore nodes.
      return p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
  }
}

namespace {

// Moves from `w` only on success.
CUresult add(CUgraphNode* out, CUgraph h, const CUgraphNode* deps, size_t n, NodeWork&& w) {
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

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

// ---------------------------------------------------------------- nodes

CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* out, CUgraph g, const CUgraphNode* deps,
                                   const CUgraphEdgeData* data, size_t n, CUgraphNodeParams* params) {
  for (size_t i = 0; data && i < n; ++i)
    if (data[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || data[i].from_port || data[i].to_port)
      return CUDA_ERROR_NOT_SUPPORTED;
  if (params && params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS_v2) == sizeof(CUDA_MEM_ALLOC_NODE_PARAMS_v1));
    return cuGraphAddMemAllocNode(out, g, deps, n, reinterpret_cast<CUDA_MEM_ALLOC_NODE_PARAMS*>(&params->alloc));
  }
  if (params && params->type == CU_GRAPH_NODE_TYPE_MEM_FREE) return cuGraphAddMemFreeNode(out, g, deps, n, params->free.dptr);
  std::lock_guard lock(graph_mutex());
  NodeWork w;
  if (params && params->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
    if (CUresult e = conditional_node_work(graph_of(g), &params->conditional, &w); e != CUDA_SUCCESS) return e;
    const CUresult e = add(out, g, deps, n, std::move(w));
    if (e != CUDA_SUCCESS) {
      for (auto& b : w.bodies) forget(b.get());  // NOLINT(bugprone-use-after-move): add() moves only on success
      params->conditional.phGraph_out = nullptr;
    }
    return e;
  }
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
  if (CUresult e = kernel_params_work(*p, &w); e != CUDA_SUCCESS) return e;
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
  if (CUresult e = kernel_params_work(*p, &w); e != CUDA_SUCCESS) return e;
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
  NodeWork w;
  return add(out, g, deps, n, std::move(w));
}

// Memory nodes (graph_memory.cc): the allocation is made with its node, so
// its address is known at once, as CUDA promises.
CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph h, const CUgraphNode* deps, size_t n,
                                        CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (!out || !p) return CUDA_ERROR_INVALID_VALUE;
  const Graph* g = nullptr;
  {
    std::lock_guard lock(graph_mutex());
    if (!(g = graph_of(h)) || g->embedded) return CUDA_ERROR_INVALID_VALUE;  // CUDA nests such graphs only by moving them
  }
  NodeWork w;  // made outside the lock: it asks the worker for the memory
  if (CUresult e = mem_alloc_node_work(g, p, &w); e != CUDA_SUCCESS) return e;
  std::lock_guard lock(graph_mutex());
  return add(out, h, deps, n, std::move(w));
}
CUresult CUDAAPI cuGraphMemAllocNodeGetParams(CUgraphNode hn, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  return with_node(hn, CU_GRAPH_NODE_TYPE_MEM_ALLOC, [p](GraphNode* n) { return mem_alloc_node_params(n->work, p); });
}
CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph h, const CUgraphNode* deps, size_t n,
                                       CUdeviceptr dptr) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  const Graph* g = graph_of(h);
  if (!g || g->embedded) return CUDA_ERROR_INVALID_VALUE;  // CUDA nests such graphs only by moving them
  NodeWork w;
  if (CUresult e = mem_free_node_work(g, dptr, &w); e != CUDA_SUCCESS) return e;
  return add(out, h, deps, n, std::move(w));
}
CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode hn, CUdeviceptr* dptr) {
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  return with_node(hn, CU_GRAPH_NODE_TYPE_MEM_FREE, [dptr](GraphNode* n) {
    *dptr = mem_free_node_address(n->work);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                          CUgraph child) {
  std::lock_guard lock(graph_mutex());
  NodeWork w;
  if (CUresult e = child_graph_work(child, &w); e != CUDA_SUCCESS) return e;
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

// ---------------------------------------------------------------- kernel node attributes

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

}  // extern "C"

// CUDA graphs (graph.cc) and stream capture (capture.cc): a graph is the
// guest's own record of work; launching it replays its nodes, in an order its
// edges allow, as the stream work they stand for on the launch stream. Every
// replayed call is ordered like the program's own (ARCHITECTURE.md,
// "Ordering rules"), so a graph launch is ordered with the stream's other work,
// across threads and through events, exactly like a kernel.
#pragma once

#include "state.h"  // first: it includes cuda.h
#include "transport/graph_steps.h"
#include "transport/launch_shape.h"

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace ordo::driver {

struct Graph;
struct GraphAllocation;  // graph_memory.cc: the memory an allocation node made
struct GraphFree;        // graph_memory.cc: a free node's claim on an allocation

// What one node does. `type` says which fields count.
struct NodeWork {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  // CU_GRAPH_NODE_TYPE_KERNEL: the function and its arguments, packed (KernelLayout).
  CUfunction fn = nullptr;
  Dim3 grid{}, block{};
  unsigned smem = 0;
  std::vector<std::byte> args;
  CUDA_MEMCPY3D copy{};           // CU_GRAPH_NODE_TYPE_MEMCPY: no arrays; the host side is read when it runs
  CUDA_MEMSET_NODE_PARAMS set{};  // CU_GRAPH_NODE_TYPE_MEMSET
  CUDA_HOST_NODE_PARAMS host{};   // CU_GRAPH_NODE_TYPE_HOST
  CUevent event = nullptr;        // CU_GRAPH_NODE_TYPE_EVENT_RECORD, CU_GRAPH_NODE_TYPE_WAIT_EVENT
  std::unique_ptr<Graph> child;   // CU_GRAPH_NODE_TYPE_GRAPH: the node's own graph
  // CU_GRAPH_NODE_TYPE_CONDITIONAL (graph_conditional.cc): its handle and
  // type, and the body graphs it owns; `body_handles` is the phGraph_out array
  // CUDA promises valid for the node's life.
  CUgraphConditionalHandle cond = 0;
  CUgraphConditionalNodeType cond_type = CU_GRAPH_COND_TYPE_IF;
  std::vector<std::unique_ptr<Graph>> bodies;
  std::vector<CUgraph> body_handles;
  // CU_GRAPH_NODE_TYPE_MEM_ALLOC and _MEM_FREE: shared with the node's copies in execs.
  std::shared_ptr<GraphAllocation> alloc;
  std::shared_ptr<GraphFree> free;
  // A kernel node's launch attributes (cuGraphKernelNodeSetAttribute): those a
  // launch accepts, kept for GetAttribute; none changes what the kernel does here.
  std::map<int, CUlaunchAttributeValue> attrs;

  NodeWork() = default;
  NodeWork(NodeWork&&) = default;
  NodeWork& operator=(NodeWork&&) = default;
  NodeWork clone() const;  // with a copy of the child graph
};

struct GraphNode {
  Graph* graph = nullptr;
  uint64_t serial = 0;  // unique for the process: execs name nodes by it (an address may be reused)
  NodeWork work;
  std::vector<GraphNode*> deps;  // edges into this node
  bool enabled = true;
  // The node this one was cloned from (cuGraphNodeFindInClone), or null.
  const GraphNode* origin = nullptr;
  // cuGraphKernelNodeGetParams hands out pointers to each argument, or, for
  // a kernel with no parameter layout, the packed bytes as `extra` describes them.
  std::vector<void*> arg_ptrs;
  void* extra[5] = {};
  size_t extra_size = 0;
};

struct UserObject;  // user_object.cc

struct Graph {
  ~Graph();  // releases its user objects
  std::vector<std::unique_ptr<GraphNode>> nodes;  // in the order they were added
  uint32_t id = 0;
  std::map<UserObject*, unsigned> user_objects;  // references it holds (cuGraphRetainUserObject)
  unsigned live_execs = 0;  // execs made from it: one at most while it has memory nodes
  bool embedded = false;    // a child graph node's own: no memory nodes in it
  // A conditional node's body: the graph it is in (conditional handles of it
  // and its ancestors may be used here), and owned by that node.
  Graph* parent = nullptr;
  // Conditional handles made for it (cuGraphConditionalHandleCreate): handle -> default value, flags.
  std::map<CUgraphConditionalHandle, std::pair<unsigned, unsigned>> cond_handles;
};

// User objects (user_object.cc): `count` references more, or fewer; the last
// release runs the object's destructor in the calling thread (CUDA forbids it
// CUDA calls, so it cannot need our locks).
void retain_user_object(UserObject* o, unsigned count);
void release_user_object(UserObject* o, unsigned count);

// Graphs, nodes, execs and captures are guarded by one lock: none of them is
// on a hot path (a launch replays an exec without it).
std::mutex& graph_mutex();

// Under graph_mutex(): the live graphs, nodes and execs, which every handle
// is checked against, and the ids graphs and execs are numbered by.
std::unordered_set<const void*>& live_handles();
uint32_t next_graph_id();
Graph* graph_of(CUgraph h);  // null if not a live graph
void forget(Graph* g);       // g and its nodes (child graphs and bodies too) are no longer live
void forget_node_graphs(GraphNode* n);  // n, and the graphs it owns, are no longer live
// A live copy of `from`; *map (optional) takes each node to its copy.
Graph* clone_graph(const Graph& from, std::map<const GraphNode*, GraphNode*>* map);
// The work a generic node's parameters describe (cuGraphAddNode, cuGraphNodeSetParams).
CUresult work_of(const CUgraphNodeParams* p, NodeWork* w);
// Replaces the work of an exec's steps that come from `node` (exec.cc).
CUresult exec_set(CUgraphExec x, CUgraphNode node, NodeWork w);

// Under graph_mutex(): a new node of `g` with `deps`, all of g's.
GraphNode* add_node(Graph* g, NodeWork work, const std::vector<GraphNode*>& deps);
Graph* new_graph();           // registered as a live handle
void delete_graph(Graph* g);  // and its handle
bool live_graph(const Graph* g);
GraphNode* live_node(CUgraphNode h);  // null if not a node of a live graph

// A kernel node's work from a launch's parameters (launch.cc): CUDA's launch
// errors, checked when the node is made.
CUresult kernel_node_work(CUfunction fn, Dim3 grid, Dim3 block, unsigned smem, void** params, void** extra,
                          NodeWork* w);
// The same from a CUDA_KERNEL_NODE_PARAMS (v2 or v3): a CUkernel stands for its function.
template <class P>
CUresult kernel_params_work(const P& p, NodeWork* w) {
  return kernel_node_work(p.func ? p.func : reinterpret_cast<CUfunction>(p.kern), {p.gridDimX, p.gridDimY, p.gridDimZ},
                          {p.blockDimX, p.blockDimY, p.blockDimZ}, p.sharedMemBytes, p.kernelParams, p.extra, w);
}
// A child graph node's own copy of `g` (nodes, edges, user objects), marked embedded.
std::unique_ptr<Graph> embedded_clone(const Graph& g);
// Launch attributes (launch.cc): the cluster and cooperative shape they ask
// for (*shape, optional), CUDA_SUCCESS for the hints and preferences stream
// order honours, CUDA_ERROR_NOT_SUPPORTED for the rest.
CUresult check_launch_attributes(const CUlaunchConfig* config, LaunchShape* shape = nullptr);
// A kernel node's shape, from its attributes.
LaunchShape shape_of(const NodeWork& w);
// Launches a kernel node's work as stream work, with its shape.
CUresult launch_node_kernel(const NodeWork& w, CUstream stream, bool per_thread);
// The flags of a kernel node's step (its shape), if CUDA would launch it; false if not.
bool node_step_shape(const NodeWork& w, uint16_t* flags);
// Sets n->arg_ptrs to each argument in n's packed bytes, by the kernel's layout (none without one).
void kernel_arg_pointers(GraphNode* n);

// ---------------------------------------------------------------- conditional nodes (graph_conditional.cc)

// A conditional node's work for graph `g` from its parameters: makes its body
// graphs and writes their handles to p->phGraph_out.
CUresult conditional_node_work(Graph* g, CUDA_CONDITIONAL_NODE_PARAMS* p, NodeWork* w);
// An exec's private copy of a conditional node's work: its bodies copied, registered nowhere.
NodeWork conditional_snapshot(const NodeWork& w);
// Whether `g` (or a graph inside it) has conditional nodes: such a graph
// cannot be cloned, nested, or instantiated twice at once.
bool has_conditional_nodes(const Graph& g);
// Under graph_mutex(): why `g` cannot be instantiated for its conditional
// nodes (CUDA_ERROR_INVALID_VALUE: a body holds a node CUDA forbids there, or
// a node's handle is not of its graph or an ancestor), else CUDA_SUCCESS.
CUresult check_conditionals(const Graph& g);
// The handles of `g` and every body in it, as the worker's kHandle steps.
std::vector<HandleStep> conditional_handles(const Graph& g);
// Appends a conditional node's steps (kCond, its bodies) to `out`; false if a
// body's node is not device work the worker can run (`out` is then unusable).
bool conditional_steps(ordo::Client* c, const NodeWork& w, GraphStepWriter* out);
// An exec's copy of the node numbered `serial` inside a conditional's bodies
// (at any depth; a child graph's inlined there too), or null.
GraphNode* node_in_bodies(NodeWork& w, uint64_t serial);
// Whether two conditional nodes' bodies have the same nodes, types and edges (cuGraphExecUpdate).
bool same_bodies(const NodeWork& a, const NodeWork& b);
// A node's device work as graph steps (graph_device_steps.cc); false if the worker cannot run it.
bool device_steps(ordo::Client* c, const NodeWork& w, GraphStepWriter* out);

// Runs `w` as stream work on `stream` (graph.cc): what a launch does per node.
CUresult run_work(const NodeWork& w, CUstream stream, bool per_thread);

// ---------------------------------------------------------------- graph memory (graph_memory.cc)

// An allocation node's work, for graph `g`: p->bytesize bytes on p's device,
// made now (the address, in p->dptr, is fixed for the node's life).
CUresult mem_alloc_node_work(const Graph* g, CUDA_MEM_ALLOC_NODE_PARAMS* p, NodeWork* w);
// A free node's work, in graph `g`: CUDA_ERROR_INVALID_VALUE unless dptr is an
// allocation node's memory that no free node frees yet.
CUresult mem_free_node_work(const Graph* g, CUdeviceptr dptr, NodeWork* w);
CUresult mem_alloc_node_params(const NodeWork& w, CUDA_MEM_ALLOC_NODE_PARAMS* out);
CUdeviceptr mem_free_node_address(const NodeWork& w);
const GraphAllocation* freed_allocation(const NodeWork& w);  // a free node's
// Whether `g` (or a child graph) has memory nodes: such a graph cannot be
// cloned, nested, instantiated twice at once, or lose nodes or edges.
bool has_memory_nodes(const Graph& g);
// A launch reaching these steps' memory nodes, in order: CUDA_ERROR_INVALID_VALUE
// (and nothing changed) for an allocation still allocated (unless `auto_free`)
// or a free of one that is not.
CUresult graph_memory_launch(const std::vector<const NodeWork*>& steps, bool auto_free);
// cuMemFree (async false) or cuMemFreeAsync on `stream` of `dptr`: false if
// it is not graph memory; else *r.
bool graph_memory_free(CUdeviceptr dptr, CUstream stream, bool async, bool per_thread, CUresult* r);
// An exec going: `done` (recorded after its last launch) fences its memory
// nodes' allocations, and belongs to them if true (else the caller destroys it).
bool graph_memory_retire(const std::vector<const NodeWork*>& steps, CUevent done);
bool is_graph_memory(CUdeviceptr dptr);

// ---------------------------------------------------------------- stream capture (capture.cc)

// Capture sequences under way, in every thread: while none is, an async call
// pays one relaxed load for capture.
extern std::atomic<int> g_captures;
inline bool any_capture() { return g_captures.load(std::memory_order_relaxed) != 0; }

// An asynchronous call on `s` while captures are under way: false if it runs
// as usual; true if capture took it, with *r its result (the node went into
// s's capture, or the error that refused it and invalidated the capture).
bool capture_work(ordo::Client* c, ordo::Stream s, NodeWork&& w, CUresult* r);
// cuEventRecord and cuStreamWaitEvent on or into a capture: the capture's
// edges, not nodes (fork and join). Same contract as capture_work.
bool capture_event_record(ordo::Client* c, ordo::Stream s, CUevent e, CUresult* r);
bool capture_stream_wait(ordo::Client* c, ordo::Stream s, CUevent e, unsigned flags, CUresult* r);
// Work on the legacy stream `s` while a blocking stream of its device
// captures: true with *r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the captures
// invalidated (what capture_work does first).
bool capture_refuses_legacy(ordo::Client* c, ordo::Stream s, CUresult* r);
// A stream or event going away: a capture forgets it (an origin's capture ends
// invalidated, its graph with it).
void capture_stream_destroyed(ordo::Stream s);
// Under graph_mutex(): `g` goes (destroyed, or a body whose node went) while
// a capture records into it (cuStreamBeginCaptureToGraph): that capture ends
// invalidated.
void capture_graph_forgotten(Graph* g);
void capture_event_destroyed(CUevent e);
// A call that waits for `s` (stream synchronize or query, a synchronous copy):
// true with *r the error if capture forbids it.
bool capture_forbids_wait(ordo::Client* c, ordo::Stream s, CUresult* r);
// cuEventSynchronize/Query of an event recorded into a capture: forbidden.
bool capture_forbids_event_wait(CUevent e, CUresult* r);
// Under graph_mutex(): the graph `s` captures into, or null (not capturing, or invalidated).
Graph* capturing_graph(ordo::Stream s);
// Calls that capture cannot see but a captured sequence might depend on
// (cuMemAlloc, cuMemFree, cuCtxSynchronize...): CUDA_SUCCESS, or
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when the calling thread's capture mode
// forbids them now (cuThreadExchangeStreamCaptureMode).
CUresult capture_check_unsafe();

}  // namespace ordo::driver

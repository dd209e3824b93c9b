// Graph memory nodes: allocation and free nodes (cuGraphAddMemAllocNode,
// cuGraphAddMemFreeNode, and cuMemAllocAsync/cuMemFreeAsync captured).
//
// CUDA fixes an allocation node's address when the node is made, and the
// memory belongs to the graph's launches: allocated when a launch reaches the
// node, freed by a free node, cuMemFree(Async) or the next launch's
// auto-free. Here the memory is made with the node and stays until no graph
// or exec holds the node and no launch left it allocated: every launch finds
// it there, so device order has nothing to wait for. What a launch changes
// is bookkeeping, checked and done when the launch is issued: whether the
// allocation is allocated ("live"), which CUDA's errors depend on (a
// relaunch of a graph whose allocation is still allocated, a second free).
//
// Memory no graph holds goes to a cache, as CUDA's graph pool keeps it, with
// fences: the events that mark the end of the last work that may use it (its
// exec's last launch, a cuMemFreeAsync's stream). A new allocation node takes
// a cached block of its size whose fences have passed, without waiting for
// anything (a node made while a host function waits for its maker must not
// wait for the device); cuDeviceGraphMemTrim returns the rest to the worker.
#include "graph.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "forwarded.h"

namespace ordo::driver {

// An event whose completion a cached block waits for; destroyed with the last holder.
struct GraphFence {
  CUevent event = nullptr;
  explicit GraphFence(CUevent e) : event(e) {}
  ~GraphFence() { cuEventDestroy_v2(event); }
  GraphFence(const GraphFence&) = delete;
  GraphFence& operator=(const GraphFence&) = delete;
};
using Fences = std::vector<std::shared_ptr<GraphFence>>;

struct GraphAllocation {
  CUdeviceptr addr = 0;
  size_t size = 0;      // asked for
  size_t capacity = 0;  // of the block (a reused one may be larger)
  CUdevice device = 0;
  CUmemPoolProps props{};
  std::vector<CUmemAccessDesc> access;
  uint32_t owner = 0;  // the id of the graph of its allocation node
  Fences fences;       // under the memory mutex
  ~GraphAllocation();
};

// A free node's claim on its allocation: an allocation is freed by one free
// node at most, in any graph, for as long as that node (or an exec's copy) lives.
struct GraphFree {
  std::shared_ptr<GraphAllocation> alloc;
  uint32_t graph = 0;  // the id of the graph of the free node
  ~GraphFree();
};

namespace {

struct Block {
  CUdeviceptr addr;
  size_t size;
  CUdevice device;
  Fences fences;
};

struct Usage {
  cuuint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
};

struct GraphMemory {
  std::mutex mu;
  // Every allocation a node holds, and whether a launch left it allocated.
  struct Entry {
    std::weak_ptr<GraphAllocation> node;
    bool live = false;
    const GraphFree* claim = nullptr;
  };
  std::map<CUdeviceptr, Entry> allocs;
  std::map<CUdeviceptr, Block> orphans;  // allocated by a launch, their graphs gone: cuMemFree's
  std::vector<Block> cache;              // held by nothing: reused, or returned at trim
  std::map<CUdevice, Usage> usage;

  void account(CUdevice d, int64_t used, int64_t reserved) {
    Usage& u = usage[d];
    u.used += cuuint64_t(used);
    u.reserved += cuuint64_t(reserved);
    u.used_high = std::max(u.used_high, u.used);
    u.reserved_high = std::max(u.reserved_high, u.reserved);
  }
};
GraphMemory& memory() {
  static auto* m = new GraphMemory;  // never destroyed: graphs may outlive exit's destructors
  return *m;
}

// Returns `device`'s cached memory to the worker, outside every lock (a free
// waits for all work first).
void trim(CUdevice device) {
  std::vector<Block> blocks;
  {
    std::lock_guard lock(memory().mu);
    auto& cache = memory().cache;
    for (auto it = cache.begin(); it != cache.end();) {
      if (it->device != device) {
        ++it;
        continue;
      }
      memory().account(it->device, 0, -int64_t(it->size));
      blocks.push_back(std::move(*it));
      it = cache.erase(it);
    }
  }
  for (const Block& b : blocks) free_device_memory(b.addr);
}

bool passed(const Fences& fences) {
  for (const auto& f : fences)
    if (cuEventQuery(f->event) != CUDA_SUCCESS) return false;
  return true;
}

// A cached block of `device` for `size` bytes (at most twice as large) that
// nothing can still be using. Its fences are asked outside the lock (an
// event query takes the graph lock, which is held around this one), and
// released after it.
bool take_cached(CUdevice device, size_t size, Block* out) {
  std::vector<std::pair<CUdeviceptr, Fences>> candidates;
  {
    std::lock_guard lock(memory().mu);
    for (const Block& b : memory().cache)
      if (b.device == device && b.size >= size && b.size / 2 <= size) candidates.push_back({b.addr, b.fences});
  }
  for (const auto& [addr, fences] : candidates) {
    if (!passed(fences)) continue;
    std::lock_guard lock(memory().mu);
    auto& cache = memory().cache;
    auto it = std::find_if(cache.begin(), cache.end(), [addr](const Block& b) { return b.addr == addr; });
    if (it == cache.end()) continue;  // another thread took it meanwhile
    *out = std::move(*it);
    cache.erase(it);
    return true;
  }
  return false;
}

}  // namespace

GraphAllocation::~GraphAllocation() {
  GraphMemory& m = memory();
  std::lock_guard lock(m.mu);
  auto it = m.allocs.find(addr);
  const bool live = it != m.allocs.end() && it->second.live;
  if (it != m.allocs.end()) m.allocs.erase(it);
  if (live) {
    m.orphans[addr] = {addr, capacity, device, std::move(fences)};
  } else {
    m.cache.push_back({addr, capacity, device, std::move(fences)});
    m.account(device, -int64_t(capacity), 0);
  }
}

GraphFree::~GraphFree() {
  std::lock_guard lock(memory().mu);
  if (auto it = memory().allocs.find(alloc->addr); it != memory().allocs.end() && it->second.claim == this)
    it->second.claim = nullptr;
}

CUresult mem_alloc_node_work(const Graph* g, CUDA_MEM_ALLOC_NODE_PARAMS* p, NodeWork* w) {
  if (!p || p->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  const CUmemPoolProps& props = p->poolProps;
  if (props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED || props.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !valid_device(props.location.id))
    return CUDA_ERROR_INVALID_VALUE;
  if (props.handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;  // no IPC
  if (p->accessDescCount > size_t(g_device_count.load()) || (p->accessDescCount && !p->accessDescs))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < p->accessDescCount; ++i) {
    const CUmemAccessDesc& a = p->accessDescs[i];
    if (a.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(a.location.id) ||
        (a.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && a.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
         a.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
      return CUDA_ERROR_INVALID_VALUE;
  }
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  Block reused{};
  uint64_t addr = 0, capacity = p->bytesize;
  const bool cached = take_cached(props.location.id, p->bytesize, &reused);
  if (cached) {
    addr = reused.addr;
    capacity = reused.size;
  } else {
    const ordo::Status s = on_device(c, props.location.id, [&] { return c->malloc(&addr, p->bytesize); });
    if (!ordo::ok(s)) return s == ordo::Status::kInvalidValue ? CUDA_ERROR_OUT_OF_MEMORY : to_cu(s);
    device_allocs().add(addr, p->bytesize, props.location.id);
  }
  auto a = std::make_shared<GraphAllocation>();
  a->addr = addr;
  a->size = p->bytesize;
  a->capacity = capacity;
  a->device = props.location.id;
  a->props = props;
  a->access.assign(p->accessDescs, p->accessDescs + p->accessDescCount);
  a->owner = g->id;
  {
    std::lock_guard lock(memory().mu);
    memory().allocs[addr] = {a, false, nullptr};
    memory().account(a->device, int64_t(capacity), cached ? 0 : int64_t(capacity));
  }
  w->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  w->alloc = std::move(a);
  p->dptr = addr;
  return CUDA_SUCCESS;
}

CUresult mem_free_node_work(const Graph* g, CUdeviceptr dptr, NodeWork* w) {
  std::shared_ptr<GraphAllocation> a;  // released after the lock: it may be the last reference
  std::lock_guard lock(memory().mu);
  auto it = memory().allocs.find(dptr);
  if (it == memory().allocs.end()) return CUDA_ERROR_INVALID_VALUE;  // not an allocation node's address
  a = it->second.node.lock();
  if (!a || it->second.claim) return CUDA_ERROR_INVALID_VALUE;  // freed by a graph already
  auto f = std::make_shared<GraphFree>();
  f->alloc = a;
  f->graph = g->id;
  it->second.claim = f.get();
  w->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  w->free = std::move(f);
  return CUDA_SUCCESS;
}

bool has_memory_nodes(const Graph& g) {
  for (const auto& n : g.nodes)
    if (n->work.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->work.type == CU_GRAPH_NODE_TYPE_MEM_FREE ||
        (n->work.child && has_memory_nodes(*n->work.child)))
      return true;
  return false;
}

CUresult graph_memory_launch(const std::vector<const NodeWork*>& steps, bool auto_free) {
  GraphMemory& m = memory();
  std::lock_guard lock(m.mu);
  // Checked first, so that a refused launch changes nothing.
  std::map<CUdeviceptr, bool> live;  // as the launch goes
  auto state = [&](CUdeviceptr a) -> bool {
    auto it = live.find(a);
    if (it != live.end()) return it->second;
    auto e = m.allocs.find(a);
    return e != m.allocs.end() && e->second.live;
  };
  for (const NodeWork* w : steps) {
    if (w->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      if (state(w->alloc->addr) && !auto_free) return CUDA_ERROR_INVALID_VALUE;  // still allocated
      live[w->alloc->addr] = true;
    } else if (w->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
      if (!state(w->free->alloc->addr)) return CUDA_ERROR_INVALID_VALUE;  // nothing to free
      live[w->free->alloc->addr] = false;
    }
  }
  for (auto [a, l] : live)
    if (auto e = m.allocs.find(a); e != m.allocs.end()) e->second.live = l;
  return CUDA_SUCCESS;
}

bool graph_memory_free(CUdeviceptr dptr, CUstream stream, bool async, bool per_thread, CUresult* r) {
  GraphMemory& m = memory();
  if (!is_graph_memory(dptr)) return false;
  // A stream-ordered free: the memory may be reused once its stream got there.
  std::shared_ptr<GraphFence> fence;
  if (async) {
    CUevent e = nullptr;
    if (CUresult x = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING); x != CUDA_SUCCESS) return *r = x, true;
    fence = std::make_shared<GraphFence>(e);
    if (CUresult x = event_record(e, stream, per_thread); x != CUDA_SUCCESS) return *r = x, true;
  }
  Block orphan{};
  std::shared_ptr<GraphAllocation> a;  // released after the lock: it may be the last reference
  {
    std::lock_guard lock(m.mu);
    if (auto it = m.allocs.find(dptr); it != m.allocs.end()) {
      a = it->second.node.lock();
      // Not allocated now, or freed inside the graph that owns it: CUDA's error.
      if (!a || !it->second.live || (it->second.claim && it->second.claim->graph == a->owner)) {
        *r = CUDA_ERROR_INVALID_VALUE;
      } else {
        it->second.live = false;
        if (fence) a->fences.push_back(fence);
        *r = CUDA_SUCCESS;
      }
      return true;
    }
    auto it = m.orphans.find(dptr);
    if (it == m.orphans.end()) {
      *r = CUDA_ERROR_INVALID_VALUE;  // cached: no graph holds it, nothing allocated it
      return true;
    }
    orphan = it->second;
    m.orphans.erase(it);
    m.account(orphan.device, -int64_t(orphan.size), -int64_t(orphan.size));
  }
  *r = free_device_memory(orphan.addr);
  return true;
}

bool is_graph_memory(CUdeviceptr dptr) {
  std::lock_guard lock(memory().mu);
  const GraphMemory& m = memory();
  return m.allocs.count(dptr) || m.orphans.count(dptr) ||
         std::any_of(m.cache.begin(), m.cache.end(), [dptr](const Block& b) { return b.addr == dptr; });
}

bool graph_memory_retire(const std::vector<const NodeWork*>& steps, CUevent done) {
  std::vector<std::shared_ptr<GraphAllocation>> allocs;
  for (const NodeWork* w : steps) {
    if (w->alloc) allocs.push_back(w->alloc);
    if (w->free) allocs.push_back(w->free->alloc);
  }
  if (allocs.empty()) return false;
  auto fence = std::make_shared<GraphFence>(done);
  {
    std::lock_guard lock(memory().mu);
    for (const auto& a : allocs) a->fences.push_back(fence);
  }
  return true;  // `allocs` drops its references after the lock
}

CUresult mem_alloc_node_params(const NodeWork& w, CUDA_MEM_ALLOC_NODE_PARAMS* out) {
  const GraphAllocation& a = *w.alloc;
  *out = {};
  out->poolProps = a.props;
  out->accessDescs = a.access.empty() ? nullptr : a.access.data();
  out->accessDescCount = a.access.size();
  out->bytesize = a.size;
  out->dptr = a.addr;
  return CUDA_SUCCESS;
}

CUdeviceptr mem_free_node_address(const NodeWork& w) { return w.free->alloc->addr; }
const GraphAllocation* freed_allocation(const NodeWork& w) { return w.free->alloc.get(); }

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice dev) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  trim(dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void* value) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(memory().mu);
  const Usage& u = memory().usage[dev];
  auto* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *out = u.used; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *out = u.used_high; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *out = u.reserved; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *out = u.reserved_high; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

// Only the high watermarks can be set, and only to 0 (they restart from now).
CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void* value) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!value || *static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(memory().mu);
  Usage& u = memory().usage[dev];
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: u.used_high = u.used; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: u.reserved_high = u.reserved; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // extern "C"

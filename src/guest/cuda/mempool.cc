// Stream-ordered allocation (cuMemAllocAsync, cuMemFreeAsync) and memory
// pools, without a stream-ordered allocator in the worker. An allocation is
// made at once: memory that exists before its stream reaches the call is
// valid from that point on, as CUDA requires. A free waits until its stream
// has reached it (the stream is synchronized), then frees: no later work can
// see the memory reused early. Pools keep their device, their attributes
// and usage counters; they never hold freed memory back (nothing to trim) and
// cannot be exported to other processes (IPC handle types are refused).
// NCCL creates a pool per communicator (cudaMemPoolCreate) and allocates its
// device structures with cudaMallocAsync.
#include "forwarded.h"
#include "graph.h"

#include <map>
#include <memory>
#include <mutex>

namespace ordo::driver {
namespace {

struct MemPool {
  CUdevice device = 0;
  int reuse[3] = {1, 1, 1};  // CU_MEMPOOL_ATTR_REUSE_*: kept, nothing to reuse
  cuuint64_t release_threshold = 0;
  cuuint64_t used = 0, used_high = 0;
};

struct Pools {
  std::mutex mu;
  std::map<CUdevice, std::unique_ptr<MemPool>> defaults;  // cuDeviceGetDefaultMemPool's
  std::map<CUdevice, MemPool*> current;                   // cuDeviceSetMemPool's
  std::map<MemPool*, std::unique_ptr<MemPool>> created;
  std::map<CUdeviceptr, std::pair<MemPool*, size_t>> allocs;  // stream-ordered allocations

  MemPool* default_of(CUdevice d) {
    auto& p = defaults[d];
    if (!p) p = std::make_unique<MemPool>(MemPool{d});
    return p.get();
  }
  // cuDeviceSetMemPool's pool for device d, else its default.
  MemPool* current_of(CUdevice d) {
    auto it = current.find(d);
    return it != current.end() ? it->second : default_of(d);
  }
  bool valid(MemPool* p) {
    if (created.count(p)) return true;
    for (auto& [d, q] : defaults)
      if (q.get() == p) return true;
    return false;
  }
};
Pools& pools() {
  static auto* p = new Pools;  // never destroyed: frees may come from atexit handlers
  return *p;
}

MemPool* pool_of(CUmemoryPool h) { return reinterpret_cast<MemPool*>(h); }
CUmemoryPool handle_of(MemPool* p) { return reinterpret_cast<CUmemoryPool>(p); }

}  // namespace

CUresult mem_alloc_from_pool_async(CUdeviceptr* ptr, size_t size, CUmemoryPool pool, CUstream stream,
                                   bool per_thread) {
  if (!ptr || !pool) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  MemPool* p = pool_of(pool);
  {
    std::lock_guard<std::mutex> l(pools().mu);
    if (!pools().valid(p)) return CUDA_ERROR_INVALID_VALUE;
  }
  CUdevice stream_dev = 0;
  if (CUresult e = stream_get_device(stream, &stream_dev, per_thread); e != CUDA_SUCCESS) return e;
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (any_capture()) {
    // Captured, the allocation is a memory node of the capture's graph
    // (graph_memory.cc), in the device's graph memory rather than the pool.
    ordo::Stream s;
    if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
    const Graph* g = nullptr;
    {
      std::lock_guard lock(graph_mutex());
      g = capturing_graph(s);
    }
    if (g) {
      CUDA_MEM_ALLOC_NODE_PARAMS node{};
      node.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      node.poolProps.location = {CU_MEM_LOCATION_TYPE_DEVICE, p->device};
      node.bytesize = size;
      NodeWork w;
      if (CUresult e = mem_alloc_node_work(g, &node, &w); e != CUDA_SUCCESS) return e;
      CUresult r = CUDA_SUCCESS;
      if (capture_work(c, s, std::move(w), &r)) {
        if (r == CUDA_SUCCESS) *ptr = node.dptr;
        return r;
      }
    }
    if (CUresult r; capture_forbids_wait(c, s, &r)) return r;
  }
  uint64_t addr = 0;
  const Status s = on_device(c, p->device, [&] { return c->malloc(&addr, size); });
  if (!ok(s)) return s == Status::kInvalidValue ? CUDA_ERROR_OUT_OF_MEMORY : to_cu(s);
  device_allocs().add(addr, size, p->device);
  std::lock_guard<std::mutex> l(pools().mu);
  pools().allocs[addr] = {p, size};
  p->used += size;
  if (p->used > p->used_high) p->used_high = p->used;
  *ptr = addr;
  return CUDA_SUCCESS;
}

CUresult mem_alloc_async(CUdeviceptr* ptr, size_t size, CUstream stream, bool per_thread) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  CUdevice dev = 0;
  if (CUresult e = stream_get_device(stream, &dev, per_thread); e != CUDA_SUCCESS) return e;
  MemPool* p = nullptr;
  {
    std::lock_guard<std::mutex> l(pools().mu);
    p = pools().current_of(dev);
  }
  return mem_alloc_from_pool_async(ptr, size, handle_of(p), stream, per_thread);
}

CUresult mem_free_async(CUdeviceptr ptr, CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  if (is_graph_memory(ptr)) {
    // Graph memory: captured, a free node of the capture's graph; else freed
    // in stream order, which here is bookkeeping (graph_memory.cc).
    ordo::Stream s;
    if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
    if (any_capture()) {
      std::unique_lock lock(graph_mutex());
      if (const Graph* g = capturing_graph(s)) {
        NodeWork w;
        if (CUresult e = mem_free_node_work(g, ptr, &w); e != CUDA_SUCCESS) return e;
        lock.unlock();
        CUresult r = CUDA_SUCCESS;
        if (capture_work(c, s, std::move(w), &r)) return r;
      }
    }
    CUresult r = CUDA_SUCCESS;
    if (graph_memory_free(ptr, stream, true, per_thread, &r)) return r;
  }
  if (CUresult e = stream_synchronize(stream, per_thread); e != CUDA_SUCCESS) return e;
  if (CUresult e = free_device_memory(ptr); e != CUDA_SUCCESS) return e;
  std::lock_guard<std::mutex> l(pools().mu);
  if (auto it = pools().allocs.find(ptr); it != pools().allocs.end()) {
    it->second.first->used -= it->second.second;
    pools().allocs.erase(it);
  }
  return CUDA_SUCCESS;
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !valid_device(props->location.id))
    return CUDA_ERROR_INVALID_VALUE;
  if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;  // no IPC
  auto p = std::make_unique<MemPool>(MemPool{props->location.id});
  std::lock_guard<std::mutex> l(pools().mu);
  *pool = handle_of(p.get());
  pools().created.emplace(p.get(), std::move(p));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  std::lock_guard<std::mutex> l(pools().mu);
  auto it = pools().created.find(pool_of(pool));
  if (it == pools().created.end()) return CUDA_ERROR_INVALID_VALUE;
  for (auto& [d, p] : pools().current)
    if (p == it->first) p = pools().default_of(d);
  // Its allocations stay valid until freed, as in CUDA; they no longer count anywhere.
  for (auto a = pools().allocs.begin(); a != pools().allocs.end();)
    a = a->second.first == it->first ? pools().allocs.erase(a) : std::next(a);
  pools().created.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(pools().mu);
  MemPool* p = pool_of(pool);
  if (!pools().valid(p)) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = *static_cast<cuuint64_t*>(value); return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:  // only a reset to 0 is allowed
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      p->used_high = p->used;
      return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

// Nothing is reserved beyond what is in use: reserved and used read the same.
CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(pools().mu);
  MemPool* p = pool_of(pool);
  if (!pools().valid(p)) return CUDA_ERROR_INVALID_VALUE;
  auto* u64 = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *u64 = p->release_threshold; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *u64 = p->used; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *u64 = p->used_high; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t) {
  std::lock_guard<std::mutex> l(pools().mu);
  return pools().valid(pool_of(pool)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(pools().mu);
  *pool = handle_of(pools().default_of(dev));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(pools().mu);
  *pool = handle_of(pools().current_of(dev));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(pools().mu);
  MemPool* p = pool_of(pool);
  if (!pools().valid(p) || p->device != dev) return CUDA_ERROR_INVALID_VALUE;
  pools().current[dev] = p;
  return CUDA_SUCCESS;
}

}  // extern "C"

#include "guest/graphs.h"

#include <cstring>

#include "transport/graph_steps.h"
#include "transport/op_args.h"

namespace ordo::guest {

Status Graphs::create(const void* steps, uint64_t size, uint32_t* graph) {
  ThreadState& t = threads_.current();
  if (!steps || !graph || size == 0 || size > kMaxGraphBytes) return threads_.finish_own(t, Status::kInvalidValue);
  void* block = memory_.alloc_host(size);
  if (!block) return threads_.finish_own(t, Status::kMemoryAllocation);
  std::memcpy(block, steps, size);
  uint64_t id = 0;
  const Status s = threads_.call(make_entry<Op::GraphCreate>({.steps = heap_.offset(block), .size = size}), &id);
  heap_.free(block);  // the worker copied the steps out before answering
  if (ok(s)) {
    std::lock_guard lock(mu_);
    launches_[uint32_t(id)] = 0;
    *graph = uint32_t(id);
  }
  return threads_.finish_own(t, s);
}

Status Graphs::launch(uint32_t graph, Stream s) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!streams_.bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  std::lock_guard ring(b.g->mu);
  {
    // Counted only for an entry that is pushed, and before it is: the
    // worker keeps the graph for exactly the launches a destroy names.
    std::lock_guard lock(mu_);
    auto it = launches_.find(graph);
    if (it == launches_.end()) return threads_.finish(t, Status::kInvalidResourceHandle);
    ++it->second;
  }
  producer_.push(t, *b.g, b.s, make_entry<Op::GraphLaunch>({.graph = graph}));
  return threads_.finish_async(t);
}

Status Graphs::destroy(uint32_t graph) {
  ThreadState& t = threads_.current();
  uint64_t launches = 0;
  {
    std::lock_guard lock(mu_);
    auto it = launches_.find(graph);
    if (it == launches_.end()) return threads_.finish_own(t, Status::kInvalidResourceHandle);
    launches = it->second;
    launches_.erase(it);
  }
  return threads_.finish_own(t, threads_.call(make_entry<Op::GraphDestroy>({.graph = graph, .launches = launches})));
}

Status Graphs::cond_handle(uint32_t device, uint64_t* handle) {
  ThreadState& t = threads_.current();
  if (!handle) return threads_.finish_own(t, Status::kInvalidValue);
  return threads_.finish_own(t, threads_.call(make_entry<Op::GraphCondHandle>({.device = device}), handle));
}

}  // namespace ordo::guest

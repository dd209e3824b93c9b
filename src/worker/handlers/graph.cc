// Graphs: a CUDA graph's device work (kernels, memsets, device-to-device
// copies, conditional nodes) as one GraphLaunch entry. The steps are copied out of the pinned
// heap and checked once (GraphCreate); each launch checks what may have
// changed since, the device ranges and kernel ids, as Launch, Memset and
// Memcpy do.
#include <new>

#include "../worker.h"

namespace ordo {

void Worker::op_GraphCreate(const SlotCall& c) {
  const auto a = decode<Op::GraphCreate>(c.e.arg);  // check_entry: inside the heap, at most kMaxGraphBytes
  auto g = std::make_shared<Graph>();
  try {
    g->bytes.assign(region_.heap() + a.steps, region_.heap() + a.steps + a.size);
  } catch (const std::bad_alloc&) {
    return reply(c, Status::kMemoryAllocation);
  }
  std::string why;
  if (!parse_graph_steps(g->bytes, &g->steps, &why)) {
    log_bad("slot", c.slot, c.seq, "graph steps refused: " + why);
    return reply(c, Status::kInvalidValue);
  }
  g->control_flow = has_control_flow(g->steps);
  std::lock_guard lock(graphs_mu_);
  if (graphs_.size() >= kMaxGraphs) return reply(c, Status::kMemoryAllocation);
  uint32_t id = next_graph_;
  while (id == 0 || graphs_.count(id)) ++id;  // wraps after 2^32 graphs: skip live ids and 0
  next_graph_ = id + 1;
  graphs_[id] = std::move(g);
  reply(c, Status::kSuccess, id);
}

void Worker::op_GraphDestroy(const SlotCall& c) {
  const auto a = decode<Op::GraphDestroy>(c.e.arg);
  std::lock_guard lock(graphs_mu_);
  auto it = graphs_.find(uint32_t(a.graph));  // check_entry: fits
  if (it == graphs_.end() || it->second->destroy_after != ~uint64_t{0})
    return reply(c, Status::kInvalidResourceHandle);
  // Launches still in the rings run first: the graph goes with the last of them.
  if (it->second->dispatched >= a.launches) graphs_.erase(it);
  else it->second->destroy_after = a.launches;
  reply(c, Status::kSuccess);
}

Status Worker::op_GraphLaunch(const RingCall& c) {
  const auto a = decode<Op::GraphLaunch>(c.e.arg);
  std::shared_ptr<const Graph> g;
  {
    std::lock_guard lock(graphs_mu_);
    auto it = graphs_.find(uint32_t(a.graph));
    if (it == graphs_.end()) return Status::kInvalidResourceHandle;
    g = it->second;
    if (++it->second->dispatched >= it->second->destroy_after) graphs_.erase(it);
  }
  if (Status s = enter_stream(c); !ok(s)) return s;
  if (faulted()) return Status::kSuccess;  // as Launch: after a kernel fault no device work runs
  if (g->control_flow) return run_program(c, g);
  for (const GraphStep& st : g->steps)
    if (Status s = run_graph_step(c, st); !ok(s)) return s;
  return Status::kSuccess;
}

// A graph with conditionals: which bodies run, and how often, only the device
// knows, so every step's memory is checked now and the backend runs it whole.
Status Worker::run_program(const RingCall& c, const std::shared_ptr<const Graph>& g) {
  {
    const auto lock = read_memory();
    for (const GraphStep& st : g->steps) {
      if (st.kind == StepKind::kMemset) {
        if (Status s = check_device_range(st.memset.dst, st.memset.size); !ok(s)) return s;
      } else if (st.kind == StepKind::kCopy) {
        if (Status s = check_device_range(st.copy.dst, st.copy.size); !ok(s)) return s;
        if (Status s = check_device_range(st.copy.src, st.copy.size); !ok(s)) return s;
      }
    }
  }
  return backend_.launch_program(c.e.stream, std::shared_ptr<const std::vector<GraphStep>>(g, &g->steps), c.tag);
}

void Worker::op_GraphCondHandle(const SlotCall& c) {
  const auto a = decode<Op::GraphCondHandle>(c.e.arg);  // check_entry: < kMaxDevices
  if (a.device >= backend_.device_count()) return reply(c, Status::kInvalidDevice);
  uint64_t handle = 0;
  const Status s = backend_.cond_handle_create(uint32_t(a.device), &handle);
  reply(c, s, ok(s) ? handle : 0);
}

Status Worker::run_graph_step(const RingCall& c, const GraphStep& st) {
  switch (st.kind) {
    case StepKind::kKernel: {
      LaunchParams p;
      p.kernel = st.kernel.kernel;
      p.grid = st.kernel.grid;
      p.block = st.kernel.block;
      p.args = st.args;
      p.args_size = st.kernel.args_size;
      p.shared_mem = st.kernel.shared_mem;
      LaunchShape::decode(st.kernel.flags, &p.shape);  // parse_graph_steps checked it
      return backend_.launch(c.e.stream, p, c.tag);
    }
    case StepKind::kMemset: {
      const auto lock = read_memory();
      if (Status s = check_device_range(st.memset.dst, st.memset.size); !ok(s)) return s;
      return backend_.memset(c.e.stream, st.memset.dst, uint8_t(st.memset.value), st.memset.size, c.tag);
    }
    case StepKind::kCopy: {
      const auto lock = read_memory();
      if (Status s = check_device_range(st.copy.dst, st.copy.size); !ok(s)) return s;
      if (Status s = check_device_range(st.copy.src, st.copy.size); !ok(s)) return s;
      return backend_.memcpy(c.e.stream, MemOperand{true, st.copy.dst}, MemOperand{true, st.copy.src}, st.copy.size, c.tag);
    }
    case StepKind::kHandle:
    case StepKind::kCond:
    case StepKind::kBody: break;  // control flow: run_program's
  }
  return Status::kInvalidValue;  // parse_graph_steps admits no other kind
}

}  // namespace ordo

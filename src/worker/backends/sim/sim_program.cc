// Conditional graph nodes on the sim: a graph with conditionals is one stream
// op (ProgramOp) whose thread runs the steps itself, deciding each IF, WHILE
// and SWITCH from the value its kernels set, as a GPU does without the host.
#include <algorithm>
#include <atomic>
#include <mutex>

#include "sim_device.h"

namespace ordo::sim {
namespace {

// Handles are unique in the worker process; the high bits make one from
// another process, or a stale number, unlikely to name a live one.
std::atomic<uint64_t> g_next_handle{0};
constexpr uint64_t kHandleTag = uint64_t{0x0c0d} << 48;

uint32_t* find(KernelContext::Conditions& conds, uint64_t handle) {
  auto it = std::find_if(conds.begin(), conds.end(), [handle](const auto& c) { return c.first == handle; });
  return it == conds.end() ? nullptr : &it->second;
}

}  // namespace

void KernelContext::set_conditional(uint64_t handle, uint32_t value) const {
  uint32_t* v = conditions_ ? find(*conditions_, handle) : nullptr;
  if (!v) throw KernelError(Status::kLaunchFailure, "cudaGraphSetConditional: not a handle of the running graph");
  *v = value;
}

Status Device::cond_handle_create(uint32_t device, uint64_t* handle) {
  if (device >= devices_) return Status::kInvalidDevice;
  *handle = kHandleTag | (g_next_handle.fetch_add(1, std::memory_order_relaxed) + 1);
  return Status::kSuccess;
}

Status Device::launch_program(uint32_t stream, std::shared_ptr<const std::vector<GraphStep>> steps,
                              const OpTag& tag) {
  // Every kernel is checked now, in bodies that may never run too: a GPU's
  // graph refuses a bad node when it is instantiated.
  for (const GraphStep& st : *steps) {
    if (st.kind != StepKind::kKernel) continue;
    Kernel fn = nullptr;
    std::string_view missing;
    LaunchShape shape;
    LaunchShape::decode(st.kernel.flags, &shape);  // parse_graph_steps checked it
    if (Status s = check_kernel(st.kernel.kernel, st.kernel.grid, st.kernel.block, st.kernel.shared_mem, shape, &fn,
                                &missing);
        !ok(s))
      return s;
  }
  std::lock_guard lk(mu_);
  Stream* s = find_stream_locked(stream);
  if (!s) return Status::kInvalidResourceHandle;
  push_locked(*s, Op{tag, ProgramOp{std::move(steps), s->device, program_epoch_.load(std::memory_order_relaxed)}});
  return Status::kSuccess;
}

void Device::run_program(const ProgramOp& p, const OpTag& tag) {
  KernelContext::Conditions conds;
  for (const GraphStep& st : *p.steps)
    if (st.kind == StepKind::kHandle)
      conds.emplace_back(st.handle.handle, st.handle.flags & kCondAssignDefault ? st.handle.default_value : 0);
  // The first failure ends the launch, as a fault ends a GPU's graph.
  if (Status s = run_steps(*p.steps, 0, p.steps->size(), p.device, p.epoch, conds); !ok(s)) report(tag, s);
}

Status Device::run_steps(const std::vector<GraphStep>& steps, size_t at, size_t end, uint32_t device, uint64_t epoch,
                         KernelContext::Conditions& conds) {
  while (at < end) {
    const GraphStep& st = steps[at];
    switch (st.kind) {
      case StepKind::kHandle: break;
      case StepKind::kBody: return Status::kInvalidValue;  // parse_graph_steps: bodies follow their kCond
      case StepKind::kKernel: {
        Kernel fn = nullptr;
        std::string_view missing;
        LaunchShape shape;
        LaunchShape::decode(st.kernel.flags, &shape);
        if (Status s = check_kernel(st.kernel.kernel, st.kernel.grid, st.kernel.block, st.kernel.shared_mem, shape,
                                    &fn, &missing);
            !ok(s))
          return s;
        if (Status s = run_kernel(fn, missing, st.kernel.grid, st.kernel.block, {st.args, st.kernel.args_size},
                                  device, &conds);
            !ok(s))
          return s;
        break;
      }
      case StepKind::kMemset:
        if (!st.memset.size) break;
        if (Status s = run_set({st.memset.dst, st.memset.size, uint8_t(st.memset.value)}); !ok(s)) return s;
        break;
      case StepKind::kCopy:
        if (!st.copy.size) break;
        if (Status s = run_copy({{true, st.copy.dst}, {true, st.copy.src}, st.copy.size}); !ok(s)) return s;
        break;
      case StepKind::kCond: {
        const uint32_t* value = find(conds, st.cond.handle);  // parse_graph_steps: declared
        if (!value) return Status::kInvalidValue;
        // Body k: its kBody step is at body(k), its steps follow it up to that step's end.
        auto body = [&](uint32_t k) {
          size_t b = at + 1;
          while (k--) b = steps[b].end;
          return b;
        };
        auto run_body = [&](size_t b) { return run_steps(steps, b + 1, steps[b].end, device, epoch, conds); };
        // Its session going (abandon_programs) or the worker: the loop ends, its launch with it.
        auto live = [&] {
          return !stopping_.load(std::memory_order_relaxed) &&
                 program_epoch_.load(std::memory_order_relaxed) == epoch;
        };
        Status s = Status::kSuccess;
        switch (CondType(st.cond.type)) {
          case CondType::kIf:
            if (*value) s = run_body(body(0));
            else if (st.cond.bodies == 2) s = run_body(body(1));
            break;
          case CondType::kWhile:
            // Decided before each pass, as CUDA's WHILE: a zero value runs no pass.
            while (ok(s) && *value && live()) s = run_body(body(0));
            break;
          case CondType::kSwitch:
            if (*value < st.cond.bodies) s = run_body(body(*value));
            break;
        }
        if (!ok(s)) return s;
        at = st.end;
        continue;
      }
    }
    ++at;
  }
  return Status::kSuccess;
}

}  // namespace ordo::sim

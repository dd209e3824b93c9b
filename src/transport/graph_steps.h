// A graph's device work as the worker runs it for one GraphLaunch entry: the
// kernels, memsets and device-to-device copies of a CUDA graph, in an order
// its edges allow. libcuda.so.1 writes the steps (GraphStepWriter) into a
// pinned-heap block for GraphCreate; the worker copies the block out and
// parses the copy (parse_graph_steps), which checks every size and field
// before anything uses it: the bytes come from the guest.
//
// Layout (little-endian, every step 8-byte aligned):
//   step   +0 u32 kind (StepKind)  +4 u32 size: the bytes after this header (a multiple of 8)
//   kKernel: KernelStep, then args_size bytes of packed arguments, padded to 8
//   kMemset: MemsetStep        kCopy: CopyStep
//   kHandle: HandleStep, a conditional handle the graph's conditional nodes
//            read; top level only, before the first kCond that names it
//   kCond:   CondStep, then `bodies` kBody steps, each followed by its body's
//            steps (any kind but kHandle, conditionals nested in them)
//   kBody:   BodyStep: how many of the steps after it (at any depth) are its body
// A graph with kHandle or kCond steps has control flow that only the device
// can decide (a kernel sets a handle's value): the backend runs it as a whole
// (Backend::launch_program), not step by step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ordo/device_info.h"
#include "transport/launch_shape.h"

namespace ordo {

// A graph's steps are at most this many bytes (the guest sends them through
// one pinned-heap block) and this many steps.
inline constexpr uint64_t kMaxGraphBytes = uint64_t{4} << 20;
inline constexpr uint32_t kMaxGraphSteps = 1u << 16;
// CUDA's limit on a kernel's parameter bytes (since 12.1).
inline constexpr uint32_t kMaxGraphParamBytes = 32764;

// Conditional nodes nest at most this deep.
inline constexpr uint32_t kMaxCondDepth = 32;

enum class StepKind : uint32_t { kKernel = 1, kMemset = 2, kCopy = 3, kHandle = 4, kCond = 5, kBody = 6 };
// CUgraphConditionalNodeType's values.
enum class CondType : uint32_t { kIf = 0, kWhile = 1, kSwitch = 2 };
// HandleStep::flags: CU_GRAPH_COND_ASSIGN_DEFAULT.
inline constexpr uint32_t kCondAssignDefault = 1;

struct StepHeader {
  uint32_t kind;
  uint32_t size;
};
struct KernelStep {
  uint32_t kernel;  // a kernel id the worker issued (KernelLookup)
  uint32_t shared_mem;
  Dim3 grid, block;
  uint32_t args_size;
  uint32_t flags;  // LaunchShape::flags()
};
struct MemsetStep {
  uint64_t dst, value, size;  // value: a byte
};
struct CopyStep {
  uint64_t dst, src, size;  // device addresses, of any of the session's devices
};
struct HandleStep {
  uint64_t handle;  // as GraphCondHandle issued it
  uint32_t default_value;
  uint32_t flags;  // kCondAssignDefault: the value is default_value when a launch starts, else 0
};
struct CondStep {
  uint64_t handle;  // a kHandle of the graph
  uint32_t type;    // CondType
  uint32_t bodies;  // kIf: 1 or 2, kWhile: 1, kSwitch: at least 1
};
struct BodyStep {
  uint32_t steps;
  uint32_t pad;
};
static_assert(sizeof(StepHeader) == 8 && sizeof(KernelStep) == 40 && sizeof(MemsetStep) == 24 &&
              sizeof(CopyStep) == 24 && sizeof(HandleStep) == 16 && sizeof(CondStep) == 16 &&
              sizeof(BodyStep) == 8);

class GraphStepWriter {
 public:
  void kernel(const KernelStep& k, const void* args) {
    const size_t at = begin(StepKind::kKernel, sizeof k + pad8(k.args_size));
    std::memcpy(&bytes_[at], &k, sizeof k);
    if (k.args_size && args) std::memcpy(&bytes_[at + sizeof k], args, k.args_size);
  }
  void memset(const MemsetStep& m) { std::memcpy(&bytes_[begin(StepKind::kMemset, sizeof m)], &m, sizeof m); }
  void copy(const CopyStep& c) { std::memcpy(&bytes_[begin(StepKind::kCopy, sizeof c)], &c, sizeof c); }
  void handle(const HandleStep& h) { std::memcpy(&bytes_[begin(StepKind::kHandle, sizeof h)], &h, sizeof h); }
  void cond(const CondStep& c) { std::memcpy(&bytes_[begin(StepKind::kCond, sizeof c)], &c, sizeof c); }
  // A body's header, its step count written by end_body() once its steps are.
  size_t begin_body() {
    const size_t at = begin(StepKind::kBody, sizeof(BodyStep));
    body_steps_.push_back(steps_);
    return at;
  }
  void end_body(size_t at) {
    const BodyStep b{steps_ - body_steps_.back(), 0};
    body_steps_.pop_back();
    std::memcpy(&bytes_[at], &b, sizeof b);
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }
  uint32_t steps() const { return steps_; }

 private:
  static size_t pad8(size_t n) { return (n + 7) & ~size_t{7}; }
  size_t begin(StepKind kind, size_t size) {
    const StepHeader h{uint32_t(kind), uint32_t(size)};
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof h + size);  // zeroed: padding stays zero
    std::memcpy(&bytes_[at], &h, sizeof h);
    ++steps_;
    return at + sizeof h;
  }
  std::vector<std::byte> bytes_;
  uint32_t steps_ = 0;
  std::vector<uint32_t> body_steps_;  // steps_ when each open body began
};

// One parsed step; `args` points into the parsed bytes (kKernel).
struct GraphStep {
  StepKind kind;
  KernelStep kernel;
  MemsetStep memset;
  CopyStep copy;
  HandleStep handle;
  CondStep cond;
  BodyStep body;
  const std::byte* args = nullptr;
  // kCond: the index past its last body; kBody: the index past its body.
  uint32_t end = 0;
};

// Parses `bytes` into *out; false with *why on anything out of bounds or
// unknown, or on conditionals that do not nest (every body inside its
// conditional, every conditional's handle declared before it, at most
// kMaxCondDepth deep). Kernel ids and device ranges are the worker's to check
// at launch, against its tables as they are then.
bool parse_graph_steps(std::span<const std::byte> bytes, std::vector<GraphStep>* out, std::string* why);

// Whether parsed steps have control flow (kHandle or kCond steps).
bool has_control_flow(std::span<const GraphStep> steps);

}  // namespace ordo

#include "transport/graph_steps.h"

#include <algorithm>

namespace ordo {
namespace {

// Checks the steps in [at, end) nest, `depth` conditionals deep, and sets each
// kCond's and kBody's `end`; `handles` are those declared so far.
bool check_nesting(std::vector<GraphStep>& s, size_t at, size_t end, uint32_t depth, std::vector<uint64_t>& handles,
                   std::string* why) {
  while (at < end) {
    GraphStep& st = s[at];
    switch (st.kind) {
      case StepKind::kHandle:
        if (depth) return *why = "conditional handle declared inside a conditional body", false;
        if (std::find(handles.begin(), handles.end(), st.handle.handle) != handles.end())
          return *why = "conditional handle declared twice", false;
        handles.push_back(st.handle.handle);
        ++at;
        break;
      case StepKind::kBody: return *why = "conditional body step outside a conditional", false;
      case StepKind::kCond: {
        if (depth + 1 > kMaxCondDepth) return *why = "conditionals nested more than kMaxCondDepth deep", false;
        if (std::find(handles.begin(), handles.end(), st.cond.handle) == handles.end())
          return *why = "conditional step names a handle the graph does not declare", false;
        size_t b = at + 1;
        for (uint32_t i = 0; i < st.cond.bodies; ++i) {
          if (b >= end || s[b].kind != StepKind::kBody)
            return *why = "conditional step without all its bodies", false;
          if (s[b].body.steps > end - b - 1) return *why = "conditional body past its conditional's end", false;
          const size_t body_end = b + 1 + s[b].body.steps;
          s[b].end = uint32_t(body_end);
          if (!check_nesting(s, b + 1, body_end, depth + 1, handles, why)) return false;
          b = body_end;
        }
        st.end = uint32_t(b);
        at = b;
        break;
      }
      default: ++at;
    }
  }
  return true;
}

}  // namespace

bool has_control_flow(std::span<const GraphStep> steps) {
  return std::any_of(steps.begin(), steps.end(),
                     [](const GraphStep& s) { return s.kind == StepKind::kHandle || s.kind == StepKind::kCond; });
}

bool parse_graph_steps(std::span<const std::byte> bytes, std::vector<GraphStep>* out, std::string* why) {
  out->clear();
  if (bytes.size() > kMaxGraphBytes) return *why = "graph steps larger than kMaxGraphBytes", false;
  size_t at = 0;
  while (at < bytes.size()) {
    StepHeader h;
    if (bytes.size() - at < sizeof h) return *why = "graph step header cut short", false;
    std::memcpy(&h, &bytes[at], sizeof h);
    at += sizeof h;
    if (h.size % 8 || h.size > bytes.size() - at) return *why = "graph step size misaligned or past the end", false;
    if (out->size() == kMaxGraphSteps) return *why = "more than kMaxGraphSteps graph steps", false;
    GraphStep st{};
    st.kind = StepKind(h.kind);
    switch (st.kind) {
      case StepKind::kKernel: {
        if (h.size < sizeof st.kernel) return *why = "kernel step too short", false;
        std::memcpy(&st.kernel, &bytes[at], sizeof st.kernel);
        const KernelStep& k = st.kernel;
        if (k.args_size > kMaxGraphParamBytes || ((sizeof k + k.args_size + 7) & ~size_t{7}) != h.size)
          return *why = "kernel step's argument size disagrees with its step size", false;
        for (uint32_t d : {k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z})
          if (d == 0) return *why = "kernel step with a zero grid or block dimension", false;
        LaunchShape shape;
        if (!LaunchShape::decode(k.flags, &shape)) return *why = "kernel step with unknown launch flags", false;
        if (!ok(check_cluster(k.grid, shape.cluster)))
          return *why = "kernel step's cluster does not divide its grid or exceeds 16 blocks", false;
        st.args = bytes.data() + at + sizeof k;
        break;
      }
      case StepKind::kMemset:
        if (h.size != sizeof st.memset) return *why = "memset step of the wrong size", false;
        std::memcpy(&st.memset, &bytes[at], sizeof st.memset);
        if (st.memset.value > 0xff) return *why = "memset step value is not a byte", false;
        break;
      case StepKind::kCopy:
        if (h.size != sizeof st.copy) return *why = "copy step of the wrong size", false;
        std::memcpy(&st.copy, &bytes[at], sizeof st.copy);
        break;
      case StepKind::kHandle:
        if (h.size != sizeof st.handle) return *why = "handle step of the wrong size", false;
        std::memcpy(&st.handle, &bytes[at], sizeof st.handle);
        if (st.handle.flags & ~kCondAssignDefault) return *why = "handle step with unknown flags", false;
        break;
      case StepKind::kCond: {
        if (h.size != sizeof st.cond) return *why = "conditional step of the wrong size", false;
        std::memcpy(&st.cond, &bytes[at], sizeof st.cond);
        const CondStep& c = st.cond;
        const bool fits = c.type == uint32_t(CondType::kIf)      ? c.bodies == 1 || c.bodies == 2
                          : c.type == uint32_t(CondType::kWhile) ? c.bodies == 1
                          : c.type == uint32_t(CondType::kSwitch) && c.bodies >= 1;
        if (!fits) return *why = "conditional step of unknown type, or with a body count its type does not allow", false;
        break;
      }
      case StepKind::kBody:
        if (h.size != sizeof st.body) return *why = "body step of the wrong size", false;
        std::memcpy(&st.body, &bytes[at], sizeof st.body);
        break;
      default: return *why = "unknown graph step kind " + std::to_string(h.kind), false;
    }
    at += h.size;
    out->push_back(st);
  }
  if (out->empty()) return *why = "a graph with no steps", false;
  std::vector<uint64_t> handles;
  return check_nesting(*out, 0, out->size(), 0, handles, why);
}

}  // namespace ordo

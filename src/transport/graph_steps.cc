#include "transport/graph_steps.h"

namespace ordo {

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
      default: return *why = "unknown graph step kind " + std::to_string(h.kind), false;
    }
    at += h.size;
    out->push_back(st);
  }
  if (out->empty()) return *why = "a graph with no steps", false;
  return true;
}

}  // namespace ordo

// A graph node's device work as the worker's graph steps
// (transport/graph_steps.h): what exec.cc sends for a run of nodes, and
// graph_conditional.cc for a conditional's bodies.
#include "graph.h"

#include <vector>

#include "module.h"

namespace ordo::driver {

// Appends `w`'s device work to `out` if the worker can run all of it without
// the guest: a kernel with a plain launch configuration, a byte-pattern memset,
// a copy between device allocations, or a conditional node of those. False
// leaves `out` as it was, except after a conditional's (then unusable).
bool device_steps(ordo::Client* c, const NodeWork& w, GraphStepWriter* out) {
  switch (w.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const Function* f = function_of(w.fn);
      const uint64_t threads = uint64_t{w.block.x} * w.block.y * w.block.z;
      uint16_t shape = 0;
      // What Client::launch would refuse, or check against the device, is left to it.
      if (!f || threads > 1024 || w.block.z > 64 || w.grid.x > 0x7fffffffu || w.grid.y > 65535 ||
          w.grid.z > 65535 || w.smem > 48 * 1024 || w.args.size() > kMaxGraphParamBytes ||
          !node_step_shape(w, &shape))
        return false;
      out->kernel({f->id, w.smem, w.grid, w.block, uint32_t(w.args.size()), shape}, w.args.data());
      return true;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS& p = w.set;
      const uint8_t b = uint8_t(p.value);
      for (unsigned i = 1; i < p.elementSize; ++i)
        if (uint8_t(p.value >> (8 * i)) != b) return false;
      const uint64_t row = uint64_t(p.width) * p.elementSize;
      for (size_t r = 0; r < p.height; ++r)
        if (!device_allocs().find(p.dst + r * p.pitch, nullptr, nullptr) || mapped_host(c, p.dst + r * p.pitch, row))
          return false;
      for (size_t r = 0; r < p.height; ++r) out->memset({p.dst + r * p.pitch, b, row});
      return true;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      const CUDA_MEMCPY3D& p = w.copy;
      auto device = [](CUmemorytype t) { return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED; };
      if (!device(p.srcMemoryType) || !device(p.dstMemoryType)) return false;
      std::vector<CopyStep> rows;
      for (size_t z = 0; z < p.Depth; ++z)
        for (size_t y = 0; y < p.Height; ++y) {
          const uint64_t src = p.srcDevice + p.srcXInBytes + (p.srcY + y) * p.srcPitch +
                               (p.srcZ + z) * p.srcHeight * p.srcPitch;
          const uint64_t dst = p.dstDevice + p.dstXInBytes + (p.dstY + y) * p.dstPitch +
                               (p.dstZ + z) * p.dstHeight * p.dstPitch;
          for (uint64_t a : {src, dst})
            if (!device_allocs().find(a, nullptr, nullptr) || mapped_host(c, a, p.WidthInBytes)) return false;
          rows.push_back({dst, src, p.WidthInBytes});
        }
      for (const CopyStep& r : rows) out->copy(r);
      return true;
    }
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return conditional_steps(c, w, out);
    default: return false;
  }
}

}  // namespace ordo::driver

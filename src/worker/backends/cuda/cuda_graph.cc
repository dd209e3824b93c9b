// Conditional graph nodes on the cuda backend. Only the device can decide a
// conditional, from a value its own kernels set with cudaGraphSetConditional
// on a handle the driver made for that graph. So a program (a worker graph
// with kHandle/kCond steps) becomes a real CUDA graph: its handles are made
// on it, and the guest's handles, which are random tokens of ours that its
// kernels carry as parameters, are replaced by them in every kernel's
// argument bytes. The exec is built at the program's first launch and kept
// while the worker keeps the program.
#include <cuda.h>

#include <cstring>
#include <random>

#include "cuda_backend_impl.h"

namespace ordo::cuda {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64: tokens no kernel argument matches by chance
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Status CudaBackend::cond_handle_create(uint32_t device, uint64_t* handle) {
  if (device >= device_count()) return Status::kInvalidDevice;
  if (!drv_.has_conditionals()) return Status::kNotSupported;
  static const uint64_t base = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  uint64_t t = 0;
  while (t == 0) t = mix(base + cond_tokens_.fetch_add(1, std::memory_order_relaxed));
  *handle = t;
  return Status::kSuccess;
}

Status CudaBackend::add_steps(CUgraph g, const std::vector<GraphStep>& steps, size_t at, size_t end,
                              uint32_t device, const std::vector<std::pair<uint64_t, CUgraphConditionalHandle>>& handles,
                              uint32_t noop) {
  CUgraphNode last = nullptr;  // the steps run in order: each node follows the one before
  const CUcontext ctx = devices_[device].ctx;
  auto add = [&](CUgraphNodeParams& p) -> Status {
    CUgraphNode n = nullptr;
    if (CUresult r = drv_.graph_add_node(&n, g, last ? &last : nullptr, nullptr, last ? 1 : 0, &p); r != CUDA_SUCCESS)
      return to_status(r);
    last = n;
    return Status::kSuccess;
  };
  while (at < end) {
    const GraphStep& st = steps[at];
    CUgraphNodeParams p{};
    switch (st.kind) {
      case StepKind::kHandle:
      case StepKind::kBody: break;  // made by build_program; a body is its kCond's
      case StepKind::kKernel: {
        const KernelStep& k = st.kernel;
        LaunchShape shape;
        LaunchShape::decode(k.flags, &shape);
        // Hopper's cuBLAS kernels run in clusters, inside XLA's loops too.
        if (!shape.plain() && !drv_.graph_kernel_node_set_attribute) return Status::kNotSupported;
        LaunchParams lp;
        lp.kernel = k.kernel;
        lp.args_size = k.args_size;
        lp.shared_mem = k.shared_mem;
        lp.shape = shape;
        CUfunction fn = nullptr;
        size_t size = 0;
        if (Status s = kernel_for_launch(device, lp, &fn, &size); !ok(s)) return s;
        std::vector<std::byte> args(st.args, st.args + k.args_size);
        for (size_t off = 0; off + 8 <= args.size(); off += 8) {
          uint64_t word;
          std::memcpy(&word, &args[off], 8);
          for (const auto& [token, real] : handles)
            if (word == token) std::memcpy(&args[off], &real, 8);
        }
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         CU_LAUNCH_PARAM_END};
        p.type = CU_GRAPH_NODE_TYPE_KERNEL;
        p.kernel.func = fn;
        p.kernel.gridDimX = k.grid.x, p.kernel.gridDimY = k.grid.y, p.kernel.gridDimZ = k.grid.z;
        p.kernel.blockDimX = k.block.x, p.kernel.blockDimY = k.block.y, p.kernel.blockDimZ = k.block.z;
        p.kernel.sharedMemBytes = k.shared_mem;
        p.kernel.extra = size ? extra : nullptr;
        if (Status s = add(p); !ok(s)) return s;  // the driver copied the arguments
        // As launch() gives them to cuLaunchKernelEx: only what differs from a plain launch.
        if (shape.blocks_per_cluster() > 1) {
          CUkernelNodeAttrValue v{};
          v.clusterDim.x = shape.cluster.x, v.clusterDim.y = shape.cluster.y, v.clusterDim.z = shape.cluster.z;
          if (CUresult r = drv_.graph_kernel_node_set_attribute(last, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v);
              r != CUDA_SUCCESS)
            return to_status(r);
        }
        if (shape.cooperative) {
          CUkernelNodeAttrValue v{};
          v.cooperative = 1;
          if (CUresult r = drv_.graph_kernel_node_set_attribute(last, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v);
              r != CUDA_SUCCESS)
            return to_status(r);
        }
        break;
      }
      case StepKind::kMemset:
        if (!st.memset.size) break;
        p.type = CU_GRAPH_NODE_TYPE_MEMSET;
        p.memset.dst = st.memset.dst;
        p.memset.value = unsigned(st.memset.value);
        p.memset.elementSize = 1;
        p.memset.width = st.memset.size;
        p.memset.height = 1;
        p.memset.ctx = ctx;
        if (Status s = add(p); !ok(s)) return s;
        break;
      case StepKind::kCopy:
        if (!st.copy.size) break;
        p.type = CU_GRAPH_NODE_TYPE_MEMCPY;
        p.memcpy.copyCtx = ctx;
        p.memcpy.copyParams.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        p.memcpy.copyParams.srcDevice = st.copy.src;
        p.memcpy.copyParams.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        p.memcpy.copyParams.dstDevice = st.copy.dst;
        p.memcpy.copyParams.WidthInBytes = st.copy.size;
        p.memcpy.copyParams.Height = 1;
        p.memcpy.copyParams.Depth = 1;
        if (Status s = add(p); !ok(s)) return s;
        break;
      case StepKind::kCond: {
        CUgraphConditionalHandle real = 0;
        for (const auto& [token, h] : handles)
          if (token == st.cond.handle) real = h;
        p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
        p.conditional.handle = real;
        p.conditional.type = CUgraphConditionalNodeType(st.cond.type);
        p.conditional.size = st.cond.bodies;
        p.conditional.ctx = ctx;
        if (Status s = add(p); !ok(s)) return s;
        std::vector<CUgraph> bodies(p.conditional.phGraph_out, p.conditional.phGraph_out + st.cond.bodies);
        size_t b = at + 1;
        for (CUgraph body : bodies) {
          if (Status s = add_steps(body, steps, b + 1, steps[b].end, device, handles, noop); !ok(s)) return s;
          b = steps[b].end;
        }
        at = st.end;
        continue;
      }
    }
    ++at;
  }
  if (!last) {
    // An empty body (an ELSE with nothing in it): drivers before 12.8 hang
    // on a conditional whose body has no node, and some refuse empty nodes
    // there, so it gets the built-in no-op kernel.
    uint32_t slot = 0;
    CUfunction fn = nullptr;
    if (!kernel_slots_.find(noop, &slot) || kernels_[slot].fn.empty()) return Status::kInvalidDeviceFunction;
    if (Status s = function_on(kernels_[slot], device, &fn); !ok(s)) return s;
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_KERNEL;
    p.kernel.func = fn;
    p.kernel.gridDimX = p.kernel.gridDimY = p.kernel.gridDimZ = 1;
    p.kernel.blockDimX = p.kernel.blockDimY = p.kernel.blockDimZ = 1;
    return add(p);
  }
  return Status::kSuccess;
}

Status CudaBackend::build_program(const std::vector<GraphStep>& steps, uint32_t device, uint32_t noop,
                                  CUgraphExec* out) {
  CUgraph g = nullptr;
  if (CUresult r = drv_.graph_create(&g, 0); r != CUDA_SUCCESS) return to_status(r);
  std::vector<std::pair<uint64_t, CUgraphConditionalHandle>> handles;
  Status s = Status::kSuccess;
  for (const GraphStep& st : steps) {
    if (st.kind != StepKind::kHandle) continue;
    CUgraphConditionalHandle h = 0;
    // Made on the root: a handle of an enclosing graph serves the conditionals of every body.
    if (CUresult r = drv_.graph_cond_handle(&h, g, devices_[device].ctx, st.handle.default_value, st.handle.flags);
        r != CUDA_SUCCESS) {
      s = to_status(r);
      break;
    }
    handles.emplace_back(st.handle.handle, h);
  }
  if (ok(s)) s = add_steps(g, steps, 0, steps.size(), device, handles, noop);
  if (ok(s))
    if (CUresult r = drv_.graph_instantiate(out, g, 0); r != CUDA_SUCCESS) s = to_status(r);
  drv_.graph_destroy(g);  // the exec is a copy
  return s;
}

void CudaBackend::drop_programs() {
  for (auto& [key, p] : programs_) drv_.graph_exec_destroy(p.exec);  // launches issued still run
  programs_.clear();
}

Status CudaBackend::launch_program(uint32_t stream, std::shared_ptr<const std::vector<GraphStep>> steps,
                                   const OpTag& tag) {
  if (!drv_.has_conditionals()) return Status::kNotSupported;
  uint32_t noop = 0;  // for empty bodies
  if (Status s = kernel_lookup(0, "ordo_noop", &noop); !ok(s)) return s;
  std::shared_lock unload(unload_mu_);  // its kernels stay loaded until the driver has the launch
  std::lock_guard lk(mu_);
  StreamEntry* st = find_stream(stream);
  if (!st) return Status::kInvalidResourceHandle;
  bind(st->device);
  // Programs the worker dropped since: their execs go now.
  std::erase_if(programs_, [this](auto& e) {
    if (!e.second.steps.expired()) return false;
    drv_.graph_exec_destroy(e.second.exec);
    return true;
  });
  Program& p = programs_[steps.get()];
  if (!p.exec || p.device != st->device) {
    if (p.exec) drv_.graph_exec_destroy(p.exec);
    p = Program{steps, st->device, nullptr};
    if (Status s = build_program(*steps, st->device, noop, &p.exec); !ok(s)) {
      programs_.erase(steps.get());
      return s;
    }
  }
  if (CUresult r = drv_.graph_launch(p.exec, reinterpret_cast<CUstream>(st->handle)); r != CUDA_SUCCESS)
    return to_status(r);
  st->last_tag = tag;
  return Status::kSuccess;
}

}  // namespace ordo::cuda

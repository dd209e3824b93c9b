// Launches, and what a launch may use: function attributes and occupancy.
#include "forwarded.h"
#include "graph.h"
#include "module.h"
#include "transport/occupancy.h"

#include <algorithm>
#include <cstdio>

namespace ordo::driver {
namespace {

// The packed arguments of a launch of `f`: from `extra` as they are, else
// from `params` by the kernel's layout (into *packed). CUDA's launch errors.
CUresult pack_args(Function* f, void** params, void** extra, ParamBuffer* packed, const void** buf, uint64_t* size) {
  *buf = nullptr;
  *size = 0;
  if (extra) {
    // {CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END}: already packed.
    for (void** e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
      if (*e == CU_LAUNCH_PARAM_BUFFER_POINTER) *buf = e[1];
      else if (*e == CU_LAUNCH_PARAM_BUFFER_SIZE && e[1]) *size = *static_cast<size_t*>(e[1]);
      else return CUDA_ERROR_INVALID_VALUE;
    }
    if (params || (*size && !*buf)) return CUDA_ERROR_INVALID_VALUE;
  } else {
    if (!f->layout) {
      std::fprintf(stderr, "ordo: no parameter layout for kernel %s in its module%s%s; it cannot be launched\n",
                   f->name.c_str(), f->module->parse_error.empty() ? "" : ": ", f->module->parse_error.c_str());
      return CUDA_ERROR_INVALID_IMAGE;
    }
    switch (pack_params(*f->layout, params, packed)) {
      case PackError::kNone: break;
      case PackError::kMissingArgument: return CUDA_ERROR_INVALID_VALUE;
      case PackError::kBadLayout: return CUDA_ERROR_INVALID_IMAGE;
    }
    *buf = packed->data();
    *size = packed->size();
  }
  if (*size > kMaxParamBytes) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// Above 48 KiB a launch needs the kernel's opt-in (cuFuncSetAttribute). The
// kernel's static shared memory, which lowers the limit, is the device's to
// count: the host driver refuses such a launch in stream order.
CUresult check_smem(Function* f, unsigned smem) {
  if (smem > 48 * 1024 && int64_t{smem} > f->max_dynamic_smem.load(std::memory_order_relaxed))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// How many blocks of `threads` threads using `smem` bytes the current device
// holds at once: the per-multiprocessor estimate times the multiprocessors.
CUresult resident_blocks(CUfunction fn, uint64_t threads, size_t smem, int64_t* out) {
  int per_sm = 0;
  if (CUresult e = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&per_sm, fn, int(threads), smem, 0);
      e != CUDA_SUCCESS)
    return e;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  *out = int64_t{per_sm} * d->attrs[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT];
  return CUDA_SUCCESS;
}

// CUDA's answer to a cluster or cooperative launch of `f` on the current
// device. A cooperative grid is held to the guest's occupancy estimate (no
// register counts); the driver behind the worker checks it exactly.
CUresult check_shape(const Function* f, Dim3 grid, Dim3 block, unsigned smem, const LaunchShape& shape) {
  if (shape.plain()) return CUDA_SUCCESS;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  if (shape.blocks_per_cluster() > 1) {
    if (!d->attrs[CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH]) return CUDA_ERROR_NOT_SUPPORTED;
    if (to_cu(check_cluster(grid, shape.cluster)) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    if (shape.blocks_per_cluster() > kMaxPortableClusterBlocks && !f->non_portable_cluster.load())
      return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  }
  if (shape.cooperative) {
    if (!d->attrs[CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH]) return CUDA_ERROR_NOT_SUPPORTED;
    int64_t fit = 0;
    if (CUresult e = resident_blocks(reinterpret_cast<CUfunction>(const_cast<Function*>(f)),
                                     uint64_t{block.x} * block.y * block.z, smem, &fit);
        e != CUDA_SUCCESS)
      return e;
    if (uint64_t{grid.x} * grid.y * grid.z > uint64_t(fit)) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  }
  return CUDA_SUCCESS;
}

// A kernel node keeps its shape as the launch attributes a program can read back.
void set_shape_attrs(const LaunchShape& shape, std::map<int, CUlaunchAttributeValue>* attrs) {
  if (shape.blocks_per_cluster() > 1) {
    CUlaunchAttributeValue v{};
    v.clusterDim.x = shape.cluster.x, v.clusterDim.y = shape.cluster.y, v.clusterDim.z = shape.cluster.z;
    (*attrs)[CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION] = v;
  }
  if (shape.cooperative) {
    CUlaunchAttributeValue v{};
    v.cooperative = 1;
    (*attrs)[CU_LAUNCH_ATTRIBUTE_COOPERATIVE] = v;
  }
}

CUresult launch(Function* f, Dim3 grid, Dim3 block, unsigned smem, CUstream stream, void** params, void** extra,
                bool per_thread, const LaunchShape& shape = {}) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  const void* buf = nullptr;
  uint64_t size = 0;
  ParamBuffer packed;
  if (CUresult e = pack_args(f, params, extra, &packed, &buf, &size); e != CUDA_SUCCESS) return e;
  if (CUresult e = check_smem(f, smem); e != CUDA_SUCCESS) return e;
  if (CUresult e = check_shape(f, grid, block, smem, shape); e != CUDA_SUCCESS) return e;
  if (any_capture()) {
    NodeWork w;
    w.type = CU_GRAPH_NODE_TYPE_KERNEL;
    w.fn = reinterpret_cast<CUfunction>(f);
    w.grid = grid;
    w.block = block;
    w.smem = smem;
    w.args.assign(static_cast<const std::byte*>(buf), static_cast<const std::byte*>(buf) + size);
    set_shape_attrs(shape, &w.attrs);
    if (CUresult r; capture_work(c, s, std::move(w), &r)) return r;
  }
  return to_cu(c->launch(f->id, grid, block, buf, uint32_t(size), s, smem, shape.flags()));
}

static_assert(CU_FUNC_ATTRIBUTE_MAX == int(ordo::kKernelAttributeCount));
static_assert(ordo::kKernelMaxThreadsPerBlock == uint32_t(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) &&
              ordo::kKernelSharedSizeBytes == uint32_t(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) &&
              ordo::kKernelLocalSizeBytes == uint32_t(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES) &&
              ordo::kKernelNumRegs == uint32_t(CU_FUNC_ATTRIBUTE_NUM_REGS) &&
              ordo::kKernelPtxVersion == uint32_t(CU_FUNC_ATTRIBUTE_PTX_VERSION) &&
              ordo::kKernelBinaryVersion == uint32_t(CU_FUNC_ATTRIBUTE_BINARY_VERSION) &&
              ordo::kKernelMaxDynamicSharedSizeBytes == uint32_t(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) &&
              ordo::kKernelPreferredSharedMemoryCarveout == uint32_t(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT));

// What device `dev` reports of the kernel: registers, local and static shared
// memory, the threads per block they allow (the host driver's answer on a
// GPU), fetched once per device. A backend that cannot tell (`null`) leaves
// the device's limits: `*out` gets them, as a kernel that uses nothing.
CUresult kernel_attrs(Function* f, CUdevice dev, std::array<int32_t, ordo::kKernelAttributeCount>* out) {
  {
    std::lock_guard lock(f->attrs_mu);
    if (auto it = f->attrs.find(dev); it != f->attrs.end()) {
      *out = it->second;
      return CUDA_SUCCESS;
    }
  }
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::array<int32_t, ordo::kKernelAttributeCount> a{};
  const ordo::Status s = c->kernel_attributes(f->id, uint32_t(dev), a.data());
  if (s == ordo::Status::kNotSupported) {
    a.fill(0);
    a[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] = d->attrs[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK];
    a[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES] = 48 * 1024;
    a[CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT] = -1;
    a[CU_FUNC_ATTRIBUTE_PTX_VERSION] = a[CU_FUNC_ATTRIBUTE_BINARY_VERSION] =
        d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] * 10 + d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  } else if (!ordo::ok(s)) {
    return to_cu(s);
  }
  std::lock_guard lock(f->attrs_mu);
  *out = f->attrs.emplace(dev, a).first->second;
  return CUDA_SUCCESS;
}

// The dynamic shared memory a launch of `f` may ask for: what the program set
// (cuFuncSetAttribute), else the device's default (48 KiB less the kernel's
// static shared memory).
int max_dynamic_smem(const Function* f, const std::array<int32_t, ordo::kKernelAttributeCount>& a) {
  const int set = f->max_dynamic_smem.load(std::memory_order_relaxed);
  return set >= 0 ? set : a[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES];
}

// Function attributes: the device's answer, with what this process set
// (cuFuncSetAttribute) over it: the settings live in the guest, which checks
// launches against them, and reach the host driver with the launches that need them.
CUresult func_attribute(int* value, CUfunction_attribute attr, CUfunction fn, CUdevice dev) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (attr < 0 || attr >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  std::array<int32_t, ordo::kKernelAttributeCount> a;
  if (CUresult e = kernel_attrs(f, dev, &a); e != CUDA_SUCCESS) return e;
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = max_dynamic_smem(f, a); break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *value = f->non_portable_cluster.load(); break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *value = f->carveout.load(); break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *value = f->cluster_policy.load(); break;
    default: *value = a[attr]; break;
  }
  return CUDA_SUCCESS;
}

// A kernel's attributes are kept once for every device (the session's devices are alike).
CUresult func_set_attribute(CUfunction fn, CUfunction_attribute attr, int value, CUdevice dev) {
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: {
      // Static and dynamic shared memory together stay within the device's opt-in limit.
      std::array<int32_t, ordo::kKernelAttributeCount> a;
      if (CUresult e = kernel_attrs(f, dev, &a); e != CUDA_SUCCESS) return e;
      if (value < 0 || int64_t{value} + a[CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES] >
                           d->attrs[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN])
        return CUDA_ERROR_INVALID_VALUE;
      f->max_dynamic_smem.store(value);
      return CUDA_SUCCESS;
    }
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      if (value != 0 && value != 1) return CUDA_ERROR_INVALID_VALUE;
      f->non_portable_cluster.store(value == 1);
      return CUDA_SUCCESS;
    // Hints: kept for reading back, as the driver keeps them.
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (value < -1 || value > 100) return CUDA_ERROR_INVALID_VALUE;
      f->carveout.store(value);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      if (value < CU_CLUSTER_SCHEDULING_POLICY_DEFAULT || value > CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING)
        return CUDA_ERROR_INVALID_VALUE;
      f->cluster_policy.store(value);
      return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

// A cluster or a cooperative grid changes how the device runs the kernel: it
// goes with the launch (LaunchShape). Hints and preferences change nothing a
// program can rely on: accepted. The rest (launch-completion and programmatic
// events) signal something ordo does not carry, and are refused rather than dropped.
CUresult check_launch_attributes(const CUlaunchConfig* config, LaunchShape* shape) {
  LaunchShape out;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttributeValue& v = config->attrs[i].value;
    switch (config->attrs[i].id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      // Preferences: the required cluster shape (or none) is always a valid answer to them.
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
      // Stream order is kept in full; allowing overlap with the previous kernel is only permission.
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: continue;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        // All zero, as an attribute never set reads back: no cluster.
        if (!v.clusterDim.x && !v.clusterDim.y && !v.clusterDim.z) continue;
        if (!v.clusterDim.x || !v.clusterDim.y || !v.clusterDim.z ||
            uint64_t{v.clusterDim.x} * v.clusterDim.y * v.clusterDim.z > kMaxClusterBlocks)
          return CUDA_ERROR_INVALID_CLUSTER_SIZE;
        out.cluster = {v.clusterDim.x, v.clusterDim.y, v.clusterDim.z};
        continue;
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE: out.cooperative = v.cooperative != 0; continue;
      default: return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  if (shape) *shape = out;
  return CUDA_SUCCESS;
}

LaunchShape shape_of(const NodeWork& w) {
  LaunchShape shape;
  if (auto it = w.attrs.find(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION); it != w.attrs.end()) {
    const auto& d = it->second.clusterDim;
    shape.cluster = {std::max(1u, d.x), std::max(1u, d.y), std::max(1u, d.z)};
  }
  if (auto it = w.attrs.find(CU_LAUNCH_ATTRIBUTE_COOPERATIVE); it != w.attrs.end())
    shape.cooperative = it->second.cooperative != 0;
  return shape;
}

// ================================================================ behind the exports (forwarders.txt)

CUresult launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, CUstream stream, void** params, void** extra, bool per_thread) {
  return launch(function_of(f), {gx, gy, gz}, {bx, by, bz}, smem, stream, params, extra, per_thread);
}

CUresult launch_kernel_ex(const CUlaunchConfig* config, CUfunction f, void** params, void** extra, bool per_thread) {
  if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
  LaunchShape shape;
  if (CUresult e = check_launch_attributes(config, &shape); e != CUDA_SUCCESS) return e;
  return launch(function_of(f), {config->gridDimX, config->gridDimY, config->gridDimZ},
                {config->blockDimX, config->blockDimY, config->blockDimZ}, config->sharedMemBytes, config->hStream,
                params, extra, per_thread, shape);
}

CUresult launch_cooperative_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned smem, CUstream stream, void** params, bool per_thread) {
  LaunchShape shape;
  shape.cooperative = true;
  return launch(function_of(f), {gx, gy, gz}, {bx, by, bz}, smem, stream, params, nullptr, per_thread, shape);
}

CUresult launch_node_kernel(const NodeWork& w, CUstream stream, bool per_thread) {
  size_t size = w.args.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(w.args.data()), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  return launch(function_of(w.fn), w.grid, w.block, w.smem, stream, nullptr, extra, per_thread, shape_of(w));
}

bool node_step_shape(const NodeWork& w, uint16_t* flags) {
  const Function* f = function_of(w.fn);
  const LaunchShape shape = shape_of(w);
  if (!f || check_shape(f, w.grid, w.block, w.smem, shape) != CUDA_SUCCESS) return false;
  *flags = shape.flags();
  return true;
}

CUresult kernel_node_work(CUfunction fn, Dim3 grid, Dim3 block, unsigned smem, void** params, void** extra,
                          NodeWork* w) {
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z) return CUDA_ERROR_INVALID_VALUE;
  const void* buf = nullptr;
  uint64_t size = 0;
  ParamBuffer packed;
  if (CUresult e = pack_args(f, params, extra, &packed, &buf, &size); e != CUDA_SUCCESS) return e;
  if (CUresult e = check_smem(f, smem); e != CUDA_SUCCESS) return e;
  w->type = CU_GRAPH_NODE_TYPE_KERNEL;
  w->fn = fn;
  w->grid = grid;
  w->block = block;
  w->smem = smem;
  w->args.assign(static_cast<const std::byte*>(buf), static_cast<const std::byte*>(buf) + size);
  return CUDA_SUCCESS;
}

void kernel_arg_pointers(GraphNode* n) {
  n->arg_ptrs.clear();
  const Function* f = function_of(n->work.fn);
  if (!f || !f->layout) return;
  for (const KernelParam& p : f->layout->params)
    n->arg_ptrs.push_back(p.offset + p.size <= n->work.args.size() ? n->work.args.data() + p.offset : nullptr);
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuFuncGetAttribute(int* value, CUfunction_attribute attr, CUfunction fn) {
  return func_attribute(value, attr, fn, this_device());
}
CUresult CUDAAPI cuKernelGetAttribute(int* value, CUfunction_attribute attr, CUkernel k, CUdevice dev) {
  return func_attribute(value, attr, reinterpret_cast<CUfunction>(k), dev);
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction fn, CUfunction_attribute attr, int value) {
  return func_set_attribute(fn, attr, value, this_device());
}
CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attr, int value, CUkernel k, CUdevice dev) {
  return func_set_attribute(reinterpret_cast<CUfunction>(k), attr, value, dev);
}
CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction fn, CUfunc_cache) {
  return function_of(fn) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;  // a preference
}
CUresult CUDAAPI cuKernelSetCacheConfig(CUkernel k, CUfunc_cache, CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  return function_of(k) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

// The occupancy calculator's limits of the current device (transport/occupancy.h).
ordo::occupancy::Limits occupancy_limits(const DeviceCache* d) {
  auto attr = [d](CUdevice_attribute x) { return uint64_t(std::max(0, d->attrs[x])); };
  ordo::occupancy::Limits l;
  l.warp_size = std::max<uint64_t>(1, attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE));
  l.max_threads_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  l.max_threads_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  l.max_blocks_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  l.regs_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  l.regs_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  l.shared_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  l.reserved_shared_per_block = attr(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
  return l;
}

// The device's own count (Op::KernelOccupancy: the host driver's on a GPU),
// kept per kernel; *answered false when the backend cannot count (`null`),
// which leaves the answer to the occupancy calculator's rules here.
CUresult device_occupancy(Function* f, CUdevice dev, uint32_t threads, uint32_t smem, const ordo::LaunchShape& shape,
                          uint64_t mode, int* out, bool* answered) {
  const std::array<uint64_t, 4> key = {uint64_t(dev), threads, smem, uint64_t(shape.flags()) | mode << 16};
  {
    std::lock_guard lock(f->occupancy_mu);
    if (auto it = f->occupancy.find(key); it != f->occupancy.end()) {
      *out = it->second;
      *answered = true;
      return CUDA_SUCCESS;
    }
  }
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  uint32_t n = 0;
  const ordo::Status s = c->kernel_occupancy(f->id, uint32_t(dev), threads, smem, shape.flags(), mode, &n);
  *answered = s != ordo::Status::kNotSupported;
  if (!*answered) return CUDA_SUCCESS;
  if (!ordo::ok(s)) return to_cu(s);
  *out = int(std::min<uint32_t>(n, INT32_MAX));
  std::lock_guard lock(f->occupancy_mu);
  if (f->occupancy.size() >= 1024) f->occupancy.clear();  // a program that asks about ever new sizes
  f->occupancy[key] = *out;
  return CUDA_SUCCESS;
}

// Blocks per multiprocessor: none past the kernel's threads per block or the
// dynamic shared memory it allows; else the device's count.
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, CUfunction fn, int block_size,
                                                                      size_t smem, unsigned int) {
  if (!blocks || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const CUdevice dev = this_device();
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::array<int32_t, ordo::kKernelAttributeCount> a;
  if (CUresult e = kernel_attrs(f, dev, &a); e != CUDA_SUCCESS) return e;
  *blocks = 0;
  if (block_size > a[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] || smem > size_t(max_dynamic_smem(f, a)))
    return CUDA_SUCCESS;
  bool answered = false;
  if (CUresult e = device_occupancy(f, dev, uint32_t(block_size), uint32_t(smem), {}, 0, blocks, &answered);
      e != CUDA_SUCCESS || answered)
    return e;
  *blocks = int(ordo::occupancy::blocks_per_sm(uint64_t(block_size), uint64_t(std::max(0, a[CU_FUNC_ATTRIBUTE_NUM_REGS])),
                                               uint64_t(std::max(0, a[CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES])) + smem,
                                               occupancy_limits(d)));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction fn, int block_size,
                                                             size_t smem) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, fn, block_size, smem, 0);
}
// The most dynamic shared memory each of `blocks` blocks of `threads` threads
// can have on one multiprocessor: what is left of the multiprocessor's
// shared memory per block (in the calculator's 128-byte steps, less the
// reserved and the kernel's static bytes), at most what the kernel allows;
// CUDA_ERROR_INVALID_VALUE when that many blocks do not fit at all, as the
// occupancy calculator answers.
CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t* smem, CUfunction fn, int blocks, int threads) {
  if (!smem || blocks <= 0 || threads <= 0) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const CUdevice dev = this_device();
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::array<int32_t, ordo::kKernelAttributeCount> a;
  if (CUresult e = kernel_attrs(f, dev, &a); e != CUDA_SUCCESS) return e;
  *smem = 0;
  const ordo::occupancy::Limits l = occupancy_limits(d);
  const uint64_t fixed = uint64_t(std::max(0, a[CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES])) + l.reserved_shared_per_block;
  const uint64_t per_block = l.shared_per_sm / uint64_t(blocks) / ordo::occupancy::kSharedUnit * ordo::occupancy::kSharedUnit;
  if (threads > a[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] || per_block < fixed ||
      ordo::occupancy::blocks_per_sm(uint64_t(threads), uint64_t(std::max(0, a[CU_FUNC_ATTRIBUTE_NUM_REGS])), 0, l) <
          uint64_t(blocks))
    return CUDA_ERROR_INVALID_VALUE;
  *smem = size_t(std::min<uint64_t>(per_block - fixed, uint64_t(std::max(0, max_dynamic_smem(f, a)))));
  return CUDA_SUCCESS;
}

// Active clusters of the config's size: CUDA's 912 for a size past 8 blocks
// the kernel does not allow (or past 16), none past the dynamic shared
// memory it allows; else the device's count.
CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* clusters, CUfunction fn, const CUlaunchConfig* config) {
  if (!clusters || !config) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  ordo::LaunchShape shape;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      const auto& c = config->attrs[i].value.clusterDim;
      shape.cluster = {std::max(1u, c.x), std::max(1u, c.y), std::max(1u, c.z)};
    }
  const uint64_t threads = uint64_t{config->blockDimX} * config->blockDimY * config->blockDimZ;
  if (!threads || threads > 1024) return CUDA_ERROR_INVALID_VALUE;
  if (shape.cluster.x > ordo::kMaxClusterBlocks || shape.cluster.y > ordo::kMaxClusterBlocks || shape.cluster.z > ordo::kMaxClusterBlocks ||
      uint64_t{shape.cluster.x} * shape.cluster.y * shape.cluster.z > ordo::kMaxClusterBlocks ||
      (shape.blocks_per_cluster() > ordo::kMaxPortableClusterBlocks && !f->non_portable_cluster.load()))
    return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  const CUdevice dev = this_device();
  std::array<int32_t, ordo::kKernelAttributeCount> a;
  if (CUresult e = kernel_attrs(f, dev, &a); e != CUDA_SUCCESS) return e;
  *clusters = 0;
  if (int64_t(threads) > a[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] ||
      config->sharedMemBytes > unsigned(std::max(0, max_dynamic_smem(f, a))))
    return CUDA_SUCCESS;
  const uint64_t mode = ordo::kOccupancyClusters | (f->non_portable_cluster.load() ? ordo::kOccupancyNonPortable : 0);
  bool answered = false;
  if (CUresult e = device_occupancy(f, dev, uint32_t(threads), config->sharedMemBytes, shape, mode, clusters, &answered);
      e != CUDA_SUCCESS || answered)
    return e;
  int64_t fit = 0;
  if (CUresult e = resident_blocks(fn, threads, config->sharedMemBytes, &fit); e != CUDA_SUCCESS) return e;
  *clusters = int(fit / shape.blocks_per_cluster());
  return CUDA_SUCCESS;
}

// The largest cluster the launch could have: the portable 8 blocks, or 16
// where the kernel allows non-portable sizes, no more than the device holds.
CUresult CUDAAPI cuOccupancyMaxPotentialClusterSize(int* size, CUfunction fn, const CUlaunchConfig* config) {
  if (!size || !config) return CUDA_ERROR_INVALID_VALUE;
  const Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  if (!d->attrs[CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH]) return CUDA_ERROR_NOT_SUPPORTED;
  int64_t fit = 0;
  if (CUresult e = resident_blocks(fn, uint64_t{config->blockDimX} * config->blockDimY * config->blockDimZ,
                                   config->sharedMemBytes, &fit);
      e != CUDA_SUCCESS)
    return e;
  const int64_t most = f->non_portable_cluster.load() ? ordo::kMaxClusterBlocks : ordo::kMaxPortableClusterBlocks;
  *size = int(std::min(fit, most));
  return CUDA_SUCCESS;
}

// The block size that keeps the most threads resident, and the grid that fills
// the device with it: the search cudaOccupancyMaxPotentialBlockSize does,
// over multiples of the warp size from the largest allowed down.
CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block, CUfunction fn,
                                                           CUoccupancyB2DSize smem_of, size_t smem, int limit,
                                                           unsigned int flags) {
  if (!min_grid || !block) return CUDA_ERROR_INVALID_VALUE;
  if (!function_of(fn)) return CUDA_ERROR_INVALID_HANDLE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  const int warp = std::max(1, d->attrs[CU_DEVICE_ATTRIBUTE_WARP_SIZE]);
  int top = d->attrs[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK];
  if (limit > 0) top = std::min(top, limit);
  int best_threads = 0, best_block = 0, best_per_sm = 0;
  for (int b = (top + warp - 1) / warp * warp; b > 0; b -= warp) {
    const int size = std::min(b, top);
    int per_sm = 0;
    const size_t s = smem_of ? smem_of(size) : smem;
    if (CUresult e = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&per_sm, fn, size, s, flags);
        e != CUDA_SUCCESS)
      return e;
    if (per_sm * size > best_threads) best_threads = per_sm * size, best_block = size, best_per_sm = per_sm;
    if (best_threads == d->attrs[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR]) break;  // full
  }
  *block = best_block;
  *min_grid = best_per_sm * d->attrs[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT];
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block, CUfunction fn, CUoccupancyB2DSize smem_of,
                                                  size_t smem, int limit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block, fn, smem_of, smem, limit, 0);
}

}  // extern "C"

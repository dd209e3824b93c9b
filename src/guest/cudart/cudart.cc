// libcudart.so.13 for the guest: the CUDA runtime API of an unmodified
// program (built with `nvcc -cudart shared`) on top of ordo::Client.
//
// Declarations come from the real CUDA headers, so every signature here is
// checked against the ABI the program was compiled for. Functions not
// implemented here exist as weak stubs (stubs.cc, generated from the real
// library's export list) that return cudaErrorNotSupported.
//
// Registration: nvcc's generated constructor calls __cudaRegisterFatBinary with
// the fatbin wrapper and __cudaRegisterFunction per kernel (host stub -> device
// name). Nothing is sent then: a module is shipped to the worker (ModuleLoad) on
// its first launch, and each kernel's id is looked up once. A launch packs the
// argument pointers the program hands over into the kernel's parameter buffer,
// using the layout read from the fatbin (fatbin.h).
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "address_ranges.h"
#include "fatbin.h"
#include "stream_handle.h"
#include "ordo/client.h"

namespace ordo::cudart {
const char* error_name(int e);  // stubs.cc, generated from driver_types.h
}

namespace {

using ordo::Status;
using ordo::cudart::error_name;
using ordo::cudart::KernelLayout;
using ordo::cudart::KernelLayouts;

const char* error_description(int e);  // below

// ---------------------------------------------------------------- the client

std::once_flag g_attach_once;
// Set once inside call_once; read without it by cudaGetLastError, which must not
// attach. Deleted by the library destructor, after the program's atexit handlers.
std::atomic<ordo::Client*> g_client{nullptr};
cudaError_t g_attach_error = cudaErrorInitializationError;

ordo::Client* client() {
  std::call_once(g_attach_once, [] {
    Status s = Status::kSuccess;
    auto c = ordo::Client::attach_for_cuda("libcudart.so.13 is ordo's guest library", &s);
    if (!c) {
      g_attach_error = cudaError_t(s);
      return;
    }
    g_client.store(c.release(), std::memory_order_release);
  });
  return g_client.load(std::memory_order_acquire);
}

__attribute__((destructor)) void detach() {
  // Runs after the program's atexit handlers (__cudaUnregisterFatBinary), so
  // nothing uses the client any more; detaching frees this session's resources
  // in the worker at once instead of after a heartbeat timeout.
  delete g_client.exchange(nullptr, std::memory_order_acq_rel);
}

thread_local cudaError_t t_last = cudaSuccess;

// Every API result goes through here: errors become the thread's last error.
cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last = e;
  return e;
}
cudaError_t ret(Status s) { return ret(cudaError_t(s)); }

#define CLIENT(c)                                 \
  ordo::Client* c = client();                     \
  if (!c) return ret(g_attach_error)

// ---------------------------------------------------------------- handles

cudaStream_t to_handle(ordo::Stream s) { return reinterpret_cast<cudaStream_t>(ordo::cudart::stream_handle(s)); }

bool from_handle(ordo::Client* c, cudaStream_t h, bool per_thread, ordo::Stream* out) {
  return ordo::cudart::stream_of_handle(c, reinterpret_cast<uintptr_t>(h), per_thread, out);
}

#define STREAM(c, h, pt, s) \
  ordo::Stream s;           \
  if (!from_handle(c, h, pt, &s)) return ret(cudaErrorInvalidResourceHandle)

ordo::Event to_event(cudaEvent_t e) { return {reinterpret_cast<uintptr_t>(e)}; }

// ---------------------------------------------------------------- device memory the program holds

ordo::cudart::AddressRanges& allocations() {
  static auto* a = new ordo::cudart::AddressRanges;  // never destroyed: used from atexit handlers
  return *a;
}

// ---------------------------------------------------------------- modules and kernels

struct Module {
  void* handle = nullptr;  // this module; the program holds a void** to this field
  const std::byte* image = nullptr;
  uint64_t size = 0;
  KernelLayouts layouts;
  std::string parse_error;
  std::mutex mu;
  bool loaded = false;
  cudaError_t load_error = cudaSuccess;
  uint32_t id = 0;  // the worker's module id
};

struct Kernel {
  Module* module = nullptr;
  std::string name;
  const KernelLayout* layout = nullptr;
  std::once_flag resolve_once;
  cudaError_t resolve_error = cudaErrorInvalidDeviceFunction;
  uint32_t id = 0;
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<Module>> modules;
  std::map<const void*, std::unique_ptr<Kernel>> kernels;  // host stub -> kernel
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: __cudaUnregisterFatBinary runs from atexit
  return *r;
}

Module* module_of(void** handle) {
  return handle ? static_cast<Module*>(*handle) : nullptr;
}

cudaError_t ensure_loaded(ordo::Client* c, Module* m) {
  std::lock_guard lock(m->mu);
  if (m->loaded) return cudaSuccess;
  if (m->load_error != cudaSuccess) return m->load_error;
  const Status s = c->module_load(m->image, m->size, &m->id);
  if (!ok(s)) {
    m->load_error = cudaError_t(s);
    if (s == Status::kMemoryAllocation)
      std::fprintf(stderr,
                   "ordo: this program's device code (%zu-byte fatbin) does not fit the region's pinned heap; "
                   "start ordo-worker with a larger --size\n",
                   size_t(m->size));
    else
      std::fprintf(stderr, "ordo: the worker refused this program's device code (%zu-byte fatbin): %s\n",
                   size_t(m->size), std::string(ordo::status_name(s)).c_str());
    return m->load_error;
  }
  m->loaded = true;
  return cudaSuccess;
}

Kernel* kernel_of(const void* host_fun) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.kernels.find(host_fun);
  return it == r.kernels.end() ? nullptr : it->second.get();
}

cudaError_t resolve(ordo::Client* c, Kernel* k) {
  std::call_once(k->resolve_once, [&] {
    if (!k->layout) {
      std::fprintf(stderr, "ordo: no parameter layout for kernel %s in its fatbin%s%s; it cannot be launched\n",
                   k->name.c_str(), k->module->parse_error.empty() ? "" : ": ", k->module->parse_error.c_str());
      k->resolve_error = cudaErrorInvalidKernelImage;
      return;
    }
    if (cudaError_t e = ensure_loaded(c, k->module); e != cudaSuccess) {
      k->resolve_error = e;
      return;
    }
    const Status s = c->kernel_lookup(k->module->id, k->name, &k->id);
    k->resolve_error = cudaError_t(s);
    if (!ok(s))
      std::fprintf(stderr, "ordo: the worker does not know kernel %s: %s\n", k->name.c_str(),
                   std::string(ordo::status_name(s)).c_str());
  });
  return k->resolve_error;
}

struct CallConfig {
  dim3 grid, block;
  size_t shared_mem;
  cudaStream_t stream;
};
thread_local std::vector<CallConfig> t_configs;

cudaError_t launch(Kernel* k, dim3 grid, dim3 block, void** args, size_t shared_mem, cudaStream_t stream,
                   bool per_thread) {
  CLIENT(c);
  if (!k) return ret(cudaErrorInvalidDeviceFunction);
  if (cudaError_t e = resolve(c, k); e != cudaSuccess) return ret(e);
  STREAM(c, stream, per_thread, s);
  if (shared_mem > UINT32_MAX) return ret(cudaErrorInvalidValue);
  ordo::cudart::ParamBuffer buf;
  switch (ordo::cudart::pack_params(*k->layout, args, &buf)) {
    case ordo::cudart::PackError::kNone: break;
    case ordo::cudart::PackError::kMissingArgument: return ret(cudaErrorInvalidValue);
    case ordo::cudart::PackError::kBadLayout: return ret(cudaErrorInvalidKernelImage);
  }
  return ret(c->launch(k->id, {grid.x, grid.y, grid.z}, {block.x, block.y, block.z}, buf.data(), uint32_t(buf.size()),
                       s, uint32_t(shared_mem)));
}

// ---------------------------------------------------------------- copies

enum class Side { Host, Device };

bool side_of(const void* p, cudaMemcpyKind kind, bool dst, Side* out) {
  switch (kind) {
    case cudaMemcpyHostToHost: *out = Side::Host; return true;
    case cudaMemcpyHostToDevice: *out = dst ? Side::Device : Side::Host; return true;
    case cudaMemcpyDeviceToHost: *out = dst ? Side::Host : Side::Device; return true;
    case cudaMemcpyDeviceToDevice: *out = Side::Device; return true;
    case cudaMemcpyDefault: *out = allocations().find(reinterpret_cast<uintptr_t>(p)) ? Side::Device : Side::Host; return true;
  }
  return false;
}

cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream, bool async,
                 bool per_thread) {
  CLIENT(c);
  if (count == 0) return ret(cudaSuccess);
  if (!dst || !src) return ret(cudaErrorInvalidValue);
  Side ds, ss;
  if (!side_of(dst, kind, true, &ds) || !side_of(src, kind, false, &ss)) return ret(cudaErrorInvalidMemcpyDirection);
  ordo::Stream s = ordo::kLegacyStream;
  if (async && !from_handle(c, stream, per_thread, &s)) return ret(cudaErrorInvalidResourceHandle);
  if (!async && per_thread) s = c->per_thread_stream();
  const uint64_t d = reinterpret_cast<uintptr_t>(dst), r = reinterpret_cast<uintptr_t>(src);
  Status st;
  if (ds == Side::Device && ss == Side::Host) {
    st = c->memcpy_h2d_async(d, src, count, s);
  } else if (ds == Side::Host && ss == Side::Device) {
    st = c->memcpy_d2h_async(dst, r, count, s);
  } else if (ds == Side::Device) {
    st = c->memcpy_d2d_async(d, r, count, s);
  } else {
    // Host to host: in stream order means after what the stream's next work would follow.
    st = c->stream_order_wait(s);
    if (ok(st)) std::memmove(dst, src, count);
    return ret(st);
  }
  if (ok(st) && !async) st = c->stream_synchronize(s);
  return ret(st);
}

cudaError_t memset_impl(void* dst, int value, size_t count, cudaStream_t stream, bool per_thread) {
  CLIENT(c);
  STREAM(c, stream, per_thread, s);
  if (count == 0) return ret(cudaSuccess);
  if (!dst) return ret(cudaErrorInvalidValue);
  return ret(c->memset_async(reinterpret_cast<uintptr_t>(dst), uint8_t(value), count, s));
}

// ---------------------------------------------------------------- device properties

cudaError_t device_info(ordo::Client* c, ordo::DeviceInfo* out) {
  static std::mutex mu;
  static ordo::DeviceInfo cached;
  static bool have = false;
  std::lock_guard lock(mu);
  if (!have) {
    if (Status s = c->device_info(&cached); !ok(s)) return cudaError_t(s);
    have = true;
  }
  *out = cached;
  return cudaSuccess;
}

}  // namespace

// ================================================================ registration (nvcc-generated code calls these)

extern "C" {

void** CUDARTAPI __cudaRegisterFatBinary(void* fat_cubin) {
  struct Wrapper {
    int magic, version;
    const void* data;
    void* filename_or_fatbins;
  };
  auto m = std::make_unique<Module>();
  const auto* w = static_cast<const Wrapper*>(fat_cubin);
  if (!w || w->magic != int(ordo::cudart::kFatbinWrapperMagic)) {
    m->parse_error = "not an nvcc fatbin wrapper";
  } else {
    m->image = static_cast<const std::byte*>(w->data);
    m->size = ordo::cudart::fatbin_size(w->data);
    if (m->size == 0)
      m->parse_error = "fatbin header not recognised";
    else if (!ordo::cudart::parse_fatbin({m->image, m->size}, &m->layouts, &m->parse_error) && m->parse_error.empty())
      m->parse_error = "fatbin unreadable";
  }
  m->handle = m.get();
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.modules.push_back(std::move(m));
  return &r.modules.back()->handle;
}

void CUDARTAPI __cudaRegisterFatBinaryEnd(void**) {}

void CUDARTAPI __cudaRegisterFunction(void** handle, const char* host_fun, char*, const char* device_name, int,
                                      uint3*, uint3*, dim3*, dim3*, int*) {
  Module* m = module_of(handle);
  if (!m || !host_fun || !device_name) return;
  auto k = std::make_unique<Kernel>();
  k->module = m;
  k->name = device_name;
  if (auto it = m->layouts.find(k->name); it != m->layouts.end()) k->layout = &it->second;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.kernels[host_fun] = std::move(k);
}

void CUDARTAPI __cudaUnregisterFatBinary(void**) {
  // Called from atexit handlers, after this thread's thread_local state (the
  // client's per-thread slot) is gone, so no call can be made. The worker
  // unloads a session's modules when the session ends; the registry keeps the
  // module for the process's lifetime.
}

void CUDARTAPI __cudaRegisterVar(void**, char*, char*, const char* name, int, size_t, int, int) {
  // Device globals (__device__/__constant__ variables) are not remoted: their
  // use fails at cudaMemcpyToSymbol & co. Kernels that only use them on the
  // device run unaffected.
  (void)name;
}

char CUDARTAPI __cudaInitModule(void**) { return 1; }

unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_mem, struct CUstream_st* stream) {
  t_configs.push_back({grid, block, shared_mem, stream});
  return 0;
}

cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_mem, void* stream) {
  if (t_configs.empty()) return cudaErrorMissingConfiguration;
  const CallConfig cfg = t_configs.back();
  t_configs.pop_back();
  *grid = cfg.grid;
  *block = cfg.block;
  *shared_mem = cfg.shared_mem;
  *static_cast<cudaStream_t*>(stream) = cfg.stream;
  return cudaSuccess;
}

cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t* out, const void* host_fun) {
  Kernel* k = kernel_of(host_fun);
  if (!out) return cudaErrorInvalidValue;
  *out = reinterpret_cast<cudaKernel_t>(k);
  return k ? cudaSuccess : cudaErrorInvalidDeviceFunction;
}

cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared_mem,
                                         cudaStream_t stream) {
  return launch(reinterpret_cast<Kernel*>(kernel), grid, block, args, shared_mem, stream, false);
}

cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                              size_t shared_mem, cudaStream_t stream) {
  return launch(reinterpret_cast<Kernel*>(kernel), grid, block, args, shared_mem, stream, true);
}

// ================================================================ the runtime API

cudaError_t CUDARTAPI cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared_mem,
                                       cudaStream_t stream) {
  return launch(kernel_of(func), grid, block, args, shared_mem, stream, false);
}

cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args, size_t shared_mem,
                                            cudaStream_t stream) {
  return launch(kernel_of(func), grid, block, args, shared_mem, stream, true);
}

// ---- errors and versions

cudaError_t CUDARTAPI cudaGetLastError(void) {
  ordo::Client* c = g_client.load(std::memory_order_acquire);
  const Status async = c ? c->get_last_error() : Status::kSuccess;
  const cudaError_t e = t_last != cudaSuccess ? t_last : cudaError_t(async);
  t_last = cudaSuccess;
  return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
  ordo::Client* c = g_client.load(std::memory_order_acquire);
  const Status async = c ? c->peek_last_error() : Status::kSuccess;
  return t_last != cudaSuccess ? t_last : cudaError_t(async);
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  const char* n = error_name(int(error));
  return n ? n : "cudaErrorUnknown";
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  if (const char* d = error_description(int(error))) return d;
  const char* n = error_name(int(error));
  return n ? n : "unrecognized error code";
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* version) {
  if (!version) return ret(cudaErrorInvalidValue);
  *version = CUDART_VERSION;  // the host's driver is at least this, or the worker would not serve
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* version) {
  if (!version) return ret(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

// ---- device

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (!count) return ret(cudaErrorInvalidValue);
  *count = 0;
  CLIENT(c);
  (void)c;
  *count = 1;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  CLIENT(c);
  (void)c;
  return ret(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  if (!device) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  (void)c;
  *device = 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaInitDevice(int device, unsigned int, unsigned int) { return cudaSetDevice(device); }
cudaError_t CUDARTAPI cudaSetDeviceFlags(unsigned int) {
  CLIENT(c);
  (void)c;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDeviceFlags(unsigned int* flags) {
  if (!flags) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  (void)c;
  *flags = cudaDeviceScheduleAuto;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  if (device != 0) return ret(cudaErrorInvalidDevice);
  ordo::DeviceInfo d;
  if (cudaError_t e = device_info(c, &d); e != cudaSuccess) return ret(e);
  std::memset(prop, 0, sizeof *prop);
  std::memcpy(prop->name, d.name, std::min(sizeof prop->name, sizeof d.name));
  prop->name[sizeof prop->name - 1] = 0;
  std::memcpy(prop->uuid.bytes, d.uuid, sizeof d.uuid);
  prop->totalGlobalMem = d.total_global_mem;
  prop->sharedMemPerBlock = d.shared_mem_per_block;
  prop->regsPerBlock = d.regs_per_block;
  prop->warpSize = d.warp_size;
  prop->memPitch = d.mem_pitch;
  prop->maxThreadsPerBlock = d.max_threads_per_block;
  for (int i = 0; i < 3; ++i) {
    prop->maxThreadsDim[i] = d.max_threads_dim[i];
    prop->maxGridSize[i] = d.max_grid_size[i];
  }
  prop->totalConstMem = d.total_const_mem;
  prop->major = d.major;
  prop->minor = d.minor;
  prop->textureAlignment = d.texture_alignment;
  prop->multiProcessorCount = d.multi_processor_count;
  prop->integrated = d.integrated;
  prop->canMapHostMemory = d.can_map_host_memory;
  prop->concurrentKernels = d.concurrent_kernels;
  prop->ECCEnabled = d.ecc_enabled;
  prop->pciBusID = d.pci_bus_id;
  prop->pciDeviceID = d.pci_device_id;
  prop->pciDomainID = d.pci_domain_id;
  prop->tccDriver = d.tcc_driver;
  prop->asyncEngineCount = d.async_engine_count;
  prop->unifiedAddressing = d.unified_addressing;
  prop->memoryBusWidth = d.memory_bus_width;
  prop->l2CacheSize = d.l2_cache_size;
  prop->persistingL2CacheMaxSize = d.persisting_l2_cache_max_size;
  prop->maxThreadsPerMultiProcessor = d.max_threads_per_multiprocessor;
  prop->streamPrioritiesSupported = d.stream_priorities_supported;
  prop->globalL1CacheSupported = d.global_l1_cache_supported;
  prop->localL1CacheSupported = d.local_l1_cache_supported;
  prop->sharedMemPerMultiprocessor = d.shared_mem_per_multiprocessor;
  prop->regsPerMultiprocessor = d.regs_per_multiprocessor;
  prop->managedMemory = d.managed_memory;
  prop->hostNativeAtomicSupported = d.host_native_atomic_supported;
  prop->pageableMemoryAccess = d.pageable_memory_access;
  prop->concurrentManagedAccess = d.concurrent_managed_access;
  prop->cooperativeLaunch = d.cooperative_launch;
  prop->sharedMemPerBlockOptin = d.shared_mem_per_block_optin;
  prop->maxBlocksPerMultiProcessor = d.max_blocks_per_multiprocessor;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  if (device != 0) return ret(cudaErrorInvalidDevice);
  ordo::DeviceInfo d;
  if (cudaError_t e = device_info(c, &d); e != cudaSuccess) return ret(e);
  auto clamp = [](uint64_t v) { return int(std::min<uint64_t>(v, INT32_MAX)); };
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = d.max_threads_per_block; break;
    case cudaDevAttrMaxBlockDimX: *value = d.max_threads_dim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = d.max_threads_dim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = d.max_threads_dim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = d.max_grid_size[0]; break;
    case cudaDevAttrMaxGridDimY: *value = d.max_grid_size[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = d.max_grid_size[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = clamp(d.shared_mem_per_block); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = clamp(d.shared_mem_per_block_optin); break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = clamp(d.shared_mem_per_multiprocessor); break;
    case cudaDevAttrTotalConstantMemory: *value = clamp(d.total_const_mem); break;
    case cudaDevAttrWarpSize: *value = d.warp_size; break;
    case cudaDevAttrMaxPitch: *value = clamp(d.mem_pitch); break;
    case cudaDevAttrMaxRegistersPerBlock: *value = d.regs_per_block; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = d.regs_per_multiprocessor; break;
    case cudaDevAttrClockRate: *value = d.clock_rate_khz; break;
    case cudaDevAttrMemoryClockRate: *value = d.memory_clock_rate_khz; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = d.memory_bus_width; break;
    case cudaDevAttrTextureAlignment: *value = clamp(d.texture_alignment); break;
    case cudaDevAttrMultiProcessorCount: *value = d.multi_processor_count; break;
    case cudaDevAttrKernelExecTimeout: *value = d.kernel_exec_timeout_enabled; break;
    case cudaDevAttrIntegrated: *value = d.integrated; break;
    case cudaDevAttrCanMapHostMemory: *value = d.can_map_host_memory; break;
    case cudaDevAttrComputeMode: *value = d.compute_mode; break;
    case cudaDevAttrConcurrentKernels: *value = d.concurrent_kernels; break;
    case cudaDevAttrEccEnabled: *value = d.ecc_enabled; break;
    case cudaDevAttrPciBusId: *value = d.pci_bus_id; break;
    case cudaDevAttrPciDeviceId: *value = d.pci_device_id; break;
    case cudaDevAttrPciDomainId: *value = d.pci_domain_id; break;
    case cudaDevAttrTccDriver: *value = d.tcc_driver; break;
    case cudaDevAttrL2CacheSize: *value = d.l2_cache_size; break;
    case cudaDevAttrMaxPersistingL2CacheSize: *value = d.persisting_l2_cache_max_size; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = d.max_threads_per_multiprocessor; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = d.max_blocks_per_multiprocessor; break;
    case cudaDevAttrAsyncEngineCount: *value = d.async_engine_count; break;
    case cudaDevAttrUnifiedAddressing: *value = d.unified_addressing; break;
    case cudaDevAttrComputeCapabilityMajor: *value = d.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = d.minor; break;
    case cudaDevAttrStreamPrioritiesSupported: *value = d.stream_priorities_supported; break;
    case cudaDevAttrGlobalL1CacheSupported: *value = d.global_l1_cache_supported; break;
    case cudaDevAttrLocalL1CacheSupported: *value = d.local_l1_cache_supported; break;
    case cudaDevAttrManagedMemory: *value = d.managed_memory; break;
    case cudaDevAttrConcurrentManagedAccess: *value = d.concurrent_managed_access; break;
    case cudaDevAttrPageableMemoryAccess: *value = d.pageable_memory_access; break;
    case cudaDevAttrHostNativeAtomicSupported: *value = d.host_native_atomic_supported; break;
    case cudaDevAttrCooperativeLaunch: *value = d.cooperative_launch; break;
    default:
      return ret(cudaErrorInvalidValue);  // as the runtime answers an attribute it does not know
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  CLIENT(c);
  (void)c;
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  ordo::DeviceInfo d;
  if (cudaError_t e = device_info(c, &d); e != cudaSuccess) return ret(e);
  const uint64_t used = allocations().total();
  *total = d.total_global_mem;
  *free = used < d.total_global_mem ? d.total_global_mem - used : 0;  // this program's view only
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  CLIENT(c);
  return ret(c->device_synchronize());
}

cudaError_t CUDARTAPI cudaDeviceReset(void) {
  // Waits for the device; allocations, streams and events stay (they are freed
  // when the program exits and its session ends).
  CLIENT(c);
  return ret(c->device_synchronize());
}

// ---- memory

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  uint64_t addr = 0;
  const Status s = c->malloc(&addr, size);
  if (!ok(s)) return ret(s == Status::kInvalidValue ? cudaErrorMemoryAllocation : cudaError_t(s));
  allocations().add(addr, size);
  *ptr = reinterpret_cast<void*>(uintptr_t(addr));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void* ptr) {
  CLIENT(c);
  if (!ptr) return ret(c->device_synchronize());  // cudaFree(0): commonly used to initialize
  const Status s = c->free(reinterpret_cast<uintptr_t>(ptr));
  if (ok(s)) allocations().erase(reinterpret_cast<uintptr_t>(ptr));
  return ret(s);
}

cudaError_t CUDARTAPI cudaMallocHost(void** ptr, size_t size) {
  if (!ptr) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  return ret(c->malloc_host(ptr, size));
}

cudaError_t CUDARTAPI cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  constexpr unsigned kKnown = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if (flags & ~kKnown) return ret(cudaErrorInvalidValue);
  return cudaMallocHost(ptr, size);
}

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  CLIENT(c);
  return ret(c->free_host(ptr));
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy(dst, src, count, kind, nullptr, false, false);
}
cudaError_t CUDARTAPI cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy(dst, src, count, kind, nullptr, false, true);
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  return copy(dst, src, count, kind, stream, true, false);
}
cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                           cudaStream_t stream) {
  return copy(dst, src, count, kind, stream, true, true);
}

cudaError_t CUDARTAPI cudaMemset(void* dst, int value, size_t count) {
  return memset_impl(dst, value, count, nullptr, false);
}
cudaError_t CUDARTAPI cudaMemset_ptds(void* dst, int value, size_t count) {
  return memset_impl(dst, value, count, nullptr, true);
}
cudaError_t CUDARTAPI cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  return memset_impl(dst, value, count, stream, false);
}
cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void* dst, int value, size_t count, cudaStream_t stream) {
  return memset_impl(dst, value, count, stream, true);
}

// ---- streams

cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* out, unsigned int flags, int priority) {
  if (!out) return ret(cudaErrorInvalidValue);
  if (flags & ~unsigned(cudaStreamNonBlocking)) return ret(cudaErrorInvalidValue);
  CLIENT(c);
  ordo::Stream s;
  const Status st = c->stream_create(&s, (flags & cudaStreamNonBlocking) ? ordo::kStreamNonBlocking : 0,
                                     std::max(-5, std::min(0, priority)));
  if (ok(st)) *out = to_handle(s);
  return ret(st);
}
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
  return cudaStreamCreateWithPriority(out, flags, 0);
}
cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* out) { return cudaStreamCreateWithPriority(out, 0, 0); }

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  CLIENT(c);
  if (!stream || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return ret(cudaErrorInvalidResourceHandle);
  STREAM(c, stream, false, s);
  return ret(c->stream_destroy(s));
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  CLIENT(c);
  STREAM(c, stream, false, s);
  return ret(c->stream_synchronize(s));
}
cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  CLIENT(c);
  STREAM(c, stream, true, s);
  return ret(c->stream_synchronize(s));
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  CLIENT(c);
  STREAM(c, stream, false, s);
  return ret(c->stream_query(s));
}
cudaError_t CUDARTAPI cudaStreamQuery_ptsz(cudaStream_t stream) {
  CLIENT(c);
  STREAM(c, stream, true, s);
  return ret(c->stream_query(s));
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  CLIENT(c);
  if (flags & ~unsigned(cudaEventWaitExternal)) return ret(cudaErrorInvalidValue);
  if (!event) return ret(cudaErrorInvalidResourceHandle);
  STREAM(c, stream, false, s);
  return ret(c->stream_wait_event(s, to_event(event)));
}
cudaError_t CUDARTAPI cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  CLIENT(c);
  if (flags & ~unsigned(cudaEventWaitExternal)) return ret(cudaErrorInvalidValue);
  if (!event) return ret(cudaErrorInvalidResourceHandle);
  STREAM(c, stream, true, s);
  return ret(c->stream_wait_event(s, to_event(event)));
}

// Host functions return at once. The function runs on the client's host-function
// thread once the stream got there (legacy-stream synchronization included:
// the HostFunc entry is stream work like a launch), and the stream's later work
// waits for it (ARCHITECTURE.md, "Host functions").
cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  CLIENT(c);
  if (!fn) return ret(cudaErrorInvalidValue);
  STREAM(c, stream, false, s);
  return ret(c->host_func(s, [fn, data] { fn(data); }));
}
cudaError_t CUDARTAPI cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  CLIENT(c);
  if (!fn) return ret(cudaErrorInvalidValue);
  STREAM(c, stream, true, s);
  return ret(c->host_func(s, [fn, data] { fn(data); }));
}

cudaError_t CUDARTAPI cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t cb, void* data,
                                            unsigned int flags) {
  CLIENT(c);
  if (!cb || flags != 0) return ret(cudaErrorInvalidValue);
  STREAM(c, stream, false, s);
  // As cudaLaunchHostFunc. The status argument: errors of earlier work reach
  // the program through its next call, as they do without ordo.
  return ret(c->host_func(s, [cb, stream, data] { cb(stream, cudaSuccess, data); }));
}
cudaError_t CUDARTAPI cudaStreamAddCallback_ptsz(cudaStream_t stream, cudaStreamCallback_t cb, void* data,
                                                 unsigned int flags) {
  if (!stream) stream = cudaStreamPerThread;
  return cudaStreamAddCallback(stream, cb, data, flags);
}

// ---- events

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
  if (!out) return ret(cudaErrorInvalidValue);
  constexpr unsigned kKnown = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (flags & ~kKnown) return ret(cudaErrorInvalidValue);
  if (flags & cudaEventInterprocess) return ret(cudaErrorNotSupported);
  CLIENT(c);
  ordo::Event e;
  const Status s = c->event_create(&e, flags);
  if (ok(s)) *out = reinterpret_cast<cudaEvent_t>(uintptr_t(e.handle));
  return ret(s);
}
cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* out) { return cudaEventCreateWithFlags(out, 0); }

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CLIENT(c);
  if (!event) return ret(cudaErrorInvalidResourceHandle);
  STREAM(c, stream, false, s);
  return ret(c->event_record(to_event(event), s));
}
cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  CLIENT(c);
  if (!event) return ret(cudaErrorInvalidResourceHandle);
  STREAM(c, stream, true, s);
  return ret(c->event_record(to_event(event), s));
}
cudaError_t CUDARTAPI cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  if (flags & ~unsigned(cudaEventRecordExternal)) return ret(cudaErrorInvalidValue);
  return cudaEventRecord(event, stream);
}
cudaError_t CUDARTAPI cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  if (flags & ~unsigned(cudaEventRecordExternal)) return ret(cudaErrorInvalidValue);
  return cudaEventRecord_ptsz(event, stream);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  CLIENT(c);
  if (!event) return ret(cudaErrorInvalidResourceHandle);
  return ret(c->event_synchronize(to_event(event)));
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  CLIENT(c);
  if (!event) return ret(cudaErrorInvalidResourceHandle);
  return ret(c->event_query(to_event(event)));
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  CLIENT(c);
  if (!ms) return ret(cudaErrorInvalidValue);
  if (!start || !end) return ret(cudaErrorInvalidResourceHandle);
  return ret(c->event_elapsed(ms, to_event(start), to_event(end)));
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  CLIENT(c);
  if (!event) return ret(cudaErrorInvalidResourceHandle);
  return ret(c->event_destroy(to_event(event)));
}

}  // extern "C"

namespace {

// What cudaGetErrorString says for the errors this library produces; others get their name.
const char* error_description(int e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error (ordo: ORDO_REGION unset or not an ordo region; see the message on stderr)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorMissingConfiguration: return "__global__ function call is not configured";
    case cudaErrorDevicesUnavailable:
      return "CUDA-capable device(s) is/are busy or unavailable (ordo: no ordo-worker serves ORDO_REGION, or it "
             "stopped)";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidKernelImage: return "device kernel image is invalid";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported (by the ordo guest library)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidHostPointer: return "invalid host pointer";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidPtx: return "a PTX JIT compilation failed";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    case cudaErrorInvalidSource: return "device kernel image is invalid";
    case cudaErrorFileNotFound: return "file not found";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorHardwareStackError: return "hardware stack error";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorInvalidAddressSpace: return "operation not supported on global/shared address space";
    case cudaErrorInvalidPc: return "invalid program counter";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case cudaErrorPeerAccessNotEnabled: return "peer access has not been enabled";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorTimeout: return "wait operation timed out";
    case cudaErrorUnknown: return "unknown error";
    default: return nullptr;
  }
}

}  // namespace

// ordo's libcuda.so.1: the CUDA driver API of an unmodified program (static or
// shared cudart, cuBLAS and the other NVIDIA libraries) on top of ordo::Client.
//
// Declarations come from the real cuda.h under __CUDA_API_VERSION_INTERNAL, so
// every function here is defined under its exported name (cuMemAlloc_v2,
// cuMemcpyHtoD_v2_ptds...) with the signature the compiler checks. What is not
// here is a weak stub (generated, driver_stubs.cc) that names itself once and
// returns CUDA_ERROR_NOT_SUPPORTED. cuGetProcAddress resolves through the
// generated table (proc_table.h). docs/CUDA.md lists what is supported.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "address_ranges.h"
#include "dark_api.h"
#include "driver.h"
#include "fatbin.h"
#include "ordo/client.h"
#include "proc_table.h"
#include "stream_handle.h"

namespace ordo::driver {
namespace {

using ordo::Status;

// ---------------------------------------------------------------- status

CUresult to_cu(Status s) {
  switch (s) {
    case Status::kSuccess: return CUDA_SUCCESS;
    // A launch with an empty grid or too large a block: NVIDIA's driver 580
    // answers CUDA_ERROR_INVALID_VALUE, and cudart 13 hands that on as
    // cudaErrorInvalidValue (measured natively on an H200: <<<0, 1>>> and
    // <<<1, 2048>>> both give 1), not the runtime's cudaErrorInvalidConfiguration.
    case Status::kInvalidConfiguration:
    case Status::kInvalidValue:
    case Status::kInvalidDevicePointer: return CUDA_ERROR_INVALID_VALUE;
    case Status::kMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case Status::kInitializationError: return CUDA_ERROR_NOT_INITIALIZED;
    case Status::kInvalidDevice: return CUDA_ERROR_INVALID_DEVICE;
    case Status::kInvalidKernelImage: return CUDA_ERROR_INVALID_IMAGE;
    case Status::kDevicesUnavailable: return CUDA_ERROR_DEVICE_UNAVAILABLE;
    case Status::kInvalidDeviceFunction: return CUDA_ERROR_NOT_FOUND;
    case Status::kInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case Status::kIllegalState: return CUDA_ERROR_ILLEGAL_STATE;
    case Status::kNotReady: return CUDA_ERROR_NOT_READY;
    case Status::kIllegalAddress: return CUDA_ERROR_ILLEGAL_ADDRESS;
    case Status::kLaunchOutOfResources: return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    case Status::kMisalignedAddress: return CUDA_ERROR_MISALIGNED_ADDRESS;
    case Status::kLaunchFailure: return CUDA_ERROR_LAUNCH_FAILED;
    case Status::kLaunchTimeout: return CUDA_ERROR_LAUNCH_TIMEOUT;
    case Status::kAssert: return CUDA_ERROR_ASSERT;
    case Status::kHardwareStackError: return CUDA_ERROR_HARDWARE_STACK_ERROR;
    case Status::kIllegalInstruction: return CUDA_ERROR_ILLEGAL_INSTRUCTION;
    case Status::kInvalidAddressSpace: return CUDA_ERROR_INVALID_ADDRESS_SPACE;
    case Status::kInvalidPc: return CUDA_ERROR_INVALID_PC;
    case Status::kNoKernelImage: return CUDA_ERROR_NO_BINARY_FOR_GPU;
    case Status::kNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    case Status::kPeerAccessUnsupported: return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    case Status::kPeerAccessAlreadyEnabled: return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    case Status::kPeerAccessNotEnabled: return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  }
  // Other codes come from a real driver through the cuda backend as cudaError_t
  // numbers, which from 100 up are the driver's CUresult numbers too.
  return int32_t(s) >= 100 ? CUresult(int32_t(s)) : CUDA_ERROR_UNKNOWN;
}

// ---------------------------------------------------------------- the client

std::atomic<bool> g_initialized{false};
// Set by an exit handler registered at cuInit, so it runs before cudart's own
// (registered earlier), after the main thread's thread_local state is gone:
// from then on calls answer CUDA_ERROR_DEINITIALIZED, as the real driver's do
// during teardown, and touch nothing.
std::atomic<bool> g_exiting{false};
std::once_flag g_attach_once;
std::atomic<ordo::Client*> g_client{nullptr};
CUresult g_attach_error = CUDA_ERROR_NOT_INITIALIZED;
// The session's devices, set by cuInit before g_initialized; 0 until then.
std::atomic<int> g_device_count{0};

CUresult attach() {
  std::call_once(g_attach_once, [] {
    Status s = Status::kSuccess;
    auto c = ordo::Client::attach_for_cuda("libcuda.so.1 is ordo's guest driver", &s);
    if (!c) {
      g_attach_error = to_cu(s);
      return;
    }
    g_client.store(c.release(), std::memory_order_release);
  });
  return g_client.load(std::memory_order_acquire) ? CUDA_SUCCESS : g_attach_error;
}

__attribute__((destructor)) void detach() {
  // After the program's atexit handlers: nothing uses the client any more, and
  // detaching frees this session in the worker at once.
  delete g_client.exchange(nullptr, std::memory_order_acq_rel);
}

CUresult follow_context(ordo::Client* c);

// The prologue of every call that reaches the client: the error to return
// before cuInit, during exit or without a worker, else CUDA_SUCCESS with the
// client in *out. It first moves the client's per-thread device to the current
// context's (follow_context): what the call creates or runs on stream 0 then
// lands on that device.
CUresult enter(ordo::Client** out) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (g_exiting.load(std::memory_order_relaxed)) return CUDA_ERROR_DEINITIALIZED;
  ordo::Client* c = g_client.load(std::memory_order_acquire);
  if (!c) return g_attach_error;
  *out = c;
  return follow_context(c);
}

// The same checks, for a call that needs no client call of its own.
CUresult enter() {
  ordo::Client* c = nullptr;
  return enter(&c);
}

bool valid_device(CUdevice dev) { return dev >= 0 && dev < g_device_count.load(std::memory_order_relaxed); }

// ---------------------------------------------------------------- contexts

// One primary context per device plus any cuCtxCreate'd ones; all share the
// client's session. Context-local storage is read on every runtime call: a
// fixed array of (key, value) pairs read without a lock.
struct Context {
  static constexpr int kSlots = 32;
  struct Slot {
    std::atomic<void*> key{nullptr};
    std::atomic<void*> value{nullptr};
    void (*dtor)(CUcontext, void*, void*) = nullptr;
  };
  Slot cls[kSlots];
  std::mutex cls_mu;  // writers
  CUdevice device = 0;
  unsigned flags = 0;
  bool primary = false;
  std::atomic<int> primary_refs{0};
  std::atomic<bool> primary_active{false};
  unsigned long long id = 0;
  size_t limits[CU_LIMIT_MAX] = {};  // CIG limits (7-9) stay 0: ordo's contexts are never CIG contexts
  CUfunc_cache cache_config = CU_FUNC_CACHE_PREFER_NONE;
};

Context g_primaries[ordo::kMaxDevices];  // device d's is g_primaries[d]
std::atomic<unsigned long long> g_next_ctx_id{1};
std::mutex g_ctx_mu;
std::vector<std::unique_ptr<Context>> g_contexts;  // created with cuCtxCreate; never freed (handles stay checkable)

thread_local std::vector<Context*> t_ctx_stack;
// This thread's device as the client has it (Client::set_device); the client
// starts every thread on device 0.
thread_local uint32_t t_client_device = 0;

CUcontext handle(Context* c) { return reinterpret_cast<CUcontext>(c); }

// A primary context is told by its address, without the lock: cls_get asks on every runtime call.
Context* primary_of_handle(CUcontext h) {
  const auto p = reinterpret_cast<uintptr_t>(h), first = reinterpret_cast<uintptr_t>(&g_primaries[0]);
  if (p < first || (p - first) % sizeof(Context) != 0) return nullptr;
  const uintptr_t i = (p - first) / sizeof(Context);
  return i < uintptr_t(g_device_count.load(std::memory_order_relaxed)) ? &g_primaries[i] : nullptr;
}

Context* context_of(CUcontext h) {
  if (Context* p = primary_of_handle(h)) return p;
  auto* c = reinterpret_cast<Context*>(h);
  std::lock_guard lock(g_ctx_mu);
  for (auto& p : g_contexts)
    if (p.get() == c) return c;
  return nullptr;
}

Context* current() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

// The device of the calling thread: its current context's, or with none, the
// one the client last had for it.
CUdevice this_device() {
  const Context* x = current();
  return x ? x->device : CUdevice(t_client_device);
}

// A compare per call when the context did not change. Hooks in the context
// calls alone would miss contexts made current before the thread reached the
// client, and cannot report a set_device that fails.
CUresult follow_context(ordo::Client* c) {
  const Context* x = current();
  if (!x || uint32_t(x->device) == t_client_device) return CUDA_SUCCESS;
  if (const Status s = c->set_device(uint32_t(x->device)); !ok(s)) return to_cu(s);
  t_client_device = uint32_t(x->device);
  return CUDA_SUCCESS;
}

// Runs `f` (client calls) with the client on `dev` for this thread, then back:
// for device-wide work of a device that is not the current one.
template <typename F>
Status on_device(ordo::Client* c, CUdevice dev, F f) {
  if (uint32_t(dev) == t_client_device) return f();
  if (const Status s = c->set_device(uint32_t(dev)); !ok(s)) return s;
  const Status r = f();
  const Status back = c->set_device(t_client_device);
  return ok(r) ? back : r;
}

void init_primaries() {  // once, by cuInit
  for (int d = 0; d < g_device_count.load(); ++d) {
    Context& p = g_primaries[d];
    p.primary = true;
    p.device = d;
    p.id = g_next_ctx_id.fetch_add(1);
    p.limits[CU_LIMIT_STACK_SIZE] = 1024;
    p.limits[CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20;
    p.limits[CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20;
    p.limits[CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2;
    p.limits[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
    p.limits[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 32;
  }
}

// ---------------------------------------------------------------- devices

constexpr int kAttrCount = 256;  // CU_DEVICE_ATTRIBUTE_MAX is below this in CUDA 13

struct DeviceCache {
  std::once_flag once;
  CUresult error = CUDA_SUCCESS;
  ordo::DeviceInfo info{};
  int32_t attrs[kAttrCount] = {};
};
DeviceCache g_devices[ordo::kMaxDevices];

// Fetched once per device and process: every attribute is a guest-local read afterwards.
CUresult device_cache(CUdevice dev, const DeviceCache** out) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  DeviceCache& d = g_devices[dev];
  std::call_once(d.once, [c, dev, &d] {
    Status s = c->device_info(uint32_t(dev), &d.info);
    for (int first = 0; ok(s) && first < kAttrCount; first += int(ordo::kDeviceAttributesPerCall))
      s = c->device_attributes(uint32_t(dev), uint32_t(first), d.attrs + first);
    d.error = to_cu(s);
  });
  *out = &d;
  return d.error;
}

// ---------------------------------------------------------------- streams

struct StreamMeta {
  std::atomic<unsigned> flags{0};
  std::atomic<int> priority{0};
  std::atomic<Context*> ctx{nullptr};  // current when it was created; none: its device's primary
};
StreamMeta* stream_meta() {
  static auto* m = new StreamMeta[ordo::kMaxStreams];  // never freed: used from atexit handlers
  return m;
}

CUstream to_handle(ordo::Stream s) { return reinterpret_cast<CUstream>(stream_handle(s)); }

bool from_handle(ordo::Client* c, CUstream h, bool per_thread, ordo::Stream* out) {
  return stream_of_handle(c, reinterpret_cast<uintptr_t>(h), per_thread, out);
}

ordo::Event to_event(CUevent e) { return {reinterpret_cast<uintptr_t>(e)}; }

// ---------------------------------------------------------------- memory the program holds

AddressRanges& device_allocs() {
  static auto* r = new AddressRanges;  // never destroyed: used from atexit handlers
  return *r;
}

// Host memory the program registered or allocated page-locked, with its flags.
struct HostRanges : AddressRanges {
  std::mutex flags_mu;
  std::map<uint64_t, unsigned> flags;  // base -> flags
};
HostRanges& host_allocs() {
  static auto* r = new HostRanges;
  return *r;
}

// ---------------------------------------------------------------- modules and functions

struct Module;
struct Function {
  Module* module = nullptr;
  std::string name;
  const KernelLayout* layout = nullptr;
  uint32_t id = 0;  // the worker's kernel id
  std::atomic<int> max_dynamic_smem{48 * 1024};
};

// An image as the worker holds it, shared by every module loaded from the same
// bytes: it goes to the worker once, and its device variables have one address
// per device.
struct Image {
  uint32_t id = 0;  // the worker's module id
  int refs = 0;
  using Globals = std::map<std::string, std::pair<uint64_t, uint64_t>, std::less<>>;  // name -> (addr, size)
  std::map<CUdevice, Globals> globals;  // resolved, by device
};

// One loaded image: CUmodule and CUlibrary are both this.
struct Module {
  uint64_t key = 0;  // of its Image
  uint32_t id = 0;   // the worker's module id
  CUdevice device = 0;  // the device current at load: a CUmodule's variables are its context's
  KernelLayouts layouts;
  GlobalSizes global_sizes;
  std::string parse_error;
  std::mutex mu;
  std::map<std::string, std::unique_ptr<Function>, std::less<>> functions;
};

// Handles are checked on every launch: hash lookups under a shared lock.
struct Modules {
  std::shared_mutex mu;
  std::unordered_map<const void*, std::unique_ptr<Module>> live;
  std::unordered_set<const void*> functions;  // every function of a live module handed out
  std::unordered_map<uint64_t, Image> images;  // content hash -> image; guarded by load_mu
  std::mutex load_mu;  // loads, unloads and variable lookups one at a time: an image is shipped once
};
Modules& modules() {
  static auto* m = new Modules;
  return *m;
}

Module* module_of(const void* h) {
  Modules& m = modules();
  std::shared_lock lock(m.mu);
  auto it = m.live.find(h);
  return it == m.live.end() ? nullptr : it->second.get();
}

Function* function_of(const void* h) {
  Modules& m = modules();
  std::shared_lock lock(m.mu);
  return m.functions.count(h) ? static_cast<Function*>(const_cast<void*>(h)) : nullptr;
}

struct ElfHeader {
  uint8_t ident[16];
  uint16_t type, machine;
  uint32_t version;
  uint64_t entry, phoff, shoff;
  uint32_t flags;
  uint16_t ehsize, phentsize, phnum, shentsize, shnum, shstrndx;
};
struct ElfSection {
  uint32_t name, type;
  uint64_t flags, addr, offset, size;
  uint32_t link, info;
  uint64_t addralign, entsize;
};

// Size of a 64-bit ELF image from its headers: the end of the furthest table or section.
uint64_t elf_size(const std::byte* p) {
  ElfHeader h;
  std::memcpy(&h, p, sizeof h);
  if (h.ident[4] != 2 || h.shentsize != sizeof(ElfSection)) return 0;
  uint64_t end = std::max<uint64_t>(sizeof h, h.shoff + uint64_t{h.shnum} * h.shentsize);
  end = std::max<uint64_t>(end, h.phoff + uint64_t{h.phnum} * h.phentsize);
  for (uint16_t i = 0; i < h.shnum; ++i) {
    ElfSection s;
    std::memcpy(&s, p + h.shoff + uint64_t{i} * sizeof s, sizeof s);
    if (s.type != 8 /* SHT_NOBITS */) end = std::max(end, s.offset + s.size);
  }
  return end;
}

// What an image pointer points at: an nvcc fatbinC wrapper, a fatbin, an ELF
// cubin or PTX text. Returns the image proper and its size.
CUresult size_image(const void* image, const std::byte** data, uint64_t* size, int* kind) {
  if (!image) return CUDA_ERROR_INVALID_VALUE;
  uint32_t magic;
  std::memcpy(&magic, image, 4);
  if (magic == kFatbinWrapperMagic) {
    struct Wrapper {
      int magic, version;
      const void* data;
      void* filename_or_fatbins;
    } w;
    std::memcpy(&w, image, sizeof w);
    return size_image(w.data, data, size, kind);
  }
  *data = static_cast<const std::byte*>(image);
  if (magic == kFatbinMagic) {
    *kind = 0;
    *size = fatbin_size(image);
  } else if (magic == 0x464c457f) {  // "\x7fELF"
    *kind = 1;
    *size = elf_size(*data);
  } else {
    *kind = 2;  // PTX text, NUL-terminated
    *size = std::strlen(static_cast<const char*>(image)) + 1;
    // Anything else is no module: PTX states its version first (after comments).
    const std::string_view text(static_cast<const char*>(image), *size - 1);
    if (text.find(".version") == std::string_view::npos) return CUDA_ERROR_INVALID_IMAGE;
  }
  return *size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
}

uint64_t hash_image(const std::byte* p, uint64_t n) {
  uint64_t h = 1469598103934665603ull ^ n;  // FNV-1a
  for (uint64_t i = 0; i < n; ++i) h = (h ^ uint64_t(p[i])) * 1099511628211ull;
  return h;
}

CUresult load_module(const void* image, Module** out) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const std::byte* data;
  uint64_t size;
  int kind;
  if (CUresult e = size_image(image, &data, &size, &kind); e != CUDA_SUCCESS) return e;
  auto m = std::make_unique<Module>();
  const std::span<const std::byte> bytes(data, size);
  bool parsed = kind == 0 ? parse_fatbin(bytes, &m->layouts, &m->parse_error, &m->global_sizes)
              : kind == 1 ? parse_cubin(bytes, &m->layouts, &m->parse_error, &m->global_sizes)
                          : parse_ptx({reinterpret_cast<const char*>(data), size - 1}, &m->layouts,
                                                    &m->parse_error);
  (void)parsed;  // kernels without a layout fail when fetched, naming themselves
  m->key = hash_image(data, size);
  m->device = this_device();
  Modules& ms = modules();
  std::lock_guard load(ms.load_mu);
  Image* img = nullptr;
  if (auto it = ms.images.find(m->key); it != ms.images.end()) img = &it->second;
  if (!img) {
    uint32_t id = 0;
    const Status s = c->module_load(data, size, &id);
    if (!ok(s)) {
      if (s == Status::kMemoryAllocation)
        std::fprintf(stderr,
                     "ordo: a %llu-byte module image does not fit the region's pinned heap; start ordo-worker with "
                     "a larger --size\n",
                     (unsigned long long)size);
      return to_cu(s);
    }
    img = &ms.images[m->key];
    img->id = id;
  }
  ++img->refs;
  m->id = img->id;
  std::unique_lock lock(ms.mu);
  Module* raw = m.get();
  ms.live.emplace(raw, std::move(m));
  *out = raw;
  return CUDA_SUCCESS;
}

CUresult unload_module(Module* m) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  Modules& ms = modules();
  std::lock_guard load(ms.load_mu);
  uint32_t drop = 0;
  {
    std::unique_lock lock(ms.mu);
    auto it = ms.live.find(m);
    if (it == ms.live.end()) return CUDA_ERROR_INVALID_HANDLE;
    // Its functions' handles now fail the check instead of reaching freed memory.
    for (auto& [n, f] : m->functions) ms.functions.erase(f.get());
    auto img = ms.images.find(m->key);
    if (img != ms.images.end() && --img->second.refs == 0) {
      drop = img->second.id;
      for (auto& [dev, globals] : img->second.globals)
        for (auto& [n, g] : globals) device_allocs().erase(g.first);
      ms.images.erase(img);
    }
    ms.live.erase(it);  // m is gone from here on
  }
  return drop ? to_cu(c->module_unload(drop)) : CUDA_SUCCESS;
}

// Names travel in a reply slot's payload: a longer one is a limit of ordo's, said as such.
CUresult check_name_fits(const char* name, const char* what) {
  const size_t n = std::strlen(name);
  if (n < ordo::kSlotPayload) return CUDA_SUCCESS;
  std::fprintf(stderr, "ordo: the %s name %.60s... is %zu bytes; ordo passes names of up to %zu bytes\n", what, name,
               n, ordo::kSlotPayload - 1);
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult get_function(Module* m, const char* name, Function** out) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!m || !name || !out) return !m ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = check_name_fits(name, "kernel"); e != CUDA_SUCCESS) return e;
  std::lock_guard lock(m->mu);
  if (auto it = m->functions.find(std::string_view(name)); it != m->functions.end()) {
    *out = it->second.get();
    return CUDA_SUCCESS;
  }
  auto f = std::make_unique<Function>();
  f->module = m;
  f->name = name;
  if (auto it = m->layouts.find(f->name); it != m->layouts.end()) f->layout = &it->second;
  // Every kernel of a readable image has a layout (cubins: a .nv.info.<kernel>
  // section each, parameterless ones too; PTX: its .entry): a name without one
  // is not in the module, whatever a backend without the image would say.
  else if (m->parse_error.empty() && !m->layouts.empty()) return CUDA_ERROR_NOT_FOUND;
  const Status s = c->kernel_lookup(m->id, f->name, &f->id);
  if (!ok(s)) return to_cu(s);
  Function* raw = f.get();
  m->functions.emplace(f->name, std::move(f));
  Modules& ms = modules();
  std::unique_lock lk(ms.mu);
  ms.functions.insert(raw);
  *out = raw;
  return CUDA_SUCCESS;
}

// Device variable `name` of `m` as device `dev` has it.
CUresult get_global(Module* m, const char* name, CUdeviceptr* addr, size_t* size, CUdevice dev) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = check_name_fits(name, "device variable"); e != CUDA_SUCCESS) return e;
  Modules& ms = modules();
  std::lock_guard load(ms.load_mu);  // keeps the image loaded while its variable is resolved
  Image::Globals& globals = ms.images.at(m->key).globals[dev];
  auto it = globals.find(std::string_view(name));
  if (it == globals.end()) {
    auto sz = m->global_sizes.find(std::string_view(name));
    const uint64_t hint = sz == m->global_sizes.end() ? 0 : sz->second;
    uint64_t a = 0, n = 0;
    const Status s = on_device(c, dev, [&] { return c->module_global(m->id, name, hint, &a, &n); });
    if (!ok(s)) return to_cu(s);
    device_allocs().add(a, n, dev);  // cuMemcpy with unified addressing sees it as device memory
    it = globals.emplace(name, std::make_pair(a, n)).first;
  }
  if (addr) *addr = it->second.first;
  if (size) *size = it->second.second;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- launches

CUresult launch(Function* f, Dim3 grid, Dim3 block, unsigned smem, CUstream stream, void** params, void** extra,
                bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  const void* buf = nullptr;
  uint64_t size = 0;
  ParamBuffer packed;
  if (extra) {
    // {CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END}: already packed.
    for (void** e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
      if (*e == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = e[1];
      else if (*e == CU_LAUNCH_PARAM_BUFFER_SIZE && e[1]) size = *static_cast<size_t*>(e[1]);
      else return CUDA_ERROR_INVALID_VALUE;
    }
    if (params || (size && !buf)) return CUDA_ERROR_INVALID_VALUE;
  } else {
    if (!f->layout) {
      std::fprintf(stderr, "ordo: no parameter layout for kernel %s in its module%s%s; it cannot be launched\n",
                   f->name.c_str(), f->module->parse_error.empty() ? "" : ": ", f->module->parse_error.c_str());
      return CUDA_ERROR_INVALID_IMAGE;
    }
    switch (pack_params(*f->layout, params, &packed)) {
      case PackError::kNone: break;
      case PackError::kMissingArgument: return CUDA_ERROR_INVALID_VALUE;
      case PackError::kBadLayout: return CUDA_ERROR_INVALID_IMAGE;
    }
    buf = packed.data();
    size = packed.size();
  }
  if (size > kMaxParamBytes) return CUDA_ERROR_INVALID_VALUE;
  if (smem > unsigned(f->max_dynamic_smem.load(std::memory_order_relaxed)) && smem > 48 * 1024)
    return CUDA_ERROR_INVALID_VALUE;
  return to_cu(c->launch(f->id, grid, block, buf, uint32_t(size), s, smem));
}

// ---------------------------------------------------------------- copies

enum class Side { kHost, kDevice };

Side side_of(CUdeviceptr p) { return device_allocs().find(p, nullptr, nullptr) ? Side::kDevice : Side::kHost; }

// One copy in stream order; `sync`: the call returns once it is done (the synchronous API).
CUresult copy(uint64_t dst, Side ds, uint64_t src, Side ss, size_t n, CUstream stream, bool sync, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  ordo::Stream s = ordo::kLegacyStream;
  if (sync) s = per_thread ? c->per_thread_stream() : ordo::kLegacyStream;
  else if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  Status st;
  if (ds == Side::kDevice && ss == Side::kHost) {
    const void* from = reinterpret_cast<const void*>(src);
    if (sync) return to_cu(c->memcpy_h2d(dst, from, n, s));  // waits first when `from` is pageable
    st = c->memcpy_h2d_async(dst, from, n, s);
  } else if (ds == Side::kHost && ss == Side::kDevice) {
    st = c->memcpy_d2h_async(reinterpret_cast<void*>(dst), src, n, s);
  } else if (ds == Side::kDevice) {
    st = c->memcpy_d2d_async(dst, src, n, s);
  } else {
    st = c->stream_order_wait(s);  // host to host, in stream order
    if (ok(st)) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return to_cu(st);
  }
  if (ok(st) && sync) st = c->stream_synchronize(s);
  return to_cu(st);
}

// cuMemcpyPeer: device memory of one context's device to another's.
CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n, CUstream stream,
                   bool sync, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Context* dc = context_of(dst_ctx);
  const Context* sc = context_of(src_ctx);
  if (!dc || !sc) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  ordo::Stream s = ordo::kLegacyStream;
  if (sync) {
    s = per_thread ? c->per_thread_stream() : ordo::kLegacyStream;
    // The synchronous copy also follows the work of both devices, not only
    // the current one's (whose legacy stream it goes on).
    for (const CUdevice d : {sc->device, dc->device})
      if (d != this_device())
        if (const Status st = on_device(c, d, [c] { return c->stream_order_wait(ordo::kLegacyStream); }); !ok(st))
          return to_cu(st);
  } else if (!from_handle(c, stream, per_thread, &s)) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  Status st = c->memcpy_peer_async(dst, uint32_t(dc->device), src, uint32_t(sc->device), n, s);
  if (ok(st) && sync) st = c->stream_synchronize(s);
  return to_cu(st);
}

CUresult copy_2d(const CUDA_MEMCPY2D* p, CUstream stream, bool sync, bool per_thread) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  auto side = [](CUmemorytype t, CUdeviceptr dev, const void* host, uint64_t* addr, Side* s) {
    switch (t) {
      case CU_MEMORYTYPE_HOST: *addr = reinterpret_cast<uintptr_t>(host); *s = Side::kHost; return true;
      case CU_MEMORYTYPE_DEVICE: *addr = dev; *s = Side::kDevice; return true;
      case CU_MEMORYTYPE_UNIFIED: *addr = dev; *s = side_of(dev); return true;
      default: return false;  // arrays: not supported
    }
  };
  uint64_t src, dst;
  Side ss, ds;
  if (!side(p->srcMemoryType, p->srcDevice, p->srcHost, &src, &ss) ||
      !side(p->dstMemoryType, p->dstDevice, p->dstHost, &dst, &ds))
    return CUDA_ERROR_NOT_SUPPORTED;
  src += p->srcXInBytes + p->srcY * p->srcPitch;
  dst += p->dstXInBytes + p->dstY * p->dstPitch;
  const size_t w = p->WidthInBytes, h = p->Height;
  if (p->Height > 1 && (p->srcPitch < w || p->dstPitch < w)) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcPitch == w && p->dstPitch == w) return copy(dst, ds, src, ss, w * h, stream, sync, per_thread);
  for (size_t row = 0; row < h; ++row)
    if (CUresult e = copy(dst + row * p->dstPitch, ds, src + row * p->srcPitch, ss, w, stream, sync && row + 1 == h,
                          per_thread);
        e != CUDA_SUCCESS)
      return e;
  return CUDA_SUCCESS;
}

// A memset of `count` elements of `width` bytes; `value` repeats per element.
CUresult memset_n(CUdeviceptr dst, uint32_t value, int width, size_t count, CUstream stream, bool sync,
                  bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (count == 0) return CUDA_SUCCESS;
  if (!dst) return CUDA_ERROR_INVALID_VALUE;
  if (width > 1 && dst % unsigned(width)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Stream s = ordo::kLegacyStream;
  if (sync) s = per_thread ? c->per_thread_stream() : ordo::kLegacyStream;
  else if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  const uint8_t b = uint8_t(value);
  bool uniform = true;
  for (int i = 1; i < width; ++i) uniform &= uint8_t(value >> (8 * i)) == b;
  Status st;
  if (uniform) {
    st = c->memset_async(dst, b, uint64_t(count) * width, s);
  } else {
    // A pattern the byte memset cannot express: the pattern is copied in, in stream order.
    std::vector<uint8_t> pattern(count * width);
    for (size_t i = 0; i < count; ++i) std::memcpy(&pattern[i * width], &value, width);
    st = c->memcpy_h2d_async(dst, pattern.data(), pattern.size(), s);
  }
  if (ok(st) && sync) st = c->stream_synchronize(s);
  return to_cu(st);
}

CUresult memset_2d(CUdeviceptr dst, size_t pitch, uint32_t value, int width, size_t w, size_t h, CUstream stream,
                   bool sync, bool per_thread) {
  if (h > 1 && pitch < w * width) return CUDA_ERROR_INVALID_VALUE;
  for (size_t row = 0; row < h; ++row)
    if (CUresult e = memset_n(dst + row * pitch, value, width, w, stream, sync && row + 1 == h, per_thread);
        e != CUDA_SUCCESS)
      return e;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- host functions

CUresult host_func(CUstream stream, bool per_thread, std::function<void()> fn) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->host_func(s, std::move(fn)));
}

// ---------------------------------------------------------------- streams

CUresult stream_create(CUstream* out, unsigned flags, int priority) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~unsigned(CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  priority = std::max(-5, std::min(0, priority));
  ordo::Stream s;
  const Status st = c->stream_create(&s, (flags & CU_STREAM_NON_BLOCKING) ? ordo::kStreamNonBlocking : 0, priority);
  if (!ok(st)) return to_cu(st);
  stream_meta()[s.id].flags.store(flags, std::memory_order_relaxed);
  stream_meta()[s.id].priority.store(priority, std::memory_order_relaxed);
  stream_meta()[s.id].ctx.store(current(), std::memory_order_relaxed);
  *out = to_handle(s);
  return CUDA_SUCCESS;
}

}  // namespace

// ================================================================ for dark_api.cc

CUresult primary_context(CUdevice dev, CUcontext* out) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context& p = g_primaries[dev];
  p.primary_refs.fetch_add(1, std::memory_order_relaxed);
  p.primary_active.store(true, std::memory_order_relaxed);
  *out = handle(&p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cls_put(CUcontext ctx, void* key, void* value, void (*dtor)(CUcontext, void*, void*)) {
  Context* c = ctx ? context_of(ctx) : current();
  if (!c || !key) return c ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(c->cls_mu);
  Context::Slot* free_slot = nullptr;
  for (auto& s : c->cls) {
    void* k = s.key.load(std::memory_order_relaxed);
    if (k == key) {
      s.dtor = dtor;
      s.value.store(value, std::memory_order_release);
      return CUDA_SUCCESS;
    }
    if (!k && !free_slot) free_slot = &s;
  }
  if (!free_slot) return CUDA_ERROR_OUT_OF_MEMORY;
  free_slot->dtor = dtor;
  free_slot->value.store(value, std::memory_order_relaxed);
  free_slot->key.store(key, std::memory_order_release);  // publishes the value with it
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cls_delete(CUcontext ctx, void* key) {
  Context* c = ctx ? context_of(ctx) : current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(c->cls_mu);
  for (auto& s : c->cls)
    if (s.key.load(std::memory_order_relaxed) == key) {
      s.key.store(nullptr, std::memory_order_release);
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cls_get(void** value, CUcontext ctx, void* key) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  // A primary context is by far the common case: context_of finds it without the lock.
  Context* c = ctx ? context_of(ctx) : current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  for (auto& s : c->cls)
    if (s.key.load(std::memory_order_acquire) == key) {
      *value = s.value.load(std::memory_order_acquire);
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_HANDLE;
}

static_assert(kMaxHashDevices >= int(ordo::kMaxDevices));

int device_hash_info(DeviceHashInfo* out, int max) {
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(0, &d); e != CUDA_SUCCESS) return -int(e);  // not initialized, worker gone
  const int n = std::min(g_device_count.load(), max);
  for (int i = 0; i < n; ++i) {
    if (CUresult e = device_cache(i, &d); e != CUDA_SUCCESS) return -int(e);
    std::memcpy(out[i].uuid, d->info.uuid, 16);
    out[i].pci_domain = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID];
    out[i].pci_bus = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID];
    out[i].pci_device = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID];
  }
  return std::max(n, 0);
}

int driver_version() { return CUDA_VERSION; }

ProcLookup lookup_proc(std::string_view name, int version, bool per_thread, void** fn) {
  const ProcEntry* begin = kProcTable;
  const ProcEntry* end = kProcTable + kProcTableSize;
  auto first = std::lower_bound(begin, end, name, [](const ProcEntry& e, std::string_view n) { return e.name < n; });
  if (first == end || first->name != name) return ProcLookup::kSymbolNotFound;
  const ProcEntry* best = nullptr;
  bool have_per_thread = false;
  for (auto* e = first; e != end && e->name == name; ++e) have_per_thread |= e->per_thread;
  const bool want = per_thread && have_per_thread;
  for (auto* e = first; e != end && e->name == name; ++e)
    if (e->per_thread == want && e->version <= version) best = e;  // sorted by version: the newest wins
  if (!best) return ProcLookup::kVersionNotSufficient;
  static const bool trace = [] {
    const char* t = std::getenv("ORDO_DRIVER_TRACE");
    return t && *t == '1';
  }();
  *fn = trace ? best->traced : best->fn;
  return ProcLookup::kFound;
}

}  // namespace ordo::driver

// ================================================================ the driver API

using namespace ordo::driver;  // NOLINT: this file is the API's implementation

extern "C" {

// ---- initialization, versions, entry points

CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = attach(); e != CUDA_SUCCESS) return e;
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] { g_exiting.store(true); });
    const uint32_t n = g_client.load(std::memory_order_acquire)->device_count();
    g_device_count.store(int(std::min<uint32_t>(n, ordo::kMaxDevices)));
    init_primaries();
  });
  g_initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = driver_version();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~cuuint64_t(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
    return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const ProcLookup r =
      lookup_proc(symbol, version, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, pfn);
  if (status)
    *status = r == ProcLookup::kFound               ? CU_GET_PROC_ADDRESS_SUCCESS
              : r == ProcLookup::kSymbolNotFound    ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                                                    : CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  return r == ProcLookup::kFound ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
  if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
  *table = export_table(reinterpret_cast<const uint8_t*>(id->bytes));
  return *table ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  *str = error_name(int(error));
  return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *str = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED:
      *str = "initialization error (ordo: ORDO_REGION unset or not an ordo region; see the message on stderr)";
      break;
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      *str = "CUDA-capable device(s) is/are busy or unavailable (ordo: no ordo-worker serves ORDO_REGION)";
      break;
    case CUDA_ERROR_NOT_SUPPORTED: *str = "operation not supported (by the ordo guest library)"; break;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *str = "no kernel image is available for execution on the device"; break;
    case CUDA_ERROR_INVALID_HANDLE: *str = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: *str = "named symbol not found"; break;
    case CUDA_ERROR_NOT_READY: *str = "device not ready"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *str = "an illegal memory access was encountered"; break;
    case CUDA_ERROR_MISALIGNED_ADDRESS: *str = "misaligned address"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *str = "unspecified launch failure"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "invalid device context"; break;
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: *str = "peer access is not supported between these two devices"; break;
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: *str = "peer access is already enabled"; break;
    case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: *str = "peer access has not been enabled"; break;
    default: *str = error_name(int(error)); break;
  }
  return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_LAZY_LOADING;  // images are shipped when the program first asks for them
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuProfilerStart(void) { return CUDA_SUCCESS; }  // no profiler attaches through ordo
CUresult CUDAAPI cuProfilerStop(void) { return CUDA_SUCCESS; }

// ---- devices

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  *count = g_device_count.load(std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::snprintf(name, size_t(len), "%.*s", int(sizeof d->info.name), d->info.name);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  *bytes = d->info.total_global_mem;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice dev) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  if (int(attr) <= 0 || int(attr) >= CU_DEVICE_ATTRIBUTE_MAX || int(attr) >= kAttrCount)
    return CUDA_ERROR_INVALID_VALUE;
  *value = d->attrs[attr];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::memcpy(uuid->bytes, d->info.uuid, 16);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

CUresult CUDAAPI cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  *major = d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
  *minor = d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char* id, int len, CUdevice dev) {
  if (!id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  std::snprintf(id, size_t(len), "%08x:%02x:%02x.0", unsigned(d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]),
                unsigned(d->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]),
                unsigned(d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* id) {
  if (!dev || !id) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  unsigned dom = 0, bus = 0, d = 0;
  if (std::sscanf(id, "%x:%x:%x", &dom, &bus, &d) != 3 && (dom = 0, std::sscanf(id, "%x:%x", &bus, &d) != 2))
    return CUDA_ERROR_INVALID_VALUE;
  for (CUdevice i = 0; i < g_device_count.load(std::memory_order_relaxed); ++i) {
    const DeviceCache* info = nullptr;
    if (CUresult e = device_cache(i, &info); e != CUDA_SUCCESS) return e;
    if (dom == unsigned(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]) &&
        bus == unsigned(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]) &&
        d == unsigned(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID])) {
      *dev = i;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
  if (dev == peer) {
    *can = 0;  // as CUDA: a device is not its own peer
    return CUDA_SUCCESS;
  }
  return to_cu(c->can_access_peer(can, uint32_t(dev), uint32_t(peer)));
}

CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attr, CUdevice src, CUdevice dst) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!valid_device(src) || !valid_device(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
    case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: *value = 0; return CUDA_SUCCESS;
    // A peer the device can reach at all it reaches fully: atomics and arrays included.
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
      return to_cu(c->can_access_peer(value, uint32_t(src), uint32_t(dst)));
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// ---- primary and current contexts

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) { return primary_context(dev, ctx); }

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context& p = g_primaries[dev];
  if (p.primary_refs.load() <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  // The context stays usable: its state lives in the worker session, freed at exit.
  if (p.primary_refs.fetch_sub(1) == 1) p.primary_active.store(false);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (flags & ~unsigned(CU_CTX_FLAGS_MASK)) return CUDA_ERROR_INVALID_VALUE;
  g_primaries[dev].flags = flags;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = g_primaries[dev].flags;
  *active = g_primaries[dev].primary_active.load() ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // Waits for the device; the session's allocations stay (freed when the program exits).
  return to_cu(on_device(c, dev, [c] { return c->device_synchronize(); }));
}
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* ctx) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  *ctx = handle(current());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ctx) {
    if (!t_ctx_stack.empty()) t_ctx_stack.pop_back();
    return CUDA_SUCCESS;
  }
  Context* c = context_of(ctx);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_ctx_stack.empty()) t_ctx_stack.push_back(c);
  else t_ctx_stack.back() = c;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = context_of(ctx);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  t_ctx_stack.push_back(c);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* ctx) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = handle(t_ctx_stack.back());
  t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice dev) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto c = std::make_unique<Context>();
  c->device = dev;
  c->flags = flags;
  c->id = g_next_ctx_id.fetch_add(1);
  std::copy(std::begin(g_primaries[dev].limits), std::end(g_primaries[dev].limits), c->limits);
  Context* raw = c.get();
  {
    std::lock_guard lock(g_ctx_mu);
    g_contexts.push_back(std::move(c));
  }
  t_ctx_stack.push_back(raw);
  *ctx = handle(raw);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  ordo::Client* cl = nullptr;
  if (CUresult e = enter(&cl); e != CUDA_SUCCESS) return e;
  Context* c = context_of(ctx);
  if (!c || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  std::erase(t_ctx_stack, c);
  // Contexts share the session: destroying one waits for its device, as CUDA does.
  return to_cu(on_device(cl, c->device, [cl] { return cl->device_synchronize(); }));
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* dev) {
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  Context* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = c->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* dev, CUcontext ctx) {
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  Context* c = ctx ? context_of(ctx) : current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = c->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  Context* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *flags = c->flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetFlags(unsigned int flags) {
  Context* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  c->flags = flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  Context* c = ctx ? context_of(ctx) : current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *id = c->id;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  Context* c = ctx ? context_of(ctx) : current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *version = 3020;  // what the real driver reports for every context since CUDA 3.2
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
  return to_cu(c->device_synchronize());
}
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Context* x = ctx ? context_of(ctx) : current();
  if (ctx && !x) return CUDA_ERROR_INVALID_CONTEXT;
  return to_cu(on_device(c, x ? x->device : this_device(), [c] { return c->device_synchronize(); }));
}

CUresult CUDAAPI cuCtxGetLimit(size_t* value, CUlimit limit) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  Context* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (unsigned(limit) >= std::size(c->limits)) return CUDA_ERROR_UNSUPPORTED_LIMIT;
  *value = c->limits[limit];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  Context* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (unsigned(limit) >= std::size(c->limits)) return CUDA_ERROR_UNSUPPORTED_LIMIT;
  if (limit == CU_LIMIT_SHMEM_SIZE || limit == CU_LIMIT_CIG_ENABLED) return CUDA_ERROR_INVALID_VALUE;  // query-only
  // Recorded for cuCtxGetLimit; the worker's context keeps the host driver's limits.
  c->limits[limit] = value;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCacheConfig(CUfunc_cache* config) {
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  Context* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *config = c->cache_config;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache config) {
  Context* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  c->cache_config = config;  // a preference; CUDA may ignore it too
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetSharedMemConfig(CUsharedconfig* config) {
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  *config = CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSetSharedMemConfig(CUsharedconfig) { return CUDA_SUCCESS; }  // a no-op since Volta

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxResetPersistingL2Cache(void) { return CUDA_SUCCESS; }  // a hint: nothing persists here

// Peer access is kept per pair of devices (by the worker), from the current
// context's device to `peer`'s.
CUresult peer_access(CUcontext peer, bool enable) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Context* self = current();
  const Context* other = context_of(peer);
  if (!self || !other) return CUDA_ERROR_INVALID_CONTEXT;
  // Its own device (the current context itself too): cudart passes this on
  // unchanged, and cudaDeviceEnablePeerAccess answers cudaErrorInvalidDevice.
  if (other->device == self->device) return CUDA_ERROR_INVALID_DEVICE;
  const auto dev = uint32_t(other->device);
  return to_cu(enable ? c->enable_peer_access(dev) : c->disable_peer_access(dev));
}
CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return peer_access(peer, true);
}
CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peer) { return peer_access(peer, false); }

// ---- memory

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* ptr, size_t size) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t addr = 0;
  const Status s = c->malloc(&addr, size);
  if (!ok(s)) return s == Status::kInvalidValue ? CUDA_ERROR_OUT_OF_MEMORY : to_cu(s);
  device_allocs().add(addr, size, this_device());
  *ptr = addr;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* ptr, size_t* pitch, size_t width, size_t height,
                                    unsigned int element) {
  if (!ptr || !pitch || !width || !height || (element != 4 && element != 8 && element != 16))
    return CUDA_ERROR_INVALID_VALUE;
  constexpr size_t kAlign = 512;  // CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT of every current GPU
  const size_t p = (width + kAlign - 1) / kAlign * kAlign;
  if (CUresult e = cuMemAlloc_v2(ptr, p * height); e != CUDA_SUCCESS) return e;
  *pitch = p;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr ptr) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!ptr) return CUDA_SUCCESS;
  const Status s = c->free(ptr);
  if (ok(s)) device_allocs().erase(ptr);
  return to_cu(s);
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  const uint64_t used = device_allocs().total(this_device());
  *total = d->info.total_global_mem;
  *free = used < *total ? *total - used : 0;  // this program's view only
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  uint64_t b, n;
  if (!device_allocs().find(ptr, &b, &n)) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = b;
  if (size) *size = n;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void** ptr, size_t size, unsigned int flags) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned kKnown = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  // Mapped memory would need the device to reach guest memory: not offered.
  if (flags & CU_MEMHOSTALLOC_DEVICEMAP) return CUDA_ERROR_NOT_SUPPORTED;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Status s = c->malloc_host(ptr, size);
  if (!ok(s)) return to_cu(s);
  HostRanges& h = host_allocs();
  h.add(reinterpret_cast<uintptr_t>(*ptr), size, this_device());
  std::lock_guard lock(h.flags_mu);
  h.flags[reinterpret_cast<uintptr_t>(*ptr)] = flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocHost_v2(void** ptr, size_t size) { return cuMemHostAlloc(ptr, size, 0); }

CUresult CUDAAPI cuMemFreeHost(void* ptr) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Status s = c->free_host(ptr);
  if (ok(s)) host_allocs().erase(reinterpret_cast<uintptr_t>(ptr));
  return to_cu(s);
}

CUresult CUDAAPI cuMemHostGetFlags(unsigned int* flags, void* ptr) {
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  HostRanges& h = host_allocs();
  uint64_t base;
  if (!h.find(reinterpret_cast<uintptr_t>(ptr), &base, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(h.flags_mu);
  *flags = h.flags[base];
  return CUDA_SUCCESS;
}

// Registering host memory: copies from it behave as from pageable memory (a
// pageable D2H returns once the data is there, which a registered one's
// caller waits for anyway), so the program's results are the same.
CUresult CUDAAPI cuMemHostRegister_v2(void* ptr, size_t size, unsigned int flags) {
  if (!ptr || !size) return CUDA_ERROR_INVALID_VALUE;
  if (flags & CU_MEMHOSTREGISTER_DEVICEMAP) return CUDA_ERROR_NOT_SUPPORTED;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  HostRanges& h = host_allocs();
  if (h.find(reinterpret_cast<uintptr_t>(ptr), nullptr, nullptr)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  h.add(reinterpret_cast<uintptr_t>(ptr), size, this_device());
  std::lock_guard lock(h.flags_mu);
  h.flags[reinterpret_cast<uintptr_t>(ptr)] = flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void* ptr) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  return host_allocs().erase(reinterpret_cast<uintptr_t>(ptr)) ? CUDA_SUCCESS
                                                                : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  uint64_t base = 0, size = 0;
  int device = 0;  // the one it was allocated on (host memory: the allocating thread's)
  const bool dev = device_allocs().find(ptr, &base, &size, &device);
  const bool host = !dev && host_allocs().find(ptr, &base, &size, &device);
  if (!dev && !host) return CUDA_ERROR_INVALID_VALUE;  // memory CUDA does not know
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = handle(&g_primaries[device]); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (!dev) return CUDA_ERROR_INVALID_VALUE;  // host memory is not mapped into the device
      *static_cast<CUdeviceptr*>(data) = ptr;
      break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (dev) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(data) = 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = device; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data) = base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<unsigned*>(data) = 1; break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *static_cast<unsigned*>(data) = 1; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  const bool known = device_allocs().find(ptr, nullptr, nullptr) || host_allocs().find(ptr, nullptr, nullptr);
  for (unsigned i = 0; i < n; ++i) {
    if (!data[i]) continue;
    if (!known) {
      // Unknown memory is not an error here: CUDA reports it as unregistered host memory.
      switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data[i]) = 0; break;
        case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data[i]) = nullptr; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = -2; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data[i]) = nullptr; break;
        default: *static_cast<unsigned*>(data[i]) = 0; break;
      }
      continue;
    }
    if (CUresult e = cuPointerGetAttribute(data[i], attrs[i], ptr); e != CUDA_SUCCESS && e != CUDA_ERROR_INVALID_VALUE)
      return e;
  }
  return CUDA_SUCCESS;
}

// ---- copies: H = host, D = device; _ptds/_ptsz: stream 0 is the per-thread stream

#define H(p) reinterpret_cast<uintptr_t>(p)
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, size_t n) {
  return copy(d, Side::kDevice, H(h), Side::kHost, n, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void* h, size_t n) {
  return copy(d, Side::kDevice, H(h), Side::kHost, n, nullptr, true, true);
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* h, CUdeviceptr d, size_t n) {
  return copy(H(h), Side::kHost, d, Side::kDevice, n, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* h, CUdeviceptr d, size_t n) {
  return copy(H(h), Side::kHost, d, Side::kDevice, n, nullptr, true, true);
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(dst, Side::kDevice, src, Side::kDevice, n, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(dst, Side::kDevice, src, Side::kDevice, n, nullptr, true, true);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  return copy(d, Side::kDevice, H(h), Side::kHost, n, s, false, false);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  return copy(d, Side::kDevice, H(h), Side::kHost, n, s, false, true);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, CUstream s) {
  return copy(H(h), Side::kHost, d, Side::kDevice, n, s, false, false);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* h, CUdeviceptr d, size_t n, CUstream s) {
  return copy(H(h), Side::kHost, d, Side::kDevice, n, s, false, true);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(dst, Side::kDevice, src, Side::kDevice, n, s, false, false);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(dst, Side::kDevice, src, Side::kDevice, n, s, false, true);
}
CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(dst, side_of(dst), src, side_of(src), n, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(dst, side_of(dst), src, side_of(src), n, nullptr, true, true);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(dst, side_of(dst), src, side_of(src), n, s, false, false);
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(dst, side_of(dst), src, side_of(src), n, s, false, true);
}
#undef H
CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  return copy_peer(dst, dst_ctx, src, src_ctx, n, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  return copy_peer(dst, dst_ctx, src, src_ctx, n, nullptr, true, true);
}
CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                                   CUstream s) {
  return copy_peer(dst, dst_ctx, src, src_ctx, n, s, false, false);
}
CUresult CUDAAPI cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                                        size_t n, CUstream s) {
  return copy_peer(dst, dst_ctx, src, src_ctx, n, s, false, true);
}
CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* p) { return copy_2d(p, nullptr, true, false); }
CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* p) { return copy_2d(p, nullptr, true, true); }
CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* p) { return copy_2d(p, nullptr, true, false); }
CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* p) { return copy_2d(p, nullptr, true, true); }
CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* p, CUstream s) { return copy_2d(p, s, false, false); }
CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* p, CUstream s) { return copy_2d(p, s, false, true); }

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  return memset_n(d, v, 1, n, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) {
  return memset_n(d, v, 1, n, nullptr, true, true);
}
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) {
  return memset_n(d, v, 2, n, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) {
  return memset_n(d, v, 2, n, nullptr, true, true);
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) {
  return memset_n(d, v, 4, n, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) {
  return memset_n(d, v, 4, n, nullptr, true, true);
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return memset_n(d, v, 1, n, s, false, false);
}
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return memset_n(d, v, 1, n, s, false, true);
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  return memset_n(d, v, 2, n, s, false, false);
}
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  return memset_n(d, v, 2, n, s, false, true);
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  return memset_n(d, v, 4, n, s, false, false);
}
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  return memset_n(d, v, 4, n, s, false, true);
}
CUresult CUDAAPI cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, 1, w, h, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, 1, w, h, nullptr, true, true);
}
CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s) {
  return memset_2d(d, pitch, v, 1, w, h, s, false, false);
}
CUresult CUDAAPI cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h,
                                        CUstream s) {
  return memset_2d(d, pitch, v, 1, w, h, s, false, true);
}
CUresult CUDAAPI cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, 2, w, h, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, 4, w, h, nullptr, true, false);
}
CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s) {
  return memset_2d(d, pitch, v, 2, w, h, s, false, false);
}
CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s) {
  return memset_2d(d, pitch, v, 4, w, h, s, false, false);
}

// ---- streams

CUresult CUDAAPI cuStreamCreate(CUstream* out, unsigned int flags) { return stream_create(out, flags, 0); }
CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* out, unsigned int flags, int priority) {
  return stream_create(out, flags, priority);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream stream) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, false, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->stream_destroy(s));
}

CUresult stream_synchronize(CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->stream_synchronize(s));
}
CUresult CUDAAPI cuStreamSynchronize(CUstream stream) { return stream_synchronize(stream, false); }
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream stream) { return stream_synchronize(stream, true); }

CUresult stream_query(CUstream stream, bool per_thread) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->stream_query(s));
}
CUresult CUDAAPI cuStreamQuery(CUstream stream) { return stream_query(stream, false); }
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream stream) { return stream_query(stream, true); }

CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (flags & ~unsigned(CU_EVENT_WAIT_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, false, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->stream_wait_event(s, to_event(event)));
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (flags & ~unsigned(CU_EVENT_WAIT_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, true, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->stream_wait_event(s, to_event(event)));
}

CUresult stream_flags(CUstream stream, bool per_thread, unsigned* flags, int* priority) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, stream, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  if (flags) *flags = s.id == ordo::kLegacyStreamId ? 0 : stream_meta()[s.id].flags.load();
  if (priority) *priority = s.id == ordo::kLegacyStreamId ? 0 : stream_meta()[s.id].priority.load();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamGetFlags(CUstream h, unsigned int* flags) {
  return flags ? stream_flags(h, false, flags, nullptr) : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream h, unsigned int* flags) {
  return flags ? stream_flags(h, true, flags, nullptr) : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuStreamGetPriority(CUstream h, int* priority) {
  return priority ? stream_flags(h, false, nullptr, priority) : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream h, int* priority) {
  return priority ? stream_flags(h, true, nullptr, priority) : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuStreamGetId(CUstream h, unsigned long long* id) {
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, false, &s)) return CUDA_ERROR_INVALID_HANDLE;
  *id = uint64_t(s.generation) << 32 | s.id;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamGetId_ptsz(CUstream h, unsigned long long* id) {
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, true, &s)) return CUDA_ERROR_INVALID_HANDLE;
  *id = uint64_t(s.generation) << 32 | s.id;
  return CUDA_SUCCESS;
}
// The context and device of a stream. The special handles (0, CU_STREAM_LEGACY,
// CU_STREAM_PER_THREAD) name the current context's default streams.
CUresult stream_home(CUstream h, bool per_thread, Context** ctx, CUdevice* dev) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, per_thread, &s)) return CUDA_ERROR_INVALID_HANDLE;
  const auto raw = reinterpret_cast<uintptr_t>(h);
  if (raw == 0 || raw == kLegacyHandle || raw == kPerThreadHandle) {
    *ctx = current();
    if (!*ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = (*ctx)->device;
    return CUDA_SUCCESS;
  }
  uint32_t d = 0;
  if (!c->device_of(s, &d)) return CUDA_ERROR_INVALID_HANDLE;
  *dev = CUdevice(d);
  *ctx = stream_meta()[s.id].ctx.load(std::memory_order_relaxed);
  if (!*ctx || (*ctx)->device != *dev) *ctx = &g_primaries[d];  // made where no context was current
  return CUDA_SUCCESS;
}
// The context a stream was made in. No green contexts here: *green is always NULL.
static CUresult stream_ctx_v2(CUstream h, CUcontext* ctx, CUgreenCtx* green, bool per_thread) {
  if (!ctx && !green) return CUDA_ERROR_INVALID_VALUE;
  Context* x = nullptr;
  CUdevice d = 0;
  if (CUresult e = stream_home(h, per_thread, &x, &d); e != CUDA_SUCCESS) return e;
  if (ctx) *ctx = handle(x);
  if (green) *green = nullptr;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamGetCtx(CUstream h, CUcontext* ctx) {
  return ctx ? stream_ctx_v2(h, ctx, nullptr, false) : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream h, CUcontext* ctx) {
  return ctx ? stream_ctx_v2(h, ctx, nullptr, true) : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuStreamGetCtx_v2(CUstream h, CUcontext* ctx, CUgreenCtx* green) {
  return stream_ctx_v2(h, ctx, green, false);
}
CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext* ctx, CUgreenCtx* green) {
  return stream_ctx_v2(h, ctx, green, true);
}
CUresult CUDAAPI cuStreamGetDevice(CUstream h, CUdevice* dev) {
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  Context* x = nullptr;
  return stream_home(h, false, &x, dev);
}
CUresult CUDAAPI cuStreamGetDevice_ptsz(CUstream h, CUdevice* dev) {
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  Context* x = nullptr;
  return stream_home(h, true, &x, dev);
}

// Stream capture is not offered: no stream is ever capturing.
CUresult CUDAAPI cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* status) {
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, false, &s)) return CUDA_ERROR_INVALID_HANDLE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus* status) {
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, true, &s)) return CUDA_ERROR_INVALID_HANDLE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                           const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* n) {
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Stream s;
  if (!from_handle(c, h, false, &s)) return CUDA_ERROR_INVALID_HANDLE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = 0;
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (n) *n = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                           const CUgraphNode** deps, size_t* n) {
  return cuStreamGetCaptureInfo_v3(h, status, id, graph, deps, nullptr, n);
}
CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id) {
  return cuStreamGetCaptureInfo_v3(h, status, id, nullptr, nullptr, nullptr, nullptr);
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::swap(*mode, t_mode);  // recorded: with no capture, every mode allows every call
  return CUDA_SUCCESS;
}

// ---- host functions

CUresult CUDAAPI cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* data) {
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  return host_func(stream, false, [fn, data] { fn(data); });
}
CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* data) {
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  return host_func(stream, true, [fn, data] { fn(data); });
}
// A stream callback gets CUDA_SUCCESS or the context's persistent error, as
// CUDA documents: a kernel fault before it is reported to it (the cuda backend
// learns of faults only this way).
CUresult callback_status() {
  ordo::Client* c = g_client.load(std::memory_order_acquire);
  return c ? to_cu(c->sticky_error()) : CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamAddCallback(CUstream stream, CUstreamCallback cb, void* data, unsigned int flags) {
  if (!cb || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return host_func(stream, false, [cb, stream, data] { cb(stream, callback_status(), data); });
}
CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream stream, CUstreamCallback cb, void* data, unsigned int flags) {
  if (!cb || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return host_func(stream, true, [cb, stream, data] { cb(stream, callback_status(), data); });
}

// ---- events

CUresult CUDAAPI cuEventCreate(CUevent* out, unsigned int flags) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned kKnown = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  if (flags & CU_EVENT_INTERPROCESS) return CUDA_ERROR_NOT_SUPPORTED;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Event e;
  const Status s = c->event_create(&e, flags);
  if (ok(s)) *out = reinterpret_cast<CUevent>(uintptr_t(e.handle));
  return to_cu(s);
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent event) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->event_destroy(to_event(event)));
}

CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, false, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->event_record(to_event(event), s));
}
CUresult CUDAAPI cuEventRecord_ptsz(CUevent event, CUstream stream) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Stream s;
  if (!from_handle(c, stream, true, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->event_record(to_event(event), s));
}
CUresult CUDAAPI cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags) {
  if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  return cuEventRecord(event, stream);
}
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent event, CUstream stream, unsigned int flags) {
  if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  return cuEventRecord_ptsz(event, stream);
}

CUresult CUDAAPI cuEventSynchronize(CUevent event) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->event_synchronize(to_event(event)));
}

CUresult CUDAAPI cuEventQuery(CUevent event) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->event_query(to_event(event)));
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
  return to_cu(c->event_elapsed(ms, to_event(start), to_event(end)));
}
CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime_v2(ms, start, end);
}

// ---- modules, libraries, kernels

CUresult CUDAAPI cuModuleLoadData(CUmodule* out, const void* image) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Module* m = nullptr;
  if (CUresult e = load_module(image, &m); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* out, const void* image, unsigned int, CUjit_option*, void**) {
  return cuModuleLoadData(out, image);  // JIT options concern PTX compilation, done on the host
}
CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* out, const void* image) { return cuModuleLoadData(out, image); }

CUresult CUDAAPI cuModuleUnload(CUmodule m) {
  Module* mod = module_of(m);
  if (!mod) return CUDA_ERROR_INVALID_HANDLE;
  return unload_module(mod);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* out, CUmodule m, const char* name) {
  Function* f = nullptr;
  if (CUresult e = get_function(module_of(m), name, &f); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* addr, size_t* size, CUmodule m, const char* name) {
  Module* mod = module_of(m);
  return get_global(mod, name, addr, size, mod ? mod->device : 0);
}
CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* addr, size_t* size, CUlibrary lib, const char* name) {
  return get_global(module_of(lib), name, addr, size, this_device());  // a library serves every context
}

CUresult CUDAAPI cuLibraryLoadData(CUlibrary* out, const void* image, CUjit_option*, void**, unsigned int,
                                   CUlibraryOption*, void**, unsigned int) {
  // Options: JIT options (host-side) and CU_LIBRARY_BINARY_IS_PRESERVED (the
  // image is copied to the worker at once either way).
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Module* m = nullptr;
  if (CUresult e = load_module(image, &m); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUlibrary>(m);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary lib) {
  Module* m = module_of(lib);
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  return unload_module(m);
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel* out, CUlibrary lib, const char* name) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Function* f = nullptr;
  if (CUresult e = get_function(module_of(lib), name, &f); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUkernel>(f);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryGetModule(CUmodule* out, CUlibrary lib) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Module* m = module_of(lib);
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction* out, CUkernel k) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!function_of(k)) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUfunction>(k);  // kernel ids serve every device: a kernel is its function everywhere
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetLibrary(CUlibrary* out, CUkernel k) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(k);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUlibrary>(f->module);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetModule(CUmodule* out, CUfunction fn) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUmodule>(f->module);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction fn) {
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  *name = f->name.c_str();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel k) {
  return cuFuncGetName(name, reinterpret_cast<CUfunction>(k));
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction fn, size_t index, size_t* offset, size_t* size) {
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (!f->layout) return CUDA_ERROR_INVALID_IMAGE;
  if (index >= f->layout->params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = f->layout->params[index].offset;
  if (size) *size = f->layout->params[index].size;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuKernelGetParamInfo(CUkernel k, size_t index, size_t* offset, size_t* size) {
  return cuFuncGetParamInfo(reinterpret_cast<CUfunction>(k), index, offset, size);
}

// Function attributes: the limits of the device; per-kernel resource use
// (registers, local memory) is the host compiler's and is not reported.
CUresult func_attribute(int* value, CUfunction_attribute attr, CUfunction fn, CUdevice dev) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  const int cc = d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] * 10 +
                 d->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = d->attrs[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = cc; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = f->max_dynamic_smem.load(); break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *value = -1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncGetAttribute(int* value, CUfunction_attribute attr, CUfunction fn) {
  return func_attribute(value, attr, fn, this_device());
}
CUresult CUDAAPI cuKernelGetAttribute(int* value, CUfunction_attribute attr, CUkernel k, CUdevice dev) {
  return func_attribute(value, attr, reinterpret_cast<CUfunction>(k), dev);
}

// A kernel's attributes are kept once for every device (the session's devices are alike).
CUresult func_set_attribute(CUfunction fn, CUfunction_attribute attr, int value, CUdevice dev) {
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(dev, &d); e != CUDA_SUCCESS) return e;
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      if (value < 0 || value > d->attrs[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN])
        return CUDA_ERROR_INVALID_VALUE;
      f->max_dynamic_smem.store(value);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: return CUDA_SUCCESS;  // hints
    default: return CUDA_ERROR_INVALID_VALUE;
  }
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

CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, CUfunction fn, int block_size,
                                                                      size_t smem, unsigned int) {
  if (!blocks || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!function_of(fn)) return CUDA_ERROR_INVALID_HANDLE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  const int warp = std::max(1, d->attrs[CU_DEVICE_ATTRIBUTE_WARP_SIZE]);
  const int threads = (block_size + warp - 1) / warp * warp;
  int n = std::min(d->attrs[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] / threads,
                   d->attrs[CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR]);
  if (smem) n = std::min<int>(n, int(d->attrs[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] / smem));
  *blocks = std::max(0, n);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction fn, int block_size,
                                                             size_t smem) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, fn, block_size, smem, 0);
}
CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t* smem, CUfunction fn, int blocks, int) {
  if (!smem || blocks <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!function_of(fn)) return CUDA_ERROR_INVALID_HANDLE;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  *smem = std::min<size_t>(size_t(d->attrs[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR]) / size_t(blocks),
                           size_t(d->attrs[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN]));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* clusters, CUfunction fn, const CUlaunchConfig* config) {
  if (!clusters || !config) return CUDA_ERROR_INVALID_VALUE;
  unsigned size = 1;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      const auto& d = config->attrs[i].value.clusterDim;
      size = std::max(1u, d.x) * std::max(1u, d.y) * std::max(1u, d.z);
    }
  int per_sm = 0;
  const int threads = int(config->blockDimX * config->blockDimY * config->blockDimZ);
  if (CUresult e = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&per_sm, fn, threads, config->sharedMemBytes, 0);
      e != CUDA_SUCCESS)
    return e;
  const DeviceCache* d = nullptr;
  if (CUresult e = device_cache(this_device(), &d); e != CUDA_SUCCESS) return e;
  *clusters = int(int64_t{per_sm} * d->attrs[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] / size);
  return CUDA_SUCCESS;
}

// ---- launches

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned smem, CUstream stream, void** params, void** extra) {
  return launch(function_of(f), {gx, gy, gz}, {bx, by, bz}, smem, stream, params, extra, false);
}
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned smem, CUstream stream, void** params, void** extra) {
  return launch(function_of(f), {gx, gy, gz}, {bx, by, bz}, smem, stream, params, extra, true);
}

// Attributes that change nothing a program can observe here: accepted. The rest
// (clusters, cooperative launches, launch-completion events...) change what
// the kernel may do or what it signals, and are refused rather than dropped.
CUresult check_launch_attributes(const CUlaunchConfig* config) {
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    switch (config->attrs[i].id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      // Stream order is kept in full; allowing overlap with the previous kernel is only permission.
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: continue;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: {
        const auto& d = config->attrs[i].value.clusterDim;
        if (d.x <= 1 && d.y <= 1 && d.z <= 1) continue;
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
        if (!config->attrs[i].value.cooperative) continue;
        return CUDA_ERROR_NOT_SUPPORTED;
      default: return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = check_launch_attributes(config); e != CUDA_SUCCESS) return e;
  return launch(function_of(f), {config->gridDimX, config->gridDimY, config->gridDimZ},
                {config->blockDimX, config->blockDimY, config->blockDimZ}, config->sharedMemBytes, config->hStream,
                params, extra, false);
}
CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = check_launch_attributes(config); e != CUDA_SUCCESS) return e;
  return launch(function_of(f), {config->gridDimX, config->gridDimY, config->gridDimZ},
                {config->blockDimX, config->blockDimY, config->blockDimZ}, config->sharedMemBytes, config->hStream,
                params, extra, true);
}

}  // extern "C"

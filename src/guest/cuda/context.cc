// Contexts: one primary context per device and those cuCtxCreate makes, each
// thread's stack of current contexts, the client's per-thread device following
// it, context-local storage (dark_api.cc) and peer access.
#include "state.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <memory>
#include <mutex>
#include <vector>

#include "driver.h"
#include "graph.h"

namespace ordo::driver {

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

namespace {

Context g_primaries[ordo::kMaxDevices];  // device d's is g_primaries[d]
std::atomic<unsigned long long> g_next_ctx_id{1};
std::mutex g_ctx_mu;
std::vector<std::unique_ptr<Context>> g_contexts;  // created with cuCtxCreate; never freed (handles stay checkable)

// Set when this thread's context stack is destroyed: the thread is ending or,
// for the main thread, the program is exiting. exit() destroys the main
// thread's thread_local objects (this stack, the client's per-thread state)
// first, then runs the atexit handlers newest first: those registered after
// cuInit (cuFFT's, which frees its buffers) run before ordo's own sets
// g_exiting. From then on calls answer CUDA_ERROR_DEINITIALIZED (enter()) and
// see no current context instead of reading destroyed state. A bool has no
// destructor: still readable then.
thread_local bool t_torn_down = false;
struct ContextStack {
  std::vector<Context*> v;
  ~ContextStack() { t_torn_down = true; }
};
thread_local ContextStack t_ctx_stack_holder;
// Only after checking t_torn_down.
std::vector<Context*>& ctx_stack() { return t_ctx_stack_holder.v; }
// This thread's device as the client has it (Client::set_device); the client
// starts every thread on device 0.
thread_local uint32_t t_client_device = 0;

// A primary context is told by its address, without the lock: cls_get asks on every runtime call.
Context* primary_of_handle(CUcontext h) {
  const auto p = reinterpret_cast<uintptr_t>(h), first = reinterpret_cast<uintptr_t>(&g_primaries[0]);
  if (p < first || (p - first) % sizeof(Context) != 0) return nullptr;
  const uintptr_t i = (p - first) / sizeof(Context);
  return i < uintptr_t(g_device_count.load(std::memory_order_relaxed)) ? &g_primaries[i] : nullptr;
}

}  // namespace

Context* context_of(CUcontext h) {
  if (Context* p = primary_of_handle(h)) return p;
  auto* c = reinterpret_cast<Context*>(h);
  std::lock_guard lock(g_ctx_mu);
  for (auto& p : g_contexts)
    if (p.get() == c) return c;
  return nullptr;
}

bool thread_torn_down() { return t_torn_down; }

Context* current() {
  if (t_torn_down) return nullptr;
  const std::vector<Context*>& stack = ctx_stack();
  return stack.empty() ? nullptr : stack.back();
}

CUdevice this_device() {
  const Context* x = current();
  return x ? x->device : CUdevice(t_client_device);
}

Context* primary_ctx(CUdevice dev) { return &g_primaries[dev]; }

CUdevice device_of(const Context* c) { return c->device; }

uint32_t client_device() { return t_client_device; }

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

// ================================================================ for dark_api.cc

CUresult primary_context(CUdevice dev, CUcontext* out) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
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

namespace {

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

}  // namespace

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

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

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (flags & ~unsigned(CU_CTX_FLAGS_MASK)) return CUDA_ERROR_INVALID_VALUE;
  g_primaries[dev].flags = flags;
  return CUDA_SUCCESS;
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

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* ctx) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  *ctx = handle(current());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_torn_down) return CUDA_ERROR_DEINITIALIZED;
  std::vector<Context*>& stack = ctx_stack();
  if (!ctx) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  Context* c = context_of(ctx);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty()) stack.push_back(c);
  else stack.back() = c;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_torn_down) return CUDA_ERROR_DEINITIALIZED;
  Context* c = context_of(ctx);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  ctx_stack().push_back(c);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_torn_down) return CUDA_ERROR_DEINITIALIZED;
  std::vector<Context*>& stack = ctx_stack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = handle(stack.back());
  stack.pop_back();
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
  ctx_stack().push_back(raw);  // enter() succeeded: the stack is there
  *ctx = handle(raw);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  ordo::Client* cl = nullptr;
  if (CUresult e = enter(&cl); e != CUDA_SUCCESS) return e;
  Context* c = context_of(ctx);
  if (!c || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  std::erase(ctx_stack(), c);
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
  if (CUresult e = capture_check_unsafe(); e != CUDA_SUCCESS) return e;
  return to_cu(c->device_synchronize());
}
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Context* x = ctx ? context_of(ctx) : current();
  if (ctx && !x) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult e = capture_check_unsafe(); e != CUDA_SUCCESS) return e;
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

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return peer_access(peer, true);
}
CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peer) { return peer_access(peer, false); }

}  // extern "C"

// The cuda backend: runs a guest's work on real GPUs, one or several host
// devices that the guest numbers 0..n-1 in the order they were given.
//
// Linking: the static CUDA runtime only, so that ordo-worker starts (and falls
// back to sim) on a machine without a driver or a libcudart.so.13; the driver
// API (modules, cuLaunchKernel) is reached through
// cudaGetDriverEntryPointByVersion instead of linking libcuda.
//
// Handles: the worker hands us small ids (stream = ring index, event = event
// slot, module = module slot) that it has already checked against what this
// guest was given; we map them to CUDA objects and still reject ids we never
// created. Device addresses are real CUdeviceptr values. Every copy and memset
// the worker asks for is checked against the allocations and module variables
// of this backend (interval maps), and host operands against the memory
// registered with register_host_memory (the shared region). Kernel arguments
// cannot be checked: a kernel can be handed any device address, as in native
// CUDA; it can only reach this worker's own contexts, i.e. this guest's memory.
//
// Devices: each has its primary context, which every call makes current on
// the calling thread before it touches the device (bind). Streams, events and
// allocations remember their device; stream d (< device count) is device d's
// legacy default stream. A module is loaded into a device's context the first
// time that device uses it (device 0 at once), so each device has its own
// copy of the module's variables, while kernel ids are the session's.
//
// Threads: the worker calls us from its one dispatch thread, which must never
// wait for the GPU. Completions (fences, a shared-ring stream synchronize,
// EventSynchronize) come back from a thread polling events, one per device
// (cuda_completions.h), which also answers after a device error, so a guest
// waiting on a fence is answered (with the error) instead of hanging. Host
// functions are stream work (later work waits for them) and run from
// cudaStreamAddCallback on CUDA's callback thread, which unlike
// cudaLaunchHostFunc also runs after an error.
// The only calls that can wait for device work are cudaFree (a guest frees
// only after waiting for its work; one that does not stalls only its own
// worker, and the implicit sync is what keeps queued kernels from using freed
// memory) and the destructor.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_backend.h"
#include "cuda_completions.h"
#include "ordo/layout.h"
#include "transport/module_image.h"

namespace {
#include "cuda_builtins_fatbin.h"  // static const unsigned char ordo_cuda_builtins[] (bin2c)
}

namespace ordo::cuda {
namespace {

constexpr uint32_t kMaxNotifyStreams = 64;  // one per guest thread that can wait at once (slot_count)
constexpr uint64_t kMaxBlockThreads = 1024;
constexpr size_t kMaxParams = 4096;         // the driver allows 32764 bytes of parameters
constexpr uint32_t kEventFlags = cudaEventBlockingSync | cudaEventDisableTiming;  // no IPC events

// cudaError_t and CUresult share their numbers for everything a backend returns
// (400 invalid handle, 700 illegal address, 719 launch failure, ...), and
// ordo::Status uses CUDA's numbers, so the value passes through unchanged.
Status to_status(cudaError_t e) { return static_cast<Status>(int32_t(e)); }
Status to_status(CUresult r) { return static_cast<Status>(int32_t(r)); }
static_assert(int(Status::kPeerAccessUnsupported) == cudaErrorPeerAccessUnsupported &&
              int(Status::kPeerAccessAlreadyEnabled) == cudaErrorPeerAccessAlreadyEnabled &&
              int(Status::kPeerAccessNotEnabled) == cudaErrorPeerAccessNotEnabled &&
              int(Status::kInvalidDevice) == cudaErrorInvalidDevice);

void log(const char* fmt, const char* a = "", const char* b = "") {
  std::fprintf(stderr, "ordo-worker: cuda: ");
  std::fprintf(stderr, fmt, a, b);
  std::fprintf(stderr, "\n");
}

}  // namespace

// cuModuleLoadData takes a bare pointer and guesses the format from the bytes,
// so only the formats we can check get through: a fatbin container, a 64-bit
// ELF cubin, or PTX text. Anything else is refused, in particular nvcc's
// fatbin wrapper, which holds a pointer to the fatbin: the driver would follow
// an address chosen by the guest. A fatbin or cubin tells the driver its own
// sizes and the driver trusts them, so every stated size must stay inside the
// bytes the guest actually sent. The formats and the checks are
// transport/module_image.h's, the reader libcuda.so.1 walks images with too.
bool check_module_image(std::span<const std::byte> img, std::string* why) {
  return image::validate_module_image(img, why);
}

namespace {

// The driver functions we use, at the ABI version these typedefs describe.
struct Driver {
  PFN_cuModuleLoadData_v2000 module_load_data = nullptr;
  PFN_cuModuleUnload_v2000 module_unload = nullptr;
  PFN_cuModuleGetFunction_v2000 module_get_function = nullptr;
  PFN_cuModuleGetGlobal_v3020 module_get_global = nullptr;
  PFN_cuLaunchKernel_v4000 launch_kernel = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuFuncGetParamInfo_v12040 func_get_param_info = nullptr;  // optional: drivers before 12.4 lack it

  template <class F>
  static bool get(const char* name, unsigned version, F* out, bool required, std::string* error) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableLegacyStream, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
      if (required && error) {
        *error = std::string("the CUDA driver has no ") + name + " (cudaGetDriverEntryPointByVersion: " +
                 cudaGetErrorName(e) + ", query result " + std::to_string(int(q)) +
                 "); update the NVIDIA driver or use --backend sim";
      }
      return !required;
    }
    *out = reinterpret_cast<F>(fn);
    return true;
  }

  bool load(std::string* error) {
    // Asked for as of CUDA 12.0 (12.4 for cuFuncGetParamInfo): none of these
    // changed its ABI since the version in its typedef's name.
    return get("cuModuleLoadData", 12000, &module_load_data, true, error) &&
           get("cuModuleUnload", 12000, &module_unload, true, error) &&
           get("cuModuleGetFunction", 12000, &module_get_function, true, error) &&
           get("cuModuleGetGlobal", 12000, &module_get_global, true, error) &&
           get("cuLaunchKernel", 12000, &launch_kernel, true, error) &&
           get("cuCtxGetCurrent", 12000, &ctx_get_current, true, error) &&
           get("cuCtxSetCurrent", 12000, &ctx_set_current, true, error) &&
           get("cuFuncGetParamInfo", 12040, &func_get_param_info, false, error);
  }
};

}  // namespace

class CudaBackend final : public Backend {
 public:
  // `ordinals`: host devices by guest device index, checked by make_cuda_backend.
  static std::unique_ptr<Backend> create(const std::vector<int>& ordinals, std::string* error) {
    std::unique_ptr<CudaBackend> b(new CudaBackend(ordinals));
    if (!b->init(error)) return nullptr;
    return b;
  }

  ~CudaBackend() override {
    // Pending callbacks point at this object; let every queued piece of work end.
    // A device whose context init() never got has nothing queued.
    for (uint32_t d = 0; d < device_count(); ++d) {
      if (!devices_[d].ctx) continue;
      bind(d);
      cudaDeviceSynchronize();
    }
    for (uint32_t d = 0; d < device_count(); ++d) {
      if (!devices_[d].completions) continue;
      bind(d);  // it destroys its device's events here
      devices_[d].completions.reset();  // answers what it still watches, then stops
    }
    std::lock_guard lk(mu_);
    for (uint32_t i = kMaxDevices; i < kMaxStreams; ++i) {
      if (!streams_[i].handle) continue;
      bind(streams_[i].device);
      cudaStreamDestroy(streams_[i].handle);
    }
    for (uint32_t d = 0; d < device_count(); ++d) {
      for (auto& n : devices_[d].notify) {
        bind(d);
        cudaStreamDestroy(n->stream);
      }
    }
    for (auto& [id, ev] : events_) {
      bind(ev.device);
      cudaEventDestroy(ev.handle);
    }
    for (auto& [id, mod] : modules_) unload_everywhere(mod);
    for (auto& [addr, a] : allocs_) {
      bind(a.device);
      cudaFree(reinterpret_cast<void*>(addr));
    }
    for (auto& r : host_ranges_)
      if (r.pinned) cudaHostUnregister(reinterpret_cast<void*>(r.base));
  }

  std::string_view name() const override { return "cuda"; }
  uint32_t device_count() const override { return uint32_t(devices_.size()); }

  void register_host_memory(void* base, uint64_t size) override {
    if (!base || size == 0) return;
    bind(0);
    // Pinning lets copies DMA straight from the shared region. Without it they
    // still work, but pageable copies are staged by the driver and a D2H copy
    // into pageable memory holds the dispatch thread until it is done.
    // Portable: pinned for every device's context, not only the current one's.
    cudaError_t e = cudaHostRegister(base, size, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it so it is not reported later
      log("cudaHostRegister of the shared region failed (%s): copies will be pageable and slower", cudaGetErrorName(e));
    }
    std::lock_guard lk(mu_);
    host_ranges_.push_back({reinterpret_cast<uintptr_t>(base), size, e == cudaSuccess});
  }

  Status stream_create(uint32_t stream, uint32_t device, bool blocking, int priority) override {
    // Ids below kMaxDevices name the devices' legacy streams, which exist from the start.
    if (stream < kMaxDevices || stream >= kMaxStreams) return Status::kInvalidValue;
    if (device >= device_count()) return Status::kInvalidDevice;
    std::lock_guard lk(mu_);
    if (streams_[stream].handle) return Status::kInvalidResourceHandle;
    bind(device);
    cudaStream_t s = nullptr;
    // The driver clamps the priority into the device's range, as cudaStreamCreateWithPriority does for a program.
    cudaError_t e = cudaStreamCreateWithPriority(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking, priority);
    if (e != cudaSuccess) return to_status(e);
    streams_[stream] = {s, device, OpTag{}};
    return Status::kSuccess;
  }

  Status stream_destroy(uint32_t stream) override {
    if (stream < kMaxDevices || stream >= kMaxStreams) return Status::kInvalidResourceHandle;
    std::lock_guard lk(mu_);
    StreamEntry& st = streams_[stream];
    if (!st.handle) return Status::kInvalidResourceHandle;
    bind(st.device);
    return to_status(cudaStreamDestroy(std::exchange(st.handle, nullptr)));  // queued work and callbacks still run
  }

  Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) override {
    if (p.grid.x == 0 || p.grid.y == 0 || p.grid.z == 0 || p.block.x == 0 || p.block.y == 0 || p.block.z == 0 ||
        uint64_t{p.block.x} * p.block.y * p.block.z > kMaxBlockThreads)
      return Status::kInvalidConfiguration;
    if (p.args_size != 0 && p.args == nullptr) return Status::kInvalidValue;
    std::lock_guard lk(mu_);
    StreamEntry* st = find_stream(stream);
    if (!st) return Status::kInvalidResourceHandle;
    uint32_t slot = 0;
    if (!kernel_slots_.find(p.kernel, &slot) || kernels_[slot].fn.empty()) return Status::kInvalidDeviceFunction;
    Kernel& k = kernels_[slot];
    // The driver reads as many parameter bytes as the kernel declares: a short
    // buffer would make it read past the guest's argument bytes.
    size_t size = p.args_size;
    if (k.param_bytes_known) {
      if (p.args_size < k.param_bytes) return Status::kInvalidValue;
      size = k.param_bytes;
    }
    bind(st->device);
    CUfunction fn = nullptr;
    if (Status s = function_on(k, st->device, &fn); !ok(s)) return s;
    // The driver copies the parameters before cuLaunchKernel returns, so the
    // staging bytes may be reused as soon as we are back.
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(p.args), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CUresult r = drv_.launch_kernel(fn, p.grid.x, p.grid.y, p.grid.z, p.block.x, p.block.y, p.block.z, p.shared_mem,
                                    reinterpret_cast<CUstream>(st->handle), nullptr, size ? extra : nullptr);
    if (r != CUDA_SUCCESS) return to_status(r);
    st->last_tag = tag;
    return Status::kSuccess;
  }

  Status memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size, const OpTag& tag) override {
    std::lock_guard lk(mu_);
    StreamEntry* st = find_stream(stream);
    if (!st) return Status::kInvalidResourceHandle;
    if (size == 0) return Status::kSuccess;
    uint32_t dst_dev = 0, src_dev = 0;
    if (Status s = check_operand(dst, size, &dst_dev); !ok(s)) return s;
    if (Status s = check_operand(src, size, &src_dev); !ok(s)) return s;
    bind(st->device);
    void* to = reinterpret_cast<void*>(uintptr_t(dst.addr));
    const void* from = reinterpret_cast<const void*>(uintptr_t(src.addr));
    cudaError_t e;
    if (dst.device && src.device && dst_dev != src_dev) {
      // Between two devices: the driver goes over the peer link where there is
      // one and through the host otherwise, peer access enabled or not.
      e = cudaMemcpyPeerAsync(to, devices_[dst_dev].ordinal, from, devices_[src_dev].ordinal, size, st->handle);
    } else {
      const cudaMemcpyKind kind = dst.device ? (src.device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                             : (src.device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
      e = cudaMemcpyAsync(to, from, size, kind, st->handle);
    }
    if (e != cudaSuccess) return to_status(e);
    st->last_tag = tag;
    return Status::kSuccess;
  }

  Status memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size, const OpTag& tag) override {
    std::lock_guard lk(mu_);
    StreamEntry* st = find_stream(stream);
    if (!st) return Status::kInvalidResourceHandle;
    if (size == 0) return Status::kSuccess;
    if (Status s = check_device(dst, size); !ok(s)) return s;
    bind(st->device);
    cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(uintptr_t(dst)), value, size, st->handle);
    if (e != cudaSuccess) return to_status(e);
    st->last_tag = tag;
    return Status::kSuccess;
  }

  Status event_create(uint32_t event, uint32_t device, uint32_t flags) override {
    if (event >= kMaxBackendEvents || (flags & ~kEventFlags)) return Status::kInvalidValue;
    if (device >= device_count()) return Status::kInvalidDevice;
    std::lock_guard lk(mu_);
    if (events_.count(event)) return Status::kInvalidResourceHandle;
    bind(device);
    cudaEvent_t ev = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&ev, flags); e != cudaSuccess) return to_status(e);
    events_.emplace(event, EventEntry{ev, device});
    return Status::kSuccess;
  }

  Status event_destroy(uint32_t event) override {
    std::lock_guard lk(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return Status::kInvalidResourceHandle;
    const EventEntry ev = it->second;
    events_.erase(it);
    bind(ev.device);
    return to_status(cudaEventDestroy(ev.handle));  // streams already waiting on it keep their wait
  }

  Status event_record(uint32_t stream, uint32_t event) override {
    std::lock_guard lk(mu_);
    const StreamEntry* st = find_stream(stream);
    const EventEntry* ev = find_event(event);
    // CUDA records an event only on a stream of the event's device.
    if (!st || !ev || ev->device != st->device) return Status::kInvalidResourceHandle;
    bind(st->device);
    return to_status(cudaEventRecord(ev->handle, st->handle));
  }

  Status stream_wait_event(uint32_t stream, uint32_t event) override {
    std::lock_guard lk(mu_);
    const StreamEntry* st = find_stream(stream);
    const EventEntry* ev = find_event(event);
    if (!st || !ev) return Status::kInvalidResourceHandle;
    bind(st->device);
    return to_status(cudaStreamWaitEvent(st->handle, ev->handle, 0));  // the event may be another device's
  }

  Status event_query(uint32_t event) override {
    std::lock_guard lk(mu_);
    const EventEntry* ev = find_event(event);
    if (!ev) return Status::kInvalidResourceHandle;
    bind(ev->device);
    return to_status(cudaEventQuery(ev->handle));  // cudaErrorNotReady is 600, Status::kNotReady
  }

  Status event_elapsed(uint32_t start, uint32_t end, float* ms) override {
    if (!ms) return Status::kInvalidValue;
    std::lock_guard lk(mu_);
    const EventEntry* a = find_event(start);
    const EventEntry* b = find_event(end);
    if (!a || !b) return Status::kInvalidResourceHandle;
    bind(a->device);
    return to_status(cudaEventElapsedTime(ms, a->handle, b->handle));  // CUDA refuses two devices' events
  }

  void event_notify(uint32_t event, std::function<void()> fn) override {
    std::unique_lock lk(mu_);
    const EventEntry* ev = find_event(event);
    if (!ev) {
      lk.unlock();
      return run_guarded(fn);  // nothing to wait for
    }
    // A private stream of the event's device waits for the event's current
    // capture (a later re-record does not move it), then answers from a
    // callback. Each pending wait gets an idle stream of its own where possible,
    // so a quick event is not answered behind a slow one.
    const uint32_t d = ev->device;
    bind(d);
    NotifyStream* n = pick_notify_stream(d);
    if (!n) {
      lk.unlock();
      return run_guarded(fn);
    }
    if (cudaError_t e = cudaStreamWaitEvent(n->stream, ev->handle, 0); e != cudaSuccess) {
      lk.unlock();
      log("cudaStreamWaitEvent for an event wait failed (%s)", cudaGetErrorName(e));
      return run_guarded(fn);
    }
    enqueue_completion(d, n->stream, std::move(fn), nullptr, &n->pending, lk);
  }

  // A host callback is stream work (later work waits for fn); a notification is not.
  void host_callback(uint32_t stream, std::function<void()> fn) override { after_stream(stream, std::move(fn), true); }
  void stream_notify(uint32_t stream, std::function<void()> fn) override { after_stream(stream, std::move(fn), false); }

  bool context_lost() const override { return lost_.load(std::memory_order_relaxed); }

  // Runs fn once the work now on `stream` is done. A device error that reaches
  // it is reported to whoever issued the stream's last work: usually the thread
  // now synchronizing on it.
  void after_stream(uint32_t stream, std::function<void()> fn, bool as_work) {
    std::unique_lock lk(mu_);
    const StreamEntry* st = find_stream(stream);
    if (!st) {
      lk.unlock();
      return run_guarded(fn);  // unknown stream: nothing to wait for
    }
    bind(st->device);
    const OpTag tag = st->last_tag;
    if (as_work)
      enqueue_callback(st->handle, std::move(fn), &tag, nullptr, lk);
    else
      enqueue_completion(st->device, st->handle, std::move(fn), &tag, nullptr, lk);
  }

  Status malloc(uint32_t device, uint64_t size, uint64_t* device_addr) override {
    if (!device_addr || size == 0) return Status::kInvalidValue;
    if (device >= device_count()) return Status::kInvalidDevice;
    bind(device);
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, size); e != cudaSuccess) {
      cudaGetLastError();  // out of memory is not sticky
      return to_status(e);
    }
    std::lock_guard lk(mu_);
    allocs_.emplace(reinterpret_cast<uintptr_t>(p), Alloc{size, device});
    *device_addr = reinterpret_cast<uintptr_t>(p);
    return Status::kSuccess;
  }

  Status free(uint64_t device_addr) override {
    if (device_addr == 0) return Status::kSuccess;  // like cudaFree(nullptr)
    std::lock_guard lk(mu_);
    auto it = allocs_.find(device_addr);
    if (it == allocs_.end()) return Status::kInvalidDevicePointer;  // only what malloc returned, and only once
    const uint32_t d = it->second.device;
    allocs_.erase(it);
    bind(d);
    return to_status(cudaFree(reinterpret_cast<void*>(uintptr_t(device_addr))));
  }

  Status module_load(uint32_t module, std::span<const std::byte> image) override {
    if (module == 0 || image.empty()) return Status::kInvalidValue;  // 0: the built-in kernels
    std::string why;
    if (!check_module_image(image, &why)) {
      log("rejected module image: %s", why.c_str());
      return to_status(CUDA_ERROR_INVALID_IMAGE);  // what the driver answers for an image it cannot parse
    }
    std::lock_guard lk(mu_);
    if (modules_.count(module)) return Status::kInvalidResourceHandle;
    if (modules_.size() > kMaxModules) return Status::kMemoryAllocation;  // ids are the worker's; the count is ours
    return add_module(module, image);
  }

  Status module_unload(uint32_t module) override {
    if (module == 0) return Status::kInvalidResourceHandle;  // the built-in kernels stay
    std::lock_guard lk(mu_);
    auto it = modules_.find(module);
    if (it == modules_.end()) return Status::kInvalidResourceHandle;
    Module mod = std::move(it->second);
    modules_.erase(it);
    // Its kernels' slots are free for reuse; their old ids stop launching (KernelIds).
    auto first = kernel_ids_.lower_bound({module, std::string()}), last = first;
    for (; last != kernel_ids_.end() && last->first.first == module; ++last) {
      uint32_t slot = 0;
      if (kernel_slots_.find(last->second, &slot)) kernels_[slot] = Kernel{};
      kernel_slots_.release(last->second);
    }
    kernel_ids_.erase(first, last);
    std::erase_if(globals_, [module](const auto& g) { return g.second.module == module; });
    return unload_everywhere(mod);
  }

  Status module_global(uint32_t module, uint32_t device, std::string_view name, uint64_t, uint64_t* addr,
                       uint64_t* size) override {
    if (name.empty() || name.find('\0') != std::string_view::npos) return Status::kInvalidValue;
    if (device >= device_count()) return Status::kInvalidDevice;
    std::lock_guard lk(mu_);
    bind(device);
    CUmodule mod = nullptr;
    if (Status st = module_on(module, device, &mod); !ok(st)) return st;
    CUdeviceptr p = 0;
    size_t n = 0;
    const CUresult r = drv_.module_get_global(&p, &n, mod, std::string(name).c_str());
    if (r == CUDA_ERROR_NOT_FOUND) return Status::kInvalidDeviceFunction;
    if (r != CUDA_SUCCESS) return Status::kInvalidValue;
    // Copies and memsets may target the variable, as they may an allocation.
    if (n) globals_[p] = Global{n, device, module};
    *addr = p;
    *size = n;
    return Status::kSuccess;
  }

  Status kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) override {
    if (!kernel || name.empty() || name.find('\0') != std::string_view::npos) return Status::kInvalidValue;
    std::lock_guard lk(mu_);
    auto mit = modules_.find(module);
    if (mit == modules_.end()) return module == 0 ? Status::kInvalidDeviceFunction : Status::kInvalidResourceHandle;
    std::pair<uint32_t, std::string> key{module, std::string(name)};
    if (auto it = kernel_ids_.find(key); it != kernel_ids_.end()) {
      *kernel = it->second;  // repeated lookups do not grow the table
      return Status::kSuccess;
    }
    if (kernel_slots_.full()) return Status::kMemoryAllocation;
    // Looked up in device 0's copy, which every module has (add_module); other
    // devices find the function the first time it runs there (function_on).
    bind(0);
    CUfunction fn = nullptr;
    CUresult r = drv_.module_get_function(&fn, mit->second.on[0], key.second.c_str());
    if (r == CUDA_ERROR_NOT_FOUND) return Status::kInvalidDeviceFunction;
    if (r != CUDA_SUCCESS) return to_status(r);
    Kernel k;
    k.module = module;
    k.name = key.second;
    k.fn.assign(device_count(), nullptr);
    k.fn[0] = fn;
    if (drv_.func_get_param_info) {
      // The parameter buffer's size: the end of the last parameter.
      size_t i = 0, off = 0, sz = 0;
      for (; i < kMaxParams && drv_.func_get_param_info(fn, i, &off, &sz) == CUDA_SUCCESS; ++i)
        k.param_bytes = std::max(k.param_bytes, off + sz);
      k.param_bytes_known = i < kMaxParams;
    }
    uint32_t id = 0, slot = 0;
    kernel_slots_.acquire(&id);  // not full(): checked above
    kernel_slots_.find(id, &slot);
    if (slot >= kernels_.size()) kernels_.resize(slot + 1);
    kernels_[slot] = std::move(k);
    kernel_ids_.emplace(std::move(key), id);
    *kernel = id;
    return Status::kSuccess;
  }

  Status device_info(uint32_t device, DeviceInfo* out) override {
    if (!out) return Status::kInvalidValue;
    if (device >= device_count()) return Status::kInvalidDevice;
    *out = devices_[device].info;
    return Status::kSuccess;
  }

  Status device_attributes(uint32_t device, uint32_t first, int32_t* out) override {
    if (first % kDeviceAttributesPerCall || first >= kDeviceAttributeCount) return Status::kInvalidValue;
    if (device >= device_count()) return Status::kInvalidDevice;
    std::memcpy(out, devices_[device].attrs + first, kDeviceAttributesPerCall * sizeof(int32_t));
    return Status::kSuccess;
  }

  bool can_access_peer(uint32_t device, uint32_t peer) override {
    if (device >= device_count() || peer >= device_count() || device == peer) return false;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, devices_[device].ordinal, devices_[peer].ordinal) != cudaSuccess) {
      cudaGetLastError();  // not sticky
      return false;
    }
    return can != 0;
  }

  Status set_peer_access(uint32_t device, uint32_t peer, bool enable) override {
    if (device >= device_count() || peer >= device_count() || device == peer) return Status::kInvalidDevice;
    bind(device);  // CUDA enables access from the current device
    const int to = devices_[peer].ordinal;
    const cudaError_t e = enable ? cudaDeviceEnablePeerAccess(to, 0) : cudaDeviceDisablePeerAccess(to);
    if (e != cudaSuccess) cudaGetLastError();  // already enabled, not enabled, unsupported: none is sticky
    return to_status(e);
  }

 private:
  struct StreamEntry {
    cudaStream_t handle = nullptr;  // null: no such stream
    uint32_t device = 0;
    OpTag last_tag;  // who issued its latest work, told about errors found when waiting for it
  };
  struct EventEntry {
    cudaEvent_t handle;
    uint32_t device;
  };
  struct Module {
    std::vector<CUmodule> on;     // by device; null until loaded there
    std::vector<uint64_t> image;  // padded(), for devices still to load it; empty with one device
  };
  struct Kernel {
    uint32_t module = 0;
    std::string name;
    std::vector<CUfunction> fn;  // by device, null until first launched there; empty while the slot is free
    size_t param_bytes = 0;
    bool param_bytes_known = false;
  };
  struct Alloc {
    uint64_t size;
    uint32_t device;
  };
  struct Global {  // a module variable copies may target (module_global)
    uint64_t size;
    uint32_t device;
    uint32_t module;
  };
  struct HostRange {
    uintptr_t base;
    uint64_t size;
    bool pinned;
  };
  struct NotifyStream {
    cudaStream_t stream = nullptr;
    std::atomic<uint32_t> pending{0};  // callbacks not yet run
  };
  struct Device {
    int ordinal = -1;          // the host's CUDA ordinal
    CUcontext ctx = nullptr;   // its primary context; null until init() got it
    DeviceInfo info{};
    int32_t attrs[kDeviceAttributeCount] = {};
    std::deque<std::unique_ptr<NotifyStream>> notify;  // guarded by mu_
    std::unique_ptr<Completions> completions;          // set by init()
  };
  // fn waiting for a stream, by callback or by Completions.
  struct Callback {
    CudaBackend* self;
    std::function<void()> fn;
    OpTag tag;
    bool report;
    std::atomic<uint32_t>* pending;

    // The stream got there (cudaSuccess) or failed: note a lost context, tell
    // the thread that issued the stream's last work, then run fn.
    void finish(cudaError_t e) {
      if (sticky(to_status(e))) self->lost_.store(true, std::memory_order_relaxed);
      if (e != cudaSuccess && report) self->report(tag, to_status(e));
      run_guarded(fn);
      if (pending) pending->fetch_sub(1, std::memory_order_acq_rel);
    }
  };

  explicit CudaBackend(const std::vector<int>& ordinals) : devices_(ordinals.size()) {
    for (size_t i = 0; i < ordinals.size(); ++i) devices_[i].ordinal = ordinals[i];
  }

  bool init(std::string* error) {
    auto fail = [&](const std::string& what, cudaError_t e) {
      if (error)
        *error = what + " failed: " + cudaGetErrorName(e) + " (" + std::to_string(int(e)) + ", " +
                 cudaGetErrorString(e) + "); check the driver with nvidia-smi, or use --backend sim";
      return false;
    };
    for (Device& d : devices_) {
      const std::string which = " (device " + std::to_string(d.ordinal) + ")";
      tls_context() = nullptr;  // cudaSetDevice changes the current context behind bind()'s cache
      if (cudaError_t e = cudaSetDevice(d.ordinal); e != cudaSuccess) return fail("cudaSetDevice" + which, e);
      if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) return fail("creating the CUDA context" + which, e);
      if (!drv_.ctx_get_current && !drv_.load(error)) return false;
      if (CUresult r = drv_.ctx_get_current(&d.ctx); r != CUDA_SUCCESS || !d.ctx) {
        d.ctx = nullptr;
        if (error)
          *error = "no current CUDA context after initializing device " + std::to_string(d.ordinal) + " (CUresult " +
                   std::to_string(int(r)) + ")";
        return false;
      }
      tls_context() = d.ctx;
      if (!fill_info(d, error)) return false;
    }
    for (uint32_t i = 0; i < device_count(); ++i) {
      devices_[i].completions = std::make_unique<Completions>([this, i] { bind(i); });
      streams_[i] = {cudaStreamLegacy, i, OpTag{}};  // guest stream d is device d's legacy default stream
    }
    // The simulator's kernels, for programs that launch them by name (module 0).
    std::lock_guard lk(mu_);
    if (Status st = add_module(0, builtin_image()); !ok(st)) {
      log("could not load the built-in kernels (status %s): only guest modules can be launched",
          std::to_string(int(st)).c_str());
    }
    return true;
  }

  bool fill_info(Device& dev, std::string* error) {
    const int ordinal = dev.ordinal;
    cudaDeviceProp p{};
    if (cudaError_t e = cudaGetDeviceProperties(&p, ordinal); e != cudaSuccess) {
      if (error)
        *error = "cudaGetDeviceProperties (device " + std::to_string(ordinal) + ") failed: " + cudaGetErrorName(e);
      return false;
    }
    // Every attribute as the driver reports it (cudaDeviceAttr numbers are CUdevice_attribute's);
    // numbers this driver does not know stay 0.
    for (uint32_t a = 1; a < kDeviceAttributeCount; ++a)
      if (cudaDeviceGetAttribute(&dev.attrs[a], cudaDeviceAttr(a), ordinal) != cudaSuccess) dev.attrs[a] = 0;
    cudaGetLastError();
    DeviceInfo& d = dev.info;
    d = DeviceInfo{};
    std::memcpy(d.name, p.name, std::min(sizeof d.name, sizeof p.name));
    d.name[sizeof d.name - 1] = 0;
    static_assert(sizeof d.uuid == sizeof p.uuid.bytes);
    std::memcpy(d.uuid, p.uuid.bytes, sizeof d.uuid);
    d.total_global_mem = p.totalGlobalMem;
    d.shared_mem_per_block = p.sharedMemPerBlock;
    d.shared_mem_per_block_optin = p.sharedMemPerBlockOptin;
    d.shared_mem_per_multiprocessor = p.sharedMemPerMultiprocessor;
    d.total_const_mem = p.totalConstMem;
    d.texture_alignment = p.textureAlignment;
    d.mem_pitch = p.memPitch;
    d.major = p.major;
    d.minor = p.minor;
    d.multi_processor_count = p.multiProcessorCount;
    d.warp_size = p.warpSize;
    d.max_threads_per_block = p.maxThreadsPerBlock;
    for (int i = 0; i < 3; ++i) {
      d.max_threads_dim[i] = p.maxThreadsDim[i];
      d.max_grid_size[i] = p.maxGridSize[i];
    }
    d.regs_per_block = p.regsPerBlock;
    d.regs_per_multiprocessor = p.regsPerMultiprocessor;
    d.memory_bus_width = p.memoryBusWidth;
    d.l2_cache_size = p.l2CacheSize;
    d.persisting_l2_cache_max_size = p.persistingL2CacheMaxSize;
    d.max_threads_per_multiprocessor = p.maxThreadsPerMultiProcessor;
    d.max_blocks_per_multiprocessor = p.maxBlocksPerMultiProcessor;
    d.concurrent_kernels = p.concurrentKernels;
    d.async_engine_count = p.asyncEngineCount;
    d.unified_addressing = p.unifiedAddressing;
    d.managed_memory = p.managedMemory;
    d.concurrent_managed_access = p.concurrentManagedAccess;
    d.pci_bus_id = p.pciBusID;
    d.pci_device_id = p.pciDeviceID;
    d.pci_domain_id = p.pciDomainID;
    d.integrated = p.integrated;
    d.can_map_host_memory = p.canMapHostMemory;
    d.ecc_enabled = p.ECCEnabled;
    d.tcc_driver = p.tccDriver;
    d.cooperative_launch = p.cooperativeLaunch;
    d.stream_priorities_supported = p.streamPrioritiesSupported;
    d.global_l1_cache_supported = p.globalL1CacheSupported;
    d.local_l1_cache_supported = p.localL1CacheSupported;
    d.pageable_memory_access = p.pageableMemoryAccess;
    d.host_native_atomic_supported = p.hostNativeAtomicSupported;
    // CUDA 13 dropped these from cudaDeviceProp; the attributes remain.
    auto attr = [&](cudaDeviceAttr a) {
      int v = 0;
      cudaDeviceGetAttribute(&v, a, ordinal);
      return int32_t(v);
    };
    d.clock_rate_khz = attr(cudaDevAttrClockRate);
    d.memory_clock_rate_khz = attr(cudaDevAttrMemoryClockRate);
    d.compute_mode = attr(cudaDevAttrComputeMode);
    d.kernel_exec_timeout_enabled = attr(cudaDevAttrKernelExecTimeout);
    return true;
  }

  // Driver API calls need a device's context current on the calling thread,
  // and runtime calls follow it (a primary context is its device's, and
  // cudaStreamLegacy is the current device's legacy stream). The cache keeps an
  // unchanged device free; contexts are process-wide, so it serves every backend.
  static CUcontext& tls_context() {
    thread_local CUcontext c = nullptr;
    return c;
  }
  void bind(uint32_t device) {
    CUcontext& c = tls_context();
    const CUcontext want = devices_[device].ctx;
    if (c != want && drv_.ctx_set_current(want) == CUDA_SUCCESS) c = want;
  }

  // `image` in an 8-byte aligned buffer with at least 64 zero bytes past its
  // end: PTX text is then NUL-terminated within memory we own, and a
  // fixed-size header the driver reads at the very end of a checked image (a
  // fatbin entry's 64 bytes) cannot take it past our copy.
  static std::vector<uint64_t> padded(std::span<const std::byte> image) {
    std::vector<uint64_t> copy((image.size() + 7) / 8 + 8, 0);
    std::memcpy(copy.data(), image.data(), image.size());
    return copy;
  }

  // Requires the device current.
  Status load_on(const std::vector<uint64_t>& image, CUmodule* out) {
    if (image.empty()) return Status::kInvalidValue;
    CUresult r = drv_.module_load_data(out, image.data());
    if (r == CUDA_SUCCESS) return Status::kSuccess;
    *out = nullptr;
    return to_status(r);
  }

  // Requires mu_. Loads into device 0 at once, which checks the image and
  // answers kernel lookups; other devices load it (and get their own copy of
  // its variables) the first time they use it, as CUDA's lazy loading does.
  Status add_module(uint32_t id, std::span<const std::byte> image) {
    if (image.empty()) return Status::kInvalidValue;
    std::vector<uint64_t> copy = padded(image);
    Module m;
    m.on.assign(device_count(), nullptr);
    bind(0);
    if (Status st = load_on(copy, &m.on[0]); !ok(st)) return st;
    if (device_count() > 1) m.image = std::move(copy);
    modules_.emplace(id, std::move(m));
    return Status::kSuccess;
  }

  // Requires mu_ and `device` current: the module's copy on `device`.
  Status module_on(uint32_t module, uint32_t device, CUmodule* out) {
    auto it = modules_.find(module);
    if (it == modules_.end()) return Status::kInvalidResourceHandle;
    Module& m = it->second;
    if (!m.on[device])
      if (Status st = load_on(m.image, &m.on[device]); !ok(st)) return st;  // e.g. no code for this device (209)
    *out = m.on[device];
    return Status::kSuccess;
  }

  // Requires mu_ and `device` current: kernel k's function on `device`.
  Status function_on(Kernel& k, uint32_t device, CUfunction* out) {
    if (!k.fn[device]) {
      CUmodule mod = nullptr;
      if (Status st = module_on(k.module, device, &mod); !ok(st)) return st;
      if (CUresult r = drv_.module_get_function(&k.fn[device], mod, k.name.c_str()); r != CUDA_SUCCESS) {
        k.fn[device] = nullptr;
        return to_status(r);
      }
    }
    *out = k.fn[device];
    return Status::kSuccess;
  }

  // Every device's copy; the first error, if any.
  Status unload_everywhere(Module& m) {
    Status first = Status::kSuccess;
    for (uint32_t d = 0; d < m.on.size(); ++d) {
      if (!m.on[d]) continue;
      bind(d);
      const Status st = to_status(drv_.module_unload(std::exchange(m.on[d], nullptr)));
      if (ok(first)) first = st;
    }
    return first;
  }

  // Requires mu_.
  StreamEntry* find_stream(uint32_t id) {
    if (id >= kMaxStreams || !streams_[id].handle) return nullptr;
    return &streams_[id];
  }
  const EventEntry* find_event(uint32_t id) const {
    auto it = events_.find(id);
    return it == events_.end() ? nullptr : &it->second;
  }

  // Whether [addr, addr + size) lies inside one entry of `ranges` (address ->
  // size and device); sets *device to its device.
  template <class Ranges>
  static bool inside(const Ranges& ranges, uint64_t addr, uint64_t size, uint32_t* device) {
    auto it = ranges.upper_bound(addr);
    if (it == ranges.begin()) return false;
    --it;
    const uint64_t off = addr - it->first;
    if (off >= it->second.size || size > it->second.size - off) return false;
    if (device) *device = it->second.device;
    return true;
  }

  // [addr, addr + size) must lie inside one live allocation or module
  // variable, of any device; *device (if asked) says which. Requires mu_.
  Status check_device(uint64_t addr, uint64_t size, uint32_t* device = nullptr) const {
    if (inside(allocs_, addr, size, device) || inside(globals_, addr, size, device)) return Status::kSuccess;
    return Status::kInvalidDevicePointer;
  }

  // Host operands must lie inside registered memory (the shared region). Requires mu_.
  Status check_operand(const MemOperand& m, uint64_t size, uint32_t* device) const {
    if (m.device) return check_device(m.addr, size, device);
    for (const HostRange& r : host_ranges_)
      if (m.addr >= r.base && m.addr - r.base < r.size && size <= r.size - (m.addr - r.base)) return Status::kSuccess;
    return Status::kInvalidValue;
  }

  // Requires mu_ and `device` current: an idle private stream of the device, or its least busy one.
  NotifyStream* pick_notify_stream(uint32_t device) {
    auto& pool = devices_[device].notify;
    NotifyStream* best = nullptr;
    for (auto& n : pool) {
      if (n->pending.load(std::memory_order_acquire) == 0) return n.get();
      if (!best || n->pending.load() < best->pending.load()) best = n.get();
    }
    if (pool.size() < kMaxNotifyStreams) {
      auto n = std::make_unique<NotifyStream>();
      if (cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) == cudaSuccess) {
        pool.push_back(std::move(n));
        return pool.back().get();
      }
      cudaGetLastError();
    }
    return best;
  }

  // Queues fn after everything now on `s`. Releases `lk`. If CUDA refuses the
  // callback (a broken context), fn runs at once so nobody waits forever.
  void enqueue_callback(cudaStream_t s, std::function<void()> fn, const OpTag* tag, std::atomic<uint32_t>* pending,
                        std::unique_lock<std::mutex>& lk) {
    auto cb = std::make_unique<Callback>(Callback{this, std::move(fn), tag ? *tag : OpTag{}, tag != nullptr, pending});
    if (pending) pending->fetch_add(1, std::memory_order_acq_rel);
    cudaError_t e = cudaStreamAddCallback(s, &CudaBackend::on_callback, cb.get(), 0);
    if (e == cudaSuccess) {
      cb.release();  // on_callback owns it now
      return;
    }
    lk.unlock();
    cb->finish(e);
  }

  // Runs fn once everything now on `s`, a stream of `device`, is done
  // (that device's Completions). Releases `lk`. A device error is reported to
  // `tag`'s thread; if CUDA refuses to record the event (a broken context), fn
  // runs at once so nobody waits forever.
  void enqueue_completion(uint32_t device, cudaStream_t s, std::function<void()> fn, const OpTag* tag,
                          std::atomic<uint32_t>* pending, std::unique_lock<std::mutex>& lk) {
    if (pending) pending->fetch_add(1, std::memory_order_acq_rel);
    Completions::Done done = [cb = Callback{this, std::move(fn), tag ? *tag : OpTag{}, tag != nullptr, pending}](
                                 cudaError_t e) mutable { cb.finish(e); };
    const cudaError_t e = devices_[device].completions->watch(s, done);
    lk.unlock();
    if (e != cudaSuccess) done(e);
  }

  // On CUDA's callback thread: must not call CUDA.
  static void CUDART_CB on_callback(cudaStream_t, cudaError_t status, void* p) {
    std::unique_ptr<Callback> cb(static_cast<Callback*>(p));
    cb->finish(status);
  }

  static void run_guarded(std::function<void()>& fn) {
    try {
      if (fn) fn();
    } catch (...) {
      // A throwing completion must not take CUDA's callback thread down.
    }
  }

  Driver drv_;
  std::vector<Device> devices_;  // by guest device index; never resized

  std::mutex mu_;
  std::atomic<bool> lost_{false};  // a kernel fault ended a device's context (a sticky error)
  // Guarded by mu_; by stream id, [d] = device d's legacy stream.
  std::vector<StreamEntry> streams_ = std::vector<StreamEntry>(kMaxStreams);
  std::unordered_map<uint32_t, EventEntry> events_;      // guarded by mu_
  std::unordered_map<uint32_t, Module> modules_;         // guarded by mu_; 0 = built-in kernels
  KernelIds kernel_slots_;                               // guarded by mu_
  std::vector<Kernel> kernels_;                          // guarded by mu_; index = kernel_slots_ slot
  std::map<std::pair<uint32_t, std::string>, uint32_t> kernel_ids_;  // guarded by mu_; (module, name) -> id
  std::map<uint64_t, Alloc> allocs_;                     // guarded by mu_; by device address
  std::map<uint64_t, Global> globals_;                   // guarded by mu_; by device address
  std::vector<HostRange> host_ranges_;                   // guarded by mu_
};

// ---------------------------------------------------------------- public API

bool built() { return true; }

std::string Probe::why_not() const {
  if (error != 0)
    return "no CUDA device (cudaGetDeviceCount: " + error_name + " (" + std::to_string(error) + "))";
  if (count <= 0) return "no CUDA device (cudaGetDeviceCount found none)";
  return "";
}

Probe probe() {
  Probe p;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  p.error = int(e);
  p.error_name = cudaGetErrorName(e);
  p.count = e == cudaSuccess ? n : 0;
  if (e != cudaSuccess) cudaGetLastError();
  return p;
}

std::unique_ptr<Backend> make_cuda_backend(const std::vector<int>& devices, std::string* error) {
  const Probe p = probe();
  if (!p.usable()) {
    if (error) *error = p.why_not() + "; use --backend sim";
    return nullptr;
  }
  auto refuse = [&](const std::string& why) {
    if (error) *error = "cuda backend: " + why;
    return nullptr;
  };
  const std::string visible = p.count == 1 ? "1 CUDA device is visible, ordinal 0"
                                           : std::to_string(p.count) + " CUDA devices are visible, ordinals 0 to " +
                                                 std::to_string(p.count - 1);
  std::vector<int> ordinals = devices;
  if (ordinals.empty()) {
    if (p.count > int(kMaxDevices))
      return refuse(visible + ", and a session sees at most " + std::to_string(kMaxDevices) +
                    ": list the ones to use (--devices) or narrow CUDA_VISIBLE_DEVICES");
    for (int i = 0; i < p.count; ++i) ordinals.push_back(i);
  }
  if (ordinals.size() > kMaxDevices)
    return refuse(std::to_string(ordinals.size()) + " devices listed, and a session sees at most " +
                  std::to_string(kMaxDevices) + ": list fewer (--devices)");
  for (size_t i = 0; i < ordinals.size(); ++i) {
    const int o = ordinals[i];
    if (o < 0 || o >= p.count)
      return refuse("there is no CUDA device " + std::to_string(o) + " (" + visible +
                    "): list devices that exist (--devices)");
    if (std::find(ordinals.begin(), ordinals.begin() + i, o) != ordinals.begin() + i)
      return refuse("CUDA device " + std::to_string(o) + " is listed twice: list each device once (--devices)");
  }
  std::string why;
  auto b = CudaBackend::create(ordinals, &why);
  if (!b && error) *error = "cuda backend: " + why;
  return b;
}

std::span<const std::byte> builtin_image() {
  return std::as_bytes(std::span(ordo_cuda_builtins));
}

}  // namespace ordo::cuda

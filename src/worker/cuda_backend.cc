// The cuda backend: runs a guest's work on a real GPU (device 0).
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
// the worker asks for is checked against the allocations made through this
// backend (an interval map), and host operands against the memory registered
// with register_host_memory (the shared region). Kernel arguments cannot be
// checked: a kernel can be handed any device address, as in native CUDA; it can
// only reach this worker's own context, i.e. this guest's memory.
//
// Threads: the worker calls us from its one dispatch thread, which must never
// wait for the GPU. Completions (fences, a shared-ring stream synchronize,
// EventSynchronize) come back from a thread polling events (cuda_completions.h),
// which also answers after a device error, so a guest waiting on a fence is
// answered (with the error) instead of hanging. Host functions are stream
// work (later work waits for them) and run from cudaStreamAddCallback on CUDA's
// callback thread, which unlike cudaLaunchHostFunc also runs after an error.
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

#include "cuda_completions.h"
#include "ordo/layout.h"
#include "ordo/cuda_backend.h"

namespace {
#include "cuda_builtins_fatbin.h"  // static const unsigned char ordo_cuda_builtins[] (bin2c)
}

namespace ordo::cuda {
namespace {

constexpr uint32_t kMaxEvents = 65536;
constexpr size_t kMaxModules = 4096;  // live at once
constexpr uint32_t kMaxNotifyStreams = 64;  // one per guest thread that can wait at once (slot_count)
constexpr uint64_t kMaxBlockThreads = 1024;
constexpr size_t kMaxParams = 4096;         // the driver allows 32764 bytes of parameters
constexpr uint32_t kEventFlags = cudaEventBlockingSync | cudaEventDisableTiming;  // no IPC events

// cudaError_t and CUresult share their numbers for everything a backend returns
// (400 invalid handle, 700 illegal address, 719 launch failure, ...), and
// ordo::Status uses CUDA's numbers, so the value passes through unchanged.
Status to_status(cudaError_t e) { return static_cast<Status>(int32_t(e)); }
Status to_status(CUresult r) { return static_cast<Status>(int32_t(r)); }

void log(const char* fmt, const char* a = "", const char* b = "") {
  std::fprintf(stderr, "ordo-worker: cuda: ");
  std::fprintf(stderr, fmt, a, b);
  std::fprintf(stderr, "\n");
}

template <class T>
T load_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

// cuModuleLoadData takes a bare pointer and guesses the format from the bytes,
// so only the formats we can check get through: a fatbin container, a 64-bit
// ELF cubin, or PTX text. Anything else is refused, in particular nvcc's
// fatbin wrapper (magic 0x466243b1), which holds a pointer to the fatbin: the
// driver would follow an address chosen by the guest. A fatbin or cubin tells
// the driver its own sizes and the driver trusts them, so every stated size
// must stay inside the bytes the guest actually sent.
bool check_module_image(std::span<const std::byte> img, std::string* why) {
  const uint64_t n = img.size();
  auto fail = [&](const char* w) {
    *why = w;
    return false;
  };
  const uint32_t magic = n >= 4 ? load_le<uint32_t>(img.data()) : 0;
  if (magic == 0xBA55ED50u) {  // fatbin
    if (n < 16) return fail("fatbin header truncated");
    const uint64_t hdr = load_le<uint16_t>(img.data() + 6);
    const uint64_t body = load_le<uint64_t>(img.data() + 8);
    if (hdr < 16 || hdr > n || body > n - hdr) return fail("fatbin size runs past the image");
    // Entries: u16 kind, u16 version, u32 header size, u64 payload size, u32
    // compressed size, ... The driver reads every entry header up to +63
    // (flags at +40, uncompressed size at +56) whatever size it states.
    for (uint64_t off = hdr, end = hdr + body; off < end;) {
      if (end - off < 64) return fail("fatbin entry header truncated");
      const uint64_t eh = load_le<uint32_t>(img.data() + off + 4);
      const uint64_t ep = load_le<uint64_t>(img.data() + off + 8);
      const uint64_t ec = load_le<uint32_t>(img.data() + off + 16);
      if (eh < 64) return fail("fatbin entry header smaller than 64 bytes");
      if (eh > end - off || ep > end - off - eh) return fail("fatbin entry runs past the image");
      if (ec > ep) return fail("fatbin entry's compressed size runs past its payload");
      off += eh + ep;
    }
    return true;
  }
  if (n >= 4 && std::memcmp(img.data(), "\x7f" "ELF", 4) == 0) {  // cubin
    if (n < 64 || uint8_t(img[4]) != 2) return fail("not a 64-bit ELF cubin");
    const uint64_t phoff = load_le<uint64_t>(img.data() + 0x20);
    const uint64_t shoff = load_le<uint64_t>(img.data() + 0x28);
    const uint64_t phentsize = load_le<uint16_t>(img.data() + 0x36), phnum = load_le<uint16_t>(img.data() + 0x38);
    const uint64_t shentsize = load_le<uint16_t>(img.data() + 0x3a), shnum = load_le<uint16_t>(img.data() + 0x3c);
    if (phoff > n || phentsize * phnum > n - phoff) return fail("ELF program headers run past the image");
    if (shoff > n || shentsize * shnum > n - shoff) return fail("ELF section headers run past the image");
    if (shnum != 0 && shentsize < 64) return fail("ELF section header size too small");
    for (uint64_t i = 0; i < shnum; ++i) {
      const std::byte* sh = img.data() + shoff + i * shentsize;
      const uint32_t type = load_le<uint32_t>(sh + 4);
      const uint64_t off = load_le<uint64_t>(sh + 0x18), size = load_le<uint64_t>(sh + 0x20);
      if (type != 8 /* SHT_NOBITS */ && (off > n || size > n - off)) return fail("ELF section runs past the image");
    }
    return true;
  }
  if (magic == 0x466243b1u)
    return fail("fatbin wrapper (__fatBinC_Wrapper_t): it points at memory outside the image; send the fatbin itself");
  // PTX: text, optionally NUL-terminated (load_module terminates its copy).
  const uint64_t text = n > 0 && img[n - 1] == std::byte{0} ? n - 1 : n;
  if (text == 0) return fail("empty module image");
  for (uint64_t i = 0; i < text; ++i) {
    const uint8_t c = uint8_t(img[i]);
    if ((c < 0x20 || c > 0x7e) && !(c >= '\t' && c <= '\r'))
      return fail("not a fatbin, a 64-bit ELF cubin or PTX text (binary bytes in what would be PTX)");
  }
  return true;
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
  static std::unique_ptr<Backend> create(int device, std::string* error) {
    std::unique_ptr<CudaBackend> b(new CudaBackend(device));
    if (!b->init(error)) return nullptr;
    return b;
  }

  ~CudaBackend() override {
    if (!ctx_) return;  // init() failed before there was anything to release
    ensure_context();
    // Pending callbacks point at this object; let every queued piece of work end.
    cudaDeviceSynchronize();
    completions_.reset();  // answers what it still watches, then stops
    std::lock_guard lk(mu_);
    for (uint32_t i = 1; i < kMaxStreams; ++i)
      if (streams_[i]) cudaStreamDestroy(streams_[i]);
    for (auto& n : notify_) cudaStreamDestroy(n->stream);
    for (auto& [id, ev] : events_) cudaEventDestroy(ev);
    for (auto& [id, mod] : modules_) drv_.module_unload(mod);
    for (auto& [addr, size] : allocs_) cudaFree(reinterpret_cast<void*>(addr));
    for (auto& r : host_ranges_)
      if (r.pinned) cudaHostUnregister(reinterpret_cast<void*>(r.base));
  }

  std::string_view name() const override { return "cuda"; }

  void register_host_memory(void* base, uint64_t size) override {
    if (!base || size == 0) return;
    ensure_context();
    // Pinning lets copies DMA straight from the shared region. Without it they
    // still work, but pageable copies are staged by the driver and a D2H copy
    // into pageable memory holds the dispatch thread until it is done.
    cudaError_t e = cudaHostRegister(base, size, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it so it is not reported later
      log("cudaHostRegister of the shared region failed (%s): copies will be pageable and slower", cudaGetErrorName(e));
    }
    std::lock_guard lk(mu_);
    host_ranges_.push_back({reinterpret_cast<uintptr_t>(base), size, e == cudaSuccess});
  }

  Status stream_create(uint32_t stream, bool blocking, int priority) override {
    if (stream == 0 || stream >= kMaxStreams) return Status::kInvalidValue;
    ensure_context();
    std::lock_guard lk(mu_);
    if (streams_[stream]) return Status::kInvalidResourceHandle;
    cudaStream_t s = nullptr;
    // The driver clamps the priority into the device's range, as cudaStreamCreateWithPriority does for a program.
    cudaError_t e = cudaStreamCreateWithPriority(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking, priority);
    if (e != cudaSuccess) return to_status(e);
    streams_[stream] = s;
    last_tag_[stream] = OpTag{};
    return Status::kSuccess;
  }

  Status stream_destroy(uint32_t stream) override {
    if (stream == 0 || stream >= kMaxStreams) return Status::kInvalidResourceHandle;
    ensure_context();
    std::lock_guard lk(mu_);
    cudaStream_t s = std::exchange(streams_[stream], nullptr);
    if (!s) return Status::kInvalidResourceHandle;
    return to_status(cudaStreamDestroy(s));  // queued work and callbacks still run
  }

  Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) override {
    if (p.grid.x == 0 || p.grid.y == 0 || p.grid.z == 0 || p.block.x == 0 || p.block.y == 0 || p.block.z == 0 ||
        uint64_t{p.block.x} * p.block.y * p.block.z > kMaxBlockThreads)
      return Status::kInvalidConfiguration;
    if (p.args_size != 0 && p.args == nullptr) return Status::kInvalidValue;
    ensure_context();
    std::lock_guard lk(mu_);
    cudaStream_t s;
    if (!find_stream(stream, &s)) return Status::kInvalidResourceHandle;
    uint32_t slot = 0;
    if (!kernel_slots_.find(p.kernel, &slot) || !kernels_[slot].fn) return Status::kInvalidDeviceFunction;
    const Kernel& k = kernels_[slot];
    // The driver reads as many parameter bytes as the kernel declares: a short
    // buffer would make it read past the guest's argument bytes.
    size_t size = p.args_size;
    if (k.param_bytes_known) {
      if (p.args_size < k.param_bytes) return Status::kInvalidValue;
      size = k.param_bytes;
    }
    // The driver copies the parameters before cuLaunchKernel returns, so the
    // staging bytes may be reused as soon as we are back.
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(p.args), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CUresult r = drv_.launch_kernel(k.fn, p.grid.x, p.grid.y, p.grid.z, p.block.x, p.block.y, p.block.z, p.shared_mem,
                                    reinterpret_cast<CUstream>(s), nullptr, size ? extra : nullptr);
    if (r != CUDA_SUCCESS) return to_status(r);
    last_tag_[stream] = tag;
    return Status::kSuccess;
  }

  Status memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size, const OpTag& tag) override {
    ensure_context();
    std::lock_guard lk(mu_);
    cudaStream_t s;
    if (!find_stream(stream, &s)) return Status::kInvalidResourceHandle;
    if (size == 0) return Status::kSuccess;
    if (Status st = check_operand(dst, size); !ok(st)) return st;
    if (Status st = check_operand(src, size); !ok(st)) return st;
    const cudaMemcpyKind kind = dst.device ? (src.device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                           : (src.device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    cudaError_t e = cudaMemcpyAsync(reinterpret_cast<void*>(uintptr_t(dst.addr)),
                                    reinterpret_cast<const void*>(uintptr_t(src.addr)), size, kind, s);
    if (e != cudaSuccess) return to_status(e);
    last_tag_[stream] = tag;
    return Status::kSuccess;
  }

  Status memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size, const OpTag& tag) override {
    ensure_context();
    std::lock_guard lk(mu_);
    cudaStream_t s;
    if (!find_stream(stream, &s)) return Status::kInvalidResourceHandle;
    if (size == 0) return Status::kSuccess;
    if (Status st = check_device(dst, size); !ok(st)) return st;
    cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(uintptr_t(dst)), value, size, s);
    if (e != cudaSuccess) return to_status(e);
    last_tag_[stream] = tag;
    return Status::kSuccess;
  }

  Status event_create(uint32_t event, uint32_t flags) override {
    if (event >= kMaxEvents || (flags & ~kEventFlags)) return Status::kInvalidValue;
    ensure_context();
    std::lock_guard lk(mu_);
    if (events_.count(event)) return Status::kInvalidResourceHandle;
    cudaEvent_t ev = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&ev, flags); e != cudaSuccess) return to_status(e);
    events_.emplace(event, ev);
    return Status::kSuccess;
  }

  Status event_destroy(uint32_t event) override {
    ensure_context();
    std::lock_guard lk(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return Status::kInvalidResourceHandle;
    cudaEvent_t ev = it->second;
    events_.erase(it);
    return to_status(cudaEventDestroy(ev));  // streams already waiting on it keep their wait
  }

  Status event_record(uint32_t stream, uint32_t event) override {
    ensure_context();
    std::lock_guard lk(mu_);
    cudaStream_t s;
    cudaEvent_t ev;
    if (!find_stream(stream, &s) || !find_event(event, &ev)) return Status::kInvalidResourceHandle;
    return to_status(cudaEventRecord(ev, s));
  }

  Status stream_wait_event(uint32_t stream, uint32_t event) override {
    ensure_context();
    std::lock_guard lk(mu_);
    cudaStream_t s;
    cudaEvent_t ev;
    if (!find_stream(stream, &s) || !find_event(event, &ev)) return Status::kInvalidResourceHandle;
    return to_status(cudaStreamWaitEvent(s, ev, 0));
  }

  Status event_query(uint32_t event) override {
    ensure_context();
    std::lock_guard lk(mu_);
    cudaEvent_t ev;
    if (!find_event(event, &ev)) return Status::kInvalidResourceHandle;
    return to_status(cudaEventQuery(ev));  // cudaErrorNotReady is 600, Status::kNotReady
  }

  Status event_elapsed(uint32_t start, uint32_t end, float* ms) override {
    if (!ms) return Status::kInvalidValue;
    ensure_context();
    std::lock_guard lk(mu_);
    cudaEvent_t a, b;
    if (!find_event(start, &a) || !find_event(end, &b)) return Status::kInvalidResourceHandle;
    return to_status(cudaEventElapsedTime(ms, a, b));
  }

  void event_notify(uint32_t event, std::function<void()> fn) override {
    ensure_context();
    std::unique_lock lk(mu_);
    cudaEvent_t ev;
    if (!find_event(event, &ev)) {
      lk.unlock();
      return run_guarded(fn);  // nothing to wait for
    }
    // A private stream waits for the event's current capture (a later re-record
    // does not move it), then answers from a callback. Each pending wait gets an
    // idle stream of its own where possible, so a quick event is not answered
    // behind a slow one.
    NotifyStream* n = pick_notify_stream();
    if (!n) {
      lk.unlock();
      return run_guarded(fn);
    }
    if (cudaError_t e = cudaStreamWaitEvent(n->stream, ev, 0); e != cudaSuccess) {
      lk.unlock();
      log("cudaStreamWaitEvent for an event wait failed (%s)", cudaGetErrorName(e));
      return run_guarded(fn);
    }
    enqueue_completion(n->stream, std::move(fn), nullptr, &n->pending, lk);
  }

  // A host callback is stream work (later work waits for fn); a notification is not.
  void host_callback(uint32_t stream, std::function<void()> fn) override { after_stream(stream, std::move(fn), true); }
  void stream_notify(uint32_t stream, std::function<void()> fn) override { after_stream(stream, std::move(fn), false); }

  bool context_lost() const override { return lost_.load(std::memory_order_relaxed); }

  // Runs fn once the work now on `stream` is done. A device error that reaches
  // it is reported to whoever issued the stream's last work: usually the thread
  // now synchronizing on it.
  void after_stream(uint32_t stream, std::function<void()> fn, bool as_work) {
    ensure_context();
    std::unique_lock lk(mu_);
    cudaStream_t s;
    if (!find_stream(stream, &s)) {
      lk.unlock();
      return run_guarded(fn);  // unknown stream: nothing to wait for
    }
    const OpTag tag = last_tag_[stream];
    if (as_work)
      enqueue_callback(s, std::move(fn), &tag, nullptr, lk);
    else
      enqueue_completion(s, std::move(fn), &tag, nullptr, lk);
  }

  Status malloc(uint64_t size, uint64_t* device_addr) override {
    if (!device_addr || size == 0) return Status::kInvalidValue;
    ensure_context();
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, size); e != cudaSuccess) {
      cudaGetLastError();  // out of memory is not sticky
      return to_status(e);
    }
    std::lock_guard lk(mu_);
    allocs_.emplace(reinterpret_cast<uintptr_t>(p), size);
    *device_addr = reinterpret_cast<uintptr_t>(p);
    return Status::kSuccess;
  }

  Status free(uint64_t device_addr) override {
    if (device_addr == 0) return Status::kSuccess;  // like cudaFree(nullptr)
    ensure_context();
    std::lock_guard lk(mu_);
    auto it = allocs_.find(device_addr);
    if (it == allocs_.end()) return Status::kInvalidDevicePointer;  // only what malloc returned, and only once
    allocs_.erase(it);
    return to_status(cudaFree(reinterpret_cast<void*>(uintptr_t(device_addr))));
  }

  Status module_load(uint32_t module, std::span<const std::byte> image) override {
    if (module == 0 || image.empty()) return Status::kInvalidValue;  // 0: the built-in kernels
    std::string why;
    if (!check_module_image(image, &why)) {
      log("rejected module image: %s", why.c_str());
      return to_status(CUDA_ERROR_INVALID_IMAGE);  // what the driver answers for an image it cannot parse
    }
    ensure_context();
    std::lock_guard lk(mu_);
    if (modules_.count(module)) return Status::kInvalidResourceHandle;
    if (modules_.size() > kMaxModules) return Status::kMemoryAllocation;  // ids are the worker's; the count is ours
    CUmodule mod = nullptr;
    if (Status st = load_module(image, &mod); !ok(st)) return st;
    modules_.emplace(module, mod);
    return Status::kSuccess;
  }

  Status module_unload(uint32_t module) override {
    if (module == 0) return Status::kInvalidResourceHandle;  // the built-in kernels stay
    ensure_context();
    std::lock_guard lk(mu_);
    auto it = modules_.find(module);
    if (it == modules_.end()) return Status::kInvalidResourceHandle;
    CUmodule mod = it->second;
    modules_.erase(it);
    // Its kernels' slots are free for reuse; their old ids stop launching (KernelIds).
    auto first = kernel_ids_.lower_bound({module, std::string()}), last = first;
    for (; last != kernel_ids_.end() && last->first.first == module; ++last) {
      uint32_t slot = 0;
      if (kernel_slots_.find(last->second, &slot)) kernels_[slot] = Kernel{};
      kernel_slots_.release(last->second);
    }
    kernel_ids_.erase(first, last);
    return to_status(drv_.module_unload(mod));
  }

  Status module_global(uint32_t module, std::string_view name, uint64_t, uint64_t* addr, uint64_t* size) override {
    if (name.empty() || name.find('\0') != std::string_view::npos) return Status::kInvalidValue;
    ensure_context();
    std::lock_guard lk(mu_);
    auto mit = modules_.find(module);
    if (mit == modules_.end()) return Status::kInvalidResourceHandle;
    CUdeviceptr p = 0;
    size_t n = 0;
    const CUresult r = drv_.module_get_global(&p, &n, mit->second, std::string(name).c_str());
    if (r == CUDA_ERROR_NOT_FOUND) return Status::kInvalidDeviceFunction;
    if (r != CUDA_SUCCESS) return Status::kInvalidValue;
    *addr = p;
    *size = n;
    return Status::kSuccess;
  }

  Status kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) override {
    if (!kernel || name.empty() || name.find('\0') != std::string_view::npos) return Status::kInvalidValue;
    ensure_context();
    std::lock_guard lk(mu_);
    auto mit = modules_.find(module);
    if (mit == modules_.end()) return module == 0 ? Status::kInvalidDeviceFunction : Status::kInvalidResourceHandle;
    std::pair<uint32_t, std::string> key{module, std::string(name)};
    if (auto it = kernel_ids_.find(key); it != kernel_ids_.end()) {
      *kernel = it->second;  // repeated lookups do not grow the table
      return Status::kSuccess;
    }
    if (kernel_slots_.full()) return Status::kMemoryAllocation;
    CUfunction fn = nullptr;
    CUresult r = drv_.module_get_function(&fn, mit->second, key.second.c_str());
    if (r == CUDA_ERROR_NOT_FOUND) return Status::kInvalidDeviceFunction;
    if (r != CUDA_SUCCESS) return to_status(r);
    Kernel k{fn, 0, false};
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
    kernels_[slot] = k;
    kernel_ids_.emplace(std::move(key), id);
    *kernel = id;
    return Status::kSuccess;
  }

  Status device_info(DeviceInfo* out) override {
    if (!out) return Status::kInvalidValue;
    *out = info_;
    return Status::kSuccess;
  }

  Status device_attributes(uint32_t first, int32_t* out) override {
    if (first % kDeviceAttributesPerCall || first >= kDeviceAttributeCount) return Status::kInvalidValue;
    std::memcpy(out, attrs_ + first, kDeviceAttributesPerCall * sizeof(int32_t));
    return Status::kSuccess;
  }

 private:
  struct Kernel {
    CUfunction fn = nullptr;  // null while the slot is free
    size_t param_bytes = 0;
    bool param_bytes_known = false;
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

  explicit CudaBackend(int device) : device_(device) {}

  bool init(std::string* error) {
    auto fail = [&](const char* what, cudaError_t e) {
      if (error)
        *error = std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + std::to_string(int(e)) + ", " +
                 cudaGetErrorString(e) + "); check the driver with nvidia-smi, or use --backend sim";
      return false;
    };
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return fail("cudaSetDevice", e);
    if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) return fail("creating the CUDA context", e);
    if (!drv_.load(error)) return false;
    if (CUresult r = drv_.ctx_get_current(&ctx_); r != CUDA_SUCCESS || !ctx_) {
      if (error) *error = "no current CUDA context after initialization (CUresult " + std::to_string(int(r)) + ")";
      return false;
    }
    tls_context() = ctx_;
    if (!fill_info(error)) return false;
    completions_ = std::make_unique<Completions>([this] {
      cudaSetDevice(device_);
      ensure_context();
    });
    streams_[0] = cudaStreamLegacy;  // guest stream 0 is the legacy default stream
    // The simulator's kernels, for programs that launch them by name (module 0).
    CUmodule mod = nullptr;
    if (Status st = load_module(builtin_image(), &mod); ok(st)) {
      modules_.emplace(0, mod);
    } else {
      log("could not load the built-in kernels (status %s): only guest modules can be launched",
          std::to_string(int(st)).c_str());
    }
    return true;
  }

  bool fill_info(std::string* error) {
    cudaDeviceProp p{};
    if (cudaError_t e = cudaGetDeviceProperties(&p, device_); e != cudaSuccess) {
      if (error) *error = std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorName(e);
      return false;
    }
    // Every attribute as the driver reports it (cudaDeviceAttr numbers are CUdevice_attribute's);
    // numbers this driver does not know stay 0.
    for (uint32_t a = 1; a < kDeviceAttributeCount; ++a)
      if (cudaDeviceGetAttribute(&attrs_[a], cudaDeviceAttr(a), device_) != cudaSuccess) attrs_[a] = 0;
    cudaGetLastError();
    DeviceInfo& d = info_;
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
      cudaDeviceGetAttribute(&v, a, device_);
      return int32_t(v);
    };
    d.clock_rate_khz = attr(cudaDevAttrClockRate);
    d.memory_clock_rate_khz = attr(cudaDevAttrMemoryClockRate);
    d.compute_mode = attr(cudaDevAttrComputeMode);
    d.kernel_exec_timeout_enabled = attr(cudaDevAttrKernelExecTimeout);
    return true;
  }

  // Driver API calls need the context current on the calling thread; runtime
  // calls find it there too. The worker may call from a thread other than the
  // one that created us.
  static CUcontext& tls_context() {
    thread_local CUcontext c = nullptr;
    return c;
  }
  void ensure_context() {
    CUcontext& c = tls_context();
    if (c != ctx_ && drv_.ctx_set_current(ctx_) == CUDA_SUCCESS) c = ctx_;
  }

  // Requires mu_. `image` is copied into an 8-byte aligned buffer with at least
  // 64 zero bytes past its end: PTX text is then NUL-terminated within memory
  // we own, and a fixed-size header the driver reads at the very end of a
  // checked image (a fatbin entry's 64 bytes) cannot take it past our copy.
  Status load_module(std::span<const std::byte> image, CUmodule* out) {
    if (image.empty()) return Status::kInvalidValue;
    std::vector<uint64_t> copy((image.size() + 7) / 8 + 8, 0);
    std::memcpy(copy.data(), image.data(), image.size());
    CUresult r = drv_.module_load_data(out, copy.data());
    return r == CUDA_SUCCESS ? Status::kSuccess : to_status(r);
  }

  // Requires mu_.
  bool find_stream(uint32_t id, cudaStream_t* s) const {
    if (id >= kMaxStreams || !streams_[id]) return false;
    *s = streams_[id];
    return true;
  }
  bool find_event(uint32_t id, cudaEvent_t* ev) const {
    auto it = events_.find(id);
    if (it == events_.end()) return false;
    *ev = it->second;
    return true;
  }

  // [addr, addr + size) must lie inside one live allocation. Requires mu_.
  Status check_device(uint64_t addr, uint64_t size) const {
    auto it = allocs_.upper_bound(addr);
    if (it == allocs_.begin()) return Status::kInvalidDevicePointer;
    --it;
    const uint64_t off = addr - it->first;
    if (off >= it->second || size > it->second - off) return Status::kInvalidDevicePointer;
    return Status::kSuccess;
  }

  // Host operands must lie inside registered memory (the shared region). Requires mu_.
  Status check_operand(const MemOperand& m, uint64_t size) const {
    if (m.device) return check_device(m.addr, size);
    for (const HostRange& r : host_ranges_)
      if (m.addr >= r.base && m.addr - r.base < r.size && size <= r.size - (m.addr - r.base)) return Status::kSuccess;
    return Status::kInvalidValue;
  }

  // Requires mu_: an idle private stream, or the least busy one.
  NotifyStream* pick_notify_stream() {
    NotifyStream* best = nullptr;
    for (auto& n : notify_) {
      if (n->pending.load(std::memory_order_acquire) == 0) return n.get();
      if (!best || n->pending.load() < best->pending.load()) best = n.get();
    }
    if (notify_.size() < kMaxNotifyStreams) {
      auto n = std::make_unique<NotifyStream>();
      if (cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) == cudaSuccess) {
        notify_.push_back(std::move(n));
        return notify_.back().get();
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

  // Runs fn once everything now on `s` is done (Completions). Releases `lk`. A
  // device error is reported to `tag`'s thread; if CUDA refuses to record the
  // event (a broken context), fn runs at once so nobody waits forever.
  void enqueue_completion(cudaStream_t s, std::function<void()> fn, const OpTag* tag,
                          std::atomic<uint32_t>* pending, std::unique_lock<std::mutex>& lk) {
    if (pending) pending->fetch_add(1, std::memory_order_acq_rel);
    Completions::Done done = [cb = Callback{this, std::move(fn), tag ? *tag : OpTag{}, tag != nullptr, pending}](
                                 cudaError_t e) mutable { cb.finish(e); };
    const cudaError_t e = completions_->watch(s, done);
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

  const int device_;
  Driver drv_;
  CUcontext ctx_ = nullptr;
  DeviceInfo info_{};
  int32_t attrs_[kDeviceAttributeCount] = {};

  std::mutex mu_;
  std::atomic<bool> lost_{false};  // a kernel fault ended the context (a sticky error)
  std::vector<cudaStream_t> streams_ = std::vector<cudaStream_t>(kMaxStreams);  // guarded by mu_; by stream id, [0] = cudaStreamLegacy
  std::vector<OpTag> last_tag_ = std::vector<OpTag>(kMaxStreams);  // guarded by mu_
  std::unordered_map<uint32_t, cudaEvent_t> events_;     // guarded by mu_
  std::unordered_map<uint32_t, CUmodule> modules_;       // guarded by mu_; 0 = built-in kernels
  KernelIds kernel_slots_;                               // guarded by mu_
  std::vector<Kernel> kernels_;                          // guarded by mu_; index = kernel_slots_ slot
  std::map<std::pair<uint32_t, std::string>, uint32_t> kernel_ids_;  // guarded by mu_; (module, name) -> id
  std::map<uint64_t, uint64_t> allocs_;                  // guarded by mu_; device address -> size
  std::vector<HostRange> host_ranges_;                   // guarded by mu_
  std::deque<std::unique_ptr<NotifyStream>> notify_;     // guarded by mu_
  std::unique_ptr<Completions> completions_;             // set by init()
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

std::unique_ptr<Backend> make_cuda_backend(std::string* error) {
  const Probe p = probe();
  if (!p.usable()) {
    if (error) *error = p.why_not() + "; use --backend sim";
    return nullptr;
  }
  std::string why;
  auto b = CudaBackend::create(0, &why);
  if (!b && error) *error = "cuda backend: " + why;
  return b;
}

std::span<const std::byte> builtin_image() {
  return std::as_bytes(std::span(ordo_cuda_builtins));
}

}  // namespace ordo::cuda

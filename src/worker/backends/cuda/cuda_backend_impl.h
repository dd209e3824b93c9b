// The cuda backend's class, CudaBackend, and where each part of it is:
// cuda_backend.cc (creation, destruction, make_cuda_backend, probe),
// cuda_device.cc (contexts, device info, peer access), cuda_memory.cc
// (allocations, registered host memory, operand checks), cuda_stream.cc
// (streams, host callbacks, notifications and the completion callbacks),
// cuda_event.cc (events), cuda_launch.cc (launches, copies, memsets),
// cuda_module.cc (module images, modules, variables, kernel lookup),
// cuda_driver.h (the driver entry points), cuda_completions.h (the poller).
//
// It runs a guest's work on real GPUs, one or several host
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
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_backend.h"
#include "cuda_completions.h"
#include "cuda_driver.h"
#include "ordo/layout.h"

namespace ordo::cuda {

class CudaBackend final : public Backend {
 public:
  // `ordinals`: host devices by guest device index, checked by make_cuda_backend.
  static std::unique_ptr<Backend> create(const std::vector<int>& ordinals, std::string* error);

  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  uint32_t device_count() const override { return uint32_t(devices_.size()); }

  bool register_host_memory(void* base, uint64_t size) override;

  Status stream_create(uint32_t stream, uint32_t device, bool blocking, int priority) override;

  Status stream_destroy(uint32_t stream) override;

  Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) override;

  Status memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size, const OpTag& tag) override;

  Status memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size, const OpTag& tag) override;

  Status event_create(uint32_t event, uint32_t device, uint32_t flags) override;

  Status event_destroy(uint32_t event) override;

  Status event_record(uint32_t stream, uint32_t event) override;

  Status stream_wait_event(uint32_t stream, uint32_t event) override;

  Status event_query(uint32_t event) override;

  Status event_elapsed(uint32_t start, uint32_t end, float* ms) override;

  void event_notify(uint32_t event, std::function<void()> fn) override;

  // A host callback is stream work (later work waits for fn); a notification is not.
  void host_callback(uint32_t stream, std::function<void()> fn) override { after_stream(stream, std::move(fn), true); }
  void stream_notify(uint32_t stream, std::function<void()> fn) override { after_stream(stream, std::move(fn), false); }

  bool context_lost() const override { return lost_.load(std::memory_order_relaxed); }

  // Runs fn once the work now on `stream` is done. A device error that reaches
  // it is reported to whoever issued the stream's last work: usually the thread
  // now synchronizing on it.
  void after_stream(uint32_t stream, std::function<void()> fn, bool as_work);

  Status malloc(uint32_t device, uint64_t size, uint64_t* device_addr) override;

  Status free(uint64_t device_addr) override;

  Status module_load(uint32_t module, std::span<const std::byte> image) override;

  Status module_unload(uint32_t module) override;

  Status module_global(uint32_t module, uint32_t device, std::string_view name, uint64_t, uint64_t* addr,
                       uint64_t* size) override;

  Status kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) override;

  Status device_info(uint32_t device, DeviceInfo* out) override;
  Status tensor_map_encode(uint32_t device, const TensorMapRequest& r, std::byte* out) override;  // cuda_tensor_map.cc
  Status kernel_attributes(uint32_t kernel, uint32_t device, int32_t* out) override;
  Status kernel_occupancy(uint32_t kernel, uint32_t device, const OccupancyQuery& q, uint32_t* out) override;

  Status device_attributes(uint32_t device, uint32_t first, int32_t* out) override;

  bool can_access_peer(uint32_t device, uint32_t peer) override;

  // Virtual memory (cuda_vmm.cc): the host driver's, where it has the calls
  // and the device attribute says so.
  // Interprocess memory and events (cuda_ipc.cc): the runtime's IPC calls; the
  // blob is the driver's 64-byte handle, which the other worker process opens.
  bool supports_ipc() const override { return true; }
  Status ipc_export_mem(uint64_t addr, IpcBlob* out, uint32_t* device) override;
  Status ipc_open_mem(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* addr) override;
  Status ipc_close_mem(uint64_t addr) override;
  Status ipc_export_event(uint32_t event, IpcBlob* out) override;
  Status ipc_open_event(uint32_t event, uint32_t device, const IpcBlob& blob) override;
  Status ipc_export_vmm(uint64_t handle, IpcBlob* out) override;
  Status ipc_import_vmm(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* handle) override;

  bool supports_vmm() const override;
  Status vmm_reserve(uint64_t size, uint64_t alignment, uint64_t hint, uint64_t* addr) override;
  Status vmm_address_free(uint64_t addr, uint64_t size) override;
  Status vmm_create(uint32_t device, uint64_t size, uint64_t* handle) override;
  Status vmm_release(uint64_t handle) override;
  Status vmm_map(uint64_t addr, uint64_t size, uint64_t handle, uint32_t device) override;
  Status vmm_unmap(uint64_t addr, uint64_t size) override;
  Status vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access) override;

  Status set_peer_access(uint32_t device, uint32_t peer, bool enable) override;

  // Conditional graph nodes (cuda_graph.cc): a guest's handle is a token of
  // ours; each program becomes a real CUDA graph, built and instantiated at
  // its first launch, whose handles are the driver's.
  Status cond_handle_create(uint32_t device, uint64_t* handle) override;
  Status launch_program(uint32_t stream, std::shared_ptr<const std::vector<GraphStep>> steps,
                        const OpTag& tag) override;

 private:
  // A program's real graph, instantiated for one device.
  struct Program {
    std::weak_ptr<const std::vector<GraphStep>> steps;  // expired: the worker dropped the graph
    uint32_t device = 0;
    CUgraphExec exec = nullptr;
  };
  // Under mu_ with `device` current: `steps` as a new exec.
  // `noop`: the built-in no-op kernel, which an empty body holds.
  Status build_program(const std::vector<GraphStep>& steps, uint32_t device, uint32_t noop, CUgraphExec* out);
  Status add_steps(CUgraph g, const std::vector<GraphStep>& steps, size_t at, size_t end, uint32_t device,
                   const std::vector<std::pair<uint64_t, CUgraphConditionalHandle>>& handles, uint32_t noop);
  void drop_programs();  // under mu_: every cached exec (a module unloaded)
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
    // By device, what the driver's function was told so far (launch_needs):
    // the dynamic shared memory it was raised to (0: never; it allows 48 KiB
    // less its static shared memory), whether it allows clusters past 8.
    std::vector<uint32_t> smem_allowed;
    std::vector<uint8_t> wide_clusters;
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

  explicit CudaBackend(const std::vector<int>& ordinals);

  bool init(std::string* error);

  bool fill_info(Device& dev, std::string* error);

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
  static std::vector<uint64_t> padded(std::span<const std::byte> image);

  // Requires the device current.
  Status load_on(const std::vector<uint64_t>& image, CUmodule* out);

  // Takes mu_ once loaded (the load itself runs without it). Loads into
  // device 0 at once, which checks the image and answers kernel lookups; other
  // devices load it (and get their own copy of its variables) the first time
  // they use it, as CUDA's lazy loading does.
  Status add_module(uint32_t id, std::span<const std::byte> image);

  // Requires mu_ and `device` current: the module's copy on `device`.
  Status module_on(uint32_t module, uint32_t device, CUmodule* out);

  // Requires mu_ and `device` current: kernel k's function on `device`.
  Status function_on(Kernel& k, uint32_t device, CUfunction* out);
  Status launch_needs(Kernel& k, uint32_t device, CUfunction fn, const LaunchParams& p);  // under mu_
  // Requires mu_ and `device` current: p.kernel's function on `device`,
  // raised to what `p` needs (launch_needs), and the argument bytes the
  // driver will read (*size). A launch's and a graph program's kernel step's.
  Status kernel_for_launch(uint32_t device, const LaunchParams& p, CUfunction* fn, size_t* size);

  // Every device's copy; the first error, if any.
  Status unload_everywhere(Module& m);

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
  Status check_device(uint64_t addr, uint64_t size, uint32_t* device = nullptr) const;

  // Host operands must lie inside registered memory (the shared region). Requires mu_.
  Status check_operand(const MemOperand& m, uint64_t size, uint32_t* device) const;

  // Requires mu_ and `device` current: an idle private stream of the device, or its least busy one.
  NotifyStream* pick_notify_stream(uint32_t device);

  // Queues fn after everything now on `s`. Releases `lk`. If CUDA refuses the
  // callback (a broken context), fn runs at once so nobody waits forever.
  void enqueue_callback(cudaStream_t s, std::function<void()> fn, const OpTag* tag, std::atomic<uint32_t>* pending,
                        std::unique_lock<std::mutex>& lk);

  // Runs fn once everything now on `s`, a stream of `device`, is done
  // (that device's Completions). Releases `lk`. A device error is reported to
  // `tag`'s thread; if CUDA refuses to record the event (a broken context), fn
  // runs at once so nobody waits forever.
  void enqueue_completion(uint32_t device, cudaStream_t s, std::function<void()> fn, const OpTag* tag,
                          std::atomic<uint32_t>* pending, std::unique_lock<std::mutex>& lk);

  // On CUDA's callback thread: must not call CUDA.
  static void CUDART_CB on_callback(cudaStream_t, cudaError_t status, void* p);

  static void run_guarded(std::function<void()>& fn);

  Driver drv_;
  std::vector<Device> devices_;  // by guest device index; never resized

  std::mutex mu_;
  // Launches hold it shared while in the driver, outside mu_; unloading a module takes it.
  std::shared_mutex unload_mu_;
  std::atomic<bool> lost_{false};  // a kernel fault ended a device's context (a sticky error)
  // Guarded by mu_; by stream id, [d] = device d's legacy stream.
  std::vector<StreamEntry> streams_ = std::vector<StreamEntry>(kMaxStreams);
  std::unordered_map<uint32_t, EventEntry> events_;      // guarded by mu_
  std::unordered_map<uint32_t, Module> modules_;         // guarded by mu_; 0 = built-in kernels
  KernelIds kernel_slots_{KernelIds::kMaxCapacity};      // guarded by mu_
  std::vector<Kernel> kernels_;                          // guarded by mu_; index = kernel_slots_ slot
  std::map<std::pair<uint32_t, std::string>, uint32_t> kernel_ids_;  // guarded by mu_; (module, name) -> id
  std::map<const void*, Program> programs_;  // guarded by mu_; by the worker's steps
  std::atomic<uint64_t> cond_tokens_{0};
  std::map<uint64_t, Alloc> allocs_;                     // guarded by mu_; by device address
  std::map<uint64_t, Global> globals_;                   // guarded by mu_; by device address
  std::map<uint64_t, int> vmm_exported_fds_;             // guarded by mu_; by handle, closed at vmm_release
  std::map<uint64_t, Alloc> ipc_opened_;                 // guarded by mu_; cudaIpcOpenMemHandle's, by device address
  std::map<uint64_t, Alloc> vmm_maps_;                   // guarded by mu_; mappings (cuMemMap), by device address
  std::vector<HostRange> host_ranges_;                   // guarded by mu_
};

}  // namespace ordo::cuda

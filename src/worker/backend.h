// What the worker drives: CUDA-like devices with streams, events and memory.
// The worker calls a backend from its dispatch threads (one per ring, several
// per session: ARCHITECTURE.md, "Dispatch threads"), in an order that already
// respects the guest's ordering (edges): any method may be called from several
// threads at once; one stream's work (launch, copies, records, waits, host
// callbacks, its destroy) comes from one of them, while stream_notify and the
// event queries may come from another. A backend only has to keep CUDA's
// own semantics for the calls it is given: stream FIFO, events (waited on by
// streams of any device), each device's legacy default stream (stream id ==
// device) synchronizing with that device's blocking streams, and never block
// the caller on device work.
//
// Devices are numbered 0..device_count()-1. Streams, events and allocations
// belong to the device they were created on; a stream's work runs on its
// device; modules and kernel ids serve every device.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ordo/device_info.h"
#include "ordo/layout.h"
#include "ordo/status.h"
#include "transport/graph_steps.h"
#include "transport/launch_shape.h"
#include "transport/tensor_map.h"

namespace ordo {

// Event ids the worker gives a backend are below this: a guest event's records
// may need more than one backend event while entries are in flight
// (EventTable: kMaxEvents + in flight beyond one per event; at most
// kMaxRings rings of 2^20 entries are in flight).
inline constexpr uint32_t kMaxBackendEvents = 2 * kMaxEvents + (kMaxRings << 20);

// Identifies the guest call behind a backend operation, for async error reports.
struct OpTag {
  uint32_t ring = 0;
  uint32_t thread = 0;  // reply slot of the issuing guest thread
  uint64_t pos = 0;     // ring position
  uint16_t op = 0;      // ordo::Op
};

// The argument buffer of a launch (LaunchParams::args) is the kernel's packed
// parameter buffer, the format cuLaunchKernel takes with
// CU_LAUNCH_PARAM_BUFFER_POINTER: each parameter's bytes at its offset from the
// kernel's parameter layout (EIATTR_KPARAM_INFO in the cubin's .nv.info.<kernel>
// section), padding between parameters unspecified, total size = offset + size
// of the last parameter. This is a contract between the guest (which packs it)
// and every backend (the cuda backend hands it to the driver as is; the sim's
// kernels read it through KernelContext::args<T>() with a struct of that layout).
struct LaunchParams {
  uint32_t kernel = 0;
  Dim3 grid, block;
  uint32_t shared_mem = 0;
  const std::byte* args = nullptr;  // valid only during the launch() call
  uint32_t args_size = 0;
  LaunchShape shape;  // cluster and cooperative; checked against the grid (check_cluster)
};

// A validated memory operand: a device address, or a host pointer into the region.
struct MemOperand {
  bool device = false;
  uint64_t addr = 0;  // device address, or reinterpret_cast<uintptr_t>(host pointer)
};

// A device attribute guests are shown as 0 whatever the device has: a feature
// whose API libcuda.so.1 answers NOT_SUPPORTED. Shown as 1, it would send a
// library down a path ordo then refuses (NCCL maps its buffers with cuMemCreate
// where virtual memory management is supported); as 0, the library takes the
// path it takes on a device without the feature.
struct WithheldAttribute {
  uint32_t attr;    // CUdevice_attribute
  const char* api;  // what is not supported
};
std::span<const WithheldAttribute> withheld_attributes();

// What a backend needs to open, in another worker process of the region,
// memory or an event it exported (on a GPU, the driver's 64-byte IPC handle;
// on the sim, a descriptor of the exporting process). Opaque to the worker.
struct IpcBlob {
  uint64_t words[10];
};

class Backend {
 public:
  // Called (from any backend thread) when async work fails after dispatch.
  using ErrorSink = std::function<void(const OpTag&, Status)>;

  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  void set_error_sink(ErrorSink sink) { error_sink_ = std::move(sink); }

  virtual uint32_t device_count() const { return 1; }

  // Streams 0..device_count()-1, the devices' legacy default streams, exist
  // from construction; stream ids the worker creates are >= kMaxDevices.
  virtual Status stream_create(uint32_t stream, uint32_t device, bool blocking, int priority) = 0;
  virtual Status stream_destroy(uint32_t stream) = 0;  // pending work still runs

  virtual Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) = 0;
  // Device operands may belong to any device (a peer copy).
  virtual Status memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size,
                        const OpTag& tag) = 0;
  virtual Status memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size,
                        const OpTag& tag) = 0;

  virtual Status event_create(uint32_t event, uint32_t device, uint32_t flags) = 0;
  virtual Status event_destroy(uint32_t event) = 0;
  virtual Status event_record(uint32_t stream, uint32_t event) = 0;  // the worker checked both are one device's
  virtual Status stream_wait_event(uint32_t stream, uint32_t event) = 0;
  virtual Status event_query(uint32_t event) = 0;  // kSuccess or kNotReady
  virtual Status event_elapsed(uint32_t start, uint32_t end, float* ms) = 0;
  // Runs fn once the work the event last captured has completed (at once if none).
  virtual void event_notify(uint32_t event, std::function<void()> fn) = 0;
  // Runs fn once all work enqueued so far on `stream` has completed. Like
  // cudaLaunchHostFunc: later work on the stream waits for fn to return.
  virtual void host_callback(uint32_t stream, std::function<void()> fn) = 0;
  // Runs fn once all work enqueued so far on `stream` has completed, without
  // being work on the stream: on the legacy stream it waits for no blocking
  // stream (what cudaStreamSynchronize and cudaStreamQuery see). The default,
  // a host callback, is work: on the legacy stream it may also wait for
  // blocking streams' work enqueued so far (never earlier than CUDA).
  virtual void stream_notify(uint32_t stream, std::function<void()> fn) { host_callback(stream, std::move(fn)); }

  // True once the device context is unusable for any session: a kernel fault
  // on a real GPU, which CUDA ends only with the process. The worker then
  // restarts itself when the faulting session ends (main.cc). The sim keeps a
  // fault to its session.
  virtual bool context_lost() const { return false; }

  virtual Status malloc(uint32_t device, uint64_t size, uint64_t* device_addr) = 0;
  virtual Status free(uint64_t device_addr) = 0;  // caller made sure no work uses it
  // Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
  // cuMemSetAccess, and their undoing). The worker holds each request to the
  // session's VmmTable first: these only do what it allowed. Sizes and
  // addresses are whole granules (kVmmGranularity); handles are the backend's.
  // A backend without it keeps supports_vmm() false: guests then read the
  // device attribute as 0 and the requests fail with kNotSupported.
  virtual bool supports_vmm() const { return false; }
  virtual Status vmm_reserve(uint64_t /*size*/, uint64_t /*alignment*/, uint64_t /*hint*/, uint64_t* /*addr*/) {
    return Status::kNotSupported;
  }
  virtual Status vmm_address_free(uint64_t /*addr*/, uint64_t /*size*/) { return Status::kNotSupported; }
  virtual Status vmm_create(uint32_t /*device*/, uint64_t /*size*/, uint64_t* /*handle*/) {
    return Status::kNotSupported;
  }
  virtual Status vmm_release(uint64_t /*handle*/) { return Status::kNotSupported; }  // memory lives while mapped
  // Maps the handle's first `size` bytes at addr, accessible from no device until vmm_set_access.
  virtual Status vmm_map(uint64_t /*addr*/, uint64_t /*size*/, uint64_t /*handle*/, uint32_t /*device*/) {
    return Status::kNotSupported;
  }
  virtual Status vmm_unmap(uint64_t /*addr*/, uint64_t /*size*/) { return Status::kNotSupported; }  // no work uses it
  // Device d's access (bits 2d..2d+1 of `access`, a VmmAccess) for each bit d of `devices`.
  virtual Status vmm_set_access(uint64_t /*addr*/, uint64_t /*size*/, uint64_t /*devices*/, uint64_t /*access*/) {
    return Status::kNotSupported;
  }
  // Interprocess memory and events (cudaIpc*): what ipc_export_* writes,
  // the same backend in another worker process of the region opens. addr is
  // an allocation's first address (the worker found it). An opened range is
  // device memory of `device`'s until ipc_close_mem; an opened event is
  // `event` here and shares its records with every process that holds it.
  // Interprocess events come from event_create with kEventInterprocess.
  virtual bool supports_ipc() const { return false; }
  virtual Status ipc_export_mem(uint64_t /*addr*/, IpcBlob* /*out*/, uint32_t* /*device*/) {
    return Status::kNotSupported;
  }
  // `size`: the exported allocation's, as its worker recorded it.
  virtual Status ipc_open_mem(const IpcBlob& /*blob*/, uint32_t /*device*/, uint64_t /*size*/, uint64_t* /*addr*/) {
    return Status::kNotSupported;
  }
  virtual Status ipc_close_mem(uint64_t /*addr*/) { return Status::kNotSupported; }  // no work uses it
  virtual Status ipc_export_event(uint32_t /*event*/, IpcBlob* /*out*/) { return Status::kNotSupported; }
  virtual Status ipc_open_event(uint32_t /*event*/, uint32_t /*device*/, const IpcBlob& /*blob*/) {
    return Status::kNotSupported;
  }
  // The session ends: waits of its streams (and notifications) on records
  // another process made stop waiting, so that its work drains even where
  // that process never completes them (it died, or its kernel spins).
  virtual void ipc_abandon() {}
  // Physical memory of vmm_create (cuMemExportToShareableHandle); importing
  // it gives a handle of this backend's for the same memory, released by
  // vmm_release as its own.
  virtual Status ipc_export_vmm(uint64_t /*handle*/, IpcBlob* /*out*/) { return Status::kNotSupported; }
  virtual Status ipc_import_vmm(const IpcBlob& /*blob*/, uint32_t /*device*/, uint64_t /*size*/,
                                uint64_t* /*handle*/) {
    return Status::kNotSupported;
  }
  // Conditional graph nodes: a handle for a graph's kHandle step, and a graph
  // with control flow (has_control_flow) run as one unit on `stream`, which
  // decides each conditional when it gets there from the value a kernel set
  // (cudaGraphSetConditional). The worker checked the steps' memory ranges;
  // kernel ids and launch shapes are the backend's to check, as for launch().
  virtual Status cond_handle_create(uint32_t /*device*/, uint64_t* /*handle*/) { return Status::kNotSupported; }
  virtual Status launch_program(uint32_t /*stream*/, std::shared_ptr<const std::vector<GraphStep>> /*steps*/,
                                const OpTag& /*tag*/) {
    return Status::kNotSupported;
  }
  // The session ends: a program's WHILE that its body never ends stops, so
  // the session's work drains (a GPU's, like a kernel that never ends, does not).
  virtual void abandon_programs() {}
  // A module image (fatbin or cubin) registered by the guest, copied out of the region.
  virtual Status module_load(uint32_t module, std::span<const std::byte> image) = 0;
  virtual Status module_unload(uint32_t module) = 0;
  // Kernel `name` (a mangled device name) of a loaded module -> a kernel id for launch().
  // Module 0 is "no module": kernels the backend knows by name (the sim's
  // built-in and registered kernels).
  virtual Status kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) = 0;
  // false: the kernel exists in its module but this backend cannot run it (the
  // sim without a host twin); its launches fail with kNoKernelImage in stream order.
  virtual bool kernel_runnable(uint32_t /*kernel*/) { return true; }
  // Device variable `name` (__device__/__constant__) of a loaded module on
  // `device`: its address and size there (each device has its own copy).
  // `size_hint` is its size in the module's symbol table (the guest read it),
  // for backends that cannot read the module themselves.
  virtual Status module_global(uint32_t /*module*/, uint32_t /*device*/, std::string_view /*name*/,
                               uint64_t /*size_hint*/, uint64_t* /*addr*/, uint64_t* /*size*/) {
    return Status::kNotSupported;
  }
  // A kernel's attributes on `device` (cuFuncGetAttribute, CUfunction_attribute
  // 0..kKernelAttributeCount-1; 0 for numbers the device does not know): what
  // the device's compiled code uses (registers, local and static shared
  // memory) and the limits that follow (threads per block). kNotSupported:
  // the backend cannot tell, and libcuda.so.1 answers from the device's limits.
  virtual Status kernel_attributes(uint32_t /*kernel*/, uint32_t /*device*/, int32_t* /*out*/) {
    return Status::kNotSupported;
  }
  // How many blocks of `kernel` (q.threads threads, q.smem bytes of dynamic
  // shared memory each) a multiprocessor of `device` holds at once, or, with
  // q.clusters, how many clusters of q.shape's size the device holds
  // (cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveClusters).
  // The guest checked q.smem against what it allowed the kernel.
  // kNotSupported: libcuda.so.1 answers from its own model.
  struct OccupancyQuery {
    uint32_t threads = 0, smem = 0;
    LaunchShape shape;
    bool clusters = false, non_portable = false;
  };
  virtual Status kernel_occupancy(uint32_t /*kernel*/, uint32_t /*device*/, const OccupancyQuery& /*q*/,
                                  uint32_t* /*out*/) {
    return Status::kNotSupported;
  }
  // A tensor map (cuTensorMapEncode*, cuTensorMapReplaceAddress) as `device`'s
  // driver makes it: 128 bytes into `out`. `r` passed check_tensor_map.
  virtual Status tensor_map_encode(uint32_t /*device*/, const TensorMapRequest& /*r*/, std::byte* /*out*/) {
    return Status::kNotSupported;
  }
  // A device, for cudaGetDeviceProperties and friends.
  virtual Status device_info(uint32_t device, DeviceInfo* out) = 0;
  // Attributes [first, first + kDeviceAttributesPerCall); 0 for numbers the device does not know.
  virtual Status device_attributes(uint32_t device, uint32_t first, int32_t* out);
  // The same as guests are shown them: with kWithheldAttributes at 0.
  Status guest_attributes(uint32_t device, uint32_t first, int32_t* out);

  // Whether `device`'s kernels could reach `peer`'s memory once enabled
  // (cudaDeviceCanAccessPeer); device != peer, both valid.
  virtual bool can_access_peer(uint32_t /*device*/, uint32_t /*peer*/) { return false; }
  // cudaDeviceEnablePeerAccess / cudaDeviceDisablePeerAccess. The worker keeps
  // the enabled pairs (and their error codes) and calls this only to change one.
  virtual Status set_peer_access(uint32_t /*device*/, uint32_t /*peer*/, bool /*enable*/) {
    return Status::kPeerAccessUnsupported;
  }

  // Host memory the worker will pass as MemOperand host pointers (the shared
  // region), told once before any copy. The cuda backend pins it so copies DMA
  // straight from it, and rejects host operands outside it. True: kernels can
  // also reach it at these same addresses (mapped pinned memory under unified
  // addressing), so the guest may hand them pinned pointers.
  virtual bool register_host_memory(void* /*base*/, uint64_t /*size*/) { return false; }

 protected:
  void report(const OpTag& tag, Status s) {
    if (error_sink_) error_sink_(tag, s);
  }

 private:
  ErrorSink error_sink_;
};

struct BackendOptions {
  std::vector<int> cuda_devices;  // host device ordinals the session sees, in order; empty: all
  uint32_t sim_devices = 1;       // devices the sim (and null) backend simulate, 1..kMaxDevices
  uint64_t null_launch_ns = 0;    // null: CPU time each launch keeps its caller busy (a driver launch's cost)
};

// "sim" (always available), "null", "cuda" (when built with CUDA and a device is
// present) or "auto" (cuda when it is available, sim otherwise; says which on stderr).
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options, std::string* error);
inline std::unique_ptr<Backend> make_backend(std::string_view name, std::string* error) {
  return make_backend(name, BackendOptions{}, error);
}
// The backend `name` would make, without making it (no device context): "sim",
// "null" or "cuda"; "" and *error when it cannot be made. Says on stderr what
// "auto" picked.
std::string resolve_backend(std::string_view name, std::string* error);

}  // namespace ordo

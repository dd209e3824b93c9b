// The guest library: what a CUDA program's calls turn into. Async calls write an
// entry into their stream's SPSC ring and return; sync calls post a request in
// the calling thread's reply slot and wait for the answer. The client decides
// the edges each entry carries (ARCHITECTURE.md, "Ordering rules").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ordo/device_info.h"
#include "ordo/limits.h"
#include "ordo/status.h"

namespace ordo {

struct Layout;  // ordo/layout.h: the region's, for tools and tests that look inside
struct TensorMapRequest;  // transport/tensor_map.h

// A stream id (< kMaxStreams) with the generation that catches use after destroy.
// Streams share rings when they outnumber them (ARCHITECTURE.md, "Streams and rings").
// kLegacyStream, as stream 0 in CUDA, names the legacy default stream of the
// calling thread's current device.
struct Stream {
  uint32_t id = kLegacyStreamId;
  uint32_t generation = 0;
};
inline constexpr Stream kLegacyStream{};
inline constexpr uint32_t kNoStream = 0xffffffffu;  // a stream that could not be created
inline constexpr uint32_t kNoRing = 0xffffffffu;

// An event handle as the worker issued it.
struct Event {
  uint64_t handle = 0;
};

struct ClientOptions {
  // false: build no edges (the old prototype). Only for tests that must see
  // ordering violations.
  bool ordered = true;
  // A call that waits this long on a worker whose heartbeat stopped fails with
  // kDevicesUnavailable instead of hanging.
  std::chrono::milliseconds worker_timeout{5000};
  // How long attach waits for the worker to accept the session.
  std::chrono::milliseconds attach_timeout{5000};
};

class Client;
namespace guest {
struct Core;  // the units a client is made of: libordo_guest's own (src/guest/core.h)
Core& core_of(Client& c);
}  // namespace guest

class Client {
 public:
  // `path`: a region file (/dev/shm/... on the host, a BAR2 resource file in a VM).
  static std::unique_ptr<Client> attach(const std::string& path, std::string* error, ClientOptions options = {});
  // Attaches to $ORDO_REGION.
  static std::unique_ptr<Client> attach_from_env(std::string* error, ClientOptions options = {});
  // attach_from_env for the CUDA stand-in libraries: on failure says on stderr
  // what is wrong and what to do, naming `library` ("libcuda.so.1 is ordo's
  // guest driver"), and sets *status to what every CUDA call will answer:
  // kInitializationError (ORDO_REGION unset or not an ordo region) or
  // kDevicesUnavailable (no live worker serves it).
  static std::unique_ptr<Client> attach_for_cuda(std::string_view library, Status* status);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Devices, as the CUDA runtime has them: each thread has a current device
  // (0 until it sets one), and streams, events and allocations are created on
  // it. A stream's work runs on the stream's device.
  uint32_t device_count() const;
  Status set_device(uint32_t device);  // kInvalidDevice past device_count()
  uint32_t current_device();
  // The device `s` belongs to; false if `s` is not a live stream.
  bool device_of(Stream s, uint32_t* device);
  // cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess and
  // cudaDeviceDisablePeerAccess (from the current device to `peer`).
  Status can_access_peer(int* can, uint32_t device, uint32_t peer);
  Status enable_peer_access(uint32_t peer);
  Status disable_peer_access(uint32_t peer);

  // Streams.
  Status stream_create(Stream* out, uint64_t flags = 0, int priority = 0);
  Status stream_destroy(Stream s);
  Stream per_thread_stream();  // this thread's default stream on its current device (cudaStreamPerThread)
  Status stream_synchronize(Stream s);
  Status stream_query(Stream s);
  Status stream_wait_event(Stream s, Event e);

  // Events.
  Status event_create(Event* out, uint32_t flags = 0);
  Status event_destroy(Event e);
  Status event_record(Event e, Stream s);
  Status event_synchronize(Event e);
  Status event_query(Event e);
  Status event_elapsed(float* ms, Event start, Event end);

  // Memory. Host pointers inside the pinned heap (malloc_host) are copied
  // zero-copy; other host memory goes through the stream's staging window.
  Status malloc(uint64_t* device_addr, uint64_t size);
  Status free(uint64_t device_addr);  // waits for all work first, as cudaFree does
  Status malloc_host(void** ptr, uint64_t size);
  Status free_host(void* ptr);
  bool is_pinned(const void* p, uint64_t size) const;
  // Whether kernels can take pinned pointers as device pointers, at the same
  // address (CUDA's mapped pinned memory under unified addressing): the guest
  // maps the region where the worker does. If not, *why says why.
  bool pinned_is_mapped(std::string* why = nullptr) const;
  // Virtual memory management, as cuMemAddressReserve, cuMemAddressFree,
  // cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap and cuMemSetAccess: in
  // whole granules (kVmmGranularity). A handle names physical memory of a
  // device; mapped at a reserved address it is device memory like malloc's
  // once set_access granted a device access (`devices`: bit d names device d,
  // `access`: bits 2d..2d+1 its VmmAccess). unmap waits for all work first.
  Status vmm_reserve(uint64_t size, uint64_t alignment, uint64_t hint, uint64_t* addr);
  Status vmm_address_free(uint64_t addr, uint64_t size);
  Status vmm_create(uint32_t device, uint64_t size, uint64_t* handle);
  Status vmm_release(uint64_t handle);
  Status vmm_map(uint64_t addr, uint64_t size, uint64_t handle);
  Status vmm_unmap(uint64_t addr, uint64_t size);
  Status vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access);
  // Interprocess memory and events (cudaIpc*). An export is a token another
  // guest process of the region opens (its own session, on a worker process
  // of its own): memory, as the whole allocation that holds device_addr, at an
  // address of the opener's, counted per open until as many closes; an event
  // made with kEventInterprocess, as an event of the opener's whose records
  // are shared. A record of, or a wait on, such an event returns once its
  // worker dispatched it, so that what the program tells another process
  // afterwards comes after it (ARCHITECTURE.md, "Sessions").
  struct IpcToken {
    uint64_t word = 0, secret = 0;
  };
  Status ipc_export_mem(uint64_t device_addr, IpcToken* out);
  // *device: the device the memory belongs to (the exporter's).
  Status ipc_open_mem(const IpcToken& t, uint64_t* device_addr, uint64_t* size, uint32_t* device);
  Status ipc_close_mem(uint64_t device_addr);
  Status ipc_export_event(Event e, IpcToken* out);
  Status ipc_open_event(const IpcToken& t, Event* out);
  // Physical memory of vmm_create (cuMemExportToShareableHandle), opened by
  // any process of the region, this one too, as a handle of its own for the
  // same memory (cuMemImportFromShareableHandle).
  Status ipc_export_vmm(uint64_t handle, IpcToken* out);
  Status ipc_open_vmm(const IpcToken& t, uint64_t* handle, uint64_t* size, uint32_t* device);
  Status memcpy_h2d_async(uint64_t dst, const void* src, uint64_t size, Stream s);
  Status memcpy_d2h_async(void* dst, uint64_t src, uint64_t size, Stream s);  // pageable dst: returns when done
  Status memcpy_d2d_async(uint64_t dst, uint64_t src, uint64_t size, Stream s);
  Status memset_async(uint64_t dst, uint8_t value, uint64_t size, Stream s);
  // cudaMemcpyPeerAsync: device memory of one device to another's, as stream work on `s`.
  Status memcpy_peer_async(uint64_t dst, uint32_t dst_device, uint64_t src, uint32_t src_device, uint64_t size,
                           Stream s);
  // Synchronous copies: legacy-stream work (after earlier legacy and blocking-stream
  // work, as cudaMemcpy), and the call returns when the copy is done.
  // `s`: the legacy stream, as cudaMemcpy; a per-thread build's cudaMemcpy is its thread's stream's work.
  Status memcpy_h2d(uint64_t dst, const void* src, uint64_t size, Stream s = kLegacyStream);
  Status memcpy_d2h(void* dst, uint64_t src, uint64_t size);

  // Kernels. Module 0 holds the kernels the backend knows by name (the sim's).
  Status kernel_lookup(const std::string& name, uint32_t* kernel) { return kernel_lookup(0, name, kernel); }
  // `runnable` (optional): false when the backend knows the kernel but cannot run it.
  Status kernel_lookup(uint32_t module, const std::string& name, uint32_t* kernel, bool* runnable = nullptr);
  // Ships a module image (fatbin or cubin) to the worker through the pinned heap.
  Status module_load(const void* image, uint64_t size, uint32_t* module);
  Status module_unload(uint32_t module);  // waits for all work first
  // A device variable of a loaded module, on the current device; `size_hint`
  // is its size in the module's symbol table.
  Status module_global(uint32_t module, const std::string& name, uint64_t size_hint, uint64_t* addr, uint64_t* size);
  // A kernel's attributes on `device` (kKernelAttributeCount int32 values by
  // CUfunction_attribute number, into `out`), as that device reports them.
  Status kernel_attributes(uint32_t kernel, uint32_t device, int32_t* out);
  // Blocks of `kernel` per multiprocessor of `device`, or active clusters
  // (`mode`: kOccupancy* bits; `shape`: a LaunchShape's flags), as the device counts them.
  Status kernel_occupancy(uint32_t kernel, uint32_t device, uint32_t threads, uint32_t smem, uint16_t shape,
                          uint64_t mode, uint32_t* out);
  Status device_info(DeviceInfo* out) { return device_info(current_device(), out); }
  Status device_info(uint32_t device, DeviceInfo* out);
  // Device attributes first.. (kDeviceAttributesPerCall of them, by CUdevice_attribute number).
  Status device_attributes(uint32_t device, uint32_t first, int32_t* out);
  // For a process that is ending (libcuda.so.1's destructor): the region stays
  // mapped past this client, until Region::privatize_retained() replaces it.
  void retain_memory_until_exit();
  // A tensor map as `device`'s driver encodes it: its 128 bytes into `map`.
  Status tensor_map_encode(uint32_t device, const TensorMapRequest& r, void* map);
  // `shape`: LaunchShape::flags() (transport/launch_shape.h) of a cluster or
  // cooperative launch, which the caller checked against the kernel and device.
  Status launch(uint32_t kernel, Dim3 grid, Dim3 block, const void* args, uint32_t args_size, Stream s,
                uint32_t shared_mem = 0, uint16_t shape = 0);

  // Graphs: device work (transport/graph_steps.h: kernels, memsets and
  // device-to-device copies) sent once and launched as one entry, ordered
  // like any stream work. destroy returns at once; launches issued before
  // still run.
  Status graph_create(const void* steps, uint64_t size, uint32_t* graph);
  Status graph_launch(uint32_t graph, Stream s);
  Status graph_destroy(uint32_t graph);
  // A conditional handle for a graph's kHandle step (cuGraphConditionalHandleCreate):
  // kNotSupported where the worker's backend cannot run conditional nodes.
  Status graph_cond_handle(uint32_t device, uint64_t* handle);

  // Host functions (cudaLaunchHostFunc): returns at once; `fn` runs on the
  // client's host-function thread once the stream's earlier work completed,
  // and the stream's later work waits until it returned.
  Status host_func(Stream s, std::function<void()> fn);

  // Device-wide: the current device's work.
  Status device_synchronize();
  // Waits for everything that stream work issued now on `s` would follow: the
  // stream, and the legacy stream's implicit synchronization (all blocking
  // streams for the legacy stream; the legacy stream for a blocking one).
  // Host-side stream work (host functions, host-to-host copies) runs after it.
  Status stream_order_wait(Stream s);
  Status null_call();         // a sync round trip that does nothing (benchmarks)
  Status get_last_error();    // returns and clears this thread's last error (a kernel fault stays)
  Status sticky_error() const;  // the kernel fault that ended this session's device context, or kSuccess
  Status peek_last_error();

  const Layout& layout() const;  // the region's: rings, staging window, pinned heap

 private:
  friend guest::Core& guest::core_of(Client& c);
  explicit Client(std::unique_ptr<guest::Core> core);
  std::unique_ptr<guest::Core> core_;
};

}  // namespace ordo

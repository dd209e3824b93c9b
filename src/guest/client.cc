// Client, the facade: attaching, and each call handed to the unit that owns
// it (core.h lists them).
#include "ordo/client.h"

#include <cstdio>
#include <cstdlib>

#include "guest/core.h"
#include "guest/testing.h"
#include "ordo/layout.h"


namespace ordo {

namespace guest {

Core::Core(std::unique_ptr<Region> region, ClientOptions options, uint64_t session_id)
    : session(std::move(region), options, session_id),
      threads(session),
      edges(session.layout().ring_count, session.options().ordered),
      producer(session, threads, edges),
      heap(session.region().heap(), session.layout().heap_size),
      pool(session, heap),
      staging(session, producer),
      waits(session, threads, producer, edges),
      streams(session, threads, edges, producer, waits),
      events(session, threads, streams, edges),
      devices(session, threads, streams),
      memory(threads, waits, heap, pool),
      copies(session, threads, streams, producer, staging, pool, heap),
      kernels(threads, streams, producer, staging, waits, devices, memory, heap),
      graphs(threads, streams, producer, memory, heap),
      host_functions(session, threads, streams, producer, memory) {
  threads.set_streams(&streams);
}

Core::~Core() {
  host_functions.stop();
  threads.orphan();  // threads exiting from now on release nothing
  session.detach();  // the worker frees whatever the session still holds
}

Core& core_of(Client& c) { return *c.core_; }

uint32_t ring_of_stream(Client& c, Stream s) { return core_of(c).streams.ring_of(s); }

uint64_t last_position(Client& c) {
  const ThreadState* t = core_of(c).threads.find_current();
  return t ? t->last_pos : 0;
}

Region& region_of(Client& c) { return core_of(c).session.region(); }

}  // namespace guest

Client::Client(std::unique_ptr<guest::Core> core) : core_(std::move(core)) {}
Client::~Client() = default;

std::unique_ptr<Client> Client::attach(const std::string& spec, std::string* error, ClientOptions options) {
  uint64_t session = 0;
  auto region = guest::Session::claim(spec, error, &options, &session);
  if (!region) return nullptr;
  return std::unique_ptr<Client>(new Client(std::make_unique<guest::Core>(std::move(region), options, session)));
}

std::unique_ptr<Client> Client::attach_from_env(std::string* error, ClientOptions options) {
  const char* p = std::getenv("ORDO_REGION");
  if (!p || !*p) {
    if (error) *error = "ORDO_REGION is not set (set it to the region path the worker serves, e.g. /dev/shm/ordo)";
    return nullptr;
  }
  return attach(p, error, options);
}

std::unique_ptr<Client> Client::attach_for_cuda(std::string_view library, Status* status) {
  std::string err;
  auto c = attach_from_env(&err);
  if (c) return c;
  const char* region = std::getenv("ORDO_REGION");
  *status = region && *region && err.find("worker") != std::string::npos ? Status::kDevicesUnavailable
                                                                          : Status::kInitializationError;
  std::fprintf(stderr,
               "ordo: cannot reach the host GPU: %s\n"
               "ordo: this %.*s; it needs ORDO_REGION set to the region an ordo-worker serves (e.g. ordo-worker "
               "--region /dev/shm/ordo, then ORDO_REGION=/dev/shm/ordo). Every CUDA call will fail with error %d.\n",
               err.c_str(), int(library.size()), library.data(), int(*status));
  return nullptr;
}

// ---- devices ---------------------------------------------------------------

uint32_t Client::device_count() const { return core_->session.device_count(); }
Status Client::set_device(uint32_t device) { return core_->devices.set_device(device); }
uint32_t Client::current_device() { return core_->devices.current_device(); }
bool Client::device_of(Stream s, uint32_t* device) { return core_->streams.device_of(s, device); }
Status Client::can_access_peer(int* can, uint32_t device, uint32_t peer) {
  return core_->devices.can_access_peer(can, device, peer);
}
Status Client::enable_peer_access(uint32_t peer) { return core_->devices.peer_access(peer, PeerCmd::kEnable); }
Status Client::disable_peer_access(uint32_t peer) { return core_->devices.peer_access(peer, PeerCmd::kDisable); }
Status Client::device_info(uint32_t device, DeviceInfo* out) { return core_->devices.device_info(device, out); }
Status Client::device_attributes(uint32_t device, uint32_t first, int32_t* out) {
  return core_->devices.device_attributes(device, first, out);
}
Status Client::tensor_map_encode(uint32_t device, const TensorMapRequest& r, void* map) {
  return core_->devices.tensor_map_encode(device, r, map);
}

// ---- streams ---------------------------------------------------------------

Status Client::stream_create(Stream* out, uint64_t flags, int priority) {
  return core_->streams.create(out, flags, priority);
}
Status Client::stream_destroy(Stream s) { return core_->streams.destroy(s); }
Stream Client::per_thread_stream() { return core_->streams.per_thread(); }
Status Client::stream_synchronize(Stream s) { return core_->streams.synchronize(s); }
Status Client::stream_query(Stream s) { return core_->streams.query(s); }
Status Client::stream_wait_event(Stream s, Event e) { return core_->events.stream_wait(s, e); }
Status Client::stream_order_wait(Stream s) { return core_->streams.order_wait(s); }

// ---- events ----------------------------------------------------------------

Status Client::event_create(Event* out, uint32_t flags) { return core_->events.create(out, flags); }
Status Client::event_destroy(Event e) { return core_->events.destroy(e); }
Status Client::event_record(Event e, Stream s) { return core_->events.record(e, s); }
Status Client::event_synchronize(Event e) { return core_->events.synchronize(e); }
Status Client::event_query(Event e) { return core_->events.query(e); }
Status Client::event_elapsed(float* ms, Event start, Event end) { return core_->events.elapsed(ms, start, end); }

// ---- memory ----------------------------------------------------------------

Status Client::malloc(uint64_t* device_addr, uint64_t size) { return core_->memory.malloc(device_addr, size); }
Status Client::free(uint64_t device_addr) { return core_->memory.free(device_addr); }
Status Client::malloc_host(void** ptr, uint64_t size) { return core_->memory.malloc_host(ptr, size); }
Status Client::free_host(void* ptr) { return core_->memory.free_host(ptr); }
Status Client::vmm_reserve(uint64_t size, uint64_t alignment, uint64_t hint, uint64_t* addr) {
  return core_->memory.vmm_reserve(size, alignment, hint, addr);
}
Status Client::vmm_address_free(uint64_t addr, uint64_t size) { return core_->memory.vmm_address_free(addr, size); }
Status Client::vmm_create(uint32_t device, uint64_t size, uint64_t* handle) {
  return core_->memory.vmm_create(device, size, handle);
}
Status Client::vmm_release(uint64_t handle) { return core_->memory.vmm_release(handle); }
Status Client::vmm_map(uint64_t addr, uint64_t size, uint64_t handle) { return core_->memory.vmm_map(addr, size, handle); }
Status Client::ipc_export_mem(uint64_t device_addr, IpcToken* out) { return core_->memory.ipc_export(device_addr, out); }
Status Client::ipc_open_mem(const IpcToken& t, uint64_t* device_addr, uint64_t* size, uint32_t* device) {
  return core_->memory.ipc_open(t, device_addr, size, device);
}
Status Client::ipc_close_mem(uint64_t device_addr) { return core_->memory.ipc_close(device_addr); }
Status Client::ipc_export_event(Event e, IpcToken* out) { return core_->events.ipc_export(e, out); }
Status Client::ipc_open_event(const IpcToken& t, Event* out) { return core_->events.ipc_open(t, out); }
Status Client::ipc_export_vmm(uint64_t handle, IpcToken* out) { return core_->memory.ipc_export_vmm(handle, out); }
Status Client::ipc_open_vmm(const IpcToken& t, uint64_t* handle, uint64_t* size, uint32_t* device) {
  return core_->memory.ipc_open_vmm(t, handle, size, device);
}
Status Client::vmm_unmap(uint64_t addr, uint64_t size) { return core_->memory.vmm_unmap(addr, size); }
Status Client::vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access) {
  return core_->memory.vmm_set_access(addr, size, devices, access);
}
bool Client::is_pinned(const void* p, uint64_t size) const { return core_->heap.contains(p, size); }
bool Client::pinned_is_mapped(std::string* why) const {
  if (why) *why = core_->session.unmapped_why();
  return core_->session.host_mapped();
}
Status Client::memcpy_h2d_async(uint64_t dst, const void* src, uint64_t size, Stream s) {
  return core_->copies.h2d_async(dst, src, size, s);
}
Status Client::memcpy_d2h_async(void* dst, uint64_t src, uint64_t size, Stream s) {
  return core_->copies.d2h_async(dst, src, size, s);
}
Status Client::memcpy_d2d_async(uint64_t dst, uint64_t src, uint64_t size, Stream s) {
  return core_->copies.d2d_async(dst, src, size, s);
}
Status Client::memset_async(uint64_t dst, uint8_t value, uint64_t size, Stream s) {
  return core_->copies.memset_async(dst, value, size, s);
}
Status Client::memcpy_peer_async(uint64_t dst, uint32_t dst_device, uint64_t src, uint32_t src_device, uint64_t size,
                                 Stream s) {
  return core_->copies.peer_async(dst, dst_device, src, src_device, size, s);
}
Status Client::memcpy_h2d(uint64_t dst, const void* src, uint64_t size, Stream s) {
  return core_->copies.h2d(dst, src, size, s);
}
Status Client::memcpy_d2h(void* dst, uint64_t src, uint64_t size) { return core_->copies.d2h(dst, src, size); }

// ---- kernels ---------------------------------------------------------------

Status Client::kernel_lookup(uint32_t module, const std::string& name, uint32_t* kernel, bool* runnable) {
  return core_->kernels.lookup(module, name, kernel, runnable);
}
Status Client::module_load(const void* image, uint64_t size, uint32_t* module) {
  return core_->kernels.module_load(image, size, module);
}
Status Client::module_unload(uint32_t module) { return core_->kernels.module_unload(module); }
Status Client::module_global(uint32_t module, const std::string& name, uint64_t size_hint, uint64_t* addr,
                             uint64_t* size) {
  return core_->kernels.module_global(module, name, size_hint, addr, size);
}
Status Client::kernel_attributes(uint32_t kernel, uint32_t device, int32_t* out) {
  return core_->kernels.attributes(kernel, device, out);
}
Status Client::kernel_occupancy(uint32_t kernel, uint32_t device, uint32_t threads, uint32_t smem, uint16_t shape,
                                uint64_t mode, uint32_t* out) {
  return core_->kernels.occupancy(kernel, device, threads, smem, shape, mode, out);
}
Status Client::launch(uint32_t kernel, Dim3 grid, Dim3 block, const void* args, uint32_t args_size, Stream s,
                      uint32_t shared_mem, uint16_t shape) {
  return core_->kernels.launch(kernel, grid, block, args, args_size, s, shared_mem, shape);
}
Status Client::graph_create(const void* steps, uint64_t size, uint32_t* graph) {
  return core_->graphs.create(steps, size, graph);
}
Status Client::graph_launch(uint32_t graph, Stream s) { return core_->graphs.launch(graph, s); }
Status Client::graph_destroy(uint32_t graph) { return core_->graphs.destroy(graph); }
Status Client::graph_cond_handle(uint32_t device, uint64_t* handle) {
  return core_->graphs.cond_handle(device, handle);
}
Status Client::host_func(Stream s, std::function<void()> fn) {
  return core_->host_functions.host_func(s, std::move(fn));
}

// ---- device-wide and errors ------------------------------------------------

Status Client::device_synchronize() { return core_->waits.device_synchronize(); }
Status Client::null_call() {
  Entry e{};
  e.op = uint16_t(Op::Null);
  return core_->threads.finish(core_->threads.current(), core_->threads.call(e));
}
Status Client::get_last_error() { return core_->threads.get_last_error(); }
Status Client::peek_last_error() { return core_->threads.peek_last_error(); }
Status Client::sticky_error() const { return core_->session.sticky_error(); }
const Layout& Client::layout() const { return core_->session.layout(); }
void Client::retain_memory_until_exit() { core_->session.region().retain_until_exit(); }

}  // namespace ordo

// The guest library: what a CUDA program's calls turn into. Async calls write an
// entry into their stream's SPSC ring and return; sync calls post a request in
// the calling thread's reply slot and wait for the answer. The client decides
// the edges each entry carries (ARCHITECTURE.md, "Ordering rules").
#pragma once

#include <array>
#include <atomic>
#include <boost/container/small_vector.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ordo/device_info.h"
#include "ordo/doorbell.h"
#include "ordo/layout.h"
#include "ordo/ops.h"
#include "ordo/region.h"
#include "ordo/status.h"

namespace ordo {

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
  uint32_t device_count() const { return device_count_; }
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
  Status device_info(DeviceInfo* out) { return device_info(current_device(), out); }
  Status device_info(uint32_t device, DeviceInfo* out);
  // Device attributes first.. (kDeviceAttributesPerCall of them, by CUdevice_attribute number).
  Status device_attributes(uint32_t device, uint32_t first, int32_t* out);
  Status launch(uint32_t kernel, Dim3 grid, Dim3 block, const void* args, uint32_t args_size, Stream s,
                uint32_t shared_mem = 0);

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

  // Position the last entry this thread pushed on `s` got, and the ring `s` is on (tests).
  uint64_t last_position(Stream s) const;
  uint32_t ring_of_stream(Stream s);
  const Layout& layout() const { return region_->layout(); }
  Region& region() { return *region_; }

 private:
  struct Ring;
  struct StreamState;
  struct Bound;
  struct EventState;
  struct ThreadState;
  struct SlotPool;
  struct HostFuncs;

  Client(std::unique_ptr<Region> region, ClientOptions options, uint64_t session);
  inline ThreadState& thread();  // inline: the fast path of every call (client.cc)
  ThreadState& thread_slow();  // thread() on this client's first call from this thread
  Status check_async_error(ThreadState& t);
  Status finish(ThreadState& t, Status own);  // record last error, surface async errors
  Status finish_own(ThreadState& t, Status own);  // record last error; async errors stay pending
  // finish() for a call that only enqueued: the errors present when it pushed its first entry.
  Status finish_async(ThreadState& t);
  inline bool bind(Stream s, Bound* out);
  // Appends `e` of stream `stream` (with edges for its op's ordering role, after
  // any edges `e` already carries) to ring `r`; caller holds r.mu.
  uint64_t push_locked(ThreadState& t, Ring& g, uint32_t r, uint32_t stream, const Entry& call, EventState* ev);
  // A launch's push_locked: its entry is written in its slot, not built and copied.
  inline uint64_t push_launch_locked(ThreadState& t, Ring& g, uint32_t r, uint32_t stream, const uint64_t (&arg)[6]);
  inline void mark_errors(ThreadState& t);
  using EdgeList = boost::container::small_vector<Edge, 16>;
  uint64_t push_event_locked(ThreadState& t, Ring& g, uint32_t r, uint32_t stream, const Entry& call, EventState& ev,
                             EdgeList& edges);  // edges: the call's own
  uint64_t push_launch_edges_locked(ThreadState& t, Ring& g, uint32_t stream, const uint64_t (&arg)[6],
                                    const EdgeList& edges);
  uint64_t push_edges_locked(ThreadState& t, Ring& g, uint32_t stream, const Entry& call,
                             const EdgeList& edges);
  void write_entry(Ring& g, const Entry& e);
  inline Entry* claim_slot(Ring& g);  // the slot at the ring's tail once it is free; nullptr: session lost
  inline void commit_slot(Ring& g);   // the entry just published: tell the worker and other threads
  inline void legacy_edges(Ring& g, uint32_t r, uint32_t stream, EdgeList* edges);
  bool alloc_staging(ThreadState& t, Ring& g, uint32_t r, uint64_t size, uint64_t* offset);
  bool try_alloc_staging(Ring& g, uint32_t r, uint64_t size, uint64_t* offset);  // size 16-aligned; no wait
  uint64_t staging_chunk(uint64_t size) const;
  void reclaim_staging(Ring& g, uint32_t r);
  uint64_t push_fence_locked(ThreadState& t, Ring& g, uint32_t r);
  Status wait_completed(uint32_t r, uint64_t pos);
  void fence_target(ThreadState& t, uint32_t r, std::vector<std::pair<uint32_t, uint64_t>>* targets);
  Status wait_targets(ThreadState& t, const std::vector<std::pair<uint32_t, uint64_t>>& targets);
  // fence_target for the work of some of ring r's streams (a device's, or its
  // blocking ones), destroyed ones included: Ring::Presence.
  void presence_target(ThreadState& t, uint32_t r, uint32_t device, bool blocking_only,
                       std::vector<std::pair<uint32_t, uint64_t>>* targets);
  // What `device`'s legacy-stream work follows: its blocking streams' work.
  void legacy_targets(ThreadState& t, uint32_t device, std::vector<std::pair<uint32_t, uint64_t>>* targets);
  Status synchronize_all(ThreadState& t);  // every device's work (cudaFree)
  uint32_t choose_ring_locked() const;     // for a new stream; caller holds rings_mu_
  Status open_legacy(ThreadState& t, uint32_t device);  // device's legacy stream, on a ring of its own if one is free
  Status peer_access(uint32_t peer, PeerCmd cmd);
  void* heap_alloc(uint64_t size);  // from the pinned heap; null when full
  void heap_free(void* p);
  // Up to kPoolBlocks pinned-heap blocks of *chunk bytes each for a pageable
  // copy of `size` (0: too small for the pool, or the heap is short: use the
  // ring's window).
  unsigned pool_blocks(uint64_t size, uint64_t* chunk, std::byte** blocks);
  // Frees `block` once ring r completed `fence` (at once if it has).
  void release_pool_block(uint32_t r, uint64_t fence, std::byte* block);
  // Frees the blocks whose copies completed (waiting for them first if
  // `wait`); true if any was freed.
  bool reclaim_pool(bool wait);
  Status call(Entry e, uint64_t* r0 = nullptr, uint64_t* r1 = nullptr, const std::string* payload = nullptr,
              void* reply_payload = nullptr, size_t reply_size = 0);
  Status wait_worker(const std::atomic<uint64_t>& word, uint64_t target);
  bool worker_alive();
  void notify_worker();
  EventState* event_of(Event e);
  Status stream_op(Stream s, Entry e, EventState* ev = nullptr);
  Status release_stream(ThreadState& t, Stream s);
  Status fetch_device_info(uint32_t device, DeviceInfo* out);  // the request alone: no last-error bookkeeping
  void run_host_funcs();

  std::unique_ptr<Region> region_;
  const ClientOptions opt_;
  WorkerBell bell_;
  uint64_t session_;
  uint32_t device_count_ = 1;  // the worker's word, checked at attach
  std::vector<std::unique_ptr<Ring>> rings_;
  std::unique_ptr<StreamState[]> streams_;  // kMaxStreams, by stream id
  std::mutex rings_mu_;                     // stream creation and destruction
  std::deque<uint32_t> free_streams_;       // guarded by rings_mu_; reused oldest first
  std::shared_ptr<SlotPool> slots_;
  uint32_t shared_slot_ = kNoSlot;  // async errors of threads without a permanent slot
  std::mutex lease_mu_;
  std::condition_variable lease_cv_;
  std::vector<uint32_t> lease_free_;  // slots lent to those threads for one sync call
  std::unique_ptr<std::atomic<EventState*>[]> events_;
  std::mutex events_mu_;
  struct Heap;
  std::unique_ptr<Heap> heap_;
  std::unique_ptr<HostFuncs> host_funcs_;
  struct PoolBlock {
    uint32_t ring;
    uint64_t fence;
    std::byte* block;
  };
  std::mutex pool_mu_;
  std::vector<PoolBlock> pool_pending_;  // staging-pool blocks an unfinished H2D copy still reads
  const uint64_t id_;
  uint64_t guest_session_ = 0;
  std::atomic<bool> lost_{false};  // the worker died or dropped this session
  std::array<std::atomic<uint64_t>, kMaxDevices> smem_optin_;  // per device: the dynamic shared memory limit; 0 until needed
  // Per device: the positions of each ring its legacy stream's work already
  // follows (under the legacy stream's ring mu; allocated when it is opened).
  std::array<std::vector<uint64_t>, kMaxDevices> legacy_covered_;
  std::thread heartbeat_;
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool beat_stop_ = false;
};

}  // namespace ordo

// The host worker: polls a region's rings and reply slots, honours each entry's
// edges, validates everything it copies out, and hands calls to a Backend.
// Several dispatch threads ("lanes") may serve one session: each ring has one
// lane, lane 0 (run()'s thread) also serves the reply slots and the session,
// and edges across lanes are met through each ring's published head
// (ARCHITECTURE.md, "Dispatch threads").
// Its units: ring_server.cc (ring reading and the edge gate), slot_server.cc
// (reply slots), session.cc (attach, liveness, the one reset), handlers/ (what
// each op of ops.def does), worker.cc (the dispatch loop and its heartbeat).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <shared_mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "doorbell_waiter.h"
#include "event_table.h"
#include "ipc_table.h"
#include "side_thread.h"
#include "stream_table.h"
#include "ordo/layout.h"
#include "ordo/ops.h"
#include "ordo/region.h"
#include "trace.h"
#include "transport/graph_steps.h"
#include "transport/op_args.h"
#include "vmm_table.h"
#include "transport/reply_slot.h"
#include "transport/ring.h"

namespace ordo {

// Dispatch threads per session: at most this many (--dispatch-threads).
inline constexpr uint32_t kMaxDispatchThreads = 64;
// What the worker chooses when not told: one per two CPUs this process may
// run on (a guest thread per dispatch thread keeps both busy), at most 8.
uint32_t default_dispatch_threads();

struct WorkerOptions {
  // false: ignore edges, as the old prototype did. Only for tests that must
  // show ordering violations; never for real guests.
  bool ordered = true;
  // != 0: hold each dispatchable entry for a random 0..chaos_max_hold_us, so
  // tests see many interleavings of the rings (a schedule fuzzer).
  uint64_t chaos_seed = 0;
  uint32_t chaos_max_hold_us = 300;
  // Idle policy: spin this long without work, then sleep on the doorbell for at
  // most max_sleep (a lost ring costs at most that).
  std::chrono::microseconds spin{200};
  std::chrono::microseconds max_sleep{std::chrono::milliseconds(20)};
  // A guest whose heartbeat stops this long is presumed dead: its streams,
  // events and memory are freed and the region waits for a new guest.
  std::chrono::milliseconds guest_timeout{5000};
  // Threads that dispatch the session's rings (1..kMaxDispatchThreads); ring
  // r is served by thread r % dispatch_threads. run() starts the extra ones.
  uint32_t dispatch_threads = 1;
  // The region's table of exports between its guest processes (ipc_table.h),
  // and this session's part of the region; null: cudaIpc* answer kNotSupported.
  IpcTable* ipc = nullptr;
  uint32_t partition = 0;
  bool trace = false;  // record every dispatch for write_trace()
  bool quiet = false;
};

struct WorkerStats {
  std::array<uint64_t, kOpCount> ops{};  // dispatched, per op
  uint64_t entries = 0;
  uint64_t slot_requests = 0;
  uint64_t slot_posts = 0;   // of those, found through slot_posted (the rest: watched slots)
  uint64_t edge_waits = 0;   // entries that found an edge not yet satisfied
  uint64_t errors = 0;       // bad entries and failed calls
  uint64_t sleeps = 0;
  uint64_t wakeups_by_doorbell = 0;
  uint64_t sessions = 0;        // guest sessions attached
  uint64_t sessions_lost = 0;   // of those, declared dead by heartbeat
  uint64_t allocations = 0;     // device allocations the current guest holds
  std::string table() const;  // plain text, one line per non-zero counter
  std::string json() const;   // one line
};

struct FenceQueue;  // fence_queue.h

class Worker {
 public:
  Worker(Region& region, Backend& backend, WorkerOptions options = {});
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves until stop(); sleeps on the doorbell (if given) when idle.
  void run(DoorbellWaiter* doorbell = nullptr);
  void stop() { stop_.store(true, std::memory_order_relaxed); }
  // run() returned because the backend lost its device context to a kernel
  // fault: serving the next session needs a fresh process.
  bool restart_requested() const { return restart_.load(std::memory_order_relaxed); }
  // One pass over rings and slots; true if anything moved.
  bool poll_once();
  // run()'s 100 ms pass: reads every slot once, ages watched slots, attaches
  // or ends the guest's session. With poll_once, drives the worker without
  // its threads (the fuzzer).
  void sweep();

  WorkerStats stats() const;
  // Writes the Chrome/Perfetto trace recorded so far (options.trace); call after run().
  bool write_trace(const std::string& path, std::string* error) const;

 private:
  struct Lane;
  struct RingState {
    RingReader reader;
    // Next position to dispatch == entries dispatched. Written by the ring's
    // lane only (release: what the dispatch did happens before), read by every
    // lane's edge gate.
    std::atomic<uint64_t> head{0};
    bool staged = false;      // `entry` holds a validated copy of position head
    bool chaos_armed = false;
    uint64_t chaos_until_ns = 0;
    bool waited = false;      // counted in edge_waits already
    uint64_t staged_ns = 0;   // when tracing
    Entry entry{};
    // A dispatched HostFunc whose function the guest has not finished: the
    // ring's next entry waits until hold->done >= hold_ticket. Set before the
    // head passes it; other lanes read them for passed().
    std::atomic<HostFuncWords*> hold{nullptr};
    std::atomic<uint64_t> hold_ticket{0};
    bool held() const;  // a hold whose function the guest has not finished
    // The staged entry's edges while it waits for them, for the cycle check
    // (waits_for_itself); guarded by waits_mu_.
    bool registered = false;
    uint8_t wait_count = 0;
    Edge wait_edges[kMaxEdges];
    // Streams that got work from this ring since its last Fence: the next
    // Fence completes once each of them has run that work.
    std::vector<uint32_t> dirty;
    uint32_t fence_count = 0;  // fences dispatched: a stream is in `dirty` iff its mark equals this
    std::shared_ptr<FenceQueue> fences;
  };
  // Watched: the guest skips posting and the worker reads request.seq each
  // pass. Leaving: the guest was told to post again; still read for one more sweep (the 100 ms pass).
  enum class Watch : uint8_t { kNone, kWatched, kLeaving };
  static constexpr size_t kMaxWatched = 8;
  struct SlotState {
    uint64_t taken = 0;       // the last request.seq taken
    Watch watch = Watch::kNone;
    bool active = false;      // a request since the last sweep
    bool staged = false;
    bool waited = false;
    uint64_t seq = 0;
    uint64_t staged_ns = 0;
    Entry entry{};
  };
  // One op of a ring, as its handler sees it.
  struct RingCall {
    uint32_t ring;
    uint64_t pos;
    const Entry& e;  // the validated copy
    RingState& rs;
    OpTag tag;
  };
  // One request of a reply slot. edges_met false: an event request answered
  // before its edges were met (try_slot).
  struct SlotCall {
    uint32_t slot;
    uint64_t seq;
    const Entry& e;
    bool edges_met;
  };
  // A handler per op of ops.def, on its path (handlers/*.cc): a new op does
  // not link until it has one. A ring op returns its status (async_error
  // reports a failure); a slot op replies itself, at once or from a backend
  // callback (deferred_reply).
#define ORDO_OP(name, path, order, args) \
  ORDO_IF(Ring, path, Status op_##name(const RingCall& c);) ORDO_IF(Slot, path, void op_##name(const SlotCall& c);)
#include "ordo/ops.def"
#undef ORDO_OP

  // A dispatch thread: the rings r % lanes == its index, and their counters.
  struct Lane {
    uint32_t index = 0;
    std::atomic<uint32_t> parked{0};     // 1: asleep (futex); a waker stores 0 and wakes it
    std::atomic<bool> waiting{false};    // parked with an entry whose edges are not met
    std::mt19937_64 chaos_rng;
    // Single-writer counters (the lane's thread), summed by stats().
    std::array<std::atomic<uint64_t>, kOpCount> ops{};
    std::atomic<uint64_t> entries{0}, edge_waits{0};
  };
  bool poll_ring(uint32_t r, Lane& lane);
  bool poll_lane(Lane& lane);            // one pass over the lane's rings
  void serve_lane(Lane& lane, std::stop_token stop);  // the extra lanes' loop
  uint32_t lane_of(uint32_t ring) const { return threads_running_ ? ring % uint32_t(lanes_.size()) : 0; }
  // After progress on a ring: lanes parked waiting for an edge look again.
  void wake_waiting_lanes();
  void wake_lane(Lane& lane);
  bool all_lanes_parked() const;
  // Stops the extra lanes between passes (attach and reset change ring state), and lets them go.
  void pause_lanes();
  void resume_lanes();
  void start_lanes();  // the extra lanes' threads (run())
  void stop_lanes();  // joins them; lane 0 serves every ring again
  void beat(std::stop_token stop);  // the heartbeat thread
  Status stream_of(const Entry& e, uint32_t ring) const;
  void mark_dirty(RingState& rs, uint32_t stream);
  // What every stream-work op does first: its stream must be on its ring, and
  // the ring's next fence waits for it.
  Status enter_stream(const RingCall& c);
  bool faulted() const { return sticky_.load(std::memory_order_relaxed) != 0; }
  bool poll_slots();
  bool try_slot(uint32_t s);
  void watch(uint32_t s);
  void age_watched();
  Status check_edges(const Entry& e, uint32_t own_ring, std::string* why);
  // Entries of ring r that edges may count as done: its head, less a HostFunc whose function has not returned.
  uint64_t passed(uint32_t r) const;
  bool edges_ready(const Edge* edges, unsigned count) const;
  bool edges_ready(const Entry& e) const { return edges_ready(e.edges, e.edge_count); }
  bool waits_for_itself(uint32_t ring);  // ring's staged entry closes a cycle of waits
  bool chaos_hold(Lane& lane, bool& armed, uint64_t& until);
  void register_wait(RingState& rs, const Entry& e);
  void unregister_wait(RingState& rs);
  Status dispatch(uint32_t ring, const Entry& e, uint64_t pos, Lane& lane);
  void serve_slot(uint32_t s, const Entry& e, uint64_t seq, bool edges_met = true);
  // The success reply to slot s for a request a backend callback completes (EventSynchronize, StreamSynchronize).
  std::function<void()> deferred_reply(uint32_t s, uint64_t seq);
  // The same with a status and a result, for a request another thread completes (ModuleLoad on side_).
  std::function<void(Status, uint64_t)> deferred_result(uint32_t s, uint64_t seq);
  Status resolve(MemKind kind, uint32_t ring, uint64_t addr, uint64_t size, MemOperand* out);
  Status check_device_range(uint64_t addr, uint64_t size) const;
  static constexpr uint64_t kCurrentEpoch = ~uint64_t{0};
  void reply(uint32_t slot, uint64_t seq, Status s, uint64_t r0 = 0, uint64_t r1 = 0, uint64_t epoch = kCurrentEpoch);
  void reply(const SlotCall& c, Status s, uint64_t r0 = 0, uint64_t r1 = 0) { reply(c.slot, c.seq, s, r0, r1); }
  std::string payload_name(uint32_t slot) const;  // a name the guest wrote into the slot's payload, copied out
  // Whether a module image piece at `at` from c's slot continues the pending
  // image (ModuleChunk, ModuleLoad); if not, logs why and drops the image.
  Status continue_image(const SlotCall& c, uint64_t at);
  bool module_loaded(uint32_t module);
  void async_error(const OpTag& tag, Status s);
  void log_bad(const char* where, uint32_t idx, uint64_t pos, const std::string& why);
  void fresh_ring(uint32_t r);  // a ring's state as a new session finds it
  void sweep(uint64_t now_ns);
  void check_session(uint64_t now_ns);
  void reset_session();
  void attach_session(uint64_t session);

  Region& region_;
  Backend& backend_;
  const WorkerOptions opt_;
  const Layout layout_;  // our own copy: the header is guest-writable
  std::vector<RingState> rings_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // [0]: run()'s thread (and the fuzzer's sweep)
  std::vector<std::jthread> lane_threads_;
  bool threads_running_ = false;             // the extra lanes serve their rings (run())
  std::atomic<uint32_t> parked_lanes_{0};    // extra lanes asleep
  std::atomic<uint32_t> pause_{0};           // 1: extra lanes stop between passes
  std::atomic<uint32_t> paused_lanes_{0};
  std::atomic<uint64_t> serving_{0};         // attached_, for the extra lanes
  std::mutex waits_mu_;                      // RingState::registered, wait_count, wait_edges
  // The session's memory tables (allocations_, globals_, vmm_): lane 0 changes them
  // (Malloc, Free, module variables, Vmm*), ring handlers on any lane read them.
  mutable std::shared_mutex memory_mu_;
  // Taken only while extra lanes run: one lane has nobody to exclude.
  std::shared_lock<std::shared_mutex> read_memory() const {
    return threads_running_ ? std::shared_lock(memory_mu_) : std::shared_lock<std::shared_mutex>();
  }
  std::unique_lock<std::shared_mutex> write_memory() {
    return threads_running_ ? std::unique_lock(memory_mu_) : std::unique_lock<std::shared_mutex>();
  }
  mutable std::mutex events_mu_;
  std::mutex streams_mu_;         // StreamCreate and StreamDestroy: streams_'s bind and unbind  // events_: records and waits on any lane, the rest on lane 0
  std::vector<SlotState> slots_;
  const uint32_t devices_;             // the backend's device count
  StreamTable streams_;
  std::array<uint32_t, kMaxDevices> peers_{};  // per device: bit p = peer access to device p enabled by this guest
  EventTable events_;
  std::map<uint64_t, uint64_t> allocations_;  // device address -> size, this guest's only
  VmmTable vmm_;  // its reserved ranges, physical memory and mappings (cuMemCreate, cuMemMap)
  // Interprocess memory and events (handlers/ipc.cc). Exports by allocation
  // address and by event index, which Free, EventDestroy and the session's
  // end take back; imports by the address they were opened at, which copies
  // may use until their last close.
  struct IpcImport {
    uint64_t size;
    uint32_t device;  // whose memory it is
    uint32_t refs;
    IpcToken token;
  };
  std::map<uint64_t, IpcToken> ipc_exported_mem_;
  std::map<uint32_t, IpcToken> ipc_exported_events_;
  std::map<uint64_t, IpcToken> ipc_exported_vmm_;  // by backend handle: gone with the physical memory
  // Whether the backend must keep physical memory the session let go, because
  // it was exported: a descriptor keeps its memory alive (released at the
  // session's end, ipc_close_imports).
  bool ipc_vmm_kept(uint64_t backend_handle);
  std::vector<uint64_t> ipc_kept_vmm_;
  std::atomic<uint32_t> ipc_closing_{0};  // IpcCloseMem calls posted to side_ and not yet done
  std::map<uint64_t, IpcImport> ipc_imports_;
  void ipc_revoke_exports();  // the session's end: first
  void ipc_close_imports();   // then, once its work drained
  // Device variables of this guest's modules: address -> (size, module). Copies
  // may target them; Free may not.
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> globals_;
  // Module ids loaded by this guest, and those side_ is loading; lane 0 and
  // side_ take modules_mu_.
  std::mutex modules_mu_;
  std::set<uint32_t> modules_, loading_;
  // A module image too large for one pinned-heap block, as its ModuleChunk
  // pieces arrive; ModuleLoad completes it. One per session, since the guest
  // sends one such image at a time; at most kMaxModuleImage bytes.
  struct PendingImage {
    std::vector<std::byte> bytes;
    uint32_t slot = kNoSlot;  // the slot whose pieces these are
  };
  PendingImage pending_image_;
  // Graphs (GraphCreate): parsed steps over the worker's own copy of the
  // guest's bytes. Lane 0 adds and removes them; GraphLaunch on any lane takes
  // a reference under graphs_mu_ and runs the steps without it.
  struct Graph {
    std::vector<std::byte> bytes;
    std::vector<GraphStep> steps;  // over `bytes`
    bool control_flow = false;     // conditionals: the backend runs it whole (launch_program)
    uint64_t dispatched = 0;       // GraphLaunch entries of it dispatched (under graphs_mu_)
    uint64_t destroy_after = ~uint64_t{0};  // GraphDestroy: the launches the guest issued
  };
  static constexpr size_t kMaxGraphs = 1u << 14;  // per session
  std::mutex graphs_mu_;
  std::map<uint32_t, std::shared_ptr<Graph>> graphs_;
  uint32_t next_graph_ = 1;
  Status run_graph_step(const RingCall& c, const GraphStep& st);
  Status run_program(const RingCall& c, const std::shared_ptr<const Graph>& g);
  uint32_t next_module_ = 1;                  // 0 means "no module" in KernelLookup
  bool rescan_slots_ = true;    // read every slot's request.seq on the next pass
  uint32_t staged_slots_ = 0;   // slots holding a request that waits for edges
  std::vector<uint32_t> watched_;  // slots in Watch::kWatched or kLeaving
  uint64_t attached_ = 0;       // guest session served; nothing is polled while 0
  std::atomic<int32_t> sticky_{0};  // a kernel fault: every later call fails with it (Status); backend threads set it
  uint64_t refused_ = 0;        // a session declared dead: not served again
  uint64_t beat_seen_ = 0, beat_changed_ns_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> restart_{false};
  // The dispatch loop's pass count, stored every 16th pass; the heartbeat thread watches it.
  std::atomic<uint32_t> loop_passes_{0};
  mutable std::mutex error_mu_;  // slot writes (errors, replies) come from backend threads too
  std::atomic<uint32_t> pending_notifies_{0};  // deferred replies not yet written (deferred_result)
  uint64_t session_epoch_ = 0;    // under error_mu_: bumped per reset, so late callbacks of a past session write nothing
  // Written by the dispatch thread (errors also by backend threads), read by stats().
  struct Counters {
    std::atomic<uint64_t> slot_requests{0}, slot_posts{0}, errors{0}, sleeps{0}, wakeups{0};
    std::atomic<uint64_t> sessions{0}, sessions_lost{0}, allocations{0};
  } counters_;
  std::atomic<uint32_t> logged_{0};
  std::unique_ptr<Tracer> tracer_;
  // Last: destroyed first, running what was posted while the rest still lives.
  SideThread side_;
};

}  // namespace ordo

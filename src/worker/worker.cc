#include "worker.h"

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cinttypes>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <sstream>
#include <stop_token>

#include "validate.h"

namespace ordo {
namespace {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// Single-writer counter: no locked instruction on the hot path.
void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// How long a store a guest issued before reading `worker_sleeping` may still be
// on its way (a store buffer drains in well under a microsecond; VM exits and
// interrupts only drain it sooner). Costs an idle worker one extra wake-up per sleep.
constexpr std::chrono::microseconds kSleepGrace{50};
constexpr uint32_t kBatch = 64;  // entries per ring per pass before the head is published

}  // namespace

// A ring's fences in flight, in ring order. Streams that share a ring finish
// their work independently, so fence k can complete before fence k-1:
// `completed` moves only to the end of the longest prefix of completed fences,
// and so never passes unfinished work of any stream on the ring. Shared with
// the backend's callbacks, which may outlive the session (then `dead`).
struct FenceQueue {
  explicit FenceQueue(RingControl* c) : ctl(c) {}
  struct Pending {
    uint64_t end;        // ring position just past the fence
    uint32_t remaining;  // streams (plus one for the dispatch itself) still running earlier work
  };
  RingControl* const ctl;
  std::mutex mu;
  std::deque<Pending> queue;  // guarded by mu
  uint64_t first = 0;         // guarded by mu: sequence number of queue.front()
  bool dead = false;          // guarded by mu

  uint64_t push(uint64_t end, uint32_t count) {
    std::lock_guard lock(mu);
    queue.push_back({end, count});
    return first + queue.size() - 1;
  }
  void done(uint64_t seq) {
    std::lock_guard lock(mu);
    if (dead) return;
    --queue[seq - first].remaining;
    uint64_t end = 0;
    for (; !queue.empty() && queue.front().remaining == 0; ++first) {
      end = queue.front().end;
      queue.pop_front();
    }
    if (end) ctl->completed.store(end, std::memory_order_release);
  }
};

Worker::Worker(Region& region, Backend& backend, WorkerOptions options)
    : region_(region),
      backend_(backend),
      opt_(options),
      layout_(region.layout()),
      rings_(layout_.ring_count),
      slots_(layout_.slot_count),
      devices_(std::clamp<uint32_t>(backend.device_count(), 1, kMaxDevices)),
      events_(backend, options.ordered, uint64_t{layout_.ring_count} * layout_.ring_capacity),
      chaos_rng_(options.chaos_seed) {
  for (uint32_t r = 0; r < layout_.ring_count; ++r) fresh_ring(r);
  if (opt_.trace) tracer_ = std::make_unique<Tracer>();
  backend_.set_error_sink([this](const OpTag& tag, Status s) { async_error(tag, s); });
  // Copies name host memory inside the region only; the cuda backend pins it.
  backend_.register_host_memory(region_.base(), region_.size());
  RegionHeader* h = region_.header();
  h->heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
  h->device_count.store(devices_, std::memory_order_relaxed);  // published by the state below, before any attach
  h->worker_state.store(uint32_t(WorkerState::kServing), std::memory_order_release);
}

Worker::~Worker() {
  // EventSynchronize callbacks still queued in the backend point at this worker.
  for (uint32_t n; (n = pending_notifies_.load(std::memory_order_acquire)) != 0;) pending_notifies_.wait(n);
  backend_.set_error_sink(nullptr);
  region_.header()->worker_state.store(uint32_t(WorkerState::kStopped), std::memory_order_release);
}

void Worker::fresh_ring(uint32_t r) {
  rings_[r] = RingState{};
  rings_[r].reader = RingReader(region_.entries(r), layout_.ring_capacity, &region_.ring(r));
  rings_[r].fences = std::make_shared<FenceQueue>(&region_.ring(r));
}

void Worker::log_bad(const char* where, uint32_t idx, uint64_t pos, const std::string& why) {
  bump(counters_.errors);
  // Bounded: a hostile guest must not be able to fill the host's disk.
  if (opt_.quiet || logged_ >= 100) return;
  if (++logged_ == 100) std::fprintf(stderr, "ordo-worker: further bad-entry messages suppressed\n");
  std::fprintf(stderr, "ordo-worker: rejected %s %u position %" PRIu64 ": %s\n", where, idx, pos, why.c_str());
}

void Worker::async_error(const OpTag& tag, Status s) {
  counters_.errors.fetch_add(1, std::memory_order_relaxed);
  if (sticky(s)) {
    // As CUDA's context after a kernel fault: every thread's next call fails.
    int32_t none = 0;
    if (sticky_.compare_exchange_strong(none, int32_t(s)))
      region_.header()->sticky_error.store(int32_t(s), std::memory_order_release);
  }
  if (tag.thread >= layout_.slot_count) return;
  std::lock_guard lock(error_mu_);
  ReplySlot& slot = region_.slot(tag.thread);
  slot.error = int32_t(s);
  slot.error_op = tag.op;
  slot.error_pos = tag.pos;
  slot.error_ring = tag.ring;
  slot.error_seq.store(slot.error_seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

Status Worker::check_edges(const Entry& e, uint32_t own_ring, std::string* why) {
  for (unsigned i = 0; i < e.edge_count; ++i) {
    const Edge& edge = e.edges[i];
    // An edge may only name an entry that was published before this one; anything
    // later could close a cycle and stall the guest's rings forever.
    const uint64_t head = rings_[edge.ring].head;
    bool seen = edge.pos <= head;
    if (!seen && edge.ring != own_ring) {
      // Only what this worker will serve: an open ring, up to its last
      // published entry. Otherwise only positions it already dispatched.
      const bool open = edge.ring == kLegacyRing || ((region_.header()->ring_open[edge.ring / 64].load(
                                                          std::memory_order_acquire) >>
                                                      (edge.ring % 64)) &
                                                     1);
      uint64_t word;
      seen = open && edge.pos - head <= layout_.ring_capacity && rings_[edge.ring].reader.published(edge.pos - 1, &word);
    }
    if (!seen) {
      *why = "edge to ring " + std::to_string(edge.ring) + " position " + std::to_string(edge.pos) +
             " which was not yet published";
      return Status::kIllegalState;
    }
  }
  return Status::kSuccess;
}

bool Worker::RingState::held() const {
  return hold && hold->done.load(std::memory_order_acquire) < hold_ticket;
}

uint64_t Worker::passed(uint32_t r) const {
  const RingState& rs = rings_[r];
  // A HostFunc is stream work that ends when the guest's function returned,
  // not when the backend's stream reached it: until then an edge past it is
  // not met (legacy-stream work after a blocking stream's function, or the
  // reverse, and a shared ring's StreamSynchronize). Its own ring holds the
  // entries after it anyway (poll_ring).
  return rs.held() ? rs.head - 1 : rs.head;
}

bool Worker::edges_ready(const Edge* edges, unsigned count) const {
  if (!opt_.ordered) return true;
  for (unsigned i = 0; i < count; ++i)
    if (passed(edges[i].ring) < edges[i].pos) return false;
  return true;
}

bool Worker::waits_for_itself(uint32_t start) const {
  std::vector<uint32_t> todo{start};
  std::vector<bool> seen(layout_.ring_count);
  while (!todo.empty()) {
    const RingState& rs = rings_[todo.back()];
    todo.pop_back();
    if (!rs.staged) continue;
    for (unsigned i = 0; i < rs.entry.edge_count; ++i) {
      const Edge& e = rs.entry.edges[i];
      if (passed(e.ring) >= e.pos) continue;
      if (e.ring == start) return true;
      if (!seen[e.ring]) {
        seen[e.ring] = true;
        todo.push_back(e.ring);
      }
    }
  }
  return false;
}

bool Worker::chaos_hold(bool& armed, uint64_t& until) {
  if (!opt_.chaos_seed) return false;
  const uint64_t now = now_ns();
  if (!armed) {
    armed = true;
    until = now + chaos_rng_() % (uint64_t{opt_.chaos_max_hold_us} * 1000 + 1);
  }
  if (now < until) return true;
  armed = false;
  return false;
}

bool Worker::poll_ring(uint32_t r) {
  RingState& rs = rings_[r];
  bool progressed = false;
  for (uint32_t n = 0; n < kBatch; ++n) {
    uint64_t word = 0;
    if (!rs.staged && !rs.reader.published(rs.head, &word)) break;
    if (rs.hold) {
      // A host function: the ring goes on once the guest ran it.
      if (rs.held()) break;
      rs.hold = nullptr;
    }
    if (!rs.staged) {
      rs.reader.copy(rs.head, word, &rs.entry);  // then validate and use only the copy
      std::string why;
      Status s = check_entry(rs.entry, Path::Ring, layout_, &why);
      if (ok(s)) s = check_edges(rs.entry, r, &why);
      if (!ok(s)) {
        log_bad("ring", r, rs.head, why);
        async_error({r, rs.entry.thread < layout_.slot_count ? rs.entry.thread : kNoSlot, rs.head, rs.entry.op}, s);
        ++rs.head;
        progressed = true;
        continue;
      }
      rs.staged = true;
      rs.waited = false;
      if (tracer_) rs.staged_ns = Tracer::stamp();
    }
    if (!edges_ready(rs.entry)) {
      if (!rs.waited) {
        // The laps only say an edge names a published entry, not one published
        // before this one: two entries can name each other. The last of a cycle
        // to start waiting closes it; reject that one.
        if (waits_for_itself(r)) {
          log_bad("ring", r, rs.head, "edges close a cycle");
          async_error({r, rs.entry.thread, rs.head, rs.entry.op}, Status::kIllegalState);
          rs.staged = false;
          ++rs.head;
          progressed = true;
          continue;
        }
        rs.waited = true;
        bump(counters_.edge_waits);
      }
      break;
    }
    if (chaos_hold(rs.chaos_armed, rs.chaos_until_ns)) break;
    const Status s = dispatch(r, rs.entry, rs.head);
    if (s == Status::kNotReady && rs.entry.op == uint16_t(Op::EventRecord)) {
      // A record that needs a backend event of its own while all are in use
      // (EventTable::record): it waits for a wait elsewhere, as for an edge.
      if (!rs.waited) {
        rs.waited = true;
        bump(counters_.edge_waits);
      }
      break;
    }
    if (!ok(s)) async_error({r, rs.entry.thread, rs.head, rs.entry.op}, s);
    if (tracer_) tracer_->record(r, rs.head, rs.entry, rs.staged_ns, Tracer::stamp());
    rs.staged = false;
    ++rs.head;
    progressed = true;
  }
  rs.reader.release(rs.head);
  return progressed;
}

Status Worker::check_device_range(uint64_t addr, uint64_t size) const {
  if (auto it = allocations_.upper_bound(addr); it != allocations_.begin()) {
    --it;
    if (range_ok(addr - it->first, size, it->second)) return Status::kSuccess;
  }
  if (auto it = globals_.upper_bound(addr); it != globals_.begin()) {
    --it;
    if (range_ok(addr - it->first, size, it->second.first)) return Status::kSuccess;
  }
  return Status::kInvalidDevicePointer;
}

Status Worker::resolve(MemKind kind, uint32_t ring, uint64_t addr, uint64_t size, MemOperand* out) {
  switch (kind) {
    case MemKind::Device:
      out->device = true;
      out->addr = addr;
      return check_device_range(addr, size);
    case MemKind::Staging:  // bounds already checked by check_entry
      out->device = false;
      out->addr = reinterpret_cast<uintptr_t>(region_.staging(ring) + addr);
      return Status::kSuccess;
    case MemKind::Pinned:
      out->device = false;
      out->addr = reinterpret_cast<uintptr_t>(region_.heap() + addr);
      return Status::kSuccess;
  }
  return Status::kInvalidValue;
}

Status Worker::stream_of(const Entry& e, uint32_t r) const {
  // A stream is used only on the ring it was created on: its entries' order is that ring's order.
  if (!streams_.on_ring(e.stream, r)) return Status::kInvalidResourceHandle;
  return Status::kSuccess;
}

void Worker::mark_dirty(RingState& rs, uint32_t stream) {
  if (streams_.mark(stream) == rs.fence_count + 1) return;
  streams_.set_mark(stream, rs.fence_count + 1);
  rs.dirty.push_back(stream);
}

void Worker::dispatch_fence(uint32_t r, uint64_t pos) {
  RingState& rs = rings_[r];
  // One count per stream that got work since the last fence, and one for this
  // dispatch, dropped last: the fence cannot complete while callbacks are queued.
  std::shared_ptr<FenceQueue> fq = rs.fences;
  const uint64_t seq = fq->push(pos + 1, uint32_t(rs.dirty.size()) + 1);
  // Not stream work: a fence on the legacy stream sees what cudaStreamSynchronize sees.
  for (uint32_t st : rs.dirty) backend_.stream_notify(st, [fq, seq] { fq->done(seq); });
  rs.dirty.clear();
  ++rs.fence_count;
  fq->done(seq);
}

Status Worker::dispatch(uint32_t r, const Entry& e, uint64_t pos) {
  const Op op = static_cast<Op>(e.op);
  bump(counters_.ops[e.op]);
  bump(counters_.entries);
  RingState& rs = rings_[r];
  const OpTag tag{r, e.thread, pos, e.op};
  const uint32_t st = e.stream;
  switch (op) {
    case Op::Nop:
      return Status::kSuccess;
    case Op::Fence:
      dispatch_fence(r, pos);
      return Status::kSuccess;
    case Op::StreamCreate: {
      const uint64_t device = e.arg[2];
      if (device >= devices_) return Status::kInvalidDevice;
      if (st >= kMaxStreams || streams_.bound(st)) return Status::kInvalidResourceHandle;
      if (e.arg[0] & kStreamLegacy) {
        // A device's legacy stream exists in the backend already: the guest
        // only chooses its ring. Device 0's is on ring 0 from the start.
        if (st != device || st == kLegacyStreamId) return Status::kInvalidResourceHandle;
      } else if (st < kMaxDevices) {
        return Status::kInvalidResourceHandle;
      } else if (Status s = backend_.stream_create(st, uint32_t(device), !(e.arg[0] & kStreamNonBlocking),
                                                   int(int64_t(e.arg[1])));
                 !ok(s)) {
        return s;
      }
      streams_.bind(st, r, uint32_t(device));
      return Status::kSuccess;
    }
    case Op::StreamDestroy: {
      if (Status s = stream_of(e, r); !ok(s) || st < kMaxDevices) return Status::kInvalidResourceHandle;
      // The guest fences before a destroy; work queued since then (none from a
      // correct guest) is not waited for by later fences of the ring.
      if (streams_.mark(st) == rs.fence_count + 1) std::erase(rs.dirty, st);
      streams_.unbind(st);
      return backend_.stream_destroy(st);
    }
    case Op::Launch:
    case Op::Memcpy:
    case Op::Memset:
    case Op::EventRecord:
    case Op::StreamWaitEvent:
    case Op::HostFunc:
      break;  // stream work: below
#define ORDO_OP(name, path, order, args) ORDO_CASE_IF(Slot, path, name)
#include "ordo/ops.def"
#undef ORDO_OP
    case Op::kCount:
      return Status::kNotSupported;  // check_entry keeps sync ops off rings
  }
  if (Status s = stream_of(e, r); !ok(s)) return s;
  mark_dirty(rs, st);
  // After a kernel fault no device work runs (the guest's calls return the
  // fault from the region header); streams and host functions still progress,
  // so no synchronize hangs.
  if (sticky_.load(std::memory_order_relaxed) && (op == Op::Launch || op == Op::Memcpy || op == Op::Memset))
    return Status::kSuccess;
  switch (op) {
    case Op::Launch: {
      LaunchParams p;
      p.kernel = uint32_t(e.arg[0]);
      p.grid = {uint32_t(e.arg[1]), uint32_t(e.arg[1] >> 32), uint32_t(e.arg[2])};
      p.block = {uint32_t(e.arg[2] >> 32), uint32_t(e.arg[3]), uint32_t(e.arg[3] >> 32)};
      p.args = region_.staging(r) + e.arg[4];
      p.args_size = uint32_t(e.arg[5]);
      p.shared_mem = uint32_t(e.arg[5] >> 32);
      return backend_.launch(st, p, tag);
    }
    case Op::Memcpy: {
      MemOperand dst, src;
      if (Status s = resolve(dst_kind(e.flags), r, e.arg[0], e.arg[2], &dst); !ok(s)) return s;
      if (Status s = resolve(src_kind(e.flags), r, e.arg[1], e.arg[2], &src); !ok(s)) return s;
      return backend_.memcpy(st, dst, src, e.arg[2], tag);
    }
    case Op::Memset:
      if (Status s = check_device_range(e.arg[0], e.arg[2]); !ok(s)) return s;
      return backend_.memset(st, e.arg[0], uint8_t(e.arg[1]), e.arg[2], tag);
    case Op::EventRecord:
    case Op::StreamWaitEvent: {
      // arg1: the record's number (a wait: the record it refers to); a record's arg2: the waits on the one it replaces.
      uint32_t idx, ev;
      if (Status s = events_.find(e.arg[0], e.arg[1], &idx); !ok(s)) return s;
      Status s;
      if (op == Op::StreamWaitEvent) {
        s = backend_.stream_wait_event(st, events_.backend_of(idx, e.arg[1]));  // any device's event, as CUDA
        events_.waited(idx, e.arg[1]);
      } else if (events_.device(idx) != streams_.device(st)) {
        return Status::kInvalidResourceHandle;  // CUDA records an event only on a stream of its own device
      } else if (s = events_.record(idx, e.arg[1], e.arg[2], &ev); ok(s)) {
        s = backend_.event_record(st, ev);
      }
      events_.settle(idx);
      return s;
    }
    case Op::HostFunc: {
      // The guest runs the function (CUDA runs it on a runtime thread of the
      // program): a callback tells it when the stream got there, and the ring
      // dispatches nothing more until the guest says done (poll_ring). Nothing
      // waits on the device, so a guest that never says done stalls only its
      // own ring, and a session reset simply drops the hold.
      auto* w = reinterpret_cast<HostFuncWords*>(region_.heap() + e.arg[0]);  // check_entry: in the heap, aligned
      const uint64_t ticket = e.arg[1];
      backend_.host_callback(st, [w, ticket] { w->reached.store(ticket, std::memory_order_release); });
      rs.hold = w;
      rs.hold_ticket = ticket;
      return Status::kSuccess;
    }
    case Op::Nop:
    case Op::Fence:
    case Op::StreamCreate:
    case Op::StreamDestroy:
      break;  // above
#define ORDO_OP(name, path, order, args) ORDO_CASE_IF(Slot, path, name)
#include "ordo/ops.def"
#undef ORDO_OP
    case Op::kCount:
      break;  // check_entry keeps sync ops off rings
  }
  return Status::kNotSupported;
}

void Worker::reply(uint32_t s, uint64_t seq, Status st, uint64_t r0, uint64_t r1, uint64_t epoch) {
  ReplySlot& slot = region_.slot(s);
  auto write = [&] { write_reply(slot, seq, st, r0, r1); };
  // Backend threads answer EventSynchronize and StreamSynchronize; the
  // dispatch thread answers the rest. A guest that posts without waiting could
  // make both write one slot, so they take error_mu_, except the dispatch
  // thread while no deferred reply is in flight: only it creates them, and a
  // finished one's writes happen before its count's decrement (acquired here).
  // That spares the common sync call a lock round trip.
  if (epoch == kCurrentEpoch && pending_notifies_.load(std::memory_order_acquire) == 0) return write();
  std::lock_guard lock(error_mu_);
  // A wait of a session that has since ended: its slot may be a new guest's now.
  if (epoch != kCurrentEpoch && epoch != session_epoch_) return;
  write();
}

bool Worker::try_slot(uint32_t s) {
  SlotState& ss = slots_[s];
  ReplySlot& slot = region_.slot(s);
  if (!ss.staged) {
    uint64_t seq;
    if (!take_request(slot, s, ss.taken, &ss.entry, &seq)) return false;  // then validate and use only the copy
    ss.taken = seq;
    ss.seq = seq;
    ss.active = true;
    if (ss.watch == Watch::kLeaving) watch(s);
    bump(counters_.slot_requests);
    std::string why;
    Status st = check_entry(ss.entry, Path::Slot, layout_, &why);
    if (ok(st)) st = check_edges(ss.entry, kMaxRings, &why);
    if (!ok(st)) {
      log_bad("slot", s, seq, why);
      reply(s, seq, st);
      return true;
    }
    ss.staged = true;
    ss.waited = false;
    if (tracer_) ss.staged_ns = Tracer::stamp();
  }
  if (!edges_ready(ss.entry)) {
    // cudaEventQuery and cudaEventElapsedTime never wait for stream work, so
    // not for a record that is not dispatched yet (behind a host function,
    // say): such a record is not complete.
    const Op op = static_cast<Op>(ss.entry.op);
    if (op == Op::EventQuery || op == Op::EventElapsed) {
      ss.staged = false;
      serve_slot(s, ss.entry, ss.seq, /*edges_met=*/false);
      return true;
    }
    if (!ss.waited) {
      ss.waited = true;
      bump(counters_.edge_waits);
    }
    return false;
  }
  ss.staged = false;
  serve_slot(s, ss.entry, ss.seq);
  if (tracer_) tracer_->record(kMaxRings + s, ss.seq, ss.entry, ss.staged_ns, Tracer::stamp());
  return true;
}

std::function<void()> Worker::deferred_reply(uint32_t s, uint64_t seq) {
  // Completes from a backend thread: the dispatch thread never waits on the device.
  uint64_t epoch;
  {
    std::lock_guard lock(error_mu_);
    epoch = session_epoch_;
  }
  pending_notifies_.fetch_add(1, std::memory_order_relaxed);
  return [this, s, seq, epoch] {
    reply(s, seq, Status::kSuccess, 0, 0, epoch);
    // Last: once this reaches 0, ~Worker may run.
    if (pending_notifies_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_notifies_.notify_all();
  };
}

void Worker::serve_slot(uint32_t s, const Entry& e, uint64_t seq, bool edges_met) {
  const Op op = static_cast<Op>(e.op);
  bump(counters_.ops[e.op]);
  if (const int32_t f = sticky_.load(std::memory_order_relaxed); f && op != Op::Null && op != Op::DeviceInfo)
    return reply(s, seq, Status(f));
  switch (op) {
    case Op::Null:
      return reply(s, seq, Status::kSuccess);
    case Op::Malloc: {
      if (e.arg[1] >= devices_) return reply(s, seq, Status::kInvalidDevice);
      uint64_t addr = 0;
      Status st = backend_.malloc(uint32_t(e.arg[1]), e.arg[0], &addr);
      if (ok(st)) {
        allocations_[addr] = e.arg[0];
        counters_.allocations.store(allocations_.size(), std::memory_order_relaxed);
      }
      return reply(s, seq, st, addr);
    }
    case Op::Free: {
      if (e.arg[0] == 0) return reply(s, seq, Status::kSuccess);  // cudaFree(nullptr)
      auto it = allocations_.find(e.arg[0]);
      if (it == allocations_.end()) return reply(s, seq, Status::kInvalidDevicePointer);
      allocations_.erase(it);
      counters_.allocations.store(allocations_.size(), std::memory_order_relaxed);
      return reply(s, seq, backend_.free(e.arg[0]));
    }
    case Op::KernelLookup: {
      char name[kSlotPayload + 1];
      std::memcpy(name, region_.slot(s).payload, kSlotPayload);
      name[kSlotPayload] = 0;
      const uint32_t module = uint32_t(e.arg[0]);  // check_entry: fits
      if (module != 0 && !modules_.count(module)) return reply(s, seq, Status::kInvalidResourceHandle);
      uint32_t id = 0;
      Status st = backend_.kernel_lookup(module, std::string_view(name, strnlen(name, kSlotPayload)), &id);
      return reply(s, seq, st, id, ok(st) && !backend_.kernel_runnable(id));
    }
    case Op::ModuleGlobal: {
      char name[kSlotPayload + 1];
      std::memcpy(name, region_.slot(s).payload, kSlotPayload);
      name[kSlotPayload] = 0;
      const uint32_t module = uint32_t(e.arg[0]);
      if (!modules_.count(module)) return reply(s, seq, Status::kInvalidResourceHandle);
      if (e.arg[2] >= devices_) return reply(s, seq, Status::kInvalidDevice);
      uint64_t addr = 0, size = 0;
      const Status st = backend_.module_global(module, uint32_t(e.arg[2]),
                                               std::string_view(name, strnlen(name, kSlotPayload)), e.arg[1], &addr, &size);
      if (ok(st) && size) globals_[addr] = {size, module};
      return reply(s, seq, st, addr, size);
    }
    case Op::ModuleLoad: {
      if (modules_.size() >= kMaxModules) return reply(s, seq, Status::kMemoryAllocation);
      // check_entry bounded the range to the pinned heap. Copy it out: the guest
      // can rewrite the heap at any time, and the backend parses the image.
      std::vector<std::byte> image;
      try {
        image.assign(region_.heap() + e.arg[0], region_.heap() + e.arg[0] + e.arg[1]);
      } catch (const std::bad_alloc&) {
        return reply(s, seq, Status::kMemoryAllocation);
      }
      uint32_t id = next_module_;
      while (id == 0 || modules_.count(id)) ++id;  // wraps after 2^32 loads: skip live ids and 0
      const Status st = backend_.module_load(id, image);
      if (!ok(st)) return reply(s, seq, st);
      next_module_ = id + 1;
      modules_.insert(id);
      return reply(s, seq, st, id);
    }
    case Op::ModuleUnload: {
      const uint32_t module = uint32_t(e.arg[0]);
      if (!modules_.erase(module)) return reply(s, seq, Status::kInvalidResourceHandle);
      std::erase_if(globals_, [module](const auto& g) { return g.second.second == module; });
      return reply(s, seq, backend_.module_unload(module));
    }
    case Op::DeviceInfo: {
      if (e.arg[0] >= devices_) return reply(s, seq, Status::kInvalidDevice);
      DeviceInfo info{};
      const Status st = backend_.device_info(uint32_t(e.arg[0]), &info);
      if (ok(st)) {
        info.name[sizeof(info.name) - 1] = 0;
        std::lock_guard lock(error_mu_);  // the payload is the guest's to read after the reply
        std::memcpy(region_.slot(s).payload, &info, sizeof(info));
      }
      return reply(s, seq, st);
    }
    case Op::DeviceAttributes: {
      if (e.arg[0] >= devices_) return reply(s, seq, Status::kInvalidDevice);
      int32_t attrs[kDeviceAttributesPerCall] = {};
      const Status st = backend_.device_attributes(uint32_t(e.arg[0]), uint32_t(e.arg[1]), attrs);
      if (ok(st)) {
        std::lock_guard lock(error_mu_);
        std::memcpy(region_.slot(s).payload, attrs, sizeof attrs);
      }
      return reply(s, seq, st);
    }
    case Op::EventCreate: {
      if (e.arg[1] >= devices_) return reply(s, seq, Status::kInvalidDevice);
      uint64_t handle = 0;
      const Status st = events_.create(uint32_t(e.arg[1]), uint32_t(e.arg[0]), &handle);
      return reply(s, seq, st, handle);
    }
    case Op::EventDestroy:  // answered at once, carried out once every wait on it was dispatched (EventTable)
      return reply(s, seq, events_.destroy(e.arg[0], e.arg[1], e.arg[2]));
    case Op::EventQuery: {
      uint32_t idx;
      if (Status st = events_.find(e.arg[0], &idx); !ok(st)) return reply(s, seq, st);
      return reply(s, seq, edges_met ? backend_.event_query(events_.backend_of(idx, e.arg[1])) : Status::kNotReady);
    }
    case Op::EventSynchronize: {
      uint32_t idx;
      if (Status st = events_.find(e.arg[0], &idx); !ok(st)) return reply(s, seq, st);
      backend_.event_notify(events_.backend_of(idx, e.arg[1]), deferred_reply(s, seq));
      return;
    }
    case Op::StreamSynchronize: {
      // The stream alone, not its ring-mates (a fence would wait for them too).
      const uint64_t id = e.arg[0];
      if (!streams_.bound(id)) return reply(s, seq, Status::kInvalidResourceHandle);
      backend_.stream_notify(uint32_t(id), deferred_reply(s, seq));
      return;
    }
    case Op::EventElapsed: {
      uint32_t a, b;
      if (Status st = events_.find(e.arg[0], &a); !ok(st)) return reply(s, seq, st);
      if (Status st = events_.find(e.arg[1], &b); !ok(st)) return reply(s, seq, st);
      if (events_.device(a) != events_.device(b)) return reply(s, seq, Status::kInvalidResourceHandle);
      if (!edges_met) return reply(s, seq, Status::kNotReady);
      float ms = 0;
      Status st = backend_.event_elapsed(events_.backend_of(a, e.arg[2]), events_.backend_of(b, e.arg[3]), &ms);
      uint32_t bits;
      std::memcpy(&bits, &ms, sizeof bits);
      return reply(s, seq, st, bits);
    }
    case Op::PeerAccess: {
      const uint64_t dev = e.arg[0], peer = e.arg[1];
      if (dev >= devices_ || peer >= devices_ || dev == peer) return reply(s, seq, Status::kInvalidDevice);
      const bool can = backend_.can_access_peer(uint32_t(dev), uint32_t(peer));
      const uint32_t bit = 1u << peer;
      switch (PeerCmd(e.arg[2])) {
        case PeerCmd::kQuery:
          return reply(s, seq, Status::kSuccess, can);
        case PeerCmd::kEnable: {
          if (!can) return reply(s, seq, Status::kPeerAccessUnsupported);
          if (peers_[dev] & bit) return reply(s, seq, Status::kPeerAccessAlreadyEnabled);
          const Status st = backend_.set_peer_access(uint32_t(dev), uint32_t(peer), true);
          if (ok(st)) peers_[dev] |= bit;
          return reply(s, seq, st);
        }
        case PeerCmd::kDisable: {
          if (!(peers_[dev] & bit)) return reply(s, seq, Status::kPeerAccessNotEnabled);
          const Status st = backend_.set_peer_access(uint32_t(dev), uint32_t(peer), false);
          if (ok(st)) peers_[dev] &= ~bit;
          return reply(s, seq, st);
        }
      }
      return reply(s, seq, Status::kInvalidValue);  // check_entry: unreachable
    }
#define ORDO_OP(name, path, order, args) ORDO_CASE_IF(Ring, path, name)
#include "ordo/ops.def"
#undef ORDO_OP
    case Op::kCount:
      break;  // check_entry keeps stream ops out of slots
  }
  reply(s, seq, Status::kNotSupported);
}

void Worker::watch(uint32_t s) {
  slots_[s].watch = Watch::kWatched;
  region_.slot(s).watched.store(1, std::memory_order_relaxed);
}

void Worker::age_watched() {
  // A slot idle for a sweep period is told it is no longer watched, and is still
  // read for one more: a guest that read `watched` just before it changed
  // published its request well before then.
  for (size_t i = 0; i < watched_.size();) {
    SlotState& ss = slots_[watched_[i]];
    if (ss.active) {
      ss.active = false;
    } else if (ss.watch == Watch::kWatched) {
      ss.watch = Watch::kLeaving;
      region_.slot(watched_[i]).watched.store(0, std::memory_order_relaxed);
    } else {
      ss.watch = Watch::kNone;
      watched_[i] = watched_.back();
      watched_.pop_back();
      continue;
    }
    ++i;
  }
}

bool Worker::poll_slots() {
  bool progressed = false;
  RegionHeader* h = region_.header();
  // Watched slots: their guests post nothing, request.seq is the signal.
  for (uint32_t s : watched_) {
    if (slots_[s].staged) continue;
    progressed |= try_slot(s);
    staged_slots_ += slots_[s].staged;
  }
  // Posted slots: one relaxed load per 64 slots when nothing is new.
  for (uint32_t w = 0; w * 64 < layout_.slot_count; ++w) {
    if (!h->slot_posted[w].load(std::memory_order_relaxed)) continue;
    for (uint64_t bits = h->slot_posted[w].exchange(0, std::memory_order_acq_rel); bits; bits &= bits - 1) {
      const uint32_t s = w * 64 + uint32_t(__builtin_ctzll(bits));
      if (s >= layout_.slot_count || slots_[s].staged) continue;
      // A slot that calls is likely to call again: watch it (up to kMaxWatched),
      // from before its reply, so its next call already skips the post.
      if (slots_[s].watch == Watch::kNone && watched_.size() < kMaxWatched) {
        watched_.push_back(s);
        watch(s);
      }
      if (try_slot(s)) {
        progressed = true;
        bump(counters_.slot_posts);
      }
      staged_slots_ += slots_[s].staged;  // its edges are not ready yet: retried below from now on
    }
  }
  // Slots waiting for edges, and every slot once per sweep (the 100 ms pass): a request
  // whose bit was never set (a guest that died between the two stores) is
  // still answered.
  if (staged_slots_ == 0 && !rescan_slots_) return progressed;
  uint32_t staged = 0;
  for (uint32_t s = 0; s < layout_.slot_count; ++s) {
    if (rescan_slots_ || slots_[s].staged) progressed |= try_slot(s);
    staged += slots_[s].staged;
  }
  staged_slots_ = staged;
  rescan_slots_ = false;
  return progressed;
}

void Worker::attach_session(uint64_t session) {
  // The guest waits for attached_session before touching the rings, so the
  // shared state can be reset here without racing it.
  for (uint32_t r = 0; r < layout_.ring_count; ++r) rings_[r].reader.reset();
  for (uint32_t i = 0; i < layout_.slot_count; ++i) {
    ReplySlot& slot = region_.slot(i);
    slot.request.seq.store(0, std::memory_order_relaxed);
    slot.reply_seq.store(0, std::memory_order_relaxed);
    slot.watched.store(0, std::memory_order_relaxed);
    slot.error_seq.store(0, std::memory_order_relaxed);
  }
  RegionHeader* h = region_.header();
  for (uint32_t w = 0; w < kMaxRings / 64; ++w) h->ring_open[w].store(w == 0 ? 1 : 0, std::memory_order_relaxed);
  for (auto& w : h->slot_posted) w.store(0, std::memory_order_relaxed);
  h->sticky_error.store(0, std::memory_order_relaxed);
  sticky_.store(0, std::memory_order_relaxed);
  rescan_slots_ = true;
  attached_ = session;
  beat_seen_ = h->guest_beat.load(std::memory_order_relaxed);
  beat_changed_ns_ = now_ns();
  counters_.sessions.fetch_add(1, std::memory_order_relaxed);
  h->attached_session.store(session, std::memory_order_release);
  if (!opt_.quiet) std::fprintf(stderr, "ordo-worker: guest session %016" PRIx64 " attached\n", session);
}

void Worker::reset_session() {
  // Let queued device work finish before freeing what it may use.
  std::mutex mu;
  std::condition_variable cv;
  uint32_t pending = 0;
  streams_.for_each_bound([&](uint32_t st) {
    {
      std::lock_guard lock(mu);
      ++pending;
    }
    backend_.host_callback(st, [&] {
      std::lock_guard lock(mu);
      if (--pending == 0) cv.notify_one();
    });
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
  // Destroyed streams' deferred work too: the fence before each destroy stays
  // queued until that work ran. (A fault it raises must not reach the next session.)
  for (const RingState& rs : rings_) {
    for (;;) {
      {
        std::lock_guard lock(rs.fences->mu);
        if (rs.fences->queue.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  streams_.for_each_bound([&](uint32_t st) {
    if (st >= kMaxDevices) backend_.stream_destroy(st);  // legacy streams stay, as the backend's own
  });
  streams_.reset();
  for (uint32_t d = 0; d < devices_; ++d)
    for (uint32_t p = 0; p < devices_; ++p)
      if (peers_[d] >> p & 1) backend_.set_peer_access(d, p, false);
  peers_.fill(0);
  events_.reset();
  for (uint32_t m : modules_) backend_.module_unload(m);
  modules_.clear();
  for (auto& [addr, size] : allocations_) backend_.free(addr);
  allocations_.clear();
  globals_.clear();
  counters_.allocations.store(0, std::memory_order_relaxed);
  for (uint32_t r = 0; r < layout_.ring_count; ++r) {
    {
      std::lock_guard lock(rings_[r].fences->mu);
      rings_[r].fences->dead = true;  // callbacks still queued in the backend belong to the old session
    }
    fresh_ring(r);
  }
  for (auto& ss : slots_) ss = SlotState{};
  watched_.clear();
  {
    std::lock_guard lock(error_mu_);
    ++session_epoch_;
  }
  staged_slots_ = 0;
  attached_ = 0;
  region_.header()->attached_session.store(0, std::memory_order_release);
  // The fault stays in sticky_ until the next attach. Not when stopping: a
  // worker told to stop while a faulted session is attached exits.
  if (sticky_.load(std::memory_order_relaxed) && backend_.context_lost() && !stop_.load(std::memory_order_relaxed)) {
    restart_.store(true, std::memory_order_relaxed);
    stop();
  }
}

void Worker::check_session(uint64_t now) {
  RegionHeader* h = region_.header();
  const uint64_t want = h->guest_session.load(std::memory_order_acquire);
  if (want != attached_) {
    if (attached_) {
      if (!opt_.quiet)
        std::fprintf(stderr, "ordo-worker: guest session %016" PRIx64 " detached; its resources are freed\n", attached_);
      reset_session();
    }
    // Not when stopping (a faulted context restarts the worker): the next
    // image serves the waiting guest, which would otherwise be attached here
    // and then find its worker gone.
    if (want != 0 && want != refused_ && !stop_.load(std::memory_order_relaxed)) attach_session(want);
    return;
  }
  if (!attached_) return;
  const uint64_t beat = h->guest_beat.load(std::memory_order_relaxed);
  if (beat != beat_seen_) {
    beat_seen_ = beat;
    beat_changed_ns_ = now;
  } else if (now - beat_changed_ns_ > uint64_t(opt_.guest_timeout.count()) * 1000000) {
    if (!opt_.quiet)
      std::fprintf(stderr,
                   "ordo-worker: guest session %016" PRIx64 " stopped its heartbeat %lld ms ago (guest died?); "
                   "freeing its streams, events and memory\n",
                   attached_, (long long)opt_.guest_timeout.count());
    refused_ = attached_;
    counters_.sessions_lost.fetch_add(1, std::memory_order_relaxed);
    // The part is free for the next guest process at once (unless one took it already).
    uint64_t dead = attached_;
    h->guest_session.compare_exchange_strong(dead, 0, std::memory_order_acq_rel);
    reset_session();
  }
}

void Worker::sweep() { sweep(now_ns()); }

void Worker::sweep(uint64_t now) {
  rescan_slots_ = true;
  age_watched();
  check_session(now);
}

bool Worker::poll_once() {
  if (!attached_) {
    check_session(now_ns());
    if (!attached_) return false;
  }
  bool progressed = poll_slots();
  const RegionHeader* h = region_.header();
  for (uint32_t w = 0; w * 64 < layout_.ring_count; ++w) {
    uint64_t open = h->ring_open[w].load(std::memory_order_acquire);
    if (w == 0) open |= 1;
    while (open) {
      const uint32_t r = w * 64 + uint32_t(__builtin_ctzll(open));
      open &= open - 1;
      if (r >= layout_.ring_count) continue;
      // An idle ring costs one load here, not a call (its head was published
      // when it was last busy).
      uint64_t word;
      if (rings_[r].staged || rings_[r].reader.published(rings_[r].head, &word)) progressed |= poll_ring(r);
    }
  }
  // Slots whose edges just became ready by the ring pass.
  return poll_slots() || progressed;
}

// True when the doorbell rang.
static bool sleep_on(DoorbellWaiter* doorbell, std::chrono::microseconds limit) {
  if (doorbell) return doorbell->wait(limit);
  timespec ts{0, long(std::min<int64_t>(limit.count(), 1000) * 1000)};
  nanosleep(&ts, nullptr);
  return false;
}

void Worker::run(DoorbellWaiter* doorbell) {
  RegionHeader* h = region_.header();
  // The heartbeat says that this process lives, not that its dispatch loop is
  // quick: guests give a session up for good when it stops, and a dispatch
  // thread held in one long backend call (a module's JIT compile, the sim
  // joining a thousand stream threads on a loaded host) is not a dead worker.
  // So a thread of its own stores it (ARCHITECTURE.md, "Idle").
  std::jthread beater;
  try {
    beater = std::jthread([this](std::stop_token stop) { beat(stop); });
  } catch (const std::system_error&) {
    // No thread to spare (a thread limit): the loop below beats instead.
  }
  uint64_t idle_since = 0;
  uint64_t last_beat = 0;
  uint32_t pass = 0;
  bool worked = false;  // since the last clock pass
  while (!stop_.load(std::memory_order_relaxed)) {
    // The clock is read on every 16th pass only, busy or idle: the sweep needs
    // 100 ms resolution and the spin limit 200 us, and a clock_gettime
    // on every idle pass (8% of the worker's time in a sync round trip) only
    // delays the pass that finds the next request.
    if ((++pass & 15) != 0) {
      if (poll_once()) worked = true;
      else _mm_pause();
      continue;
    }
    const uint64_t now = now_ns();
    loop_passes_.store(pass, std::memory_order_relaxed);
    if (now - last_beat > 100'000'000) {
      if (!beater.joinable()) h->heartbeat_ns.store(now, std::memory_order_relaxed);
      last_beat = now;
      sweep(now);
    } else if (h->guest_session.load(std::memory_order_relaxed) != attached_) {
      check_session(now);
    }
    if (poll_once() || worked) {
      worked = false;
      idle_since = 0;
      continue;
    }
    if (idle_since == 0) idle_since = now;
    // Chaos keeps a serving worker awake (a held entry is work); with no guest it sleeps.
    const bool chaos_pending = opt_.chaos_seed != 0 && attached_;
    if (now - idle_since < uint64_t(opt_.spin.count()) * 1000 || chaos_pending) {
      _mm_pause();
      continue;
    }
    // Sleep handshake: announce, fence, look once more, sleep through a grace
    // period, look again, then sleep. A guest publishes, then checks the flag
    // without a fence of its own: a guest that read 0 stored its entry before
    // the flag was set, and that store is visible well within the grace
    // period, so the second look finds it (ARCHITECTURE.md, "Idle").
    h->worker_sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!poll_once()) {
      bump(counters_.sleeps);
      const auto grace = std::min(kSleepGrace, opt_.max_sleep);
      bool rang = sleep_on(doorbell, grace);
      if (!rang && !poll_once()) rang = sleep_on(doorbell, opt_.max_sleep - grace);
      if (rang) bump(counters_.wakeups);
    }
    h->worker_sleeping.store(0, std::memory_order_relaxed);
    idle_since = 0;
  }
  // Stopping ends the guest's session: its device resources go with it.
  if (attached_) reset_session();
}

void Worker::beat(std::stop_token stop) {
  // Guests wait out a dispatch thread held in a backend call; an operator
  // should still hear of one held for long (a hung driver call).
  constexpr uint32_t kStallBeats = 300;  // 30 s
  RegionHeader* h = region_.header();
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  uint32_t seen = 0, still = 0;
  while (!stop.stop_requested()) {
    h->heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
    const uint32_t passes = loop_passes_.load(std::memory_order_relaxed);
    if (passes != seen || h->attached_session.load(std::memory_order_relaxed) == 0) {
      seen = passes;
      still = 0;
    } else if (++still == kStallBeats && !opt_.quiet) {
      std::fprintf(stderr,
                   "ordo-worker: the dispatch thread has been in one call for %u s (a backend call that does not "
                   "return?); its guest's calls wait for it\n",
                   kStallBeats / 10);
    }
    cv.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
  }
}

bool Worker::write_trace(const std::string& path, std::string* error) const {
  if (!tracer_) {
    if (error) *error = "tracing was not enabled";
    return false;
  }
  return tracer_->write(path, error);
}

WorkerStats Worker::stats() const {
  WorkerStats s;
  for (size_t i = 0; i < kOpCount; ++i) s.ops[i] = counters_.ops[i].load(std::memory_order_relaxed);
  s.entries = counters_.entries.load(std::memory_order_relaxed);
  s.slot_requests = counters_.slot_requests.load(std::memory_order_relaxed);
  s.slot_posts = counters_.slot_posts.load(std::memory_order_relaxed);
  s.edge_waits = counters_.edge_waits.load(std::memory_order_relaxed);
  s.errors = counters_.errors.load(std::memory_order_relaxed);
  s.sleeps = counters_.sleeps.load(std::memory_order_relaxed);
  s.wakeups_by_doorbell = counters_.wakeups.load(std::memory_order_relaxed);
  s.sessions = counters_.sessions.load(std::memory_order_relaxed);
  s.sessions_lost = counters_.sessions_lost.load(std::memory_order_relaxed);
  s.allocations = counters_.allocations.load(std::memory_order_relaxed);
  return s;
}

std::string WorkerStats::table() const {
  std::ostringstream o;
  o << "ring entries dispatched  " << entries << "\n"
    << "sync requests            " << slot_requests << " (" << slot_posts << " found by their posted bit)\n"
    << "entries that waited      " << edge_waits << "\n"
    << "errors                   " << errors << "\n"
    << "idle sleeps              " << sleeps << " (" << wakeups_by_doorbell << " ended by doorbell)\n"
    << "guest sessions           " << sessions << " (" << sessions_lost << " lost their heartbeat)\n"
    << "live allocations         " << allocations << "\n";
  for (size_t i = 0; i < kOpCount; ++i)
    if (ops[i]) o << "  " << kOps[i].name << std::string(24 - std::min<size_t>(22, kOps[i].name.size()), ' ') << ops[i] << "\n";
  return o.str();
}

std::string WorkerStats::json() const {
  std::ostringstream o;
  o << "{\"entries\":" << entries << ",\"sync_requests\":" << slot_requests << ",\"sync_requests_posted\":" << slot_posts << ",\"edge_waits\":" << edge_waits
    << ",\"errors\":" << errors << ",\"sleeps\":" << sleeps << ",\"doorbell_wakeups\":" << wakeups_by_doorbell
    << ",\"sessions\":" << sessions << ",\"sessions_lost\":" << sessions_lost << ",\"allocations\":" << allocations
    << ",\"ops\":{";
  bool first = true;
  for (size_t i = 0; i < kOpCount; ++i) {
    if (!ops[i]) continue;
    o << (first ? "" : ",") << "\"" << kOps[i].name << "\":" << ops[i];
    first = false;
  }
  o << "}}";
  return o.str();
}

}  // namespace ordo

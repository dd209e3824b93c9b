// The guest's session: attaching one, watching its heartbeat, and the one
// reset that frees everything it held when it ends, dies or the worker stops.
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "clock.h"
#include "fence_queue.h"
#include "worker.h"

namespace ordo {

void Worker::fresh_ring(uint32_t r) {
  // Field by field: the atomics other lanes read make RingState immovable.
  RingState& rs = rings_[r];
  rs.reader = RingReader(region_.entries(r), layout_.ring_capacity, &region_.ring(r));
  rs.head.store(0, std::memory_order_relaxed);
  rs.staged = rs.chaos_armed = rs.waited = false;
  rs.chaos_until_ns = rs.staged_ns = 0;
  rs.entry = Entry{};
  rs.hold.store(nullptr, std::memory_order_relaxed);
  rs.hold_ticket.store(0, std::memory_order_relaxed);
  rs.registered = false;
  rs.wait_count = 0;
  rs.dirty.clear();
  rs.fence_count = 0;
  rs.fences = std::make_shared<FenceQueue>(&region_.ring(r));
}

void Worker::attach_session(uint64_t session) {
  // The guest waits for attached_session before touching the rings, so the
  // shared state can be reset here without racing it; the lanes stand still.
  pause_lanes();
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
  serving_.store(session, std::memory_order_release);
  resume_lanes();
  h->attached_session.store(session, std::memory_order_release);
  if (!opt_.quiet) std::fprintf(stderr, "ordo-worker: guest session %016" PRIx64 " attached\n", session);
}

void Worker::reset_session() {
  pause_lanes();  // every lane between passes until the session is gone
  // Nobody opens this session's exports from now on, and its streams stop
  // waiting on records other processes may never complete.
  ipc_revoke_exports();
  backend_.ipc_abandon();
  backend_.abandon_programs();
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
    while (!rs.fences->empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
  side_.drain();  // loads in flight land in modules_ (their replies go to the ended session)
  for (uint32_t m : modules_) backend_.module_unload(m);
  modules_.clear();
  pending_image_ = {};  // an image whose last piece never came
  {
    std::lock_guard lock(graphs_mu_);
    graphs_.clear();
    next_graph_ = 1;
  }
  ipc_close_imports();
  for (auto& [addr, size] : allocations_) backend_.free(addr);
  // Virtual memory: mappings first, so that physical memory and ranges are free to go.
  for (auto& [addr, m] : vmm_.mappings()) backend_.vmm_unmap(addr, m.size);
  for (auto& [h, p] : vmm_.handles()) backend_.vmm_release(p.backend_handle);
  for (auto& [addr, size] : vmm_.reservations()) backend_.vmm_address_free(addr, size);
  vmm_.clear();
  allocations_.clear();
  globals_.clear();
  counters_.allocations.store(0, std::memory_order_relaxed);
  for (uint32_t r = 0; r < layout_.ring_count; ++r) {
    rings_[r].fences->kill();
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
  serving_.store(0, std::memory_order_release);
  resume_lanes();
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

}  // namespace ordo

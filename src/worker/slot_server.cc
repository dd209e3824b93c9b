// The reply-slot server: takes each slot's request (posted, or read directly
// from a watched slot), validates the copy, holds it until its edges are met,
// and hands it to the op's handler (handlers/), which replies.
#include <cstring>
#include <mutex>
#include <string>

#include "clock.h"
#include "validate.h"
#include "worker.h"

namespace ordo {

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
      bump(lanes_[0]->edge_waits);  // slots are lane 0's
    }
    return false;
  }
  ss.staged = false;
  serve_slot(s, ss.entry, ss.seq);
  if (tracer_) tracer_->record(kMaxRings + s, ss.seq, ss.entry, ss.staged_ns, Tracer::stamp());
  return true;
}

std::function<void(Status, uint64_t)> Worker::deferred_result(uint32_t s, uint64_t seq) {
  // Completes from another thread: the dispatch thread never waits on the device.
  uint64_t epoch;
  {
    std::lock_guard lock(error_mu_);
    epoch = session_epoch_;
  }
  pending_notifies_.fetch_add(1, std::memory_order_relaxed);
  return [this, s, seq, epoch](Status st, uint64_t r0) {
    reply(s, seq, st, r0, 0, epoch);
    // Last: once this reaches 0, ~Worker may run.
    if (pending_notifies_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_notifies_.notify_all();
  };
}

std::function<void()> Worker::deferred_reply(uint32_t s, uint64_t seq) {
  return [done = deferred_result(s, seq)] { done(Status::kSuccess, 0); };
}

void Worker::serve_slot(uint32_t s, const Entry& e, uint64_t seq, bool edges_met) {
  const Op op = static_cast<Op>(e.op);
  bump(lanes_[0]->ops[e.op]);
  if (const int32_t f = sticky_.load(std::memory_order_relaxed); f && op != Op::Null && op != Op::DeviceInfo)
    return reply(s, seq, Status(f));
  const SlotCall c{s, seq, e, edges_met};
  switch (op) {
#define ORDO_OP(name, path, order, args) \
  case Op::name:                         \
    ORDO_IF(Slot, path, return op_##name(c);) ORDO_IF(Ring, path, break;)
#include "ordo/ops.def"
#undef ORDO_OP
    case Op::kCount:
      break;
  }
  reply(s, seq, Status::kNotSupported);  // check_entry keeps stream ops out of slots
}

std::string Worker::payload_name(uint32_t s) const {
  char name[kSlotPayload];
  std::memcpy(name, region_.slot(s).payload, kSlotPayload);  // once: the guest may rewrite it
  return std::string(name, strnlen(name, kSlotPayload));
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

}  // namespace ordo

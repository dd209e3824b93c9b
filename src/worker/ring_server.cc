// Ring reading and the edge gate: copies each ring's next entry out,
// validates it, holds it until its edges are met (and no host function holds
// its ring), and hands it to the op's handler (handlers/).
#include <algorithm>
#include <string>
#include <vector>

#include "clock.h"
#include "validate.h"
#include "worker.h"

namespace ordo {
namespace {

constexpr uint32_t kBatch = 64;  // entries per ring per pass before the head is published

}  // namespace

Status Worker::check_edges(const Entry& e, uint32_t own_ring, std::string* why) {
  for (unsigned i = 0; i < e.edge_count; ++i) {
    const Edge& edge = e.edges[i];
    // An edge may only name an entry that was published before this one; anything
    // later could close a cycle and stall the guest's rings forever.
    const uint64_t head = rings_[edge.ring].head.load(std::memory_order_acquire);
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
  // Another lane may read a hold newer than the ticket or the reverse; either
  // way it finds the ring held longer, never shorter.
  const HostFuncWords* h = hold.load(std::memory_order_acquire);
  return h && h->done.load(std::memory_order_acquire) < hold_ticket.load(std::memory_order_acquire);
}

uint64_t Worker::passed(uint32_t r) const {
  const RingState& rs = rings_[r];
  // A HostFunc is stream work that ends when the guest's function returned,
  // not when the backend's stream reached it: until then an edge past it is
  // not met (legacy-stream work after a blocking stream's function, or the
  // reverse, and a shared ring's StreamSynchronize). Its own ring holds the
  // entries after it anyway (poll_ring).
  const uint64_t head = rs.head.load(std::memory_order_acquire);
  return rs.held() ? head - 1 : head;
}

bool Worker::edges_ready(const Edge* edges, unsigned count) const {
  if (!opt_.ordered) return true;
  for (unsigned i = 0; i < count; ++i)
    if (passed(edges[i].ring) < edges[i].pos) return false;
  return true;
}

// Lanes see each other's waits only as registered here, under waits_mu_.
void Worker::register_wait(RingState& rs, const Entry& e) {
  std::lock_guard lock(waits_mu_);
  rs.registered = true;
  rs.wait_count = e.edge_count;
  std::copy_n(e.edges, e.edge_count, rs.wait_edges);
}

void Worker::unregister_wait(RingState& rs) {
  if (!rs.waited) return;
  std::lock_guard lock(waits_mu_);
  rs.registered = false;
}

bool Worker::waits_for_itself(uint32_t start) {
  std::lock_guard lock(waits_mu_);
  std::vector<uint32_t> todo{start};
  std::vector<bool> seen(layout_.ring_count);
  while (!todo.empty()) {
    const RingState& rs = rings_[todo.back()];
    todo.pop_back();
    if (!rs.registered) continue;
    for (unsigned i = 0; i < rs.wait_count; ++i) {
      const Edge& e = rs.wait_edges[i];
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

bool Worker::chaos_hold(Lane& lane, bool& armed, uint64_t& until) {
  if (!opt_.chaos_seed) return false;
  const uint64_t now = now_ns();
  if (!armed) {
    armed = true;
    until = now + lane.chaos_rng() % (uint64_t{opt_.chaos_max_hold_us} * 1000 + 1);
  }
  if (now < until) return true;
  armed = false;
  return false;
}

bool Worker::poll_ring(uint32_t r, Lane& lane) {
  RingState& rs = rings_[r];
  uint64_t head = rs.head.load(std::memory_order_relaxed);  // this lane's own
  auto advance = [&] {
    rs.head.store(++head, std::memory_order_release);
  };
  bool progressed = false;
  for (uint32_t n = 0; n < kBatch; ++n) {
    uint64_t word = 0;
    if (!rs.staged && !rs.reader.published(head, &word)) break;
    if (rs.hold.load(std::memory_order_relaxed)) {
      // A host function: the ring goes on once the guest ran it.
      if (rs.held()) break;
      rs.hold.store(nullptr, std::memory_order_relaxed);
    }
    if (!rs.staged) {
      rs.reader.copy(head, word, &rs.entry);  // then validate and use only the copy
      std::string why;
      Status s = check_entry(rs.entry, Path::Ring, layout_, &why);
      if (ok(s)) s = check_edges(rs.entry, r, &why);
      if (!ok(s)) {
        log_bad("ring", r, head, why);
        async_error({r, rs.entry.thread < layout_.slot_count ? rs.entry.thread : kNoSlot, head, rs.entry.op}, s);
        advance();
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
        register_wait(rs, rs.entry);
        rs.waited = true;
        if (waits_for_itself(r)) {
          log_bad("ring", r, head, "edges close a cycle");
          async_error({r, rs.entry.thread, head, rs.entry.op}, Status::kIllegalState);
          unregister_wait(rs);
          rs.staged = false;
          advance();
          progressed = true;
          continue;
        }
        bump(lane.edge_waits);
      }
      break;
    }
    if (chaos_hold(lane, rs.chaos_armed, rs.chaos_until_ns)) break;
    const Status s = dispatch(r, rs.entry, head, lane);
    if (s == Status::kNotReady && rs.entry.op == uint16_t(Op::EventRecord)) {
      // A record that needs a backend event of its own while all are in use
      // (EventTable::record): it waits for a wait elsewhere, as for an edge.
      if (!rs.waited) {
        rs.waited = true;
        bump(lane.edge_waits);
      }
      break;
    }
    if (!ok(s)) async_error({r, rs.entry.thread, head, rs.entry.op}, s);
    if (tracer_) tracer_->record(r, head, rs.entry, rs.staged_ns, Tracer::stamp());
    unregister_wait(rs);
    rs.staged = false;
    advance();
    progressed = true;
  }
  rs.reader.release(head);
  if (progressed) wake_waiting_lanes();
  return progressed;
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

Status Worker::enter_stream(const RingCall& c) {
  if (Status s = stream_of(c.e, c.ring); !ok(s)) return s;
  mark_dirty(c.rs, c.e.stream);
  return Status::kSuccess;
}

Status Worker::dispatch(uint32_t r, const Entry& e, uint64_t pos, Lane& lane) {
  bump(lane.ops[e.op]);
  bump(lane.entries);
  const RingCall c{r, pos, e, rings_[r], OpTag{r, e.thread, pos, e.op}};
  switch (static_cast<Op>(e.op)) {
#define ORDO_OP(name, path, order, args) \
  case Op::name:                         \
    ORDO_IF(Ring, path, return op_##name(c);) ORDO_IF(Slot, path, break;)
#include "ordo/ops.def"
#undef ORDO_OP
    case Op::kCount:
      break;
  }
  return Status::kNotSupported;  // check_entry keeps sync ops off rings
}

}  // namespace ordo

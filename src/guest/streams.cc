#include "guest/streams.h"
#include "transport/op_args.h"

namespace ordo::guest {

Streams::Streams(Session& session, Threads& threads, Edges& edges, RingProducer& producer, Waits& waits)
    : session_(session),
      threads_(threads),
      edges_(edges),
      producer_(producer),
      waits_(waits),
      table_(new StreamState[kMaxStreams]),
      placement_(producer.size()) {
  // Device 0's legacy stream is open from the start, on the legacy ring.
  placement_[kLegacyRing].live = 1;
  edges.stream_opened(kLegacyRing, 0, false);
  edges.legacy_opened(0, kLegacyRing);
  table_[kLegacyStreamId].ring.store(kLegacyRing);
  ids_.open(kLegacyStreamId);
}

Status Streams::stream_op(Stream s, const Entry& e, EventState* ev, Edge* placed) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  // CUDA records an event only on a stream of the event's device.
  if (ev && static_cast<Op>(e.op) == Op::EventRecord && b.s.device != ev->device)
    return threads_.finish(t, Status::kInvalidResourceHandle);
  std::lock_guard lock(b.g->mu);
  const uint64_t pos = producer_.push(t, *b.g, b.s, e, ev);
  if (placed) *placed = {b.g->index, 0, pos + 1};
  return threads_.finish_async(t);
}

uint32_t Streams::choose_ring_locked() const {
  // The ring with the fewest streams: its own ring while streams are fewer
  // than rings, shared ones after that (ARCHITECTURE.md, "Streams and rings").
  // Among those, one whose destroyed streams' work completed: that work may
  // be a host function the program has not let return, and the ring holds
  // every later entry behind it, a new stream's too.
  auto rank = [&](uint32_t q) {
    const bool pending = session_.completed(q) < placement_[q].released_end;
    return uint64_t{placement_[q].live} * 2 + pending;
  };
  uint32_t r = 0;
  for (uint32_t q = 1; q < placement_.size(); ++q)
    if (!r || rank(q) < rank(r)) r = q;
  return r;
}

void Streams::open_ring(uint32_t r) {
  session_.region().header()->ring_open[r / 64].fetch_or(uint64_t{1} << (r % 64), std::memory_order_release);
}

Status Streams::open_legacy(ThreadState& t, uint32_t d) {
  std::lock_guard lock(mu_);
  StreamState& st = table_[d];
  if (ids_.live(d)) return Status::kSuccess;
  const uint32_t r = choose_ring_locked();
  ++placement_[r].live;
  edges_.stream_opened(r, d, false);
  edges_.legacy_opened(d, r);
  st.ring.store(r, std::memory_order_relaxed);
  st.device.store(d, std::memory_order_relaxed);
  // Opened under mu_: a thread reaches device d's legacy stream only after
  // its own set_device(d), which waits here, so nothing is pushed on the
  // stream before its create below.
  ids_.open(d);
  open_ring(r);
  Entry e = make_entry<Op::StreamCreate>({.flags = kStreamLegacy, .priority = 0, .device = d});
  Ring& g = producer_.ring(r);
  std::lock_guard rl(g.mu);
  producer_.push(t, g, StreamRef{d, d, false}, e);
  return Status::kSuccess;
}

Status Streams::create(Stream* out, uint64_t flags, int priority) {
  ThreadState& t = threads_.current();
  if (!out || (flags & ~kStreamNonBlocking)) return threads_.finish_own(t, Status::kInvalidValue);
  // After a kernel fault the context is dead: CUDA creates nothing and says so.
  if (const Status f = session_.sticky_error(); !ok(f)) return threads_.finish_own(t, f);
  const bool blocking = !(flags & kStreamNonBlocking);
  const uint32_t d = t.device;
  uint32_t id = 0, r = 0, generation = 0;
  Entry e = make_entry<Op::StreamCreate>({.flags = flags, .priority = priority, .device = d});
  {
    std::lock_guard lock(mu_);
    if (ids_.full() || placement_.size() < 2) return threads_.finish_own(t, Status::kMemoryAllocation);
    r = choose_ring_locked();
    uint64_t handle = 0;
    ids_.acquire(&id, &handle, [&](uint32_t i) {
      StreamState& st = table_[i];
      ++placement_[r].live;
      edges_.stream_opened(r, d, blocking);
      edges_.recreate(i, r, &e);
      st.ring.store(r, std::memory_order_relaxed);
      st.device.store(d, std::memory_order_relaxed);
      st.blocking.store(blocking, std::memory_order_relaxed);
    });
    generation = ids_.generation_of(handle);
  }
  open_ring(r);
  Ring& g = producer_.ring(r);
  {
    std::lock_guard lock(g.mu);
    producer_.push(t, g, StreamRef{id, d, blocking}, e);
  }
  *out = {id, generation};
  return threads_.finish_own(t, Status::kSuccess);
}

Status Streams::release(ThreadState& t, Stream s) {
  std::lock_guard lock(mu_);
  const uint32_t id = s.id;
  StreamState& st = table_[id];
  // Checked again under the lock: two destroys of one handle release it once.
  if (!ids_.find(id, s.generation)) return Status::kInvalidResourceHandle;
  const uint32_t r = st.ring.load(std::memory_order_relaxed);
  Ring& g = producer_.ring(r);
  std::lock_guard rl(g.mu);
  // CUDA defers the destroy: the stream's work still runs. The fence lets the
  // ring's later fences (device-wide waits) cover that work once the stream is gone.
  if (g.fence_end != g.writer.tail()) producer_.push_fence(t, g);
  const StreamRef ref{id, st.device.load(std::memory_order_relaxed), st.blocking.load(std::memory_order_relaxed)};
  edges_.stream_closed(r, ref.device, ref.blocking, g.fence_end);
  placement_[r].released_end = g.fence_end;
  Entry e{};
  e.op = uint16_t(Op::StreamDestroy);
  edges_.destroyed(id, r, producer_.push(t, g, ref, e));
  ids_.release(id);
  --placement_[r].live;
  return Status::kSuccess;
}

Status Streams::destroy(Stream s) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!bind(s, &b) || b.s.id < kMaxDevices) return threads_.finish(t, Status::kInvalidResourceHandle);
  for (Stream& p : t.per_thread)
    if (p.id == s.id && p.generation == s.generation)
      p = Stream{kNoStream, 0};  // destroyed by hand: the thread's exit has nothing left to release
  return threads_.finish(t, release(t, s));
}

Stream Streams::per_thread() {
  ThreadState& t = threads_.current();
  Stream& p = t.per_thread[t.device];
  if (p.id == kNoStream) {
    Stream s;
    if (ok(create(&s, 0, 0))) p = s;
  }
  // No stream: an invalid handle, never a silent switch to the legacy stream
  // (that would change what the program's calls synchronize with).
  return p;
}

Status Streams::synchronize(Stream s) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  const uint32_t r = b.g->index;
  bool shared;
  {
    std::lock_guard lock(mu_);
    shared = placement_[r].live > 1;
  }
  Targets targets;
  if (shared) {
    // A fence would also wait for the ring-mates' work: ask for this stream
    // alone, once everything it published so far was dispatched.
    Entry req = make_entry<Op::StreamSynchronize>({.stream = b.s.id});
    const uint64_t end = b.g->order->published.load(std::memory_order_acquire);
    if (end) req.edges[req.edge_count++] = {r, 0, end};
    const Status st = threads_.call(req);
    // A legacy stream (past device 0's, it may share a ring) also covers its
    // device's blocking streams, which the request does not.
    if (!ok(st) || !edges_.ordered() || b.s.id >= kMaxDevices) return threads_.finish(t, st);
    waits_.legacy_targets(t, b.s.id, &targets);
    return waits_.wait(t, targets);
  }
  waits_.fence_target(t, r, &targets);
  if (edges_.ordered() && b.s.id < kMaxDevices) waits_.legacy_targets(t, b.s.id, &targets);
  return waits_.wait(t, targets);
}

Status Streams::query(Stream s) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  const uint32_t r = b.g->index;
  if (edges_.ordered() && b.s.id < kMaxDevices) {
    Targets targets;
    waits_.fence_target(t, r, &targets);
    waits_.legacy_targets(t, b.s.id, &targets);
    for (auto [q, pos] : targets)
      if (session_.completed(q) < pos) return threads_.finish(t, Status::kNotReady);
    return threads_.finish(t, Status::kSuccess);
  }
  std::lock_guard lock(b.g->mu);
  if (session_.completed(r) >= b.g->writer.tail()) return threads_.finish(t, Status::kSuccess);
  if (b.g->fence_end != b.g->writer.tail()) producer_.push_fence(t, *b.g);
  return threads_.finish(t, Status::kNotReady);
}

Status Streams::order_wait(Stream s) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  // What stream work issued now on `s` would wait for: the stream itself and,
  // through the legacy stream's implicit synchronization, the legacy stream
  // (from a blocking stream) or every blocking stream, destroyed ones with
  // pending work included (from the legacy stream).
  Targets targets;
  waits_.fence_target(t, b.g->index, &targets);
  const uint32_t d = b.s.device;
  if (edges_.ordered() && b.s.id < kMaxDevices) {
    waits_.legacy_targets(t, d, &targets);
  } else if (edges_.ordered() && b.s.blocking) {
    waits_.fence_target(t, table_[d].ring.load(std::memory_order_relaxed), &targets);
  }
  return waits_.wait(t, targets);
}

bool Streams::device_of(Stream s, uint32_t* device) {
  Bound b;
  if (!bind(s, &b)) return false;
  *device = b.s.device;
  return true;
}

uint32_t Streams::ring_of(Stream s) {
  Bound b;
  return bind(s, &b) ? b.g->index : kNoRing;
}

}  // namespace ordo::guest

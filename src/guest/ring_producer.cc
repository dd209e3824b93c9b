#include "guest/ring_producer.h"

#include <algorithm>

namespace ordo::guest {

RingProducer::RingProducer(Session& session, Threads& threads, Edges& edges)
    : session_(session), threads_(threads), edges_(edges) {
  const Layout& l = session.layout();
  Region& region = session.region();
  rings_.reserve(l.ring_count);
  for (uint32_t r = 0; r < l.ring_count; ++r) {
    auto g = std::make_unique<Ring>();
    g->index = r;
    g->writer = RingWriter(region.entries(r), l.ring_capacity, &region.ring(r));
    g->order = &edges.ring(r);
    g->order->published.store(g->writer.tail());
    g->fence_end = g->writer.tail();
    g->staging = StagingWindow(region.staging(r), l.staging_per_ring, &region.ring(r).completed);
    rings_.push_back(std::move(g));
  }
}

Entry* RingProducer::claim_slot_slow(Ring& g) {
  session_.notify_worker();
  // Backpressure: the worker dispatches without guest help (edges point back), so this ends.
  if (!ok(session_.wait_worker(g.writer.head(), g.writer.room_at()))) return nullptr;  // session lost: finish() says so
  return g.writer.claim();
}

void RingProducer::write_entry(Ring& g, const Entry& e) {
  Entry* slot = claim_slot(g);
  if (!slot) return;
  g.writer.publish(slot, e);
  commit_slot(g);
}

uint64_t RingProducer::push(ThreadState& t, Ring& g, const StreamRef& s, const Entry& call, EventState* ev) {
  threads_.mark_errors(t);
  return edges_.order(g.index, s, call, ev, [&](const Entry& e, const EdgeList& edges) {
    return push_edges(t, g, s.id, e, edges);
  });
}

uint64_t RingProducer::push_edges(ThreadState& t, Ring& g, uint32_t stream, const Entry& call,
                                  const EdgeList& edges) {
  // By reference, then copied: a 64-byte-aligned argument passed by value is
  // copied with `rep movs`, on every call.
  Entry e = call;
  e.thread = t.err_slot;
  e.stream = stream;
  size_t i = 0;
  // More edges than fit: earlier Nop entries on the same ring carry the rest.
  while (edges.size() - i > kMaxEdges) {
    Entry nop{};
    nop.op = uint16_t(Op::Nop);
    nop.thread = t.err_slot;
    nop.stream = stream;
    nop.edge_count = kMaxEdges;
    for (uint32_t k = 0; k < kMaxEdges; ++k) nop.edges[k] = edges[i++];
    write_entry(g, nop);
  }
  e.edge_count = uint8_t(edges.size() - i);
  for (uint32_t k = 0; i < edges.size(); ++k) e.edges[k] = edges[i++];
  const uint64_t pos = g.writer.tail();
  write_entry(g, e);
  t.last_pos = pos;
  return pos;
}

uint64_t RingProducer::push_launch_edges(ThreadState& t, Ring& g, uint32_t stream, const uint64_t (&arg)[6],
                                         uint16_t flags, const EdgeList& edges) {
  Entry e{};
  e.op = uint16_t(Op::Launch);
  e.flags = flags;
  std::copy(std::begin(arg), std::end(arg), e.arg);
  return push_edges(t, g, stream, e, edges);
}

uint64_t RingProducer::push_fence(ThreadState& t, Ring& g) {
  Entry e{};
  e.op = uint16_t(Op::Fence);
  const uint64_t keep = t.last_pos;  // a fence is bookkeeping, not the caller's call
  push(t, g, StreamRef{}, e);         // a fence covers the ring, whatever stream it names
  t.last_pos = keep;
  g.fence_end = g.writer.tail();
  g.staging.fenced();
  return g.fence_end;
}

}  // namespace ordo::guest

// The rings' producer side in the guest: each ring's guest-private state and
// the pushes that write entries into it, with the edges edges.h decides
// (ARCHITECTURE.md, "Pieces"). Guest threads using a ring serialize on its
// lock, so one writer writes at a time (transport/ring.h: the protocol).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "guest/edges.h"
#include "guest/session.h"
#include "guest/staging.h"
#include "guest/threads.h"
#include "ordo/layout.h"
#include "transport/ring.h"

namespace ordo::guest {

// Guest-private state of one ring. Nothing here is visible to the worker.
struct Ring {
  uint32_t index = 0;
  std::mutex mu;            // producers on this ring's streams
  RingWriter writer;        // tail(): the next position to write
  RingOrder* order = nullptr;  // published: the tail, for other threads' edges (edges.h)
  uint64_t fence_end = 0;   // position just past the last fence
  StagingWindow staging;    // its window (staging.h)
};

class RingProducer {
 public:
  RingProducer(Session& session, Threads& threads, Edges& edges);

  uint32_t size() const { return uint32_t(rings_.size()); }
  Ring& ring(uint32_t r) { return *rings_[r]; }

  // Appends `call`, an entry of stream `s`, to ring g with the edges it
  // carries followed by those its op's ordering role adds (Edges::order): for
  // a record of or a wait on an event, `ev`. Returns its position. Caller
  // holds g.mu.
  uint64_t push(ThreadState& t, Ring& g, const StreamRef& s, const Entry& call, EventState* ev = nullptr);
  // push for a launch: its entry is written in its slot, not built and copied.
  [[gnu::always_inline]] inline uint64_t push_launch(ThreadState& t, Ring& g, const StreamRef& s,
                                                     const uint64_t (&arg)[6], uint16_t flags);
  // A fence on g: the worker advances the ring's `completed` past it once
  // everything before it ran. Returns the position just past it.
  uint64_t push_fence(ThreadState& t, Ring& g);

 private:
  uint64_t push_launch_edges(ThreadState& t, Ring& g, uint32_t stream, const uint64_t (&arg)[6], uint16_t flags,
                             const EdgeList& edges);
  uint64_t push_edges(ThreadState& t, Ring& g, uint32_t stream, const Entry& call, const EdgeList& edges);
  void write_entry(Ring& g, const Entry& e);
  // The slot at the ring's tail once it is free; nullptr: session lost.
  [[gnu::always_inline]] Entry* claim_slot(Ring& g) {
    Entry* slot = g.writer.claim();
    if (!slot) [[unlikely]] return claim_slot_slow(g);
    return slot;
  }
  Entry* claim_slot_slow(Ring& g);
  // The entry just published: tell the worker and other threads.
  [[gnu::always_inline]] void commit_slot(Ring& g) {
    // After notify_worker's sfence: on a write-combined BAR mapping the entry's
    // publishing store may otherwise still wait in this core's write-combining
    // buffer when another thread reads `published`, names the entry in an edge,
    // and the worker rejects that edge as naming an unpublished entry.
    session_.notify_worker();
    g.order->published.store(g.writer.tail(), std::memory_order_release);
  }

  Session& session_;
  Threads& threads_;
  Edges& edges_;
  std::vector<std::unique_ptr<Ring>> rings_;
};

[[gnu::always_inline]] inline uint64_t RingProducer::push_launch(ThreadState& t, Ring& g, const StreamRef& s,
                                                                const uint64_t (&arg)[6], uint16_t flags) {
  static_assert(info(Op::Launch).order == Order::Stream);
  static_assert(offsetof(Entry, stream) == offsetof(Entry, thread) + 4 && offsetof(Entry, arg) % 16 == 0);
  // Each store a launch makes queues behind the previous launch's entry line
  // while the worker's core holds that line; past a few dozen the queue is
  // full and the launch waits out the line's trip (ARCHITECTURE.md, "The
  // launch path"). So the common case writes its fields in the slot, once,
  // in four stores and the publishing one.
  threads_.mark_errors(t);
  EdgeList edges;
  if (edges_.ordered()) edges_.legacy(g.index, s, &edges);
  if (!edges.empty()) [[unlikely]] return push_launch_edges(t, g, s.id, arg, flags, edges);
  Entry* slot = claim_slot(g);
  t.last_pos = g.writer.tail();
  if (!slot) return t.last_pos;  // session lost: finish() says so
  const uint64_t who = t.err_slot | uint64_t{s.id} << 32;
  std::memcpy(reinterpret_cast<char*>(slot) + offsetof(Entry, thread), &who, sizeof who);  // thread, stream
  for (int k = 0; k < 6; k += 2)
    _mm_store_si128(reinterpret_cast<__m128i*>(&slot->arg[k]), _mm_set_epi64x(int64_t(arg[k + 1]), int64_t(arg[k])));
  static_assert(offsetof(Entry, flags) == 2);
  g.writer.publish_in_place(slot, uint64_t(Op::Launch) | uint64_t{flags} << 16);
  commit_slot(g);
  return t.last_pos;
}

}  // namespace ordo::guest

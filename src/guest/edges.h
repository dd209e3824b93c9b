// Ordering edges: which "ring R dispatched its first p entries" edges an entry
// carries (ARCHITECTURE.md, "Ordering rules"). Rule 1 (per stream) is ring
// order and needs none; this is rule 2 (events), rule 3 (the legacy stream),
// rule 5 (a reused stream id) and what they read of the rings' progress. All
// of it is guest-private bookkeeping: no region, no worker, so that
// tests/test_edges.cc checks it directly. The ring writer (ring_producer.h)
// writes what it decides.
#pragma once

#include <array>
#include <atomic>
#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ordo/client.h"
#include "ordo/layout.h"
#include "ordo/ops.h"
#include "transport/op_args.h"

namespace ordo::guest {

// Inline storage: no heap allocation unless an entry needs more than 16 edges.
// (Not a reused thread_local vector: a thread_local with a destructor is gone
// before the static destructors and atexit handlers that may still push.)
using EdgeList = boost::container::small_vector<Edge, 16>;

// What the rules need of a stream, fixed while it is open.
struct StreamRef {
  uint32_t id = kLegacyStreamId;  // < kMaxDevices: device `id`'s legacy stream
  uint32_t device = 0;
  bool blocking = false;  // synchronizes with its device's legacy stream (non-legacy streams)
};

// A ring's progress as other rings' edges see it.
struct RingOrder {
  std::atomic<uint64_t> published{0};  // the writer's tail, for other threads' edge snapshots
  // Per device, the ring's streams of that device: how many live, and where
  // the last one destroyed left its work (the fence before its destroy). A
  // device's legacy stream follows the ring's blocking streams of the device:
  // all the ring published while one lives, else up to that fence, so other
  // streams left on the ring are never waited for; device_synchronize covers
  // the ring likewise for any stream of the device.
  struct Presence {
    std::atomic<uint32_t> live{0};  // changed under the stream table's lock
    std::atomic<uint64_t> end{0};   // changed under the ring's and the stream table's locks
  };
  std::array<Presence, kMaxDevices> on;        // every stream of the device
  std::array<Presence, kMaxDevices> blocking;  // its blocking streams
  // Under the ring's lock: each legacy stream's ring positions already covered by an edge from here.
  std::array<uint64_t, kMaxDevices> legacy_seen{};
};

// An event as its users see it (rule 2).
struct EventState {
  std::mutex mu;
  uint64_t handle = 0;  // 0 once destroyed: stale handles find nothing
  uint32_t device = 0;
  bool interprocess = false;  // kEventInterprocess: other processes hold it too
  bool recorded = false;
  Edge record{};        // the record the next user refers to
  uint64_t number = 0;  // records issued: the worker keeps a record's state while waits on it are to come
  uint64_t waits = 0;   // StreamWaitEvents issued on record `number`

  // A new event in this slot (under mu): nothing recorded.
  void reset(uint64_t h, uint32_t d, bool ipc = false) {
    handle = h;
    device = d;
    interprocess = ipc;
    recorded = false;
    number = 0;
    waits = 0;
  }
};

class Edges {
 public:
  // `ordered` false: no edges for rules 2 and 3 (ClientOptions::ordered).
  Edges(uint32_t ring_count, bool ordered);

  bool ordered() const { return ordered_; }
  uint32_t ring_count() const { return ring_count_; }
  RingOrder& ring(uint32_t r) { return rings_[r]; }
  const RingOrder& ring(uint32_t r) const { return rings_[r]; }

  // The stream table's changes that the rules read, made under its lock.
  // Device d's legacy stream opened on ring r (device 0's is there from the start).
  void legacy_opened(uint32_t device, uint32_t r);
  void stream_opened(uint32_t r, uint32_t device, bool blocking);
  // A stream's destroy: its work ends at `end`, the fence pushed before its
  // StreamDestroy. Under ring r's lock too.
  void stream_closed(uint32_t r, uint32_t device, bool blocking, uint64_t end);

  // Writes `call`, an entry of stream `s` on ring r, through `write(entry,
  // edges) -> its position`, with the edges it carries followed by those its
  // op's ordering role adds: rule 3 for stream work; for a record of or a wait
  // on `ev`, rule 3 and rule 2, numbered under the event's lock, which is held
  // across the write. Caller holds ring r's lock.
  template <class Write>
  uint64_t order(uint32_t r, const StreamRef& s, const Entry& call, EventState* ev, Write&& write);

  // Rule 3: the edges stream work of `s` on ring r carries. Caller holds ring r's lock.
  [[gnu::always_inline]] inline void legacy(uint32_t r, const StreamRef& s, EdgeList* edges);

  // Rule 2 for a sync call about `ev`'s current record (EventSynchronize,
  // EventQuery, EventElapsedTime): the edge to that record. Caller holds ev.mu.
  void follow_record(const EventState& ev, Entry* e) const {
    if (ordered_ && ev.recorded) e->edges[e->edge_count++] = ev.record;
  }

  // Rule 5: the worker knows a stream id only once the StreamDestroy of its
  // previous stream (maybe on another ring) has been dispatched, so the
  // StreamCreate of a reused id on ring r follows that destroy.
  void recreate(uint32_t id, uint32_t r, Entry* create) const {
    const Edge& d = destroyed_[id];
    if (d.pos && d.ring != r) create->edges[create->edge_count++] = d;
  }
  void destroyed(uint32_t id, uint32_t r, uint64_t pos) { destroyed_[id] = {r, 0, pos + 1}; }

 private:
  const uint32_t ring_count_;
  const bool ordered_;
  std::unique_ptr<RingOrder[]> rings_;
  // Per device: the ring its legacy stream is on (kNoRing until opened), and
  // the positions of each ring its work already follows (under that ring's
  // lock; allocated when it is opened).
  std::array<std::atomic<uint32_t>, kMaxDevices> legacy_ring_;
  std::array<std::vector<uint64_t>, kMaxDevices> legacy_covered_;
  std::unique_ptr<Edge[]> destroyed_;  // by stream id, under the stream table's lock: its last StreamDestroy
};

[[gnu::always_inline]] inline void Edges::legacy(uint32_t r, const StreamRef& s, EdgeList* edges) {
  const uint32_t d = s.device;
  if (s.id < kMaxDevices) {
    // Legacy stream work follows everything published on its device's
    // blocking streams (on its own ring, ring order does that).
    std::vector<uint64_t>& covered = legacy_covered_[d];  // under this ring's lock, as every push on the stream
    for (uint32_t q = 0; q < ring_count_; ++q) {
      if (q == r) continue;
      const RingOrder& o = rings_[q];
      const uint64_t p = o.blocking[d].live.load(std::memory_order_acquire)
                             ? o.published.load(std::memory_order_acquire)
                             : o.blocking[d].end.load(std::memory_order_acquire);
      if (p > covered[q]) {
        edges->push_back({q, 0, p});
        covered[q] = p;
      }
    }
  } else if (s.blocking) {
    // Blocking stream work follows everything published on its device's legacy stream.
    const uint32_t lr = legacy_ring_[d].load(std::memory_order_acquire);
    if (lr == kNoRing || lr == r) return;
    const uint64_t p = rings_[lr].published.load(std::memory_order_acquire);
    uint64_t& seen = rings_[r].legacy_seen[d];
    if (p > seen) {
      edges->push_back({lr, 0, p});
      seen = p;
    }
  }
}

template <class Write>
uint64_t Edges::order(uint32_t r, const StreamRef& s, const Entry& call, EventState* ev, Write&& write) {
  EdgeList edges;
  for (unsigned k = 0; k < call.edge_count && k < kMaxEdges; ++k) edges.push_back(call.edges[k]);
  if (!ev) {
    if (ordered_ && info(static_cast<Op>(call.op)).order != Order::None) legacy(r, s, &edges);
    return write(call, edges);
  }
  // Numbered under the event's lock, so numbers and wait counts follow the
  // order in which records and waits replaced and used the event's state.
  // A re-record needs no edge to the record it replaces or its waits: the
  // worker keeps that record in a backend event of its own while waits on it
  // are to come (EventTable), so nothing CUDA would not hold holds it.
  std::lock_guard lock(ev->mu);
  const bool record = static_cast<Op>(call.op) == Op::EventRecord;
  Entry e = call;
  if (record) {
    auto a = decode<Op::EventRecord>(e.arg);
    a.number = ev->number + 1;
    a.replaced_waits = ev->waits;
    encode(a, e.arg);
  } else {
    auto a = decode<Op::StreamWaitEvent>(e.arg);
    a.number = ev->number;
    encode(a, e.arg);
  }
  if (ordered_) {
    legacy(r, s, &edges);
    if (!record && ev->recorded) edges.push_back(ev->record);
  }
  const uint64_t pos = write(e, edges);
  if (record) {
    ev->recorded = true;
    ev->record = {r, 0, pos + 1};
    ev->number++;
    ev->waits = 0;
  } else {
    ev->waits++;
  }
  return pos;
}

}  // namespace ordo::guest

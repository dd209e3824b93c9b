// Streams: the guest's table of stream ids, which ring each is on, and the
// stream calls (create, destroy, synchronize, query, per-thread streams).
// Streams are not rings: they share rings when they outnumber them
// (ARCHITECTURE.md, "Streams and rings").
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "guest/edges.h"
#include "guest/ring_producer.h"
#include "guest/session.h"
#include "guest/threads.h"
#include "guest/waits.h"
#include "ordo/client.h"
#include "transport/handle_table.h"

namespace ordo::guest {

// One stream id. `ring`, `device` and `blocking` are fixed while the stream is
// open (whether it is, and its generation: Streams::ids_).
struct StreamState {
  std::atomic<uint32_t> ring{kNoRing};
  std::atomic<uint32_t> device{0};
  std::atomic<bool> blocking{false};
};

// A live stream handle, resolved.
struct Bound {
  Ring* g;
  StreamRef s;  // s.id: kLegacyStream resolved to the current device's legacy stream
};

class Streams {
 public:
  Streams(Session& session, Threads& threads, Edges& edges, RingProducer& producer, Waits& waits);

  // False if `s` is not a live stream.
  [[gnu::always_inline]] inline bool bind(Stream s, Bound* out);
  // Pushes one entry of stream work (a record of or a wait on `ev`) and finish_async()es.
  // `placed`: where the entry went, as an edge past it.
  Status stream_op(Stream s, const Entry& e, EventState* ev = nullptr, Edge* placed = nullptr);

  Status create(Stream* out, uint64_t flags, int priority);
  Status destroy(Stream s);
  // A destroy, also of a per-thread stream at its thread's exit: its work still runs.
  Status release(ThreadState& t, Stream s);
  Stream per_thread();
  Status synchronize(Stream s);
  Status query(Stream s);
  // Waits for everything that stream work issued now on `s` would follow.
  Status order_wait(Stream s);
  // Device d's legacy stream, on a ring of its own if one is free (set_device).
  Status open_legacy(ThreadState& t, uint32_t device);
  bool device_of(Stream s, uint32_t* device);
  uint32_t ring_of(Stream s);

 private:
  // Per ring, under mu_: the streams on it, and where the last one destroyed
  // left its work (the fence before its destroy).
  struct Placement {
    uint32_t live = 0;
    uint64_t released_end = 0;
  };
  uint32_t choose_ring_locked() const;  // for a new stream; caller holds mu_
  void open_ring(uint32_t r);           // the worker polls only open rings

  Session& session_;
  Threads& threads_;
  Edges& edges_;
  RingProducer& producer_;
  Waits& waits_;
  std::unique_ptr<StreamState[]> table_;  // kMaxStreams, by stream id
  std::mutex mu_;                         // stream creation and destruction
  // Which ids are open, and their generations; looked up without mu_, changed
  // under it. Ids below kMaxDevices are the devices' legacy streams.
  HandleTable<32> ids_{kMaxStreams, kMaxDevices, /*eager=*/true};
  std::vector<Placement> placement_;      // by ring
};

[[gnu::always_inline]] inline bool Streams::bind(Stream s, Bound* out) {
  uint32_t id = s.id;
  if (id == kLegacyStreamId) {
    id = threads_.current().device;  // as stream 0 in CUDA: the current device's legacy stream (set_device opened it)
  } else if (id < kMaxDevices || id >= kMaxStreams) {
    return false;  // another device's legacy stream is never named by its id
  }
  if (id < kMaxDevices ? !ids_.live(id) : !ids_.find(id, s.generation)) return false;
  StreamState& st = table_[id];
  out->g = &producer_.ring(st.ring.load(std::memory_order_relaxed));
  out->s = {id, st.device.load(std::memory_order_relaxed), st.blocking.load(std::memory_order_relaxed)};
  return true;
}

}  // namespace ordo::guest

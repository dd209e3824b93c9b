// Events: the guest's table of the events the worker issued, and the event
// calls. What a record or a wait carries is rule 2 (edges.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "guest/edges.h"
#include "guest/session.h"
#include "guest/streams.h"
#include "guest/threads.h"
#include "ordo/client.h"

namespace ordo::guest {

// Event states by handle index (the handle's low 32 bits); a state is made
// once per index and reused by the events the worker issues there later.
class EventTable {
 public:
  EventTable();
  ~EventTable();
  EventTable(const EventTable&) = delete;
  EventTable& operator=(const EventTable&) = delete;

  // The live event `e` names, or null (a stale or foreign handle).
  EventState* find(Event e) const;
  // The state of a new event the worker issued as `handle` on `device`;
  // null: a handle past the table.
  EventState* install(uint64_t handle, uint32_t device, bool interprocess = false);
  // After the worker destroyed `e`: stale handles fail find() from now on.
  static void forget(EventState& ev, Event e);

 private:
  std::unique_ptr<std::atomic<EventState*>[]> states_;  // kMaxEvents
  std::mutex mu_;  // making states
};

class Events {
 public:
  Events(Session& session, Threads& threads, Streams& streams, Edges& edges)
      : session_(session), threads_(threads), streams_(streams), edges_(edges) {}

  Status create(Event* out, uint32_t flags);
  Status destroy(Event e);
  Status record(Event e, Stream s);
  Status stream_wait(Stream s, Event e);
  Status synchronize(Event e);
  Status query(Event e);
  Status elapsed(float* ms, Event start, Event end);
  // Interprocess events (client.h).
  Status ipc_export(Event e, Client::IpcToken* out);
  Status ipc_open(const Client::IpcToken& t, Event* out);

 private:
  // EventSynchronize or EventQuery: after the record current now.
  Status about_record(Op op, Event e);
  // A record of or a wait on an interprocess event: returns once the worker
  // dispatched it. Another process learns of the call only from this one,
  // after it returns; its own worker then dispatches what it does about the
  // event after this (ARCHITECTURE.md, "Sessions").
  Status ipc_op(Stream s, const Entry& e, EventState* ev);

  Session& session_;
  Threads& threads_;
  Streams& streams_;
  Edges& edges_;
  EventTable table_;
};

}  // namespace ordo::guest

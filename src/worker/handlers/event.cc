// Events: the worker's EventTable numbers each record (arg1), so that a wait
// or a query reaches the record it referred to when the guest issued it, even
// after the event was recorded again or destroyed.
#include <cstring>

#include "../worker.h"

namespace ordo {

Status Worker::op_EventRecord(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  // arg1: the record's number; arg2: the waits on the one it replaces.
  uint32_t idx, ev;
  if (Status s = events_.find(c.e.arg[0], c.e.arg[1], &idx); !ok(s)) return s;
  if (events_.device(idx) != streams_.device(c.e.stream))
    return Status::kInvalidResourceHandle;  // CUDA records an event only on a stream of its own device
  Status s = events_.record(idx, c.e.arg[1], c.e.arg[2], &ev);
  if (ok(s)) s = backend_.event_record(c.e.stream, ev);
  events_.settle(idx);
  return s;
}

Status Worker::op_StreamWaitEvent(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  uint32_t idx;  // arg1: the number of the record it waits for
  if (Status s = events_.find(c.e.arg[0], c.e.arg[1], &idx); !ok(s)) return s;
  const Status s = backend_.stream_wait_event(c.e.stream, events_.backend_of(idx, c.e.arg[1]));  // any device's, as CUDA
  events_.waited(idx, c.e.arg[1]);
  events_.settle(idx);
  return s;
}

void Worker::op_EventCreate(const SlotCall& c) {
  if (c.e.arg[1] >= devices_) return reply(c, Status::kInvalidDevice);
  uint64_t handle = 0;
  const Status st = events_.create(uint32_t(c.e.arg[1]), uint32_t(c.e.arg[0]), &handle);
  reply(c, st, handle);
}

void Worker::op_EventDestroy(const SlotCall& c) {
  // Answered at once, carried out once every wait on it was dispatched (EventTable).
  reply(c, events_.destroy(c.e.arg[0], c.e.arg[1], c.e.arg[2]));
}

void Worker::op_EventQuery(const SlotCall& c) {
  uint32_t idx;
  if (Status st = events_.find(c.e.arg[0], &idx); !ok(st)) return reply(c, st);
  reply(c, c.edges_met ? backend_.event_query(events_.backend_of(idx, c.e.arg[1])) : Status::kNotReady);
}

void Worker::op_EventSynchronize(const SlotCall& c) {
  uint32_t idx;
  if (Status st = events_.find(c.e.arg[0], &idx); !ok(st)) return reply(c, st);
  backend_.event_notify(events_.backend_of(idx, c.e.arg[1]), deferred_reply(c.slot, c.seq));
}

void Worker::op_EventElapsed(const SlotCall& c) {
  const Entry& e = c.e;
  uint32_t a, b;
  if (Status st = events_.find(e.arg[0], &a); !ok(st)) return reply(c, st);
  if (Status st = events_.find(e.arg[1], &b); !ok(st)) return reply(c, st);
  if (events_.device(a) != events_.device(b)) return reply(c, Status::kInvalidResourceHandle);
  if (!c.edges_met) return reply(c, Status::kNotReady);
  float ms = 0;
  const Status st = backend_.event_elapsed(events_.backend_of(a, e.arg[2]), events_.backend_of(b, e.arg[3]), &ms);
  uint32_t bits;
  std::memcpy(&bits, &ms, sizeof bits);
  reply(c, st, bits);
}

}  // namespace ordo

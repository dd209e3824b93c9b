// Events: the worker's EventTable numbers each record (arg1), so that a wait
// or a query reaches the record it referred to when the guest issued it, even
// after the event was recorded again or destroyed.
#include <cstring>
#include <mutex>

#include "../worker.h"

namespace ordo {

Status Worker::op_EventRecord(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  const auto a = decode<Op::EventRecord>(c.e.arg);
  uint32_t idx, ev;
  std::lock_guard lock(events_mu_);  // records and waits come from every lane
  if (Status s = events_.find(a.event, a.number, &idx); !ok(s)) return s;
  if (events_.device(idx) != streams_.device(c.e.stream))
    return Status::kInvalidResourceHandle;  // CUDA records an event only on a stream of its own device
  Status s = events_.record(idx, a.number, a.replaced_waits, &ev);
  if (ok(s)) s = backend_.event_record(c.e.stream, ev);
  events_.settle(idx);
  return s;
}

Status Worker::op_StreamWaitEvent(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  const auto a = decode<Op::StreamWaitEvent>(c.e.arg);
  uint32_t idx;
  std::lock_guard lock(events_mu_);
  if (Status s = events_.find(a.event, a.number, &idx); !ok(s)) return s;
  const Status s = backend_.stream_wait_event(c.e.stream, events_.backend_of(idx, a.number));  // any device's, as CUDA
  events_.waited(idx, a.number);
  events_.settle(idx);
  return s;
}

void Worker::op_EventCreate(const SlotCall& c) {
  const auto a = decode<Op::EventCreate>(c.e.arg);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  // CUDA's rule: an interprocess event keeps no time.
  if ((a.flags & kEventInterprocess) && !(a.flags & kEventDisableTiming)) return reply(c, Status::kInvalidValue);
  uint64_t handle = 0;
  Status st;
  {
    std::lock_guard lock(events_mu_);
    st = events_.create(uint32_t(a.device), uint32_t(a.flags), &handle);
  }
  reply(c, st, handle);
}

void Worker::op_EventDestroy(const SlotCall& c) {
  // Answered at once, carried out once every wait on it was dispatched (EventTable).
  const auto a = decode<Op::EventDestroy>(c.e.arg);
  Status st;
  {
    std::lock_guard lock(events_mu_);
    uint32_t idx;
    if (ok(events_.find(a.event, &idx))) {
      if (auto e = ipc_exported_events_.find(idx); e != ipc_exported_events_.end()) {
        opt_.ipc->revoke(e->second, opt_.partition);  // processes that opened it keep theirs
        ipc_exported_events_.erase(e);
      }
    }
    st = events_.destroy(a.event, a.number, a.waits);
  }
  reply(c, st);
}

void Worker::op_EventQuery(const SlotCall& c) {
  const auto a = decode<Op::EventQuery>(c.e.arg);
  uint32_t idx;
  Status st;
  {
    std::lock_guard lock(events_mu_);
    st = events_.find(a.event, &idx);
    if (ok(st)) st = c.edges_met ? backend_.event_query(events_.backend_of(idx, a.number)) : Status::kNotReady;
  }
  reply(c, st);
}

void Worker::op_EventSynchronize(const SlotCall& c) {
  const auto a = decode<Op::EventSynchronize>(c.e.arg);
  uint32_t idx;
  std::unique_lock lock(events_mu_);  // held until notified: a record's settle may drop the backend event
  if (Status st = events_.find(a.event, &idx); !ok(st)) {
    lock.unlock();
    return reply(c, st);
  }
  backend_.event_notify(events_.backend_of(idx, a.number), deferred_reply(c.slot, c.seq));
}

void Worker::op_EventElapsed(const SlotCall& c) {
  const auto args = decode<Op::EventElapsed>(c.e.arg);
  uint32_t a, b;
  std::unique_lock lock(events_mu_);
  if (Status st = events_.find(args.start, &a); !ok(st)) return reply(c, st);
  if (Status st = events_.find(args.end, &b); !ok(st)) return reply(c, st);
  if (events_.device(a) != events_.device(b)) return reply(c, Status::kInvalidResourceHandle);
  if (!c.edges_met) return reply(c, Status::kNotReady);
  float ms = 0;
  const Status st =
      backend_.event_elapsed(events_.backend_of(a, args.start_number), events_.backend_of(b, args.end_number), &ms);
  lock.unlock();
  uint32_t bits;
  std::memcpy(&bits, &ms, sizeof bits);
  reply(c, st, bits);
}

}  // namespace ordo

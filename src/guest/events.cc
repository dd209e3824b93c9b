#include "guest/events.h"
#include "transport/op_args.h"

#include <cstring>

namespace ordo::guest {

namespace {
// EventSynchronize or EventQuery: a request about the record the caller saw.
Entry about(Op op, uint64_t event, uint64_t number) {
  if (op == Op::EventQuery) return make_entry<Op::EventQuery>({.event = event, .number = number});
  return make_entry<Op::EventSynchronize>({.event = event, .number = number});
}
}  // namespace

EventTable::EventTable() : states_(new std::atomic<EventState*>[kMaxEvents]) {
  for (uint32_t i = 0; i < kMaxEvents; ++i) states_[i].store(nullptr, std::memory_order_relaxed);
}

EventTable::~EventTable() {
  for (uint32_t i = 0; i < kMaxEvents; ++i) delete states_[i].load();
}

EventState* EventTable::find(Event e) const {
  const uint32_t idx = uint32_t(e.handle);
  if (idx >= kMaxEvents) return nullptr;
  EventState* ev = states_[idx].load(std::memory_order_acquire);
  if (!ev || ev->handle != e.handle) return nullptr;
  return ev;
}

EventState* EventTable::install(uint64_t handle, uint32_t device, bool interprocess) {
  const uint32_t idx = uint32_t(handle);
  if (idx >= kMaxEvents) return nullptr;
  std::lock_guard lock(mu_);
  EventState* ev = states_[idx].load();
  if (!ev) {
    ev = new EventState();
    states_[idx].store(ev, std::memory_order_release);
  }
  std::lock_guard el(ev->mu);
  ev->reset(handle, device, interprocess);
  return ev;
}

void EventTable::forget(EventState& ev, Event e) {
  // Another thread's event_create may already have been given this index
  // (with a new generation) once the worker freed it: leave that one alone.
  std::lock_guard lock(ev.mu);
  if (ev.handle == e.handle) ev.handle = 0;
}

Status Events::create(Event* out, uint32_t flags) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish_own(t, Status::kInvalidValue);
  uint64_t h = 0;
  Status s = threads_.call(make_entry<Op::EventCreate>({.flags = flags, .device = t.device}), &h);
  if (!ok(s)) return threads_.finish_own(t, s);
  if (!table_.install(h, t.device, flags & kEventInterprocess)) return threads_.finish_own(t, Status::kIllegalState);
  out->handle = h;
  return threads_.finish_own(t, Status::kSuccess);
}

Status Events::destroy(Event e) {
  ThreadState& t = threads_.current();
  EventState* ev = table_.find(e);
  if (!ev) return threads_.finish(t, Status::kInvalidResourceHandle);
  Entry req{};
  {
    // CUDA defers the destroy: the record and every wait already issued on
    // the event keep their meaning. The worker answers at once and carries
    // the destroy out once every wait on it was dispatched (EventTable), so
    // nothing here waits for stream work, as cudaEventDestroy does not.
    std::lock_guard lock(ev->mu);
    req = make_entry<Op::EventDestroy>({.event = e.handle, .number = ev->number, .waits = ev->waits});
  }
  Status s = threads_.call(req);
  if (ok(s)) EventTable::forget(*ev, e);  // stale handles fail find() from now on
  return threads_.finish(t, s);
}

Status Events::record(Event e, Stream s) {
  EventState* ev = table_.find(e);
  if (!ev) return threads_.finish(threads_.current(), Status::kInvalidResourceHandle);
  const Entry call = make_entry<Op::EventRecord>({.event = e.handle, .number = 0, .replaced_waits = 0});
  return ev->interprocess ? ipc_op(s, call, ev) : streams_.stream_op(s, call, ev);
}

Status Events::stream_wait(Stream s, Event e) {
  EventState* ev = table_.find(e);
  if (!ev) return threads_.finish(threads_.current(), Status::kInvalidResourceHandle);
  const Entry call = make_entry<Op::StreamWaitEvent>({.event = e.handle, .number = 0});
  return ev->interprocess ? ipc_op(s, call, ev) : streams_.stream_op(s, call, ev);
}

Status Events::ipc_op(Stream s, const Entry& call, EventState* ev) {
  Edge placed{};
  Status st = streams_.stream_op(s, call, ev, &placed);
  // Without ordering (tests that must see violations) nothing waits.
  if (!ok(st) || !edges_.ordered() || !placed.pos) return st;
  // Not while a host function of this process has not returned: the entry
  // may be held behind it (on its ring, or through an edge into that ring),
  // and it may be waiting for this very thread (natively the call returns at
  // once). Then the call is ordered for other processes only once it returned.
  ThreadState& t = threads_.current();
  const Status w = session_.wait_worker(session_.region().ring(placed.ring).head, placed.pos,
                                        &session_.host_functions_pending());
  if (!ok(w) && w != Status::kNotReady) return threads_.finish(t, w);
  return st;
}

Status Events::ipc_export(Event e, Client::IpcToken* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish_own(t, Status::kInvalidValue);
  if (!table_.find(e)) return threads_.finish_own(t, Status::kInvalidResourceHandle);
  const Entry req = make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kEvent), .handle = e.handle});
  return threads_.finish_own(t, threads_.call(req, &out->word, &out->secret));
}

Status Events::ipc_open(const Client::IpcToken& tok, Event* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish_own(t, Status::kInvalidValue);
  uint64_t h = 0, device = 0;
  Status s = threads_.call(make_entry<Op::IpcOpenEvent>({.token = tok.word, .secret = tok.secret}), &h, &device);
  if (!ok(s)) return threads_.finish_own(t, s);
  if (!table_.install(h, uint32_t(device), true)) return threads_.finish_own(t, Status::kIllegalState);
  out->handle = h;
  return threads_.finish_own(t, Status::kSuccess);
}

Status Events::about_record(Op op, Event e) {
  ThreadState& t = threads_.current();
  EventState* ev = table_.find(e);
  if (!ev) return threads_.finish(t, Status::kInvalidResourceHandle);
  Entry req;
  {
    std::lock_guard lock(ev->mu);
    req = about(op, e.handle, ev->number);
    edges_.follow_record(*ev, &req);
  }
  return threads_.finish(t, threads_.call(req));
}

Status Events::synchronize(Event e) { return about_record(Op::EventSynchronize, e); }
Status Events::query(Event e) { return about_record(Op::EventQuery, e); }

Status Events::elapsed(float* ms, Event start, Event end) {
  ThreadState& t = threads_.current();
  EventState* a = table_.find(start);
  EventState* b = table_.find(end);
  if (!ms) return threads_.finish(t, Status::kInvalidValue);
  if (!a || !b) return threads_.finish(t, Status::kInvalidResourceHandle);
  Args<Op::EventElapsed> args{.start = start.handle, .end = end.handle, .start_number = 0, .end_number = 0};
  Entry req = make_entry(args);
  for (int k = 0; k < 2; ++k) {
    EventState* ev = k ? b : a;
    std::lock_guard lock(ev->mu);
    (k ? args.end_number : args.start_number) = ev->number;
    edges_.follow_record(*ev, &req);
  }
  encode(args, req.arg);
  uint64_t bits = 0;
  Status s = threads_.call(req, &bits);
  if (ok(s)) {
    uint32_t b32 = uint32_t(bits);
    std::memcpy(ms, &b32, sizeof(float));
  }
  return threads_.finish(t, s);
}

}  // namespace ordo::guest

// The sim's events, completion notifications and host callbacks. An event is
// a captured point in a stream (Capture, sim_stream.h); waiting for one is a
// WaitOp in the waiting stream.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>

#include "sim_device.h"

namespace ordo::sim {

Status Device::event_create(uint32_t event, uint32_t device, uint32_t flags) {
  if (event >= kMaxBackendEvents || device >= devices_) return Status::kInvalidValue;
  std::shared_ptr<IpcEventCell> cell;
  if (flags & kEventInterprocess) {
    if (!(flags & kEventDisableTiming)) return Status::kInvalidValue;
    if (!(cell = new_ipc_cell())) return Status::kMemoryAllocation;
  }
  std::lock_guard lk(mu_);
  auto [it, inserted] = events_.try_emplace(event);
  if (!inserted) return Status::kInvalidResourceHandle;
  it->second.flags = flags;
  it->second.ipc = std::move(cell);
  return Status::kSuccess;
}

Status Device::event_destroy(uint32_t event) {
  std::lock_guard lk(mu_);
  return events_.erase(event) ? Status::kSuccess : Status::kInvalidResourceHandle;
}

Status Device::event_record(uint32_t stream, uint32_t event) {
  std::lock_guard lk(mu_);
  Stream* s = find_stream_locked(stream);
  Event* e = find_event_locked(event);
  if (!s || !e) return Status::kInvalidResourceHandle;
  if (e->ipc) return ipc_record_locked(*s, e->ipc);
  auto cap = std::make_shared<Capture>();
  cap->stream = streams_[stream];
  push_locked(*s, Op{OpTag{}, RecordOp{cap}});
  cap->seq = s->enqueued;  // includes the record op itself, so its timestamp is set
  e->cap = std::move(cap);
  return Status::kSuccess;
}

Status Device::stream_wait_event(uint32_t stream, uint32_t event) {
  std::lock_guard lk(mu_);
  Stream* s = find_stream_locked(stream);
  Event* e = find_event_locked(event);
  if (!s || !e) return Status::kInvalidResourceHandle;
  if (e->ipc) return ipc_wait_locked(*s, e->ipc);
  const std::shared_ptr<Capture>& cap = e->cap;
  // Never recorded, already complete, or earlier on this very stream (FIFO): no-op.
  if (!cap || cap->stream.get() == s || capture_done(*cap)) return Status::kSuccess;
  push_locked(*s, Op{OpTag{}, WaitOp{cap->stream, cap->seq}});
  return Status::kSuccess;
}

Status Device::event_query(uint32_t event) {
  std::lock_guard lk(mu_);
  Event* e = find_event_locked(event);
  if (!e) return Status::kInvalidResourceHandle;
  if (e->ipc) return e->ipc->done(e->ipc->shared->recorded.load(std::memory_order_acquire)) ? Status::kSuccess
                                                                                               : Status::kNotReady;
  if (!e->cap || capture_done(*e->cap)) return Status::kSuccess;
  return Status::kNotReady;
}

Status Device::event_elapsed(uint32_t start, uint32_t end, float* ms) {
  if (!ms) return Status::kInvalidValue;
  std::lock_guard lk(mu_);
  Event* a = find_event_locked(start);
  Event* b = find_event_locked(end);
  if (!a || !b) return Status::kInvalidResourceHandle;
  if ((a->flags | b->flags) & kEventDisableTiming) return Status::kInvalidResourceHandle;
  if (!a->cap || !b->cap) return Status::kInvalidResourceHandle;
  if (!capture_done(*a->cap) || !capture_done(*b->cap)) return Status::kNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->cap->time - a->cap->time).count();
  return Status::kSuccess;
}

void Device::event_notify(uint32_t event, std::function<void()> fn) {
  std::shared_ptr<Capture> cap;
  std::shared_ptr<IpcEventCell> cell;
  uint64_t seq = 0;
  {
    std::lock_guard lk(mu_);
    if (Event* e = find_event_locked(event); e && e->ipc) {
      cell = e->ipc;
      seq = cell->shared->recorded.load(std::memory_order_acquire);
    } else if (e && e->cap) {
      cap = e->cap;
      seq = cap->seq;
    }
  }
  if (cell) {
    if (cell->done(seq)) return run_guarded(fn);
    return ipc_notify(std::move(cell), seq, std::move(fn));
  }
  if (!cap || !cap->stream->add_notify(seq, fn)) run_guarded(fn);
}

void Device::stream_notify(uint32_t stream, std::function<void()> fn) {
  std::shared_ptr<Stream> s;
  uint64_t seq = 0;
  {
    std::lock_guard lk(mu_);
    if (stream < kMaxStreams && streams_[stream]) {
      s = streams_[stream];
      seq = s->enqueued;
    }
  }
  if (!s || !s->add_notify(seq, fn)) run_guarded(fn);
}

void Device::host_callback(uint32_t stream, std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    if (Stream* s = find_stream_locked(stream)) {
      push_locked(*s, Op{OpTag{}, HostOp{std::move(fn)}});
      return;
    }
  }
  run_guarded(fn);  // unknown stream: nothing to wait for
}

}  // namespace ordo::sim

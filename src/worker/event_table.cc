#include "event_table.h"

#include <algorithm>
#include <utility>

namespace ordo {

EventTable::EventTable(Backend& backend, bool versioned, uint64_t in_flight)
    : backend_(backend),
      versioned_(versioned),
      in_flight_(in_flight) {}

Status EventTable::create(uint32_t device, uint32_t flags, uint64_t* handle, const IpcBlob* from) {
  uint32_t idx;
  uint64_t h;
  if (!ids_.acquire(&idx, &h)) return Status::kMemoryAllocation;
  if (idx >= events_.size()) events_.resize(idx + 1);
  // An event's first backend event has the event's index as its id.
  const Status made = from ? backend_.ipc_open_event(idx, device, *from) : backend_.event_create(idx, device, flags);
  if (Status st = made; !ok(st)) {
    ids_.release(idx);
    return st;
  }
  Event& ev = events_[idx];
  ev.destroying = false;
  ev.device = uint8_t(device);
  ev.flags = flags;
  ev.records.assign(1, Record{0, idx});
  ++records_;
  ev.spare.clear();
  *handle = h;
  return Status::kSuccess;
}

const EventTable::Event* EventTable::live(uint64_t handle, uint32_t* idx) const {
  return ids_.find(handle, idx) ? &events_[*idx] : nullptr;
}

Status EventTable::find(uint64_t handle, uint32_t* idx) const {
  const Event* ev = live(handle, idx);
  return ev && !ev->destroying ? Status::kSuccess : Status::kInvalidResourceHandle;
}

Status EventTable::find(uint64_t handle, uint64_t number, uint32_t* idx) const {
  const Event* ev = live(handle, idx);
  return ev && !(ev->destroying && number > ev->last) ? Status::kSuccess : Status::kInvalidResourceHandle;
}

const EventTable::Record* EventTable::find_record(const Event& ev, uint64_t number) {
  for (const Record& r : ev.records)
    if (r.number == number) return &r;
  return nullptr;
}

EventTable::Record* EventTable::find_record(Event& ev, uint64_t number) {
  return const_cast<Record*>(find_record(std::as_const(ev), number));
}

EventTable::Record* EventTable::at(Event& ev, uint64_t number) {
  if (Record* r = find_record(ev, number)) return r;
  ++records_;
  Record& r = ev.records.emplace_back(Record{number});
  if (ev.destroying && number == ev.last) {  // the destroy arrived before its last record
    r.closed = true;
    r.expected = ev.last_waits;
  }
  return &r;
}

size_t EventTable::newest(const Event& ev) const {
  size_t best = ev.records.size();
  for (size_t i = 0; i < ev.records.size(); ++i)
    if (ev.records[i].backend != kNone && (best == ev.records.size() || ev.records[i].number > ev.records[best].number))
      best = i;
  return best;
}

void EventTable::drop(uint32_t backend) {
  backend_.event_destroy(backend);  // CUDA keeps work already enqueued on it
  if (backend >= kMaxEvents) free_extra_.push_back(backend);
}

void EventTable::collect(Event& ev) {
  // The newest dispatched record stays: requests that lost a race with a
  // re-record fall back to it, and the next record takes its backend event.
  // An extra backend event goes back to all events at once, so that only
  // records with waits still to come hold extras.
  const size_t keep = newest(ev);
  const uint64_t keep_number = keep < ev.records.size() ? ev.records[keep].number : 0;
  std::erase_if(ev.records, [&](const Record& r) {
    if (r.number == keep_number || !r.done()) return false;
    if (r.backend < kMaxEvents) ev.spare.push_back(r.backend);  // the event's own: at most one
    else drop(r.backend);
    --records_;
    return true;
  });
}

bool EventTable::can_record(Event& ev, uint64_t n, uint64_t waits_before) {
  // Decided before anything changes, so that a record asked again finds the
  // table as it left it (a predecessor closed twice could come back as a record
  // nothing will dispatch).
  if (records_ + 2 > max_records()) return false;
  if (!ev.spare.empty() || !free_extra_.empty() || extra_made_ < max_extra()) return true;
  const size_t k = newest(ev);
  if (k == ev.records.size() || ev.records[k].number >= n) return false;
  const Record& p = ev.records[k];
  return p.done() || (p.number + 1 == n && p.waited >= waits_before);
}

Status EventTable::record(uint32_t idx, uint64_t number, uint64_t waits_before, uint32_t* backend) {
  Event& ev = events_[idx];
  if (!versioned(ev)) {
    *backend = ev.records.front().backend;
    return Status::kSuccess;
  }
  if (Record* r = find_record(ev, number); r && r->backend != kNone) {
    *backend = r->backend;  // a number seen before (only a hostile guest repeats one)
    return Status::kSuccess;
  }
  if (!can_record(ev, number, waits_before)) return Status::kNotReady;
  if (number > 0) {
    Record* prev = at(ev, number - 1);
    prev->closed = true;
    prev->expected = waits_before;
  }
  collect(ev);
  // The common case: the record this one replaces has no wait left to
  // dispatch, and its backend event takes this record (as CUDA re-records in
  // place). The event's own backend event first, so an extra one goes back.
  uint32_t b;
  if (!ev.spare.empty()) {
    b = ev.spare.back();
    ev.spare.pop_back();
  } else if (const size_t k = newest(ev);
             k < ev.records.size() && ev.records[k].number < number && ev.records[k].done()) {
    b = ev.records[k].backend;
    ev.records.erase(ev.records.begin() + ptrdiff_t(k));
    --records_;
  } else {
    if (!free_extra_.empty()) {
      b = free_extra_.back();
      free_extra_.pop_back();
    } else {
      b = kMaxEvents + extra_made_++;  // can_record checked there is one
    }
    if (Status st = backend_.event_create(b, ev.device, ev.flags); !ok(st)) {
      free_extra_.push_back(b);
      return st;
    }
  }
  at(ev, number)->backend = *backend = b;
  return Status::kSuccess;
}

void EventTable::waited(uint32_t idx, uint64_t number) {
  if (!versioned(events_[idx])) return;
  if (Record* r = find_record(events_[idx], number); r && r->backend != kNone) ++r->waited;
}

void EventTable::settle(uint32_t idx) {
  Event& ev = events_[idx];
  if (!ids_.live(idx)) return;
  if (versioned(ev)) collect(ev);
  if (!ev.destroying) return;
  // Once its last record was dispatched, every earlier one not yet dispatched is kept (closed by its successor).
  const Record* last = find_record(ev, ev.last);
  if (!last || last->backend == kNone ||
      !std::all_of(ev.records.begin(), ev.records.end(), [](const Record& r) { return r.done(); }))
    return;
  for (const Record& r : ev.records) drop(r.backend);
  for (uint32_t b : ev.spare) drop(b);
  records_ -= ev.records.size();
  ev.records.clear();
  ev.spare.clear();
  ev.destroying = false;
  ids_.release(idx);
}

uint32_t EventTable::backend_of(uint32_t idx, uint64_t number) const {
  const Event& ev = events_[idx];
  if (const Record* r = find_record(ev, number); r && r->backend != kNone) return r->backend;
  return ev.records[newest(ev)].backend;  // one is always dispatched: record 0 from the create
}

Status EventTable::destroy(uint64_t handle, uint64_t number, uint64_t waits) {
  uint32_t idx;
  if (Status st = find(handle, &idx); !ok(st)) return st;
  Event& ev = events_[idx];
  ev.destroying = true;
  ev.last = versioned(ev) ? number : ev.records.front().number;
  ev.last_waits = versioned(ev) ? waits : 0;  // unversioned, waits are not counted
  if (Record* r = find_record(ev, ev.last)) {  // else closed when it comes (at())
    r->closed = true;
    r->expected = ev.last_waits;
  }
  settle(idx);
  return Status::kSuccess;
}

void EventTable::reset() {
  for (uint32_t i = 0; i < events_.size(); ++i) {
    if (!ids_.live(i)) continue;
    const Event& ev = events_[i];
    for (const Record& r : ev.records)
      if (r.backend != kNone) backend_.event_destroy(r.backend);
    for (uint32_t b : ev.spare) backend_.event_destroy(b);
  }
  events_.clear();
  ids_.reset();  // generations carry on: the last session's handles stay stale
  free_extra_.clear();
  extra_made_ = 0;
  records_ = 0;
}

}  // namespace ordo

// The guest's events as the worker keeps them: handles, and the records behind them.
//
// cudaEventRecord replaces an event's state at once, yet a wait issued on the
// record it replaces keeps that record's meaning. A backend event can hold one
// record, so while the replaced record still has a wait to dispatch (it may be
// held behind a host function the guest has not finished), the new record goes
// to a backend event of its own instead of waiting for it (issue 28). The guest
// numbers an event's records (1, 2, ...; 0 is the state before any): a record
// carries how many waits used the record it replaces, a wait the number of the
// record it refers to. A record whose waits were all dispatched hands its
// backend event to the next one, so a program that re-records after its waits
// ran creates no backend event. cudaEventDestroy is deferred the same way:
// carried out once every record of the event has no wait left to dispatch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend.h"
#include "transport/handle_table.h"
#include "ordo/limits.h"
#include "ordo/status.h"

namespace ordo {

class EventTable {
 public:
  // versioned false (the worker ignores edges): one backend event per event, as
  // CUDA's API has it; records and waits then arrive in any order anyway.
  // `in_flight`: how many entries the guest can have published and not yet
  // dispatched (rings x capacity), which bounds what a correct guest makes the
  // table keep (see limits below).
  EventTable(Backend& backend, bool versioned, uint64_t in_flight);
  EventTable(const EventTable&) = delete;
  EventTable& operator=(const EventTable&) = delete;

  // `from`: an event another worker's backend exported (IpcOpenEvent), opened
  // instead of made.
  Status create(uint32_t device, uint32_t flags, uint64_t* handle, const IpcBlob* from = nullptr);
  // A live event that is not being destroyed (requests: query, synchronize, elapsed, destroy).
  Status find(uint64_t handle, uint32_t* idx) const;
  // The same for a ring's record or wait of record `number`: those issued
  // before the destroy are still to come after it.
  Status find(uint64_t handle, uint64_t number, uint32_t* idx) const;
  uint32_t device(uint32_t idx) const { return events_[idx].device; }
  uint32_t flags(uint32_t idx) const { return events_[idx].flags; }
  // EventRecord: the backend event record `number` goes to; then settle().
  // kNotReady (only a guest that lies about numbers and counts gets there):
  // the table is at its limits; nothing changed, ask again later.
  Status record(uint32_t idx, uint64_t number, uint64_t waits_before, uint32_t* backend);
  // StreamWaitEvent, once handed to the backend (failed or not): counts it; then settle().
  void waited(uint32_t idx, uint64_t number);
  // Backend events nobody can wait for any more go; so does a destroyed event
  // once all its records are done. After the backend call that used one.
  void settle(uint32_t idx);
  // The backend event holding record `number`, or the newest dispatched
  // record's when that one is gone (a request that raced a re-record).
  uint32_t backend_of(uint32_t idx, uint64_t number) const;
  // `number`: the event's last record, `waits`: the waits issued on it.
  Status destroy(uint64_t handle, uint64_t number, uint64_t waits);
  void reset();  // the session ended: every backend event goes

  // Limits, which a correct guest never reaches: a kept record other than an
  // event's newest is either not dispatched or has its successor or a wait on
  // it still to dispatch, one entry in flight each; so with E events the table
  // keeps at most E + 2 x in_flight records, and holds at most E + in_flight
  // backend events beyond each event's own (ids from kMaxEvents on).
  uint64_t max_records() const { return events_.size() + 2 * in_flight_; }
  uint64_t max_extra() const {
    return std::min<uint64_t>(events_.size() + in_flight_, kMaxBackendEvents - kMaxEvents);
  }

 private:
  static constexpr uint32_t kNone = 0xffffffffu;
  struct Record {
    uint64_t number;
    uint32_t backend = kNone;  // its EventRecord was dispatched (record 0: from the create)
    bool closed = false;       // the next record or the destroy said how many waits it has
    uint64_t expected = 0;
    uint64_t waited = 0;
    bool done() const { return backend != kNone && closed && waited >= expected; }
  };
  struct Event {
    bool destroying = false;
    uint8_t device = 0;
    uint32_t flags = 0;
    uint64_t last = 0;             // destroying: the number of the last record
    uint64_t last_waits = 0;       // and the waits issued on it
    std::vector<Record> records;   // unfinished ones, and the newest dispatched
    std::vector<uint32_t> spare;   // the event's own backend event while it holds nothing anyone waits for
  };

  // Whether records of `ev` may go to backend events of their own. An
  // interprocess event has one backend event, which other processes hold too:
  // its records go there in dispatch order (ARCHITECTURE.md, "Sessions").
  bool versioned(const Event& ev) const { return versioned_ && !(ev.flags & kEventInterprocess); }
  const Event* live(uint64_t handle, uint32_t* idx) const;  // a live event's slot (destroying or not)
  static const Record* find_record(const Event& ev, uint64_t number);
  static Record* find_record(Event& ev, uint64_t number);
  Record* at(Event& ev, uint64_t number);  // found or added (the caller checked the limit)
  bool can_record(Event& ev, uint64_t number, uint64_t waits_before);
  size_t newest(const Event& ev) const;     // index of the newest dispatched record
  void collect(Event& ev);                  // done records' backend events to spare
  void drop(uint32_t backend);

  Backend& backend_;
  const bool versioned_;
  HandleTable<32> ids_{kMaxEvents};  // handles: generation << 32 | index
  std::vector<Event> events_;       // by index
  std::vector<uint32_t> free_extra_;
  uint32_t extra_made_ = 0;  // ids kMaxEvents .. kMaxEvents + extra_made_ - 1 were handed out once
  uint64_t records_ = 0;     // kept, over all events
  const uint64_t in_flight_;
};

}  // namespace ordo

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

#include <cstdint>
#include <vector>

#include "backend.h"
#include "ordo/status.h"

namespace ordo {

class EventTable {
 public:
  // versioned false (the worker ignores edges): one backend event per event, as
  // CUDA's API has it; records and waits then arrive in any order anyway.
  EventTable(Backend& backend, bool versioned) : backend_(backend), versioned_(versioned) {}
  EventTable(const EventTable&) = delete;
  EventTable& operator=(const EventTable&) = delete;

  Status create(uint32_t device, uint32_t flags, uint64_t* handle);
  // A live event that is not being destroyed (requests: query, synchronize, elapsed, destroy).
  Status find(uint64_t handle, uint32_t* idx) const;
  // The same for a ring's record or wait of record `number`: those issued
  // before the destroy are still to come after it.
  Status find(uint64_t handle, uint64_t number, uint32_t* idx) const;
  uint32_t device(uint32_t idx) const { return events_[idx].device; }
  // EventRecord: the backend event record `number` goes to; then settle().
  // kNotReady: it needs a backend event of its own while kMaxExtraEvents
  // records hold one because waits on the records they replaced are still to
  // come: the ring waits (as it did before records had their own) until one of
  // those waits was dispatched.
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

  // Backend events beyond one per guest event, for records whose predecessor
  // still has waits to dispatch: ids kMaxEvents .. kMaxBackendEvents - 1.
  static constexpr uint32_t kMaxExtraEvents = kMaxBackendEvents - kMaxEvents;

 private:
  static constexpr uint32_t kNone = 0xffffffffu;
  // A guest can fall this many records behind on one event before its records
  // wait for backend events (bounds what a hostile guest makes us keep).
  static constexpr size_t kMaxRecords = 64;
  static constexpr uint64_t kGenShift = 32;
  struct Record {
    uint64_t number;
    uint32_t backend = kNone;  // its EventRecord was dispatched (record 0: from the create)
    bool closed = false;       // the next record or the destroy said how many waits it has
    uint64_t expected = 0;
    uint64_t waited = 0;
    bool done() const { return backend != kNone && closed && waited >= expected; }
  };
  struct Event {
    uint32_t generation = 1;
    bool live = false;
    bool destroying = false;
    uint8_t device = 0;
    uint32_t flags = 0;
    uint64_t last = 0;             // destroying: the number of the last record
    std::vector<Record> records;   // unfinished ones, and the newest dispatched
    std::vector<uint32_t> spare;   // the event's own backend event while it holds nothing anyone waits for
  };

  Record* at(Event& ev, uint64_t number);  // found or added; null past kMaxRecords
  size_t newest(const Event& ev) const;     // index of the newest dispatched record
  void collect(Event& ev);                  // done records' backend events to spare
  void drop(uint32_t backend);

  Backend& backend_;
  const bool versioned_;
  std::vector<Event> events_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> free_extra_;
  uint32_t extra_made_ = 0;  // ids kMaxEvents .. kMaxEvents + extra_made_ - 1 were handed out once
};

}  // namespace ordo

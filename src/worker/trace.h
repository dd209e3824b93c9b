// A record of what the worker dispatched, written as a Chrome/Perfetto trace
// (open in ui.perfetto.dev or chrome://tracing): one track per ring, a slice per
// call from the moment the worker had it staged to its dispatch (the slice's
// length is the time it waited for its edges), and flow arrows for edges.
// Recording is two clock reads and one append; the JSON is written at exit.
#pragma once

#include <x86intrin.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "ordo/layout.h"

namespace ordo {

class Tracer {
 public:
  explicit Tracer(size_t max_events = 4'000'000)
      : max_(max_events), tsc0_(__rdtsc()), ns0_(std::chrono::steady_clock::now()) {}

  // Timestamps are raw TSC ticks, converted when the trace is written: a clock
  // read can be a system call in a VM, the TSC never is.
  static uint64_t stamp() { return __rdtsc(); }

  // `track`: a ring index, or kMaxRings + slot for sync calls; times from stamp().
  // Every dispatch thread records: a lock, which tracing (a debugging aid) can afford.
  void record(uint32_t track, uint64_t pos, const Entry& e, uint64_t staged_ns, uint64_t done_ns) {
    std::lock_guard lock(mu_);
    if (events_.size() >= max_) {
      ++dropped_;
      return;
    }
    Event ev{track, e.op, e.thread, e.edge_count, pos, staged_ns, done_ns, {}};
    for (unsigned i = 0; i < e.edge_count && i < kMaxEdges; ++i) ev.edges[i] = e.edges[i];
    events_.push_back(ev);  // a deque: growing never copies what is recorded
  }

  size_t size() const { return events_.size(); }
  size_t dropped() const { return dropped_; }
  bool write(const std::string& path, std::string* error) const;

 private:
  struct Event {
    uint32_t track;
    uint16_t op;
    uint32_t thread;
    uint8_t edge_count;
    uint64_t pos, staged_ns, done_ns;
    Edge edges[kMaxEdges];
  };
  std::mutex mu_;
  std::deque<Event> events_;
  size_t max_;
  uint64_t tsc0_;
  std::chrono::steady_clock::time_point ns0_;
  size_t dropped_ = 0;
};

}  // namespace ordo

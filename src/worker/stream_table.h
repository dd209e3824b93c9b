// The session's streams as the worker knows them. Per stream id (the guest's,
// < kMaxStreams): the ring its entries arrive on, since a stream's order is
// that ring's order and nothing else; its device; and the fence mark that says
// whether it got work since its ring's last fence. The table lists the ids it
// ever bound, so that ending a session costs what the session used, not
// kMaxStreams (a session's end is on the fuzzer's every input).
//
// With several dispatch threads, a stream's entries are read by its ring's
// thread while others create and destroy streams: the per-id words are
// atomics (relaxed: a stream's own entries are ordered by its ring, and
// create and destroy by the worker's streams lock), so a guest that names a
// stream on the wrong ring gets an error, never a torn read.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "ordo/layout.h"

namespace ordo {

class StreamTable {
 public:
  static constexpr uint32_t kUnbound = 0xffffffffu;

  StreamTable();  // as a session finds it: device 0's legacy stream on the legacy ring

  bool bound(uint64_t id) const { return id < kMaxStreams && ring(uint32_t(id)) != kUnbound; }
  // Whether `id` is a stream whose entries arrive on `ring`.
  bool on_ring(uint64_t id, uint32_t r) const { return id < kMaxStreams && ring(uint32_t(id)) == r; }
  uint32_t device(uint32_t id) const { return device_[id].load(std::memory_order_relaxed); }  // id bound

  void bind(uint32_t id, uint32_t ring, uint32_t device);
  void unbind(uint32_t id);

  // The fence mark: equal to a ring's fence count + 1 while the stream is on
  // that ring's dirty list. Bound ids only.
  uint32_t mark(uint32_t id) const { return mark_[id].load(std::memory_order_relaxed); }
  void set_mark(uint32_t id, uint32_t mark) { mark_[id].store(mark, std::memory_order_relaxed); }

  // Calls f(id) for every bound stream, legacy streams included.
  template <class F>
  void for_each_bound(F&& f) const {
    for (uint32_t id : listed_)
      if (ring(id) != kUnbound) f(id);
  }
  // Forgets every stream but device 0's legacy stream.
  void reset();

 private:
  uint32_t ring(uint32_t id) const { return ring_[id].load(std::memory_order_relaxed); }

  std::unique_ptr<std::atomic<uint32_t>[]> ring_;
  std::unique_ptr<std::atomic<uint32_t>[]> mark_;
  std::unique_ptr<std::atomic<uint8_t>[]> device_;
  std::vector<uint8_t> is_listed_;  // per id: in listed_
  std::vector<uint32_t> listed_;    // every id bound since the last reset, once
};

}  // namespace ordo

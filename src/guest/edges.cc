#include "guest/edges.h"

namespace ordo::guest {

Edges::Edges(uint32_t ring_count, bool ordered)
    : ring_count_(ring_count),
      ordered_(ordered),
      rings_(new RingOrder[ring_count]),
      destroyed_(new Edge[kMaxStreams]()) {
  for (auto& r : legacy_ring_) r.store(kNoRing, std::memory_order_relaxed);
}

void Edges::legacy_opened(uint32_t device, uint32_t r) {
  legacy_covered_[device].assign(ring_count_, 0);
  legacy_ring_[device].store(r, std::memory_order_release);
}

void Edges::stream_opened(uint32_t r, uint32_t device, bool blocking) {
  rings_[r].on[device].live.fetch_add(1, std::memory_order_release);
  if (blocking) rings_[r].blocking[device].live.fetch_add(1, std::memory_order_release);
}

void Edges::stream_closed(uint32_t r, uint32_t device, bool blocking, uint64_t end) {
  RingOrder& g = rings_[r];
  g.on[device].end.store(end, std::memory_order_release);
  g.on[device].live.fetch_sub(1, std::memory_order_release);
  if (blocking) {
    g.blocking[device].end.store(end, std::memory_order_release);
    g.blocking[device].live.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace ordo::guest

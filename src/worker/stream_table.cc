#include "stream_table.h"

namespace ordo {

StreamTable::StreamTable()
    : ring_(new std::atomic<uint32_t>[kMaxStreams]),
      mark_(new std::atomic<uint32_t>[kMaxStreams]),
      device_(new std::atomic<uint8_t>[kMaxStreams]),
      is_listed_(kMaxStreams, 0) {
  for (uint32_t id = 0; id < kMaxStreams; ++id) {
    ring_[id].store(kUnbound, std::memory_order_relaxed);
    mark_[id].store(0, std::memory_order_relaxed);
    device_[id].store(0, std::memory_order_relaxed);
  }
  bind(kLegacyStreamId, kLegacyRing, 0);
}

void StreamTable::bind(uint32_t id, uint32_t ring, uint32_t device) {
  mark_[id].store(0, std::memory_order_relaxed);
  device_[id].store(uint8_t(device), std::memory_order_relaxed);
  ring_[id].store(ring, std::memory_order_relaxed);
  if (!is_listed_[id]) {
    is_listed_[id] = 1;
    listed_.push_back(id);
  }
}

void StreamTable::unbind(uint32_t id) {
  ring_[id].store(kUnbound, std::memory_order_relaxed);
  mark_[id].store(0, std::memory_order_relaxed);
}

void StreamTable::reset() {
  for (uint32_t id : listed_) {
    unbind(id);
    device_[id].store(0, std::memory_order_relaxed);
    is_listed_[id] = 0;
  }
  listed_.clear();
  bind(kLegacyStreamId, kLegacyRing, 0);
}

}  // namespace ordo

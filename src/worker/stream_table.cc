#include "stream_table.h"

namespace ordo {

StreamTable::StreamTable()
    : ring_(kMaxStreams, kUnbound), mark_(kMaxStreams, 0), device_(kMaxStreams, 0), is_listed_(kMaxStreams, 0) {
  bind(kLegacyStreamId, kLegacyRing, 0);
}

void StreamTable::bind(uint32_t id, uint32_t ring, uint32_t device) {
  ring_[id] = ring;
  mark_[id] = 0;
  device_[id] = uint8_t(device);
  if (!is_listed_[id]) {
    is_listed_[id] = 1;
    listed_.push_back(id);
  }
}

void StreamTable::unbind(uint32_t id) {
  ring_[id] = kUnbound;
  mark_[id] = 0;
}

void StreamTable::reset() {
  for (uint32_t id : listed_) {
    ring_[id] = kUnbound;
    mark_[id] = 0;
    device_[id] = 0;
    is_listed_[id] = 0;
  }
  listed_.clear();
  bind(kLegacyStreamId, kLegacyRing, 0);
}

}  // namespace ordo

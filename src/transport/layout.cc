#include "ordo/layout.h"

namespace ordo {
namespace {

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }
constexpr bool pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

bool plan_layout(uint64_t size, uint32_t ring_count, uint32_t ring_capacity, uint32_t slot_count,
                 uint64_t staging_per_ring, Layout* out) {
  if (!pow2(size) || size < (1u << 20)) return false;
  if (ring_count == 0 || ring_count > kMaxRings) return false;
  if (!pow2(ring_capacity) || ring_capacity < 8 || ring_capacity > (1u << 20)) return false;
  if (slot_count == 0 || slot_count > kMaxSlots) return false;
  if (staging_per_ring < 4096 || staging_per_ring % 4096 != 0) return false;
  // ring_count * staging_per_ring and the offsets below must not wrap around.
  if (staging_per_ring > size / ring_count) return false;

  Layout l{};
  l.region_size = size;
  l.ring_count = ring_count;
  l.ring_capacity = ring_capacity;
  l.slot_count = slot_count;
  l.staging_per_ring = staging_per_ring;
  l.rings_off = kHeaderSize;
  l.entries_off = align_up(l.rings_off + uint64_t{ring_count} * sizeof(RingControl), 4096);
  l.slots_off = align_up(l.entries_off + uint64_t{ring_count} * ring_capacity * sizeof(Entry), 4096);
  l.staging_off = align_up(l.slots_off + uint64_t{slot_count} * sizeof(ReplySlot), 4096);
  l.heap_off = align_up(l.staging_off + uint64_t{ring_count} * staging_per_ring, 4096);
  if (l.heap_off > size) return false;
  l.heap_size = size - l.heap_off;
  *out = l;
  return true;
}

bool plan_default_layout(uint64_t size, Layout* out) {
  const bool big = size >= (32u << 20);
  return plan_layout(size, big ? 64 : 16, big ? 1024 : 256, 64, size / 256 < 4096 ? 4096 : size / 256, out);
}

}  // namespace ordo

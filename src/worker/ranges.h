// Ranges that sit side by side: mapped memory (cuMemMap) may be touched
// across the seam of two adjacent mappings, so the worker's books, the sim and
// the cuda backend each ask whether a range lies in entries that follow one
// another without a gap.
#pragma once

#include <cstdint>

namespace ordo {

// Whether [addr, addr + size) lies in entries of `m` (start address -> entry,
// an ordered map) that follow one another without a gap, starting with the
// one that holds addr, and each passes ok(entry). size_of(entry) is its length.
template <class Map, class SizeOf, class Ok>
bool covered(const Map& m, uint64_t addr, uint64_t size, SizeOf size_of, Ok ok) {
  if (addr + size < addr) return false;
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return false;
  --it;
  if (addr - it->first >= size_of(it->second)) return false;
  for (;;) {
    if (!ok(it->second)) return false;
    const uint64_t end = it->first + size_of(it->second);
    if (end - addr >= size) return true;
    if (++it == m.end() || it->first != end) return false;
  }
}

}  // namespace ordo

// Checks on an entry copied out of shared memory. Pure functions of the copy and
// the worker's own layout, so they can be unit-tested and fuzzed in isolation.
// Checks that need worker state (handles, device pointers, edge positions) are
// in Worker.
#pragma once

#include <cstdint>
#include <string>

#include "ordo/layout.h"
#include "ordo/ops.h"
#include "ordo/status.h"

namespace ordo {

// [off, off + size) lies inside [0, limit), without overflow.
constexpr bool range_ok(uint64_t off, uint64_t size, uint64_t limit) {
  return off <= limit && size <= limit - off;
}

// Op known and allowed on `path`, edge count and rings in range, the thread slot
// in range, memory kinds known, staging and pinned ranges inside their windows.
// On failure returns the status for the guest and says why in `why`.
Status check_entry(const Entry& e, Path path, const Layout& layout, std::string* why);

}  // namespace ordo

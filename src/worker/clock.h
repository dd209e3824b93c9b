// The engine's clock and its single-writer counters, shared by its units.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace ordo {

inline uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// Single-writer counter: no locked instruction on the hot path.
inline void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

}  // namespace ordo

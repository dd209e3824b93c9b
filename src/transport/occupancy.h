// How many blocks of a kernel a multiprocessor holds, and how many threads a
// block of it may have: the occupancy calculator's rules, for the guest's
// cuOccupancy* answers and the sim's kernel attributes alike.
//
// A multiprocessor has 4 sub-partitions, each with a quarter of the register
// file; registers go to warps 256 at a time, and a block's warps are spread
// over the sub-partitions, so a block takes its warps rounded up to 4 from
// the block's register limit. Shared memory goes to blocks 128 bytes at a
// time, each block with the device's reserved bytes on top of its own.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ordo::occupancy {

inline constexpr uint64_t kRegisterUnit = 256;
inline constexpr uint64_t kSubPartitions = 4;
inline constexpr uint64_t kSharedUnit = 128;
inline constexpr uint64_t kDefaultSharedPerBlock = 48 * 1024;  // without an opt-in

struct Limits {
  uint64_t warp_size = 32;
  uint64_t max_threads_per_block = 1024;
  uint64_t max_threads_per_sm = 2048;
  uint64_t max_blocks_per_sm = 32;
  uint64_t regs_per_block = 65536;
  uint64_t regs_per_sm = 65536;
  uint64_t shared_per_sm = 0;
  uint64_t reserved_shared_per_block = 0;
};

inline uint64_t round_up(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

// Registers a warp of `regs`-register threads takes.
inline uint64_t regs_per_warp(uint64_t regs, const Limits& l) { return round_up(regs * l.warp_size, kRegisterUnit); }

// The most threads a block may have: the device's, the launch bound's
// (`bound`, 0 for none), and what the register file allows, in 4-warp steps.
inline uint64_t max_threads_per_block(uint64_t regs, uint64_t bound, const Limits& l) {
  uint64_t n = l.max_threads_per_block;
  if (bound) n = std::min(n, bound);
  if (regs) n = std::min(n, l.regs_per_block / (regs_per_warp(regs, l) * kSubPartitions) * kSubPartitions * l.warp_size);
  return n;
}

// Blocks of `threads` threads per multiprocessor, each using `regs`
// registers per thread and `shared` bytes of shared memory (static and
// dynamic); 0 when one block does not fit. The caller checks `shared`
// against what the kernel allows per block.
inline uint64_t blocks_per_sm(uint64_t threads, uint64_t regs, uint64_t shared, const Limits& l) {
  if (!threads || threads > l.max_threads_per_block) return 0;
  const uint64_t warps = (threads + l.warp_size - 1) / l.warp_size;
  uint64_t n = std::min(l.max_threads_per_sm / l.warp_size / warps, l.max_blocks_per_sm);
  if (regs) {
    const uint64_t per_warp = regs_per_warp(regs, l);
    if (per_warp * round_up(warps, kSubPartitions) > l.regs_per_block) return 0;
    const uint64_t warps_by_regs = l.regs_per_sm / kSubPartitions / per_warp * kSubPartitions;
    n = std::min(n, warps_by_regs / warps);
  }
  const uint64_t per_block = round_up(shared + l.reserved_shared_per_block, kSharedUnit);
  if (per_block) n = std::min(n, l.shared_per_sm / per_block);
  return n;
}

}  // namespace ordo::occupancy

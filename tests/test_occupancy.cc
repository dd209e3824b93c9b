// The occupancy calculator's rules (src/transport/occupancy.h), on an H100's
// limits, against numbers NVIDIA's own calculator (cuda_occupancy.h) gives.
#include <gtest/gtest.h>

#include "transport/occupancy.h"

namespace ordo::occupancy {
namespace {

Limits h100() {
  Limits l;
  l.warp_size = 32;
  l.max_threads_per_block = 1024;
  l.max_threads_per_sm = 2048;
  l.max_blocks_per_sm = 32;
  l.regs_per_block = 65536;
  l.regs_per_sm = 65536;
  l.shared_per_sm = 228 * 1024;
  l.reserved_shared_per_block = 1024;
  return l;
}

TEST(Occupancy, RegistersGoToSubPartitions) {
  const Limits l = h100();
  EXPECT_EQ(blocks_per_sm(96, 40, 0, l), 16u);
  EXPECT_EQ(blocks_per_sm(160, 40, 0, l), 9u);
  EXPECT_EQ(blocks_per_sm(800, 80, 0, l), 0u) << "28 warps' registers exceed a block's";
  EXPECT_EQ(blocks_per_sm(256, 32, 0, l), 8u);
  EXPECT_EQ(blocks_per_sm(128, 0, 0, l), 16u) << "threads alone";
  EXPECT_EQ(blocks_per_sm(32, 0, 0, l), 32u) << "blocks alone";
  EXPECT_EQ(blocks_per_sm(2048, 0, 0, l), 0u) << "past the block limit";
}

TEST(Occupancy, SharedMemoryCountsTheReservedBytes) {
  const Limits l = h100();
  // Its bytes and the 1 KiB reserved per block, in 128-byte steps: 20096 + 1024
  // is 165 steps, 11 blocks in 228 KiB; one byte more is a step more, 10 blocks.
  EXPECT_EQ(blocks_per_sm(64, 0, 20096, l), 11u);
  EXPECT_EQ(blocks_per_sm(64, 0, 20097, l), 10u);
  EXPECT_EQ(blocks_per_sm(64, 0, 0, l), 32u) << "the reserved bytes alone bind nothing";
  EXPECT_EQ(blocks_per_sm(128, 0, 227 * 1024, l), 1u);
  EXPECT_EQ(blocks_per_sm(128, 0, 228 * 1024, l), 0u);
}

TEST(Occupancy, ThreadsPerBlockInFourWarpSteps) {
  const Limits l = h100();
  EXPECT_EQ(max_threads_per_block(80, 0, l), 768u);
  EXPECT_EQ(max_threads_per_block(96, 0, l), 640u);
  EXPECT_EQ(max_threads_per_block(46, 0, l), 1024u);
  EXPECT_EQ(max_threads_per_block(46, 128, l), 128u);
  EXPECT_EQ(max_threads_per_block(0, 0, l), 1024u);
  EXPECT_EQ(max_threads_per_block(255, 0, l), 256u);
}

}  // namespace
}  // namespace ordo::occupancy

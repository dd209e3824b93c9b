// A launch's cluster shape and whether it is cooperative: what of cuLaunchKernelEx's
// attributes changes how the device runs a kernel (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
// CU_LAUNCH_ATTRIBUTE_COOPERATIVE). The rest only permit or prefer (launch.cc), so
// stream order kept in full honours them. 13 bits, in a Launch entry's flags and a
// graph KernelStep's flags, so that a plain launch still fits one cache line:
//   bits 0-3, 4-7, 8-11: cluster x-1, y-1, z-1     bit 12: cooperative
#pragma once

#include <cstdint>

#include "ordo/device_info.h"
#include "ordo/status.h"

namespace ordo {

// CUDA's largest cluster: 8 blocks portably, 16 where the kernel allows a
// non-portable size (Hopper).
inline constexpr uint32_t kMaxPortableClusterBlocks = 8;
inline constexpr uint32_t kMaxClusterBlocks = 16;

struct LaunchShape {
  Dim3 cluster;  // 1x1x1: no cluster
  bool cooperative = false;

  bool plain() const { return cluster.x == 1 && cluster.y == 1 && cluster.z == 1 && !cooperative; }
  uint32_t blocks_per_cluster() const { return cluster.x * cluster.y * cluster.z; }

  // Only for a shape that passed check_cluster (each dimension 1..16).
  uint16_t flags() const {
    return uint16_t((cluster.x - 1) | (cluster.y - 1) << 4 | (cluster.z - 1) << 8 | uint32_t(cooperative) << 12);
  }
  // False when `flags` has bits no shape sets (they come from the guest).
  static bool decode(uint32_t flags, LaunchShape* out) {
    if (flags >> 13) return false;
    out->cluster = {(flags & 15) + 1, (flags >> 4 & 15) + 1, (flags >> 8 & 15) + 1};
    out->cooperative = flags >> 12 & 1;
    return true;
  }
};

// CUDA's answer to a cluster shape for `grid`, whoever asks (the guest before
// it sends a launch, the worker before it runs one): each dimension at least 1
// and dividing the grid's, at most kMaxClusterBlocks blocks in all.
inline Status check_cluster(Dim3 grid, Dim3 cluster) {
  const Dim3& c = cluster;
  if (!c.x || !c.y || !c.z || uint64_t{c.x} * c.y * c.z > kMaxClusterBlocks) return Status::kInvalidClusterSize;
  if (grid.x % c.x || grid.y % c.y || grid.z % c.z) return Status::kInvalidClusterSize;
  return Status::kSuccess;
}

}  // namespace ordo

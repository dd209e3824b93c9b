#include "guest/staging.h"

#include <algorithm>

#include "guest/pinned_heap.h"
#include "guest/ring_producer.h"
#include "guest/session.h"

namespace ordo::guest {

bool Staging::alloc(ThreadState& t, Ring& g, uint64_t size, uint64_t* offset) {
  StagingWindow& w = g.staging;
  size = align16(size);
  if (size > w.size() / 2) return false;
  while (!w.try_alloc(size, offset)) {
    // Full: staging comes back as entries complete, which we learn at fences.
    if (g.fence_end < g.writer.tail()) producer_.push_fence(t, g);
    if (!ok(session_.wait_completed(g.index, w.returns_at(g.fence_end)))) return false;
  }
  return true;
}

void Staging::release_after(ThreadState& t, Ring& g, uint64_t pos) {
  g.staging.release_at(pos);
  if (g.staging.since_fence() > g.staging.size() / 4) producer_.push_fence(t, g);
}

// Pageable copies move through staging in chunks: a quarter of the copy, at
// least 64 KiB (a chunk costs an entry and, for D2H, a fence) and at most a
// quarter of the ring's window, so that up to four are in flight.
uint64_t Staging::chunk(uint64_t size) const {
  const uint64_t w = session_.layout().staging_per_ring;
  // The window's quarter wins over the 64 KiB floor (a small region's window is 4 KiB).
  return std::min<uint64_t>(std::max<uint64_t>((size / 4 + 4095) & ~uint64_t{4095}, 64 << 10), w / 4);
}

unsigned StagingPool::blocks(uint64_t size, uint64_t* chunk, std::byte** blocks) {
  if (size < kCopyMin) return 0;
  *chunk = std::clamp<uint64_t>((size / kBlocks + 4095) & ~uint64_t{4095}, kChunkMin, kChunkMax);
  const unsigned want = unsigned(std::min<uint64_t>(kBlocks, (size + *chunk - 1) / *chunk));
  reclaim(false);
  unsigned n = 0;
  for (; n < want; ++n)
    if (!(blocks[n] = static_cast<std::byte*>(heap_.alloc(*chunk)))) break;
  // One block would serialize the guest's copy with the device's: the window does as well.
  if (n == 1) heap_.free(blocks[--n]);
  return n;
}

bool StagingPool::reclaim(bool wait) {
  std::vector<Pending> done;
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < pending_.size();) {
      const Pending& b = pending_[i];
      if (wait) session_.wait_completed(b.ring, b.fence);  // its fence is pushed: needs nothing more from the guest
      if (session_.completed(b.ring) >= b.fence || session_.lost()) {
        done.push_back(b);
        pending_[i] = pending_.back();
        pending_.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (const Pending& b : done) heap_.free(b.block);
  return !done.empty();
}

void StagingPool::release(uint32_t r, uint64_t fence, std::byte* block) {
  if (session_.completed(r) >= fence) return heap_.free(block);
  std::lock_guard lock(mu_);
  pending_.push_back({r, fence, block});
}

}  // namespace ordo::guest

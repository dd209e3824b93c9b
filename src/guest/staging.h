// Staging: where pageable copies and launch arguments pass through shared
// memory. Each ring has a window in the region, a byte FIFO released in ring
// order as entries complete; large pageable copies use blocks of the pinned
// heap instead (the pool).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "ordo/status.h"

namespace ordo::guest {

class PinnedHeap;
class RingProducer;
class Session;
struct Ring;
struct ThreadState;

constexpr uint64_t align16(uint64_t v) { return (v + 15) & ~uint64_t{15}; }

// A ring's staging window, under the ring's lock. Bytes are handed out at the
// tail and come back at the head once the entry that used them completed.
class StagingWindow {
 public:
  StagingWindow() = default;
  StagingWindow(std::byte* base, uint64_t size, const std::atomic<uint64_t>* completed)
      : base_(base), size_(size), completed_(completed) {}

  std::byte* at(uint64_t offset) const { return base_ + offset; }
  uint64_t size() const { return size_; }
  uint64_t tail() const { return tail_; }
  // `size` (16-aligned) bytes at *offset, without waiting; false: full.
  bool try_alloc(uint64_t size, uint64_t* offset) {
    reclaim();
    const uint64_t cur = tail_ % size_;
    const uint64_t skip = cur + size > size_ ? size_ - cur : 0;
    if (tail_ + skip + size - head_ > size_) return false;
    tail_ += skip;
    *offset = tail_ % size_;
    tail_ += size;
    return true;
  }
  // Everything handed out up to `end` (a tail()) comes back once the entry at `pos` completed.
  void release_at(uint64_t pos, uint64_t end) { marks_.push_back({pos, end}); }
  void release_at(uint64_t pos) { release_at(pos, tail_); }
  // The position whose completion gives bytes back next: the oldest mark's
  // entry, else `fence_end` (staging comes back as entries complete, which we learn at fences).
  uint64_t returns_at(uint64_t fence_end) const { return marks_.empty() ? fence_end : marks_.front().first + 1; }
  // Bytes handed out since the last fence.
  uint64_t since_fence() const { return tail_ - fenced_; }
  void fenced() { fenced_ = tail_; }

 private:
  void reclaim() {
    const uint64_t done = completed_->load(std::memory_order_acquire);
    while (!marks_.empty() && marks_.front().first < done) {
      head_ = marks_.front().second;
      marks_.pop_front();
    }
  }

  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  const std::atomic<uint64_t>* completed_ = nullptr;  // the ring's
  uint64_t head_ = 0, tail_ = 0, fenced_ = 0;
  std::deque<std::pair<uint64_t, uint64_t>> marks_;  // (position, tail after it)
};

// The windows' waiting side: what needs a fence or the worker.
class Staging {
 public:
  Staging(Session& session, RingProducer& producer) : session_(session), producer_(producer) {}
  // `size` bytes of g's window at *offset, waiting (after a fence) while it
  // is full; false: more than half the window, or the session is lost.
  // Caller holds g's lock.
  bool alloc(ThreadState& t, Ring& g, uint64_t size, uint64_t* offset);
  // What g's window handed out so far comes back once the entry at `pos`
  // completed; a fence every quarter window lets the guest learn when.
  void release_after(ThreadState& t, Ring& g, uint64_t pos);
  // Pageable copies move through the window in chunks of this size.
  uint64_t chunk(uint64_t size) const;

 private:
  Session& session_;
  RingProducer& producer_;
};

// ---- the staging pool ------------------------------------------------------
//
// Large pageable copies stage through blocks of the pinned heap instead of
// the ring's fixed window (64 KiB chunks at a 64 MiB region): a copy of
// megabytes moves in chunks of up to kPoolChunkMax, and streams that copy
// nothing hold none. Larger chunks measured slower (less overlap, out of
// cache). A block an unfinished H2D copy still reads is freed once its ring
// completed past the block's fence (reclaim).
class StagingPool {
 public:
  static constexpr uint64_t kCopyMin = uint64_t{1} << 20;
  static constexpr uint64_t kChunkMin = uint64_t{256} << 10;
  static constexpr uint64_t kChunkMax = uint64_t{1} << 20;
  static constexpr unsigned kBlocks = 8;  // chunks in flight per copy

  StagingPool(Session& session, PinnedHeap& heap) : session_(session), heap_(heap) {}
  // Up to kBlocks pinned-heap blocks of *chunk bytes each for a pageable
  // copy of `size` (0: too small for the pool, or the heap is short: use the
  // ring's window).
  unsigned blocks(uint64_t size, uint64_t* chunk, std::byte** blocks);
  // Frees `block` once ring r completed `fence` (at once if it has).
  void release(uint32_t r, uint64_t fence, std::byte* block);
  // Frees the blocks whose copies completed (waiting for them first if
  // `wait`); true if any was freed.
  bool reclaim(bool wait);

 private:
  struct Pending {
    uint32_t ring;
    uint64_t fence;
    std::byte* block;
  };
  Session& session_;
  PinnedHeap& heap_;
  std::mutex mu_;
  std::vector<Pending> pending_;  // blocks an unfinished H2D copy still reads
};

}  // namespace ordo::guest

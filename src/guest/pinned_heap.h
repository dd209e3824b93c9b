// The pinned heap: the region's memory that cudaMallocHost hands out. The
// worker reads and writes it directly, so copies from and to it are
// zero-copy; the allocator's metadata lives in the heap and the worker never
// reads it.
#pragma once

#include <boost/interprocess/interprocess_fwd.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

namespace ordo::guest {

class PinnedHeap {
 public:
  // An empty heap (under 4 KiB) hands out nothing.
  PinnedHeap(std::byte* base, uint64_t size);
  ~PinnedHeap();
  PinnedHeap(const PinnedHeap&) = delete;
  PinnedHeap& operator=(const PinnedHeap&) = delete;

  void* alloc(uint64_t size);  // 64-byte aligned; null when full
  void free(void* p);
  // Whether [p, p + size) lies inside the heap.
  bool contains(const void* p, uint64_t size) const {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= base_ && uint64_t(b - base_) <= size_ && size <= size_ - uint64_t(b - base_);
  }
  uint64_t size() const { return size_; }
  // What an entry names a heap pointer by.
  uint64_t offset(const void* p) const { return uint64_t(static_cast<const std::byte*>(p) - base_); }

 private:
  std::byte* const base_;
  const uint64_t size_;
  std::mutex mu_;
  std::unique_ptr<boost::interprocess::managed_external_buffer> buf_;
};

}  // namespace ordo::guest

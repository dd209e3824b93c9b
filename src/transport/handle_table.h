// Generation-tagged handles, the one way both sides number what a program
// creates and destroys: the guest its streams, the worker its events, the
// cuda backend its kernels. A handle is a slot index (low kIndexBits) and
// the slot's generation above it; destroying bumps the generation, so a
// handle used after its object was destroyed fails instead of naming
// whatever reuses the slot. Freed slots are reused oldest first, which makes
// a stale handle meet its slot's next owner as late as possible.
//
// Each slot is one word, generation << 1 | live, accessed with atomic_ref: a
// table made `eager` (every slot allocated up front, so the words never move)
// can be looked up by any thread while one thread at a time, under the
// owner's lock, acquires and releases; acquire() publishes the slot after the
// owner's `init`, so a lookup that finds it live sees what init wrote. A lazy
// table grows on demand and is for one thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <type_traits>
#include <vector>

namespace ordo {

template <unsigned kIndexBits, unsigned kHandleBits = 64>
class HandleTable {
  static_assert(kIndexBits < kHandleBits && kHandleBits <= 64);

 public:
  using Handle = std::conditional_t<kHandleBits <= 32, uint32_t, uint64_t>;
  // 31 at most: the slot word keeps the live bit beside it.
  static constexpr unsigned kGenBits = std::min(kHandleBits - kIndexBits, 31u);
  static constexpr uint32_t kGenMask = uint32_t((uint64_t{1} << kGenBits) - 1);
  static constexpr uint64_t kMaxCapacity = uint64_t{1} << kIndexBits;

  // Slots [first, capacity): those below `first` are the owner's to manage.
  explicit HandleTable(uint64_t capacity, uint32_t first = 0, bool eager = false)
      : capacity_(uint32_t(std::min<uint64_t>(capacity, kMaxCapacity))), first_(first) {
    if (eager) {
      words_.assign(capacity_, kFirstGen << 1);
      for (uint32_t i = first_; i < capacity_; ++i) free_.push_back(i);
    } else {
      words_.assign(first_, kFirstGen << 1);
    }
  }

  static uint32_t index_of(Handle h) { return uint32_t(h & (kMaxCapacity - 1)); }
  static uint32_t generation_of(Handle h) { return uint32_t(h >> kIndexBits) & kGenMask; }

  bool full() const { return free_.empty() && words_.size() >= capacity_; }

  // A free slot made live, and its handle; false when every slot is in use.
  // `init(index)` runs before the slot is published.
  template <class Init = void (*)(uint32_t)>
  bool acquire(uint32_t* index, Handle* handle, Init&& init = [](uint32_t) {}) {
    uint32_t i;
    if (!free_.empty()) {
      i = free_.front();
      free_.pop_front();
    } else if (words_.size() < capacity_) {
      i = uint32_t(words_.size());
      words_.push_back(kFirstGen << 1);
    } else {
      return false;
    }
    init(i);
    word(i).store(word(i).load(std::memory_order_relaxed) | 1, std::memory_order_release);
    *index = i;
    *handle = handle_of(i);
    return true;
  }

  // The slot of a live handle; false for one never given, or released since.
  bool find(Handle h, uint32_t* index) const {
    const uint32_t i = index_of(h);
    if (i >= size() || word(i).load(std::memory_order_acquire) != (generation_of(h) << 1 | 1)) return false;
    *index = i;
    return true;
  }
  // The same for a handle kept as its two halves (the guest's Stream).
  bool find(uint32_t index, uint32_t generation) const {
    return index < size() && word(index).load(std::memory_order_acquire) == ((generation & kGenMask) << 1 | 1);
  }

  // Slots below `first`: made live by their owner, released like any other.
  void open(uint32_t index) {
    word(index).store(word(index).load(std::memory_order_relaxed) | 1, std::memory_order_release);
  }

  bool live(uint32_t index) const { return index < size() && (word(index).load(std::memory_order_acquire) & 1); }
  // The current handle of slot `index`.
  Handle handle_of(uint32_t index) const {
    return Handle(uint64_t(generation(index)) << kIndexBits | index);
  }
  uint32_t generation(uint32_t index) const { return word(index).load(std::memory_order_relaxed) >> 1; }

  // Ends a live slot's handle; its next owner gets the next generation.
  void release(uint32_t index) {
    if (!live(index)) return;
    uint32_t gen = (generation(index) + 1) & kGenMask;
    if (gen == 0) gen = kFirstGen;
    word(index).store(gen << 1, std::memory_order_release);
    if (index >= first_) free_.push_back(index);
  }

  // Every slot free; generations carry on, so handles of before stay stale.
  void reset() {
    for (uint32_t i = first_; i < size(); ++i) release(i);
  }

 private:
  // Generation 0 is never handed out: a zeroed handle is never live.
  static constexpr uint32_t kFirstGen = 1;

  uint32_t size() const { return uint32_t(words_.size()); }
  std::atomic_ref<uint32_t> word(uint32_t i) const { return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(words_[i])); }

  const uint32_t capacity_;
  const uint32_t first_;
  std::vector<uint32_t> words_;  // generation << 1 | live
  std::deque<uint32_t> free_;
};

}  // namespace ordo

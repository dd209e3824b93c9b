// One stream ring of the region, both ends: the guest's writer and the
// worker's reader of a single-producer single-consumer ring of Entry.
//
// The ring has no tail index: an entry says itself that it is published. Its
// first 8 bytes (op, flags, edge_count, lap) are stored last, in one release
// store, and `lap` then names the lap of the ring its position is on. The slot
// holds the lap before until then (0 before the first: the worker zeroes the
// words when a session attaches), so the reader polls the slot at its head and
// finds the entry and the news of it on one line: a launch hands the worker's
// core one line, not an entry line and an index line. The reader's head goes
// back to the writer through RingControl::head, which the reader never reads
// back (a hostile guest cannot make the worker trust a forged one).
//
// Guest threads serialize on the ring's guest-private mutex, so one writer
// writes at a time; the worker's one dispatch thread is the reader.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>

#include "ordo/layout.h"

namespace ordo {

inline constexpr size_t kRingEntryShift = 7;  // log2(sizeof(Entry))
static_assert(sizeof(Entry) == size_t{1} << kRingEntryShift);

// The lap of position `pos` in a ring of `capacity` entries (never 0).
constexpr uint8_t entry_lap(uint64_t pos, uint32_t capacity) {
  return uint8_t((pos >> std::countr_zero(capacity)) + 1);
}

inline std::atomic_ref<uint64_t> entry_word(Entry* slot) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(slot));
}

static_assert(std::endian::native == std::endian::little, "entry words are read as x86 stores them");
constexpr uint8_t word_lap(uint64_t word) { return uint8_t(word >> (8 * offsetof(Entry, lap))); }
constexpr uint64_t with_lap(uint64_t word, uint8_t lap) {
  return (word & ~(uint64_t{0xff} << (8 * offsetof(Entry, lap)))) | uint64_t{lap} << (8 * offsetof(Entry, lap));
}

// Publishes the entry whose other bytes are written in `slot`: `word` is its
// first 8 bytes, with the lap of its position (with_lap).
inline void publish_word(Entry* slot, uint64_t word) {
  // On a write-combined BAR mapping the release store alone does not order the
  // entry's other stores before it: the fence does.
  _mm_sfence();
  entry_word(slot).store(word, std::memory_order_release);
}

// Writes `e` into `slot` as the entry at `pos` of a ring of `capacity` entries.
inline void publish_entry(Entry* slot, const Entry& e, uint64_t pos, uint32_t capacity) {
  // Fixed sizes: a memcpy of a size known only at run time is a `rep movs`.
  std::memcpy(reinterpret_cast<char*>(slot) + 8, reinterpret_cast<const char*>(&e) + 8, kCacheLine - 8);
  if (e.edge_count) std::memcpy(slot->edges, e.edges, sizeof e.edges);
  uint64_t word;
  std::memcpy(&word, &e, sizeof word);
  publish_word(slot, with_lap(word, entry_lap(pos, capacity)));
}

class RingWriter {
 public:
  RingWriter() = default;
  // Starts at the reader's head (a ring the session has not used starts at 0).
  RingWriter(Entry* slots, uint32_t capacity, const RingControl* control)
      : slots_(slots),
        capacity_(capacity),
        control_(control),
        tail_(control->head.load(std::memory_order_acquire)),
        head_cache_(tail_) {}

  uint64_t tail() const { return tail_; }  // the next position to write == entries published
  // The slot of position tail(), or null while the reader is a whole ring
  // behind: then wait for head() to reach room_at() and claim again.
  [[gnu::always_inline]] Entry* claim() {
    if (tail_ - head_cache_ >= capacity_) [[unlikely]] {
      head_cache_ = control_->head.load(std::memory_order_acquire);
      if (tail_ - head_cache_ >= capacity_) return nullptr;
    }
    return &slots_[tail_ & (capacity_ - 1)];
  }
  const std::atomic<uint64_t>& head() const { return control_->head; }
  uint64_t room_at() const { return tail_ - capacity_ + 1; }
  // Writes `e` into the claimed slot and publishes it at tail(); returns its position.
  [[gnu::always_inline]] uint64_t publish(Entry* slot, const Entry& e) {
    publish_entry(slot, e, tail_, capacity_);
    return tail_++;
  }
  // Publishes the claimed slot, whose other bytes were written in place:
  // `word` is its first 8 bytes (its lap is set here).
  [[gnu::always_inline]] uint64_t publish_in_place(Entry* slot, uint64_t word) {
    publish_word(slot, with_lap(word, entry_lap(tail_, capacity_)));
    return tail_++;
  }

 private:
  Entry* slots_ = nullptr;
  uint32_t capacity_ = 1;
  const RingControl* control_ = nullptr;
  uint64_t tail_ = 0;
  uint64_t head_cache_ = 0;  // the reader's head as last read
};

class RingReader {
 public:
  RingReader() = default;
  // A session starts every ring at position 0 (see reset()).
  RingReader(Entry* slots, uint32_t capacity, RingControl* control)
      : slots_(slots), capacity_(capacity), control_(control) {}

  // Whether the entry at `pos` is published; `word` gets its first 8 bytes.
  bool published(uint64_t pos, uint64_t* word) const {
    *word = entry_word(slot(pos)).load(std::memory_order_acquire);
    return word_lap(*word) == entry_lap(pos, capacity_);
  }
  // Copies the published entry at `pos` out, whose first 8 bytes `published`
  // read: once, so that only the copy is validated and used (no double fetch).
  // The edges' line only when the copied count says there are edges: the
  // writer writes it only then.
  void copy(uint64_t pos, uint64_t word, Entry* out) const {
    const Entry* s = slot(pos);
    std::memcpy(out, s, kCacheLine);
    std::memcpy(out, &word, sizeof word);
    if (out->edge_count) std::memcpy(out->edges, s->edges, sizeof out->edges);
  }
  // Tells the writer that every entry before `head` was consumed.
  void release(uint64_t head) {
    if (head == released_) return;
    released_ = head;
    control_->head.store(head, std::memory_order_release);
  }
  // A new session: positions start again at 0, whose lap no slot may show yet.
  // Only while no writer uses the ring.
  void reset() {
    control_->head.store(0, std::memory_order_relaxed);
    control_->completed.store(0, std::memory_order_relaxed);
    for (uint32_t i = 0; i < capacity_; ++i) entry_word(&slots_[i]).store(0, std::memory_order_relaxed);
    released_ = 0;
  }

 private:
  Entry* slot(uint64_t pos) const { return &slots_[pos & (capacity_ - 1)]; }
  Entry* slots_ = nullptr;
  uint32_t capacity_ = 1;
  RingControl* control_ = nullptr;
  uint64_t released_ = 0;  // head as last stored
};

}  // namespace ordo

// The ring protocol alone (src/transport/ring.h): a writer and a reader over
// plain memory, no Client, no Worker.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/ring.h"

namespace ordo::test {
namespace {

struct Ring {
  explicit Ring(uint32_t capacity) : capacity(capacity), slots(capacity) {
    control.head.store(0);
    control.completed.store(0);
    reader = RingReader(slots.data(), capacity, &control);
    reader.reset();
    writer = RingWriter(slots.data(), capacity, &control);
  }
  uint32_t capacity;
  std::vector<Entry> slots;
  RingControl control;
  RingWriter writer;
  RingReader reader;
};

Entry numbered(uint64_t n) {
  Entry e{};
  e.op = uint16_t(1 + n % 7);
  e.thread = uint32_t(n);
  e.arg[0] = n;
  e.arg[5] = ~n;
  e.edge_count = uint8_t(n % (kMaxEdges + 1));
  for (unsigned k = 0; k < e.edge_count; ++k) e.edges[k] = {uint32_t(k), 0, n + k};
  return e;
}

// Every entry arrives once, whole, in order, across many laps of a small ring
// whose writer keeps finding it full (run under TSan too).
TEST(Ring, TwoThreadsPassEveryEntryInOrder) {
  constexpr uint64_t kCount = 100000;
  Ring ring(8);
  std::thread writer([&] {
    for (uint64_t n = 0; n < kCount; ++n) {
      Entry* slot;
      while (!(slot = ring.writer.claim())) {
        // Full: what the guest waits for.
        while (ring.writer.head().load(std::memory_order_acquire) < ring.writer.room_at()) std::this_thread::yield();
      }
      EXPECT_EQ(ring.writer.publish(slot, numbered(n)), n);
    }
  });
  uint64_t head = 0;
  Entry e;
  while (head < kCount) {
    uint64_t word;
    if (!ring.reader.published(head, &word)) {
      std::this_thread::yield();
      continue;
    }
    ring.reader.copy(head, word, &e);
    const Entry want = numbered(head);
    ASSERT_EQ(e.op, want.op) << head;
    ASSERT_EQ(e.arg[0], head);
    ASSERT_EQ(e.arg[5], ~head);
    ASSERT_EQ(e.thread, want.thread);
    ASSERT_EQ(e.edge_count, want.edge_count);
    for (unsigned k = 0; k < e.edge_count; ++k) ASSERT_EQ(e.edges[k].pos, want.edges[k].pos);
    ASSERT_EQ(e.lap, entry_lap(head, ring.capacity));
    ++head;
    if (head % 3 == 0 || head == kCount) ring.reader.release(head);
  }
  writer.join();
  EXPECT_EQ(ring.control.head.load(), kCount);
}

// A reader that stops holds the writer at exactly one ring of entries, and
// one released entry makes exactly one slot.
TEST(Ring, AHeldReaderHoldsTheWriterAtOneRing) {
  Ring ring(4);
  for (uint64_t n = 0; n < 4; ++n) {
    Entry* slot = ring.writer.claim();
    ASSERT_NE(slot, nullptr);
    ring.writer.publish(slot, numbered(n));
  }
  EXPECT_EQ(ring.writer.claim(), nullptr);
  EXPECT_EQ(ring.writer.room_at(), 1u);
  uint64_t word;
  ASSERT_TRUE(ring.reader.published(0, &word));
  ring.reader.release(1);
  Entry* slot = ring.writer.claim();
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(slot, &ring.slots[0]);
  ring.writer.publish(slot, numbered(4));
  EXPECT_EQ(ring.writer.claim(), nullptr);
  // Position 4 is published in slot 0; position 0's lap is gone from it.
  EXPECT_TRUE(ring.reader.published(4, &word));
  EXPECT_FALSE(ring.reader.published(0, &word));
  EXPECT_FALSE(ring.reader.published(8, &word)) << "a lap ahead is not published";
}

// An entry written in place (a launch's fields) is published by its word alone.
TEST(Ring, InPlaceEntriesArePublishedByTheirWord) {
  Ring ring(2);
  uint64_t word;
  for (uint64_t n = 0; n < 5; ++n) {
    Entry* slot = ring.writer.claim();
    ASSERT_NE(slot, nullptr);
    EXPECT_FALSE(ring.reader.published(n, &word));
    slot->arg[0] = n;
    EXPECT_EQ(ring.writer.publish_in_place(slot, 3), n);
    ASSERT_TRUE(ring.reader.published(n, &word));
    Entry e;
    ring.reader.copy(n, word, &e);
    EXPECT_EQ(e.op, 3);
    EXPECT_EQ(e.arg[0], n);
    ring.reader.release(n + 1);
  }
}

// A new session starts every ring at position 0 with no lap showing, and a
// writer made then starts at 0; the reader's head is stored once per change.
TEST(Ring, ResetStartsAgainAtZero) {
  Ring ring(4);
  for (uint64_t n = 0; n < 6; ++n) {
    Entry* slot = ring.writer.claim();
    if (!slot) {
      ring.reader.release(n);
      slot = ring.writer.claim();
    }
    ring.writer.publish(slot, numbered(n));
  }
  ring.reader.reset();
  uint64_t word;
  for (uint64_t n = 0; n < 8; ++n) EXPECT_FALSE(ring.reader.published(n, &word)) << n;
  EXPECT_EQ(ring.control.head.load(), 0u);
  ring.writer = RingWriter(ring.slots.data(), ring.capacity, &ring.control);
  EXPECT_EQ(ring.writer.tail(), 0u);
  ring.control.head.store(77);  // a forged head: the reader never reads it back
  ring.reader.release(0);
  EXPECT_EQ(ring.control.head.load(), 77u);
  ring.reader.release(1);
  EXPECT_EQ(ring.control.head.load(), 1u);
}

}  // namespace
}  // namespace ordo::test

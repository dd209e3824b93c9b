// The reply slot protocol alone (src/transport/reply_slot.h): a caller and a
// server over plain memory, no Client, no Worker.
#include <atomic>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "transport/reply_slot.h"

namespace ordo::test {
namespace {

Entry request(uint64_t n) {
  Entry e{};
  e.op = uint16_t(1 + n % 5);
  e.flags = uint16_t(n);
  e.thread = 12345;  // not carried: the slot is the thread
  e.stream = 678;
  for (unsigned k = 0; k < 6; ++k) e.arg[k] = n * 10 + k;
  e.edge_count = uint8_t(n % (kMaxEdges + 1));
  for (unsigned k = 0; k < e.edge_count; ++k) e.edges[k] = {k, 0, n};
  return e;
}

// Each request reaches the server once, whole, and each caller reads the
// answer to its own request (run under TSan too).
TEST(ReplySlot, TwoThreadsCallAndAnswer) {
  constexpr uint64_t kCalls = 20000;
  auto slot = std::make_unique<ReplySlot>();
  std::atomic<bool> stop{false};
  std::thread server([&] {
    uint64_t taken = 0;
    Entry e;
    while (!stop.load(std::memory_order_relaxed)) {
      uint64_t seq;
      if (!take_request(*slot, 7, taken, &e, &seq)) continue;
      taken = seq;
      const Entry want = request(seq);
      const bool same = e.op == want.op && e.flags == want.flags && e.edge_count == want.edge_count &&
                        e.arg[0] == want.arg[0] && e.arg[5] == want.arg[5] && e.thread == 7 && e.stream == 0 &&
                        (e.edge_count == 0 || e.edges[e.edge_count - 1].pos == seq);
      write_reply(*slot, seq, same ? Status::kSuccess : Status::kIllegalState, seq * 2, ~seq);
    }
  });
  for (uint64_t seq = 1; seq <= kCalls; ++seq) {
    write_request(*slot, request(seq), seq);
    while (slot->reply_seq.load(std::memory_order_acquire) < seq) std::this_thread::yield();
    uint64_t r0 = 0, r1 = 0;
    ASSERT_EQ(read_reply(*slot, &r0, &r1), Status::kSuccess) << "the server saw request " << seq << " torn";
    ASSERT_EQ(r0, seq * 2);
    ASSERT_EQ(r1, ~seq);
  }
  stop = true;
  server.join();
}

// A request is taken once; the copy is all the server reads, whatever the
// slot says afterwards; a count past kMaxEdges is copied for validation to reject.
TEST(ReplySlot, ARequestIsCopiedOutOnce) {
  auto slot = std::make_unique<ReplySlot>();
  Entry e;
  uint64_t seq = 99;
  EXPECT_FALSE(take_request(*slot, 0, 0, &e, &seq)) << "nothing posted yet";
  write_request(*slot, request(3), 1);
  ASSERT_TRUE(take_request(*slot, 0, 0, &e, &seq));
  EXPECT_EQ(seq, 1u);
  EXPECT_FALSE(take_request(*slot, 0, 1, &e, &seq)) << "the same request twice";
  slot->request.arg[0] = 555;  // a guest rewriting its request after posting it
  EXPECT_EQ(e.arg[0], 30u);
  EXPECT_EQ(e.edge_count, 3u);
  slot->request.edge_count = kMaxEdges + 9;
  slot->request.seq.store(2);
  ASSERT_TRUE(take_request(*slot, 0, 1, &e, &seq));
  EXPECT_EQ(e.edge_count, kMaxEdges + 9);
  EXPECT_EQ(e.arg[0], 555u);
  write_reply(*slot, 2, Status::kInvalidValue, 1, 2);
  EXPECT_EQ(slot->reply_seq.load(), 2u);
  uint64_t r0 = 0;
  EXPECT_EQ(read_reply(*slot, &r0, nullptr), Status::kInvalidValue);
  EXPECT_EQ(r0, 1u);
}

}  // namespace
}  // namespace ordo::test

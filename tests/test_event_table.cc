// EventTable without a worker: which backend event each record and wait of a
// guest event uses, when a re-record gets a backend event of its own, and when
// a destroyed event's backend events go.
#include <set>

#include <gtest/gtest.h>

#include "worker/backends/null/null_backend.h"
#include "worker/event_table.h"

namespace ordo::test {
namespace {

// Keeps the backend events that exist, and fails what CUDA would fail.
class CountingBackend : public NullBackend {
 public:
  Status event_create(uint32_t event, uint32_t, uint32_t) override {
    if (event >= kMaxBackendEvents || !live.insert(event).second) ++misuse;
    ++created;
    return Status::kSuccess;
  }
  Status event_destroy(uint32_t event) override {
    if (!live.erase(event)) ++misuse;
    return Status::kSuccess;
  }
  std::set<uint32_t> live;
  uint32_t created = 0, misuse = 0;
};

class EventTableTest : public ::testing::Test {
 protected:
  uint64_t create() {
    uint64_t h = 0;
    EXPECT_EQ(t_.create(0, 0, &h), Status::kSuccess);
    return h;
  }
  uint32_t idx(uint64_t h, uint64_t number = 0) {
    uint32_t i = ~0u;
    EXPECT_EQ(t_.find(h, number, &i), Status::kSuccess);
    return i;
  }
  // What the worker does for an EventRecord: the backend event, or ~0u.
  uint32_t record(uint64_t h, uint64_t number, uint64_t waits_before, Status want = Status::kSuccess) {
    uint32_t b = ~0u;
    EXPECT_EQ(t_.record(idx(h, number), number, waits_before, &b), want);
    t_.settle(idx(h, number));
    return b;
  }
  uint32_t wait(uint64_t h, uint64_t number) {
    const uint32_t i = idx(h, number);
    const uint32_t b = t_.backend_of(i, number);
    t_.waited(i, number);
    t_.settle(i);
    return b;
  }
  CountingBackend be_;
  EventTable t_{be_, /*versioned=*/true};
};

TEST_F(EventTableTest, ARecordWhoseWaitsRanReusesTheBackendEvent) {
  const uint64_t h = create();
  const uint32_t i = uint32_t(h);
  EXPECT_EQ(record(h, 1, 0), i);
  EXPECT_EQ(wait(h, 1), i);
  EXPECT_EQ(wait(h, 1), i);
  EXPECT_EQ(record(h, 2, 2), i) << "re-recorded in place once both waits ran";
  EXPECT_EQ(record(h, 3, 0), i);
  EXPECT_EQ(be_.created, 1u);
  EXPECT_EQ(be_.misuse, 0u);
}

TEST_F(EventTableTest, ARecordWithAWaitToComeGetsItsOwnBackendEvent) {
  const uint64_t h = create();
  const uint32_t i = uint32_t(h);
  EXPECT_EQ(record(h, 1, 0), i);
  // One wait on record 1 is issued but not dispatched (held behind a host function).
  const uint32_t b2 = record(h, 2, 1);
  EXPECT_GE(b2, kMaxEvents);
  EXPECT_EQ(t_.backend_of(i, 1), i);
  EXPECT_EQ(t_.backend_of(i, 2), b2);
  EXPECT_EQ(wait(h, 2), b2);
  EXPECT_EQ(wait(h, 1), i) << "the held wait keeps record 1's meaning";
  // Both records' waits ran: the event's own backend event takes the next
  // record, and the extra one goes back to all events.
  EXPECT_EQ(record(h, 3, 1), i);
  EXPECT_EQ(be_.live.count(b2), 0u);
  EXPECT_EQ(record(h, 4, 0), i);
  // A request that raced a re-record falls back to the newest record.
  EXPECT_EQ(t_.backend_of(i, 1), i);
  EXPECT_EQ(be_.created, 2u);
  EXPECT_EQ(be_.live.size(), 1u);
  EXPECT_EQ(be_.misuse, 0u);
}

TEST_F(EventTableTest, RecordsDispatchedOutOfOrderEachGetTheirOwn) {
  const uint64_t h = create();
  const uint32_t i = uint32_t(h);
  // Record 1 is held on one ring; record 2 on another is dispatched first.
  const uint32_t b2 = record(h, 2, 0);
  EXPECT_NE(b2, i);
  const uint32_t b1 = record(h, 1, 0);
  EXPECT_NE(b1, b2) << "the late record would overwrite the newer one";
  EXPECT_EQ(t_.backend_of(i, 2), b2);
  // Record 1 has no wait to come: once recorded, its backend event is spare.
  EXPECT_EQ(t_.backend_of(i, 1), b2);
  EXPECT_EQ(record(h, 3, 0), i);
  EXPECT_EQ(be_.live.size(), 1u);
  EXPECT_EQ(be_.misuse, 0u);
}

TEST_F(EventTableTest, ADestroyWaitsForTheWaitsStillToCome) {
  const uint64_t h = create();
  const uint32_t i = uint32_t(h);
  record(h, 1, 0);
  record(h, 2, 1);  // one wait on record 1 to come
  EXPECT_EQ(t_.destroy(h, 2, 1), Status::kSuccess);  // and one on record 2
  uint32_t j;
  EXPECT_EQ(t_.find(h, &j), Status::kInvalidResourceHandle) << "requests fail at once";
  EXPECT_EQ(t_.destroy(h, 2, 1), Status::kInvalidResourceHandle);
  EXPECT_EQ(t_.find(h, 3, &j), Status::kInvalidResourceHandle) << "a record issued after the destroy";
  EXPECT_EQ(wait(h, 2), t_.backend_of(i, 2));
  EXPECT_FALSE(be_.live.empty());
  wait(h, 1);
  EXPECT_TRUE(be_.live.empty()) << "carried out once the last wait ran";
  EXPECT_EQ(t_.find(h, 1, &j), Status::kInvalidResourceHandle);
  const uint64_t again = create();
  EXPECT_EQ(uint32_t(again), i);
  EXPECT_NE(again, h);
  EXPECT_EQ(be_.misuse, 0u);
}

TEST_F(EventTableTest, ADestroyWaitsForItsLastRecord) {
  const uint64_t h = create();
  EXPECT_EQ(t_.destroy(h, 1, 0), Status::kSuccess);  // record 1 is held behind a host function
  EXPECT_FALSE(be_.live.empty());
  record(h, 1, 0);
  EXPECT_TRUE(be_.live.empty());
  EXPECT_EQ(be_.misuse, 0u);
}

TEST_F(EventTableTest, WhenEveryExtraBackendEventIsInUseARecordWaits) {
  std::vector<uint64_t> hs;
  for (uint32_t k = 0; k < EventTable::kMaxExtraEvents; ++k) {
    hs.push_back(create());
    EXPECT_GE(record(hs.back(), 1, 1), kMaxEvents);  // a wait on the never-recorded state is to come
  }
  const uint64_t last = create();
  record(last, 1, 1, Status::kNotReady);
  EXPECT_EQ(t_.destroy(hs[0], 1, 0), Status::kSuccess);
  wait(hs[0], 0);  // its last wait: the destroy is carried out and its extra event is free
  EXPECT_GE(record(last, 1, 1), kMaxEvents);
  EXPECT_EQ(be_.misuse, 0u);
}

TEST_F(EventTableTest, AHostileGuestCannotGrowItWithoutBound) {
  const uint64_t h = create();
  // Records far ahead of any dispatched one, each leaving a placeholder.
  const uint32_t i = uint32_t(h);
  uint32_t made = 0, refused = 0;
  for (uint64_t n = 2; n < 1000; n += 2) {
    uint32_t b = ~0u;
    const Status s = t_.record(i, n, 5, &b);
    t_.settle(i);
    ++(ok(s) ? made : refused);
  }
  EXPECT_LE(made, 64u);
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(record(h, 2, 5), t_.backend_of(uint32_t(h), 2)) << "a number seen before goes where it went";
  t_.reset();
  EXPECT_TRUE(be_.live.empty());
  EXPECT_EQ(be_.misuse, 0u);
}

TEST(EventTableUnversioned, OneBackendEventPerEvent) {
  CountingBackend be;
  EventTable t(be, /*versioned=*/false);
  uint64_t h = 0;
  ASSERT_EQ(t.create(0, 0, &h), Status::kSuccess);
  uint32_t b = ~0u;
  EXPECT_EQ(t.record(uint32_t(h), 2, 7, &b), Status::kSuccess);
  EXPECT_EQ(b, uint32_t(h));
  EXPECT_EQ(t.destroy(h, 2, 7), Status::kSuccess);
  EXPECT_TRUE(be.live.empty()) << "without ordering a destroy is carried out at once";
}

}  // namespace
}  // namespace ordo::test

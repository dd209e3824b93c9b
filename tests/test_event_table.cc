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

// A table over a CountingBackend, as the worker drives it.
struct Table {
  explicit Table(uint64_t in_flight) : t_(be_, /*versioned=*/true, in_flight) {}
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
  // As the worker: the status, and the backend event in *b.
  Status try_record(uint64_t h, uint64_t number, uint64_t waits_before, uint32_t* b) {
    const uint32_t i = idx(h, number);
    const Status s = t_.record(i, number, waits_before, b);
    t_.settle(i);
    return s;
  }
  CountingBackend be_;
  EventTable t_;
};

class EventTableTest : public ::testing::Test, public Table {
 protected:
  EventTableTest() : Table(1024) {}
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

// Records of one event dispatched far ahead of their predecessors (one ring
// polled before the others, 64 entries a pass): each is kept until the ones
// before it and their waits were dispatched, however many (a fixed cap of 64
// kept records once hung a worker here).
TEST_F(EventTableTest, RecordsFarAheadOfTheirPredecessorsAreAllKept) {
  const uint64_t h = create();
  constexpr uint64_t kRecords = 400;
  uint32_t b;
  for (uint64_t first : {1, 2, 3, 4})  // ring P0's records, then P1's, ...
    for (uint64_t n = first; n <= kRecords; n += 4) ASSERT_EQ(try_record(h, n, 1, &b), Status::kSuccess) << n;
  for (uint64_t n = 0; n < kRecords; ++n) wait(h, n);  // one wait on each, issued before the next record
  EXPECT_EQ(t_.destroy(h, kRecords, 0), Status::kSuccess);
  EXPECT_TRUE(be_.live.empty()) << be_.live.size() << " backend events left";
  EXPECT_EQ(be_.misuse, 0u);
}

// At the table's limits (only a guest that lies gets there; here a small
// in-flight count stands in) a record is refused without changing anything:
// asked again after a newer record went, it leaves no record behind that
// nothing would dispatch, and the destroy is carried out.
TEST(EventTableLimits, ARefusedRecordAskedAgainLeavesNothingBehind) {
  for (int rounds : {1, 80}) {
    Table t(8);
    const uint64_t h = t.create();
    uint32_t b;
    uint64_t n = 0;
    for (int round = 0; round < rounds; ++round) {
      const uint64_t base = n;
      while (t.try_record(h, n + 1, n == base ? 0 : 1, &b) == Status::kSuccess) ++n;  // waits on each held
      ASSERT_GT(n, base) << "round " << round;
      const uint64_t a = n + 1, c = n + 2;  // on rings A and C, both refused
      EXPECT_EQ(t.try_record(h, c, 0, &b), Status::kNotReady);
      for (uint64_t k = base + 1; k <= n; ++k) t.wait(h, k);  // the held waits go
      ASSERT_EQ(t.try_record(h, c, 0, &b), Status::kSuccess) << "round " << round;  // ring C first
      ASSERT_EQ(t.try_record(h, a, 1, &b), Status::kSuccess) << "round " << round;
      t.wait(h, a);
      n = c;
    }
    EXPECT_EQ(t.t_.destroy(h, n, 0), Status::kSuccess);
    EXPECT_TRUE(t.be_.live.empty()) << "rounds " << rounds << ": " << t.be_.live.size() << " backend events left";
    EXPECT_EQ(uint32_t(t.create()), uint32_t(h)) << "the destroyed event's index was never freed";
    EXPECT_EQ(t.be_.misuse, 0u);
  }
}

// A destroy that comes before its last record (held behind a host function)
// while many records are kept: carried out once that record came.
TEST_F(EventTableTest, ADestroyBeforeItsLastRecordAmongManyKept) {
  const uint64_t h = create();
  uint32_t b;
  for (uint64_t n = 1; n <= 100; ++n) ASSERT_EQ(try_record(h, n, n == 1 ? 0 : 1, &b), Status::kSuccess) << n;
  EXPECT_EQ(t_.destroy(h, 101, 0), Status::kSuccess);
  for (uint64_t n = 1; n <= 100; ++n) wait(h, n);
  EXPECT_FALSE(be_.live.empty()) << "carried out before its last record";
  ASSERT_EQ(try_record(h, 101, 1, &b), Status::kSuccess);
  EXPECT_TRUE(be_.live.empty()) << be_.live.size() << " backend events left";
  EXPECT_EQ(be_.misuse, 0u);
}

// With E events and N entries in flight, E + N extra backend events: a record
// past that waits (refused, unchanged) until a wait frees one.
TEST(EventTableLimits, ExtraBackendEventsAreBoundedByWhatIsInFlight) {
  Table t(4);
  const uint64_t h = t.create();
  uint32_t b;
  uint64_t n = 1;
  ASSERT_EQ(t.try_record(h, 1, 1, &b), Status::kSuccess);  // a wait on the never-recorded state is held
  while (t.try_record(h, n + 1, 1, &b) == Status::kSuccess) ++n;
  EXPECT_EQ(t.be_.live.size(), 1 + t.t_.max_extra());
  t.wait(h, 0);  // the event's own backend event is free again
  EXPECT_EQ(t.try_record(h, n + 1, 1, &b), Status::kSuccess);
  EXPECT_LT(b, kMaxEvents);
  EXPECT_EQ(t.be_.misuse, 0u);
}

TEST(EventTableLimits, AHostileGuestCannotGrowItWithoutBound) {
  Table t(8);
  const uint64_t h = t.create();
  // Records far ahead of any dispatched one, each leaving a placeholder, and
  // counts of waits that never come.
  uint32_t made = 0, refused = 0;
  for (uint64_t n = 2; n < 1000; n += 2) {
    uint32_t b = ~0u;
    ++(ok(t.try_record(h, n, 5, &b)) ? made : refused);
  }
  EXPECT_LE(made, t.t_.max_records());
  EXPECT_GT(refused, 0u);
  EXPECT_LE(t.be_.live.size(), 1 + t.t_.max_extra());
  EXPECT_EQ(t.record(h, 2, 5), t.t_.backend_of(uint32_t(h), 2)) << "a number seen before goes where it went";
  t.t_.reset();
  EXPECT_TRUE(t.be_.live.empty());
  EXPECT_EQ(t.be_.misuse, 0u);
}

TEST(EventTableUnversioned, OneBackendEventPerEvent) {
  CountingBackend be;
  EventTable t(be, /*versioned=*/false, 1024);
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

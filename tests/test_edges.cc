// The ordering edges (src/guest/edges.h) on their own: no region, no worker.
// Rings is what RingProducer::push does around Edges::order, over plain
// counters: each entry gets the ring's next position, is logged with the
// edges it would carry (overflow Nops aside: those only spread the same edges
// over more entries), and then becomes visible to other rings' edges
// (`published`), as a real publish does. Streams are opened as the stream
// table opens them (Edges::stream_opened and friends).
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "guest/edges.h"
#include "guest/events.h"

namespace ordo {

// Found by argument-dependent lookup, so in Edge's namespace.
static bool operator==(const Edge& a, const Edge& b) { return a.ring == b.ring && a.pos == b.pos; }
static std::ostream& operator<<(std::ostream& os, const Edge& e) {
  return os << "(ring " << e.ring << ", " << e.pos << ")";
}

namespace guest {
namespace {

struct Written {
  uint32_t ring;
  uint64_t pos;
  Entry e;
  std::vector<Edge> edges;
};

class Rings {
 public:
  explicit Rings(uint32_t n, bool ordered = true) : edges(n, ordered), mu_(n), tail_(n, 0) {
    // Device 0's legacy stream, open from the start on the legacy ring (Streams' constructor).
    edges.stream_opened(kLegacyRing, 0, false);
    edges.legacy_opened(0, kLegacyRing);
  }

  // A stream of `device` opened on ring r, as Streams::create opens it.
  StreamRef open(uint32_t id, uint32_t r, bool blocking, uint32_t device = 0) {
    edges.stream_opened(r, device, blocking);
    return {id, device, blocking};
  }
  // Device d's legacy stream, opened on ring r (Streams::open_legacy).
  StreamRef open_legacy(uint32_t d, uint32_t r) {
    edges.stream_opened(r, d, false);
    edges.legacy_opened(d, r);
    return {d, d, false};
  }
  // Streams::release: a fence, then the destroy, which still carries the stream's edges.
  void close(const StreamRef& s, uint32_t r) {
    const uint64_t fence = push(r, {}, entry(Op::Fence));
    edges.stream_closed(r, s.device, s.blocking, fence + 1);
    edges.destroyed(s.id, r, push(r, s, entry(Op::StreamDestroy)));
  }

  static Entry entry(Op op, uint64_t arg0 = 0) {
    Entry e{};
    e.op = uint16_t(op);
    e.arg[0] = arg0;
    return e;
  }

  uint64_t push(uint32_t r, const StreamRef& s, const Entry& call, EventState* ev = nullptr) {
    std::lock_guard lock(mu_[r]);  // the ring's lock, as every push holds it
    return edges.order(r, s, call, ev, [&](const Entry& e, const EdgeList& l) {
      const uint64_t pos = tail_[r]++;
      {
        std::lock_guard log_lock(log_mu_);
        log_.push_back({r, pos, e, {l.begin(), l.end()}});
      }
      edges.ring(r).published.store(tail_[r], std::memory_order_release);
      return pos;
    });
  }
  uint64_t launch(uint32_t r, const StreamRef& s) { return push(r, s, entry(Op::Launch)); }
  uint64_t record(uint32_t r, const StreamRef& s, EventState& ev) { return push(r, s, entry(Op::EventRecord), &ev); }
  uint64_t wait(uint32_t r, const StreamRef& s, EventState& ev) { return push(r, s, entry(Op::StreamWaitEvent), &ev); }

  // What the entry at `pos` of ring r carries.
  const Written& at(uint32_t r, uint64_t pos) const {
    std::lock_guard lock(log_mu_);
    for (const Written& w : log_)
      if (w.ring == r && w.pos == pos) return w;
    ADD_FAILURE() << "no entry at ring " << r << " position " << pos;
    static const Written none{};
    return none;
  }
  std::vector<Edge> edges_of(uint32_t r, uint64_t pos) const { return at(r, pos).edges; }
  std::vector<Written> log() const {
    std::lock_guard lock(log_mu_);
    return log_;
  }
  uint64_t tail(uint32_t r) const { return tail_[r]; }

  Edges edges;

 private:
  std::vector<std::mutex> mu_;
  std::vector<uint64_t> tail_;
  mutable std::mutex log_mu_;
  std::vector<Written> log_;
};

using EdgeVector = std::vector<Edge>;
constexpr bool kBlocking = true, kNonBlocking = false;

// ---- rule 2: events --------------------------------------------------------

TEST(Edges, AWaitFollowsTheRecordIssuedBeforeIt) {
  Rings g(4);
  const StreamRef s1 = g.open(40, 1, kNonBlocking), s2 = g.open(41, 2, kNonBlocking);
  EventState ev;
  g.launch(1, s1);
  g.launch(1, s1);
  const uint64_t p = g.record(1, s1, ev);
  EXPECT_EQ(g.edges_of(1, p), EdgeVector{}) << "a record carries no edge of its own";
  EXPECT_EQ(g.at(1, p).e.arg[1], 1u) << "the event's first record";
  const uint64_t w = g.wait(2, s2, ev);
  EXPECT_EQ(g.edges_of(2, w), (EdgeVector{{1, 0, p + 1}}));
  EXPECT_EQ(g.at(2, w).e.arg[1], 1u) << "the wait names the record it follows";
  EXPECT_EQ(g.edges_of(2, g.launch(2, s2)), EdgeVector{}) << "later work on S2 follows the wait by ring order";
}

TEST(Edges, AReRecordReplacesTheRecordAndCountsTheWaitsOnTheOldOne) {
  Rings g(4);
  const StreamRef s1 = g.open(40, 1, kNonBlocking), s2 = g.open(41, 2, kNonBlocking),
                  s3 = g.open(42, 3, kNonBlocking);
  EventState ev;
  const uint64_t p1 = g.record(1, s1, ev);
  EXPECT_EQ(g.edges_of(2, g.wait(2, s2, ev)), (EdgeVector{{1, 0, p1 + 1}}));
  EXPECT_EQ(g.edges_of(3, g.wait(3, s3, ev)), (EdgeVector{{1, 0, p1 + 1}}));
  g.launch(1, s1);
  const uint64_t p2 = g.record(1, s1, ev);
  EXPECT_EQ(g.edges_of(1, p2), EdgeVector{}) << "no edge to the record it replaces nor to its waits";
  EXPECT_EQ(g.at(1, p2).e.arg[1], 2u);
  EXPECT_EQ(g.at(1, p2).e.arg[2], 2u) << "the waits issued on the record it replaces";
  const uint64_t w = g.wait(2, s2, ev);
  EXPECT_EQ(g.edges_of(2, w), (EdgeVector{{1, 0, p2 + 1}}));
  EXPECT_EQ(g.at(2, w).e.arg[1], 2u);
  // Recorded on another ring now: its users follow that ring.
  const uint64_t p3 = g.record(3, s3, ev);
  EXPECT_EQ(g.at(3, p3).e.arg[2], 1u);
  EXPECT_EQ(g.edges_of(2, g.wait(2, s2, ev)), (EdgeVector{{3, 0, p3 + 1}}));
  EXPECT_EQ(ev.number, 3u);
  EXPECT_EQ(ev.waits, 1u) << "what an EventDestroy now would say";
}

TEST(Edges, AWaitOnAnEventNeverRecordedIsANoOp) {
  Rings g(3);
  const StreamRef s = g.open(40, 1, kNonBlocking);
  EventState ev;
  const uint64_t w = g.wait(1, s, ev);
  EXPECT_EQ(g.edges_of(1, w), EdgeVector{});
  EXPECT_EQ(g.at(1, w).e.arg[1], 0u) << "record 0: the worker does nothing";
  Entry sync = Rings::entry(Op::EventSynchronize);
  g.edges.follow_record(ev, &sync);
  EXPECT_EQ(sync.edge_count, 0u);
}

TEST(Edges, SyncCallsAboutAnEventFollowItsCurrentRecord) {
  Rings g(3);
  const StreamRef s = g.open(40, 1, kNonBlocking);
  EventState ev;
  g.record(1, s, ev);
  const uint64_t p = g.record(1, s, ev);
  Entry query = Rings::entry(Op::EventQuery);
  g.edges.follow_record(ev, &query);
  ASSERT_EQ(query.edge_count, 1u);
  EXPECT_EQ(query.edges[0], (Edge{1, 0, p + 1}));
}

TEST(Edges, ADestroyedEventsHandleFindsNothingAndItsSlotStartsAfresh) {
  Rings g(3);
  const StreamRef s1 = g.open(40, 1, kNonBlocking), s2 = g.open(41, 2, kNonBlocking);
  EventTable table;
  const Event old{uint64_t{1} << 32 | 7};  // index 7, generation 1
  EventState* ev = table.install(old.handle, 0);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(table.find(old), ev);
  const uint64_t p = g.record(1, s1, *ev);
  const uint64_t w = g.wait(2, s2, *ev);
  EventTable::forget(*ev, old);
  EXPECT_EQ(table.find(old), nullptr) << "a stale handle names no event";
  EXPECT_EQ(g.edges_of(2, w), (EdgeVector{{1, 0, p + 1}})) << "a wait issued before the destroy keeps its record";
  // The worker hands index 7 out again, with a new generation.
  const Event reused{uint64_t{2} << 32 | 7};
  EXPECT_EQ(table.install(reused.handle, 0), ev) << "one state per index";
  EXPECT_EQ(table.find(old), nullptr);
  EXPECT_EQ(table.find(reused), ev);
  const uint64_t w2 = g.wait(2, s2, *ev);
  EXPECT_EQ(g.edges_of(2, w2), EdgeVector{}) << "the new event was never recorded: no edge to the old one's record";
  EXPECT_EQ(g.at(2, w2).e.arg[1], 0u);
  // forget() of the old handle after the index was reused leaves the new event alone.
  EventTable::forget(*ev, old);
  EXPECT_EQ(table.find(reused), ev);
  EXPECT_EQ(table.find(Event{kMaxEvents}), nullptr) << "an index past the table";
}

// ---- rule 3: the legacy stream ---------------------------------------------

TEST(Edges, BlockingStreamWorkFollowsTheLegacyStreamOncePerAdvance) {
  Rings g(4);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  const StreamRef b = g.open(40, 1, kBlocking), n = g.open(41, 2, kNonBlocking);
  for (int i = 0; i < 3; ++i) g.launch(kLegacyRing, legacy);
  EXPECT_EQ(g.edges_of(1, g.launch(1, b)), (EdgeVector{{kLegacyRing, 0, 3}}));
  EXPECT_EQ(g.edges_of(1, g.launch(1, b)), EdgeVector{}) << "already covered from ring 1";
  EXPECT_EQ(g.edges_of(2, g.launch(2, n)), EdgeVector{}) << "a non-blocking stream follows nothing";
  g.launch(kLegacyRing, legacy);
  EXPECT_EQ(g.edges_of(1, g.launch(1, b)), (EdgeVector{{kLegacyRing, 0, 4}}));
}

TEST(Edges, LegacyStreamWorkFollowsEveryBlockingStreamAndNoOther) {
  Rings g(5);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  const StreamRef b1 = g.open(40, 1, kBlocking), b2 = g.open(41, 2, kBlocking), n = g.open(42, 3, kNonBlocking);
  g.launch(1, b1);
  g.launch(1, b1);
  g.launch(2, b2);
  g.launch(3, n);
  EXPECT_EQ(g.edges_of(kLegacyRing, g.launch(kLegacyRing, legacy)), (EdgeVector{{1, 0, 2}, {2, 0, 1}}));
  EXPECT_EQ(g.edges_of(kLegacyRing, g.launch(kLegacyRing, legacy)), EdgeVector{}) << "nothing new published";
  g.launch(1, b1);
  EXPECT_EQ(g.edges_of(kLegacyRing, g.launch(kLegacyRing, legacy)), (EdgeVector{{1, 0, 3}}));
}

TEST(Edges, LegacyWorkFollowsADestroyedBlockingStreamOnlyUpToItsDestroy) {
  Rings g(3);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  // A blocking and a non-blocking stream share ring 1.
  const StreamRef b = g.open(40, 1, kBlocking), n = g.open(41, 1, kNonBlocking);
  g.launch(1, b);
  g.launch(1, b);
  g.close(b, 1);  // a fence at 2, the destroy at 3
  for (int i = 0; i < 5; ++i) g.launch(1, n);
  EXPECT_EQ(g.edges_of(kLegacyRing, g.launch(kLegacyRing, legacy)), (EdgeVector{{1, 0, 3}}))
      << "up to the fence before the destroy: the non-blocking ring-mate's later work is not waited for";
  EXPECT_EQ(g.edges_of(kLegacyRing, g.launch(kLegacyRing, legacy)), EdgeVector{});
}

TEST(Edges, EachDevicesLegacyStreamHasItsOwnBlockingStreams) {
  Rings g(5);
  const StreamRef legacy0{kLegacyStreamId, 0, false};
  const StreamRef legacy1 = g.open_legacy(1, 3);
  g.push(3, legacy1, Rings::entry(Op::StreamCreate, kStreamLegacy));
  const StreamRef b0 = g.open(40, 1, kBlocking, 0), b1 = g.open(41, 2, kBlocking, 1);
  g.launch(kLegacyRing, legacy0);
  g.launch(3, legacy1);
  g.launch(3, legacy1);
  EXPECT_EQ(g.edges_of(2, g.launch(2, b1)), (EdgeVector{{3, 0, 3}}))
      << "device 1's blocking stream follows device 1's legacy stream";
  EXPECT_EQ(g.edges_of(1, g.launch(1, b0)), (EdgeVector{{kLegacyRing, 0, 1}}));
  EXPECT_EQ(g.edges_of(3, g.launch(3, legacy1)), (EdgeVector{{2, 0, 1}}));
  EXPECT_EQ(g.edges_of(kLegacyRing, g.launch(kLegacyRing, legacy0)), (EdgeVector{{1, 0, 1}}));
}

TEST(Edges, ALegacyStreamSharingItsRingNeedsNoEdgeToIt) {
  Rings g(3);
  // Device 1's legacy stream and one of its blocking streams on ring 2: ring order does it.
  const StreamRef legacy1 = g.open_legacy(1, 2);
  const StreamRef b = g.open(40, 2, kBlocking, 1);
  g.launch(2, legacy1);
  EXPECT_EQ(g.edges_of(2, g.launch(2, b)), EdgeVector{});
  EXPECT_EQ(g.edges_of(2, g.launch(2, legacy1)), EdgeVector{});
}

TEST(Edges, AnEventWaitOnTheLegacyStreamCarriesBothRules) {
  Rings g(4);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  const StreamRef b = g.open(40, 1, kBlocking), n = g.open(41, 2, kNonBlocking);
  EventState ev;
  g.launch(1, b);
  const uint64_t p = g.record(2, n, ev);
  EXPECT_EQ(g.edges_of(kLegacyRing, g.wait(kLegacyRing, legacy, ev)), (EdgeVector{{1, 0, 1}, {2, 0, p + 1}}));
}

TEST(Edges, ACallsOwnEdgesComeFirst) {
  Rings g(3);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  const StreamRef b = g.open(40, 1, kBlocking);
  g.launch(1, b);
  Entry e = Rings::entry(Op::Launch);
  e.edges[e.edge_count++] = {2, 0, 9};
  EXPECT_EQ(g.edges_of(kLegacyRing, g.push(kLegacyRing, legacy, e)), (EdgeVector{{2, 0, 9}, {1, 0, 1}}));
}

TEST(Edges, CallsWithoutAnOrderingRoleGetNoEdges) {
  Rings g(3);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  const StreamRef b = g.open(40, 1, kBlocking);
  g.launch(1, b);
  EXPECT_EQ(g.edges_of(kLegacyRing, g.push(kLegacyRing, legacy, Rings::entry(Op::Fence))), EdgeVector{});
  EXPECT_EQ(g.edges_of(kLegacyRing, g.launch(kLegacyRing, legacy)), (EdgeVector{{1, 0, 1}}));
}

TEST(Edges, UnorderedBuildsNoEdgesButStillNumbersRecords) {
  Rings g(3, /*ordered=*/false);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  const StreamRef b = g.open(40, 1, kBlocking);
  EventState ev;
  g.launch(kLegacyRing, legacy);
  EXPECT_EQ(g.edges_of(1, g.launch(1, b)), EdgeVector{});
  const uint64_t p = g.record(1, b, ev);
  EXPECT_EQ(g.at(1, p).e.arg[1], 1u);
  EXPECT_EQ(g.edges_of(kLegacyRing, g.wait(kLegacyRing, legacy, ev)), EdgeVector{});
  Entry sync = Rings::entry(Op::EventSynchronize);
  g.edges.follow_record(ev, &sync);
  EXPECT_EQ(sync.edge_count, 0u);
}

// ---- rule 5: a reused stream id --------------------------------------------

TEST(Edges, AReusedStreamIdsCreateFollowsItsDestroyOnAnotherRing) {
  Rings g(4);
  const StreamRef s = g.open(40, 1, kNonBlocking);
  g.launch(1, s);
  g.close(s, 1);
  const uint64_t destroy = g.tail(1) - 1;
  Entry there = Rings::entry(Op::StreamCreate), here = Rings::entry(Op::StreamCreate),
        fresh = Rings::entry(Op::StreamCreate);
  g.edges.recreate(40, 2, &there);
  ASSERT_EQ(there.edge_count, 1u);
  EXPECT_EQ(there.edges[0], (Edge{1, 0, destroy + 1}));
  g.edges.recreate(40, 1, &here);
  EXPECT_EQ(here.edge_count, 0u) << "on the same ring, ring order does it";
  g.edges.recreate(41, 2, &fresh);
  EXPECT_EQ(fresh.edge_count, 0u) << "an id never used before";
}

// ---- several threads -------------------------------------------------------

// Threads record and wait on one event from streams of their own: whatever
// the interleaving, a wait names a record that exists and follows exactly
// that record's entry, and each re-record counts the waits on the record it
// replaced.
TEST(Edges, RecordsAndWaitsFromManyThreadsStayConsistent) {
  constexpr uint32_t kThreads = 6;
  constexpr int kCalls = 3000;
  Rings g(kThreads + 1);
  EventState ev;
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      const uint32_t r = i + 1;
      const StreamRef s{40 + i, 0, false};
      std::mt19937 rng(i);
      for (int k = 0; k < kCalls; ++k) {
        if (rng() % 3 == 0) g.record(r, s, ev);
        else g.wait(r, s, ev);
      }
    });
  for (auto& t : threads) t.join();
  std::map<uint64_t, Edge> records;  // number -> the edge past it
  std::map<uint64_t, uint64_t> waits_on, counted;  // number -> waits naming it, waits the next record counted
  for (const Written& w : g.log()) {
    if (static_cast<Op>(w.e.op) == Op::EventRecord) {
      EXPECT_TRUE(records.emplace(w.e.arg[1], Edge{w.ring, 0, w.pos + 1}).second) << "record number reused";
      counted[w.e.arg[1] - 1] = w.e.arg[2];
    } else {
      ++waits_on[w.e.arg[1]];
    }
  }
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.begin()->first, 1u);
  EXPECT_EQ(records.rbegin()->first, records.size()) << "records numbered 1..n";
  for (const Written& w : g.log()) {
    if (static_cast<Op>(w.e.op) != Op::StreamWaitEvent) continue;
    if (w.e.arg[1] == 0) {
      EXPECT_TRUE(w.edges.empty());
      continue;
    }
    ASSERT_EQ(w.edges.size(), 1u);
    EXPECT_EQ(w.edges[0], records.at(w.e.arg[1])) << "a wait follows the record it names";
  }
  for (auto [number, n] : counted)
    EXPECT_EQ(n, waits_on[number]) << "record " << number + 1 << " counted the waits on record " << number;
}

// Blocking streams on rings of their own push from threads of their own while
// the legacy stream pushes too: its edges only move forward and never name
// unpublished work, and once the threads are done the next legacy entry
// covers all of it.
TEST(Edges, LegacyEdgesFromManyThreadsCoverEveryBlockingStream) {
  constexpr uint32_t kThreads = 5;
  constexpr int kLaunches = 2000;
  Rings g(kThreads + 1);
  const StreamRef legacy{kLegacyStreamId, 0, false};
  std::vector<StreamRef> streams;
  for (uint32_t i = 0; i < kThreads; ++i) streams.push_back(g.open(40 + i, i + 1, kBlocking));
  std::barrier start(kThreads + 1);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      for (int k = 0; k < kLaunches; ++k) g.launch(i + 1, streams[i]);
    });
  start.arrive_and_wait();
  for (int k = 0; k < kLaunches; ++k) g.launch(kLegacyRing, legacy);
  for (auto& t : threads) t.join();
  g.launch(kLegacyRing, legacy);
  std::vector<uint64_t> covered(kThreads + 1, 0);
  std::vector<Written> log = g.log();
  std::sort(log.begin(), log.end(), [](const Written& a, const Written& b) {
    return a.ring != b.ring ? a.ring < b.ring : a.pos < b.pos;
  });
  for (const Written& w : log) {
    if (w.ring != kLegacyRing) continue;
    for (const Edge& e : w.edges) {
      ASSERT_NE(e.ring, kLegacyRing);
      EXPECT_GT(e.pos, covered[e.ring]) << "an edge repeats what an earlier one covered";
      EXPECT_LE(e.pos, g.tail(e.ring));
      covered[e.ring] = e.pos;
    }
  }
  for (uint32_t r = 1; r <= kThreads; ++r) EXPECT_EQ(covered[r], g.tail(r)) << "ring " << r;
}

}  // namespace
}  // namespace guest
}  // namespace ordo

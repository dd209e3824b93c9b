// Randomized ordering stress checked against a model of the allowed orders.
//
// Several guest threads issue random programs over blocking, non-blocking and
// the legacy default stream, with events and device-wide syncs. Every kernel is
// an `ordo_stamp` that records when it started and ended on one clock shared by
// all simulated streams. Afterwards the stamps are checked against what CUDA
// guarantees for the happens-before relation the program set up:
//   C1 stream order      same ring, earlier position   -> ends before the later starts
//   C2 events            work before the record a wait referred to -> ends before work after the wait
//   C3 legacy stream     legacy <-> blocking stream work ordered by happens-before
//   C4 device sync       work happening before cudaDeviceSynchronize -> ends before work after it
// Threads run in phases separated by barriers (happens-before across threads).
// Even phases may re-record events, odd phases wait on them, so each wait
// refers to exactly one record.
#include <gtest/gtest.h>

#include <barrier>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

enum class Kind { Stamp, Record, Wait, DeviceSync };

struct OpLog {
  Kind kind;
  int thread, phase, seq;  // seq: program order within the thread
  uint32_t ring = 0;
  uint64_t pos = 0;
  int event = -1;
  int stamp = -1;
  Edge record{};  // Wait: the record it refers to
  bool refers = false;
};

struct Program {
  int threads = 4, phases = 24, ops_per_phase = 4, events = 4;
};

struct Result {
  size_t stamps = 0;
  size_t violations = 0;
  std::string first;
};

Result run_model(WorkerProcess& w, uint64_t seed, const Program& prog = {}) {
  auto c = w.attach();
  const uint32_t stamp_k = kernel(*c, "ordo_stamp");
  std::vector<Stream> streams{kLegacyStream};
  std::vector<bool> blocking{true};
  for (int i = 0; i < 6; ++i) {
    Stream s;
    const bool nb = i % 2;
    EXPECT_EQ(c->stream_create(&s, nb ? kStreamNonBlocking : 0), Status::kSuccess);
    streams.push_back(s);
    blocking.push_back(!nb);
  }
  std::vector<Event> events(prog.events);
  for (auto& e : events) EXPECT_EQ(c->event_create(&e), Status::kSuccess);
  const int max_stamps = prog.threads * prog.phases * prog.ops_per_phase;
  uint64_t dstamps = 0;
  EXPECT_EQ(c->malloc(&dstamps, max_stamps * sizeof(sim::Stamp)), Status::kSuccess);
  EXPECT_EQ(c->memset_async(dstamps, 0, max_stamps * sizeof(sim::Stamp), kLegacyStream), Status::kSuccess);
  EXPECT_EQ(c->device_synchronize(), Status::kSuccess);

  std::mutex log_mu;
  std::vector<OpLog> log;
  std::atomic<int> next_stamp{0};
  // Per event, the last record (read in odd phases only, written in even ones).
  std::vector<Edge> last_record(prog.events);
  std::vector<bool> recorded(prog.events, false);
  std::barrier sync(prog.threads);

  auto body = [&](int th) {
    std::mt19937_64 rng(seed * 1000003 + th);
    int seq = 0;
    for (int ph = 0; ph < prog.phases; ++ph) {
      for (int k = 0; k < prog.ops_per_phase; ++k) {
        OpLog op{Kind::Stamp, th, ph, seq++};
        const int roll = int(rng() % 100);
        const size_t si = rng() % streams.size();
        const Stream s = streams[si];
        const int ev = int(rng() % prog.events);
        if (roll < 20 && ph % 2 == 0 && ev % prog.threads == th) {
          op.kind = Kind::Record;
          op.event = ev;
          EXPECT_EQ(c->event_record(events[ev], s), Status::kSuccess);
        } else if (roll < 20 && ph % 2 == 1 && recorded[ev]) {
          op.kind = Kind::Wait;
          op.event = ev;
          op.record = last_record[ev];
          op.refers = true;
          EXPECT_EQ(c->stream_wait_event(s, events[ev]), Status::kSuccess);
        } else if (roll < 23) {
          op.kind = Kind::DeviceSync;
          EXPECT_EQ(c->device_synchronize(), Status::kSuccess);
        } else {
          op.stamp = next_stamp++;
          sim::StampArgs a{dstamps, uint32_t(op.stamp), uint32_t(rng() % 200)};
          EXPECT_EQ(c->launch(stamp_k, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
        }
        if (op.kind != Kind::DeviceSync) {
          op.ring = s.ring;
          op.pos = c->last_position(s);
        }
        std::lock_guard lock(log_mu);
        log.push_back(op);
      }
      sync.arrive_and_wait();
      if (th == 0 && ph % 2 == 0) {
        // Publish this phase's records for the next (waiting) phase.
        std::lock_guard lock(log_mu);
        for (const OpLog& o : log)
          if (o.kind == Kind::Record && o.phase == ph) {
            last_record[o.event] = {o.ring, 0, o.pos + 1};
            recorded[o.event] = true;
          }
      }
      sync.arrive_and_wait();
    }
  };
  std::vector<std::thread> ts;
  for (int th = 0; th < prog.threads; ++th) ts.emplace_back(body, th);
  for (auto& t : ts) t.join();

  EXPECT_EQ(c->device_synchronize(), Status::kSuccess);
  const int n = next_stamp.load();
  std::vector<sim::Stamp> st(n);
  if (n) {
    EXPECT_EQ(c->memcpy_d2h(st.data(), dstamps, n * sizeof(sim::Stamp)), Status::kSuccess);
  }

  Result res;
  std::vector<const OpLog*> stamps;
  for (const OpLog& o : log)
    if (o.kind == Kind::Stamp) stamps.push_back(&o);
  res.stamps = stamps.size();
  for (const OpLog* o : stamps) {
    const sim::Stamp& s = st[o->stamp];
    EXPECT_TRUE(s.start > 0 && s.end > s.start) << "stamp " << o->stamp << " never ran: a lost call";
  }
  auto hb = [](const OpLog& a, const OpLog& b) {
    return a.phase < b.phase || (a.thread == b.thread && a.seq < b.seq);
  };
  auto must_precede = [&](const OpLog& a, const OpLog& b, const char* rule) {
    if (st[a.stamp].end < st[b.stamp].start) return;
    if (res.violations++ == 0) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: stamp %d (ring %u pos %llu) overlaps or follows stamp %d (ring %u pos %llu)",
                    rule, a.stamp, a.ring, (unsigned long long)a.pos, b.stamp, b.ring, (unsigned long long)b.pos);
      res.first = buf;
    }
  };
  for (const OpLog* a : stamps)
    for (const OpLog* b : stamps) {
      if (a == b) continue;
      if (a->ring == b->ring && a->pos < b->pos) must_precede(*a, *b, "C1 stream order");
      const bool a_legacy = a->ring == kLegacyRing, b_legacy = b->ring == kLegacyRing;
      auto is_blocking = [&](uint32_t ring) {
        for (size_t i = 0; i < streams.size(); ++i)
          if (streams[i].ring == ring) return bool(blocking[i]);
        return false;
      };
      const bool pair = (a_legacy && !b_legacy && is_blocking(b->ring)) || (b_legacy && !a_legacy && is_blocking(a->ring));
      if (pair && hb(*a, *b)) must_precede(*a, *b, "C3 legacy stream");
    }
  for (const OpLog& wt : log) {
    if (wt.kind == Kind::Wait && wt.refers) {
      for (const OpLog* a : stamps)
        if (a->ring == wt.record.ring && a->pos < wt.record.pos)
          for (const OpLog* b : stamps)
            if (b->ring == wt.ring && b->pos > wt.pos) must_precede(*a, *b, "C2 event wait");
    }
    if (wt.kind == Kind::DeviceSync) {
      for (const OpLog* a : stamps)
        if (hb(*a, wt))
          for (const OpLog* b : stamps)
            if (hb(wt, *b)) must_precede(*a, *b, "C4 device sync");
    }
  }
  return res;
}

TEST(Model, RandomProgramsKeepEveryAllowedOrder) {
  WorkerProcess w({"--chaos", "11"});
  size_t stamps = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Result r = run_model(w, seed);
    stamps += r.stamps;
    EXPECT_EQ(r.violations, 0u) << "seed " << seed << ": " << r.first;
  }
  std::printf("checked %zu stamped kernels over 4 random programs\n", stamps);
  EXPECT_GT(stamps, 800u);
}

TEST(Model, RandomProgramsBreakWithoutEdges) {
  WorkerProcess w({"--chaos", "11", "--unordered"});
  size_t violations = 0;
  std::string first;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Result r = run_model(w, seed);
    if (first.empty()) first = r.first;
    violations += r.violations;
  }
  std::printf("without edges: %zu violated pairs, first: %s\n", violations, first.c_str());
  EXPECT_GT(violations, 0u) << "the model check must catch a worker that drops edges";
}

}  // namespace
}  // namespace ordo::test

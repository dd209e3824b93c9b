#include "scenarios.h"

#include <barrier>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "guest/testing.h"
#include "ordo/sim.h"

namespace ordo::scenario {

#define CHECK_OK(call)                                                              \
  do {                                                                              \
    const Status s_ = (call);                                                       \
    if (s_ != Status::kSuccess)                                                     \
      p.add(std::string(#call) + " returned " + std::string(status_name(s_)));      \
  } while (0)

namespace {

uint32_t kernel(Client& c, const char* name, Problems& p) {
  uint32_t k = 0;
  CHECK_OK(c.kernel_lookup(name, &k));
  return k;
}

constexpr uint32_t kBytes = 4096;

// Runs `a` on one thread and then, strictly after `a` returned, `b` on another:
// the guest-visible "A happened before B" of the seed scenario.
void a_then_b(const std::function<void()>& a, const std::function<void()>& b) {
  std::mutex mu;
  std::condition_variable cv;
  bool a_done = false;
  std::thread ta([&] {
    a();
    std::lock_guard lock(mu);
    a_done = true;
    cv.notify_one();
  });
  std::thread tb([&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return a_done; });
    lock.unlock();
    b();
  });
  ta.join();
  tb.join();
}

struct Buffers {
  uint64_t x = 0, out = 0;
  std::vector<uint8_t> old_x = std::vector<uint8_t>(kBytes, 0x11), new_x = std::vector<uint8_t>(kBytes, 0x22);
};

Buffers make_buffers(Client& c, Problems& p) {
  Buffers b;
  CHECK_OK(c.malloc(&b.x, kBytes));
  CHECK_OK(c.malloc(&b.out, kBytes));
  return b;
}

void free_buffers(Client& c, const Buffers& b, Problems& p) {
  CHECK_OK(c.free(b.x));
  CHECK_OK(c.free(b.out));
}

// Resets X to the old data and OUT to zero, everything idle afterwards.
void reset(Client& c, const Buffers& b, Problems& p) {
  CHECK_OK(c.memcpy_h2d(b.x, b.old_x.data(), kBytes));
  CHECK_OK(c.memset_async(b.out, 0, kBytes, kLegacyStream));
  CHECK_OK(c.device_synchronize());
}

// True when the slow kernel read the old X, as native CUDA guarantees. A
// read of the new X, or of a mix (the overwrite ran while the kernel read,
// which is what a violation looks like when the copy and the read overlap),
// is a violation either way: the ordered runs count none, the unordered
// controls count them all.
bool kernel_saw_old_x(Client& c, const Buffers& b, Problems& p) {
  CHECK_OK(c.device_synchronize());
  std::vector<uint8_t> out(kBytes);
  CHECK_OK(c.memcpy_d2h(out.data(), b.out, kBytes));
  return out == b.old_x;
}

sim::SlowCopyArgs slow_copy(const Buffers& b) { return {b.out, b.x, kBytes, 3000, 0}; }

}  // namespace

// The seed scenario: A launches a kernel on S that reads X late; B, after A
// returned, records an event on S, makes S2 wait for it and overwrites X on S2.
int seed_violations(Client& cl, int iterations, Problems& p) {
  Client* c = &cl;
  const uint32_t k = kernel(*c, "ordo_slow_copy", p);
  Buffers b = make_buffers(*c, p);
  Stream s, s2;
  CHECK_OK(c->stream_create(&s, kStreamNonBlocking));
  CHECK_OK(c->stream_create(&s2, kStreamNonBlocking));
  Event e;
  CHECK_OK(c->event_create(&e));
  int violations = 0;
  for (int i = 0; i < iterations; ++i) {
    reset(*c, b, p);
    a_then_b(
        [&] {
          auto args = slow_copy(b);
          CHECK_OK(c->launch(k, {1}, {1}, &args, sizeof args, s));
        },
        [&] {
          CHECK_OK(c->event_record(e, s));
          CHECK_OK(c->stream_wait_event(s2, e));
          CHECK_OK(c->memcpy_h2d_async(b.x, b.new_x.data(), kBytes, s2));
        });
    violations += !kernel_saw_old_x(*c, b, p);
  }
  CHECK_OK(c->stream_destroy(s));
  CHECK_OK(c->stream_destroy(s2));
  CHECK_OK(c->event_destroy(e));
  free_buffers(*c, b, p);
  return violations;
}

// The legacy default stream: work on it waits for blocking streams and the
// other way round. `legacy_first`: A uses the legacy stream and B a blocking one.
int legacy_violations(Client& cl, int iterations, bool legacy_first, Problems& p) {
  Client* c = &cl;
  const uint32_t k = kernel(*c, "ordo_slow_copy", p);
  Buffers b = make_buffers(*c, p);
  Stream s;
  CHECK_OK(c->stream_create(&s));  // blocking
  const Stream first = legacy_first ? kLegacyStream : s, second = legacy_first ? s : kLegacyStream;
  int violations = 0;
  for (int i = 0; i < iterations; ++i) {
    reset(*c, b, p);
    a_then_b(
        [&] {
          auto args = slow_copy(b);
          CHECK_OK(c->launch(k, {1}, {1}, &args, sizeof args, first));
        },
        [&] { CHECK_OK(c->memcpy_h2d_async(b.x, b.new_x.data(), kBytes, second)); });
    violations += !kernel_saw_old_x(*c, b, p);
  }
  CHECK_OK(c->stream_destroy(s));
  free_buffers(*c, b, p);
  return violations;
}

// Re-recording an event must not overtake an earlier wait on it: S2 waits for
// the record after the slow kernel on S; then (after that wait returned) the
// event is re-recorded on an idle S3. If the re-record were dispatched first,
// S2 would wait for S3 only and overwrite X while the kernel still sleeps.
int rerecord_violations(Client& cl, int iterations, Problems& p) {
  Client* c = &cl;
  const uint32_t k = kernel(*c, "ordo_slow_copy", p);
  Buffers b = make_buffers(*c, p);
  Stream s, s2, s3;
  CHECK_OK(c->stream_create(&s, kStreamNonBlocking));
  CHECK_OK(c->stream_create(&s2, kStreamNonBlocking));
  CHECK_OK(c->stream_create(&s3, kStreamNonBlocking));
  Event e;
  CHECK_OK(c->event_create(&e));
  int violations = 0;
  for (int i = 0; i < iterations; ++i) {
    reset(*c, b, p);
    auto args = slow_copy(b);
    CHECK_OK(c->launch(k, {1}, {1}, &args, sizeof args, s));
    CHECK_OK(c->event_record(e, s));
    a_then_b([&] { CHECK_OK(c->stream_wait_event(s2, e)); },
             [&] { CHECK_OK(c->event_record(e, s3)); });
    CHECK_OK(c->memcpy_h2d_async(b.x, b.new_x.data(), kBytes, s2));
    violations += !kernel_saw_old_x(*c, b, p);
  }
  CHECK_OK(c->stream_destroy(s));
  CHECK_OK(c->stream_destroy(s2));
  CHECK_OK(c->stream_destroy(s3));
  CHECK_OK(c->event_destroy(e));
  free_buffers(*c, b, p);
  return violations;
}

namespace {

enum class Kind { Stamp, Record, Wait, DeviceSync };

struct OpLog {
  Kind kind;
  int thread, phase, seq;  // seq: program order within the thread
  uint32_t ring = 0;  // the stream id (streams may share a ring; positions order one stream)
  uint64_t pos = 0;
  int event = -1;
  int stamp = -1;
  Edge record{};  // Wait: the record it refers to
  bool refers = false;
};

}  // namespace

ModelResult run_model(Client& cl, uint64_t seed, Problems& p, const ModelProgram& prog) {
  Client* c = &cl;
  const uint32_t stamp_k = kernel(*c, "ordo_stamp", p);
  std::vector<Stream> streams{kLegacyStream};
  std::vector<bool> blocking{true};
  for (int i = 0; i < 6; ++i) {
    Stream s;
    const bool nb = i % 2;
    CHECK_OK(c->stream_create(&s, nb ? kStreamNonBlocking : 0));
    streams.push_back(s);
    blocking.push_back(!nb);
  }
  std::vector<Event> events(prog.events);
  for (auto& e : events) CHECK_OK(c->event_create(&e));
  const int max_stamps = prog.threads * prog.phases * prog.ops_per_phase;
  uint64_t dstamps = 0;
  CHECK_OK(c->malloc(&dstamps, max_stamps * sizeof(sim::Stamp)));
  CHECK_OK(c->memset_async(dstamps, 0, max_stamps * sizeof(sim::Stamp), kLegacyStream));
  CHECK_OK(c->device_synchronize());

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
          CHECK_OK(c->event_record(events[ev], s));
        } else if (roll < 20 && ph % 2 == 1 && recorded[ev]) {
          op.kind = Kind::Wait;
          op.event = ev;
          op.record = last_record[ev];
          op.refers = true;
          CHECK_OK(c->stream_wait_event(s, events[ev]));
        } else if (roll < 23) {
          op.kind = Kind::DeviceSync;
          CHECK_OK(c->device_synchronize());
        } else {
          op.stamp = next_stamp++;
          sim::StampArgs a{dstamps, uint32_t(op.stamp), uint32_t(rng() % 200)};
          CHECK_OK(c->launch(stamp_k, {1}, {1}, &a, sizeof a, s));
        }
        if (op.kind != Kind::DeviceSync) {
          op.ring = s.id;  // the stream: positions are compared within one stream only
          op.pos = guest::last_position(*c);
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

  CHECK_OK(c->device_synchronize());
  const int n = next_stamp.load();
  std::vector<sim::Stamp> st(n);
  if (n) {
    CHECK_OK(c->memcpy_d2h(st.data(), dstamps, n * sizeof(sim::Stamp)));
  }

  ModelResult res;
  std::vector<const OpLog*> stamps;
  for (const OpLog& o : log)
    if (o.kind == Kind::Stamp) stamps.push_back(&o);
  res.stamps = stamps.size();
  for (const OpLog* o : stamps) {
    const sim::Stamp& s = st[o->stamp];
    if (!(s.start > 0 && s.end > s.start)) p.add("stamp " + std::to_string(o->stamp) + " never ran: a lost call");
  }
  auto hb = [](const OpLog& a, const OpLog& b) {
    return a.phase < b.phase || (a.thread == b.thread && a.seq < b.seq);
  };
  auto must_precede = [&](const OpLog& a, const OpLog& b, const char* rule) {
    if (st[a.stamp].end < st[b.stamp].start) return;
    if (res.violations++ == 0) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: stamp %d (stream %u pos %llu) overlaps or follows stamp %d (stream %u pos %llu)",
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
          if (streams[i].id == ring) return bool(blocking[i]);
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
  for (size_t i = 1; i < streams.size(); ++i) CHECK_OK(c->stream_destroy(streams[i]));
  for (auto& e : events) CHECK_OK(c->event_destroy(e));
  CHECK_OK(c->free(dstamps));
  return res;
}


}  // namespace ordo::scenario

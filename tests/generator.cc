// Random programs drawn from every stream/event API of the Client, checked
// against CUDA's ordering guarantees (see generator.h).
//
// Each thread owns private streams (created blocking or non-blocking at random,
// destroyed with work still pending and re-created, so rings are reused), its
// per-thread default stream (released when the thread exits without a
// synchronize), short-lived child threads with per-thread streams of their own,
// and private events (recorded on one stream and then re-recorded on another,
// waited on, destroyed with waits still pending, re-created). All threads also
// share the legacy stream and four created streams. Kernels are `ordo_stamp`s
// (start and end on one clock of the simulated device); afterwards every stamp
// must have run and every pair the program ordered must not overlap:
//   C1 stream order   same stream, earlier call
//   C2 event wait     work before the record a wait referred to -> work after the wait
//   C3 legacy stream  legacy <-> blocking-stream work ordered by happens-before
//   C4 device sync    work before cudaDeviceSynchronize -> work after it
//   C5 stream sync    a stream's work before cudaStreamSynchronize -> work after it
//   C7 event sync     work before the record -> work after cudaEventSynchronize (or a query that said done)
//   C6 host function  the thread's earlier work the stream follows -> the function -> the stream's later work
//                     (checked through pinned copies on both sides of it); a host-to-host copy (the
//                     caller's stream_order_wait) likewise follows that earlier work
// Happens-before across threads comes from barriers between phases and from
// joining child threads.
#include "generator.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "ordo/sim.h"

namespace ordo::scenario {
namespace {

#define GEN_OK(call)                                                              \
  do {                                                                            \
    const Status s_ = (call);                                                     \
    if (s_ != Status::kSuccess) p.add(std::string(#call) + " returned " + std::string(status_name(s_))); \
  } while (0)

enum class Kind { Stamp, Wait, DeviceSync, StreamSync, EventSync };

struct Logged {
  Kind kind;
  int thread = 0, phase = 0, seq = 0;
  uint64_t sid = 0;  // the generator's stream identity (rings are reused)
  bool legacy = false, blocking = false;
  uint64_t pos = 0;  // ring position of the call
  int stamp = -1;
  uint64_t rec_sid = 0, rec_end = 0;  // Wait: the record it refers to (ring position + 1)
};

struct GenStream {
  Stream s;
  uint64_t sid = 0;
  bool blocking = true, legacy = false;
};

struct GenEvent {
  Event e;
  bool recorded = false;
  uint64_t rec_sid = 0, rec_end = 0;
};

constexpr int kShared = 4;
constexpr uint64_t kScratch = 4096;

}  // namespace

ModelResult run_generated(Client& cl, uint64_t seed, Problems& p, const GenProgram& prog) {
  Client* c = &cl;
  uint32_t stamp_k = 0;
  GEN_OK(c->kernel_lookup("ordo_stamp", &stamp_k));
  std::atomic<uint64_t> next_sid{1};
  std::vector<GenStream> shared{{kLegacyStream, 0, true, true}};
  for (int i = 0; i < kShared; ++i) {
    GenStream g;
    g.blocking = i % 2 == 0;
    GEN_OK(c->stream_create(&g.s, g.blocking ? 0 : kStreamNonBlocking));
    g.sid = next_sid++;
    shared.push_back(g);
  }
  // Upper bound on stamps: every op a stamp, plus child bursts of up to 3.
  const int max_stamps = prog.threads * prog.phases * prog.ops_per_phase * 3;
  uint64_t dstamps = 0, scratch = 0;
  GEN_OK(c->malloc(&dstamps, max_stamps * sizeof(sim::Stamp)));
  GEN_OK(c->malloc(&scratch, kScratch * 2 * prog.threads));
  GEN_OK(c->memset_async(dstamps, 0, max_stamps * sizeof(sim::Stamp), kLegacyStream));
  GEN_OK(c->device_synchronize());

  // Host functions: a snapshot of the stamp the function must follow, copied
  // just before it, and the flag it sets, copied to the device just after it.
  const int max_hf = prog.threads * prog.phases * prog.ops_per_phase;
  void* hf_host = nullptr;
  GEN_OK(c->malloc_host(&hf_host, uint64_t(max_hf) * (sizeof(sim::Stamp) + 4)));
  auto* hf_snap = static_cast<sim::Stamp*>(hf_host);
  auto* hf_flag = reinterpret_cast<uint32_t*>(hf_snap + max_hf);
  std::memset(hf_host, 0, uint64_t(max_hf) * (sizeof(sim::Stamp) + 4));
  uint64_t hf_dev = 0;
  GEN_OK(c->malloc(&hf_dev, uint64_t(max_hf) * 4));
  GEN_OK(c->memset_async(hf_dev, 0, uint64_t(max_hf) * 4, kLegacyStream));
  GEN_OK(c->device_synchronize());
  std::atomic<int> next_hf{0}, hf_early{0};

  std::mutex log_mu;
  std::vector<Logged> log;
  std::atomic<int> next_stamp{0};
  std::barrier sync(prog.threads);

  auto body = [&](int th) {
    std::mt19937_64 rng(seed * 1000003 + uint64_t(th));
    int seq = 0;
    auto make_private = [&](GenStream* g) {
      g->blocking = rng() % 2;
      GEN_OK(c->stream_create(&g->s, g->blocking ? 0 : kStreamNonBlocking));
      g->sid = next_sid++;
    };
    const int npriv = std::max(prog.private_streams, 0);
    std::vector<GenStream> priv(static_cast<size_t>(npriv));
    for (int i = 0; i < npriv; ++i) make_private(&priv[i]);
    GenStream per_thread = shared[0];
    if (prog.per_thread) per_thread = {c->per_thread_stream(), next_sid++, true, false};
    GenEvent evs[2];
    for (auto& e : evs) GEN_OK(c->event_create(&e.e));
    auto pick = [&]() -> const GenStream& {
      const unsigned r = unsigned(rng() % (shared.size() + unsigned(npriv) + 1));
      if (r < shared.size()) return shared[r];
      if (r < shared.size() + unsigned(npriv)) return priv[r - shared.size()];
      return per_thread;
    };
    auto add = [&](Logged l) {
      std::lock_guard lock(log_mu);
      log.push_back(l);
    };
    Logged last{Kind::Stamp};  // this thread's latest stamp (stamp -1: none yet)
    auto stamp_on = [&](const GenStream& g, int phase) {
      Logged l{Kind::Stamp, th, phase, seq++, g.sid, g.legacy, g.blocking};
      l.stamp = next_stamp++;
      sim::StampArgs a{dstamps, uint32_t(l.stamp), uint32_t(rng() % 200)};
      GEN_OK(c->launch(stamp_k, {1}, {1}, &a, sizeof a, g.s));
      l.pos = c->last_position(g.s);
      add(l);
      last = l;
    };
    // Host-side work on g at index idx: if stream work issued now on g follows
    // `last` (C1 or C3), so must it. Then a copy of `last`'s stamp, queued on g
    // just before it, must show that stamp done. Returns whether it follows.
    auto snapshot_last = [&](const GenStream& g, int idx) {
      const bool follows = last.stamp >= 0 && (last.sid == g.sid || (g.legacy && !last.legacy && last.blocking) ||
                                               (!g.legacy && g.blocking && last.legacy));
      if (follows)
        GEN_OK(c->memcpy_d2h_async(&hf_snap[idx], dstamps + uint64_t(last.stamp) * sizeof(sim::Stamp),
                                   sizeof(sim::Stamp), g.s));
      return follows;
    };
    for (int ph = 0; ph < prog.phases; ++ph) {
      for (int k = 0; k < prog.ops_per_phase; ++k) {
        const int roll = int(rng() % 100);
        GenEvent& ev = evs[rng() % 2];
        GenStream& mine = npriv ? priv[rng() % unsigned(npriv)] : shared[1 + rng() % kShared];
        const bool has_mine = npriv > 0;
        if (roll < 38) {
          stamp_on(pick(), ph);
        } else if (roll < 42) {  // the host waits for an event: synchronize, a successful query, elapsed time
          if (!ev.recorded) continue;
          const unsigned which = unsigned(rng() % 3);
          Status st = Status::kSuccess;
          if (which == 0) {
            GEN_OK(st = c->event_synchronize(ev.e));
          } else if (which == 1) {
            st = c->event_query(ev.e);
            if (st != Status::kSuccess && st != Status::kNotReady) p.add("event_query failed");
          } else {
            float ms = 0;
            const Status e = c->event_elapsed(&ms, evs[0].e, evs[1].e);
            // Not ready, or never recorded (invalid handle), are CUDA's answers too.
            if (e != Status::kSuccess && e != Status::kNotReady && e != Status::kInvalidResourceHandle)
              p.add("event_elapsed failed");
            st = Status::kNotReady;  // orders nothing the checks use
          }
          if (st == Status::kSuccess) {
            Logged l{Kind::EventSync, th, ph, seq++};
            l.rec_sid = ev.rec_sid;
            l.rec_end = ev.rec_end;
            add(l);
          }
        } else if (roll < 52) {  // record, or re-record on another stream
          const GenStream& g = pick();
          GEN_OK(c->event_record(ev.e, g.s));
          ev.recorded = true;
          ev.rec_sid = g.sid;
          ev.rec_end = c->last_position(g.s) + 1;
        } else if (roll < 61) {
          if (!ev.recorded) continue;
          const GenStream& g = pick();
          GEN_OK(c->stream_wait_event(g.s, ev.e));
          Logged l{Kind::Wait, th, ph, seq++, g.sid, g.legacy, g.blocking};
          l.pos = c->last_position(g.s);
          l.rec_sid = ev.rec_sid;
          l.rec_end = ev.rec_end;
          add(l);
        } else if (roll < 66) {  // destroy with waits pending, then a new event
          GEN_OK(c->event_destroy(ev.e));
          ev = GenEvent{};
          GEN_OK(c->event_create(&ev.e));
        } else if (roll < 73 && has_mine) {  // destroy with work pending (ring reuse), maybe after a query's fence
          if (rng() % 2) {
            const Status q = c->stream_query(mine.s);
            if (q != Status::kSuccess && q != Status::kNotReady) p.add("stream_query failed");
          }
          GEN_OK(c->stream_destroy(mine.s));
          make_private(&mine);
        } else if (roll < 77 && has_mine) {
          const Status q = c->stream_query(mine.s);
          if (q != Status::kSuccess && q != Status::kNotReady) p.add("stream_query failed");
        } else if (roll < 81 && prog.per_thread) {  // a thread that exits with work pending on its per-thread stream
          std::thread child([&] {
            GenStream cs{c->per_thread_stream(), next_sid++, true, false};
            for (int n = 1 + int(rng() % 3); n-- > 0;) stamp_on(cs, ph);
          });
          child.join();
        } else if (roll < 84) {
          GEN_OK(c->device_synchronize());
          add({Kind::DeviceSync, th, ph, seq++});
        } else if (roll < 88) {
          const GenStream& g = pick();
          GEN_OK(c->stream_synchronize(g.s));
          add({Kind::StreamSync, th, ph, seq++, g.sid, g.legacy, g.blocking});
        } else if (roll < 94) {  // copies and fills on the thread's own scratch: every stream op
          const GenStream& g = pick();
          const uint64_t a = scratch + uint64_t(th) * 2 * kScratch;
          if (rng() % 2) GEN_OK(c->memset_async(a, uint8_t(rng()), kScratch, g.s));
          else GEN_OK(c->memcpy_d2d_async(a + kScratch, a, kScratch, g.s));
        } else if (roll < 97) {  // a host function on any stream kind
          const GenStream& g = pick();
          const int idx = next_hf++;
          if (idx >= max_hf) continue;
          const bool follows = snapshot_last(g, idx);
          const uint32_t nap = uint32_t(rng() % 300);
          // By value: the function runs on the client's thread, outside this frame's lifetime guarantees.
          GEN_OK(c->host_func(g.s, [hf_snap, hf_flag, early = &hf_early, idx, follows, nap] {
            if (follows && hf_snap[idx].end == 0) ++*early;
            std::this_thread::sleep_for(std::chrono::microseconds(nap));
            hf_flag[idx] = uint32_t(idx) + 1;
          }));
          GEN_OK(c->memcpy_h2d_async(hf_dev + uint64_t(idx) * 4, &hf_flag[idx], 4, g.s));
        } else if (roll < 99) {  // host-to-host cudaMemcpyAsync: synchronous, after what g's next work follows
          const GenStream& g = pick();
          const int idx = next_hf++;
          if (idx >= max_hf) continue;
          const bool follows = snapshot_last(g, idx);
          GEN_OK(c->stream_order_wait(g.s));
          if (follows && hf_snap[idx].end == 0) ++hf_early;
          hf_flag[idx] = uint32_t(idx) + 1;
          GEN_OK(c->memcpy_h2d_async(hf_dev + uint64_t(idx) * 4, &hf_flag[idx], 4, g.s));
        } else {
          stamp_on(pick(), ph);
        }
      }
      sync.arrive_and_wait();
    }
    // Leave with work pending: private streams destroyed, events destroyed,
    // and the per-thread stream released by the thread's exit, none synchronized.
    for (int i = 0; i < npriv; ++i) GEN_OK(c->stream_destroy(priv[i].s));
    for (auto& e : evs) GEN_OK(c->event_destroy(e.e));
  };
  std::vector<std::thread> ts;
  for (int th = 0; th < prog.threads; ++th) ts.emplace_back(body, th);
  for (auto& t : ts) t.join();

  GEN_OK(c->device_synchronize());
  const int n = next_stamp.load();
  std::vector<sim::Stamp> st(size_t(std::max(n, 1)));
  if (n) GEN_OK(c->memcpy_d2h(st.data(), dstamps, uint64_t(n) * sizeof(sim::Stamp)));
  // Read before any stamp could still be running: a stamp with no end means a
  // device-wide wait did not cover it (or it was lost).
  ModelResult res;
  std::vector<const Logged*> stamps;
  for (const Logged& o : log)
    if (o.kind == Kind::Stamp) stamps.push_back(&o);
  res.stamps = stamps.size();
  for (const Logged* o : stamps) {
    const sim::Stamp& s = st[size_t(o->stamp)];
    if (!(s.start > 0 && s.end > s.start))
      p.add("stamp " + std::to_string(o->stamp) + " had not run by the final device synchronize: lost or not waited for");
  }
  auto hb = [](const Logged& a, const Logged& b) { return a.phase < b.phase || (a.thread == b.thread && a.seq < b.seq); };
  auto violate = [&](const Logged& a, const Logged& b, const char* rule) {
    if (res.violations++ == 0) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: stamp %d (stream %llu pos %llu) overlaps or follows stamp %d (stream %llu pos %llu)",
                    rule, a.stamp, (unsigned long long)a.sid, (unsigned long long)a.pos, b.stamp,
                    (unsigned long long)b.sid, (unsigned long long)b.pos);
      res.first = buf;
    }
  };
  auto must_precede = [&](const Logged& a, const Logged& b, const char* rule) {
    if (st[size_t(a.stamp)].end >= st[size_t(b.stamp)].start) violate(a, b, rule);
  };
  // "Everything in `before` ends before anything in `after` starts", in O(n).
  auto all_precede = [&](auto&& before, auto&& after, const char* rule) {
    const Logged* last = nullptr;
    for (const Logged* a : stamps)
      if (before(*a) && (!last || st[size_t(a->stamp)].end > st[size_t(last->stamp)].end)) last = a;
    if (!last) return;
    for (const Logged* b : stamps)
      if (after(*b)) must_precede(*last, *b, rule);
  };
  for (const Logged* a : stamps)
    for (const Logged* b : stamps) {
      if (a == b) continue;
      if (a->sid == b->sid && a->pos < b->pos) must_precede(*a, *b, "C1 stream order");
      const bool pair = (a->legacy && !b->legacy && b->blocking) || (b->legacy && !a->legacy && a->blocking);
      if (pair && hb(*a, *b)) must_precede(*a, *b, "C3 legacy stream");
    }
  for (const Logged& o : log) {
    if (o.kind == Kind::Wait)
      all_precede([&](const Logged& a) { return a.sid == o.rec_sid && a.pos < o.rec_end; },
                  [&](const Logged& b) { return b.sid == o.sid && b.pos > o.pos; }, "C2 event wait");
    if (o.kind == Kind::DeviceSync)
      all_precede([&](const Logged& a) { return hb(a, o); }, [&](const Logged& b) { return hb(o, b); }, "C4 device sync");
    if (o.kind == Kind::StreamSync)
      all_precede([&](const Logged& a) { return a.sid == o.sid && hb(a, o); },
                  [&](const Logged& b) { return hb(o, b); }, "C5 stream sync");
    if (o.kind == Kind::EventSync)
      all_precede([&](const Logged& a) { return a.sid == o.rec_sid && a.pos < o.rec_end; },
                  [&](const Logged& b) { return hb(o, b); }, "C7 event synchronize");
  }
  const int hfs = std::min(next_hf.load(), max_hf);
  std::vector<uint32_t> flags(size_t(std::max(hfs, 1)));
  if (hfs) GEN_OK(c->memcpy_d2h(flags.data(), hf_dev, uint64_t(hfs) * 4));
  for (int i = 0; i < hfs; ++i)
    if (flags[size_t(i)] != uint32_t(i) + 1 && res.violations++ == 0)
      res.first = "C6 host function " + std::to_string(i) + ": the stream's next copy ran before it returned";
  if (hf_early.load() && res.violations++ == 0)
    res.first = "C6 host function: " + std::to_string(hf_early.load()) + " ran before the stream's earlier work (host functions or host-to-host copies)";
  res.host_functions = size_t(hfs);
  for (size_t i = 1; i < shared.size(); ++i) GEN_OK(c->stream_destroy(shared[i].s));
  GEN_OK(c->free(hf_dev));
  GEN_OK(c->free_host(hf_host));
  GEN_OK(c->free(dstamps));
  GEN_OK(c->free(scratch));
  return res;
}

}  // namespace ordo::scenario

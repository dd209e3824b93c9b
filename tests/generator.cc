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
// (start and end on one clock of the simulated device; one in five launched as
// a one-kernel graph, a GraphLaunch entry, half of those inside the body of a
// conditional node that its default value takes); afterwards every stamp
// must have run and every pair the program ordered must not overlap:
//   C1 stream order   same stream, earlier call
//   C2 event wait     work before the record a wait referred to -> work after the wait
//   C3 legacy stream  legacy <-> blocking-stream work ordered by happens-before
//   C4 device sync    work before cudaDeviceSynchronize -> work after it
//   C5 stream sync    a stream's work before cudaStreamSynchronize -> work after it
//   C7 event sync     work before the record -> work after cudaEventSynchronize (or a query that said done)
//   C6 host function  the thread's earlier work the stream follows (stamps, and its last host function)
//                     -> the function -> work after it: a copy of the flag it writes, queued on the same
//                     stream, across the legacy/blocking boundary (the legacy stream after a blocking
//                     stream's function or the reverse, cudaStreamPerThread included), by a synchronous
//                     cudaMemcpy, or on a stream that waited on an event recorded after it, must carry
//                     the flag; and a synchronizing call that covers it (stream, legacy stream, device,
//                     event synchronize, a query that said done) returns only after it returned. A
//                     host-to-host copy (the caller's stream_order_wait) likewise follows that earlier work
//   C8 peer copy      a copy to another device's memory, on a stream that follows the thread's last
//                     stamp (C1, C3, or a wait on an event recorded after it), carries that stamp's
//                     final value
// Happens-before across threads comes from barriers between phases and from
// joining child threads. With several devices every stream, event and buffer
// belongs to one; the legacy-stream rules (C3) and device-wide waits (C4) are
// per device, and event waits and copies cross devices.
#include "generator.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "guest/testing.h"
#include "ordo/sim.h"
#include "transport/graph_steps.h"

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
  uint32_t device = 0;
  uint64_t pos = 0;  // ring position of the call
  int stamp = -1;
  uint64_t rec_sid = 0, rec_end = 0;  // Wait: the record it refers to (ring position + 1)
};

struct GenStream {
  Stream s;
  uint64_t sid = 0;
  bool blocking = true, legacy = false;
  uint32_t device = 0;
};

struct GenEvent {
  Event e;
  uint32_t device = 0;
  bool recorded = false;
  uint64_t rec_sid = 0, rec_end = 0;
};

// Work issued now on stream `g` follows work issued earlier on stream `a` by
// stream order or the legacy stream's implicit synchronization (C1, C3).
bool follows(uint64_t sid, bool legacy, bool blocking, uint32_t device, const GenStream& g) {
  if (sid == g.sid) return true;
  if (device != g.device) return false;
  return (g.legacy && !legacy && blocking) || (!g.legacy && g.blocking && legacy);
}
bool follows_stamp(const Logged& last, const GenStream& g) {
  return last.stamp >= 0 && follows(last.sid, last.legacy, last.blocking, last.device, g);
}

// How the flag of a host function was copied to the device after it (C6).
enum class HfCopy : uint8_t { SameStream, AcrossLegacy, Synchronous, SynchronousPageable, EventWait };
const char* hf_copy_name(HfCopy h) {
  switch (h) {
    case HfCopy::SameStream: return "queued on its stream";
    case HfCopy::AcrossLegacy: return "queued across the legacy/blocking boundary";
    case HfCopy::Synchronous: return "a synchronous cudaMemcpy";
    case HfCopy::SynchronousPageable: return "a synchronous cudaMemcpy from pageable memory";
    case HfCopy::EventWait: return "queued on a stream that waited on an event recorded after it";
  }
  return "?";
}

uint32_t load_flag(uint32_t* f) { return std::atomic_ref<uint32_t>(*f).load(std::memory_order_acquire); }
void store_flag(uint32_t* f, uint32_t v) { std::atomic_ref<uint32_t>(*f).store(v, std::memory_order_release); }

constexpr int kShared = 4;
constexpr uint64_t kScratch = 4096;

}  // namespace

ModelResult run_generated(Client& cl, uint64_t seed, Problems& p, const GenProgram& prog) {
  Client* c = &cl;
  uint32_t stamp_k = 0, fill_k = 0;
  GEN_OK(c->kernel_lookup("ordo_stamp", &stamp_k));
  GEN_OK(c->kernel_lookup("ordo_fill_u32", &fill_k));
  if (uint32_t(std::max(prog.devices, 1)) > c->device_count())
    p.add("the program wants " + std::to_string(prog.devices) + " devices, the worker has " +
          std::to_string(c->device_count()));
  const uint32_t ndev = std::min(uint32_t(std::max(prog.devices, 1)), c->device_count());
  // Devices are current per thread (Client::set_device); the main thread ends on device 0.
  auto use = [&](uint32_t& cur, uint32_t d) {
    if (cur != d) GEN_OK(c->set_device(d));
    cur = d;
  };
  uint32_t main_dev = 0;
  std::atomic<uint64_t> next_sid{1};
  std::vector<GenStream> shared;
  for (uint32_t d = 0; d < ndev; ++d) shared.push_back({kLegacyStream, next_sid++, true, true, d});
  for (int i = 0; i < kShared; ++i) {
    GenStream g;
    g.blocking = i % 2 == 0;
    g.device = uint32_t(i) % ndev;
    use(main_dev, g.device);
    GEN_OK(c->stream_create(&g.s, g.blocking ? 0 : kStreamNonBlocking));
    g.sid = next_sid++;
    shared.push_back(g);
  }
  // Upper bound on stamps: every op a stamp, plus child bursts of up to 3.
  // Each device's kernels stamp into that device's memory (a kernel may not
  // touch another device's without peer access); stamp k lives at index k
  // in its device's buffer. Peer snapshots of stamps go to psnap.
  const int max_stamps = prog.threads * prog.phases * prog.ops_per_phase * 3;
  const int max_pc = prog.threads * prog.phases * prog.ops_per_phase;
  std::vector<uint64_t> dstamps(ndev), scratch(ndev), psnap(ndev);
  for (uint32_t d = 0; d < ndev; ++d) {
    use(main_dev, d);
    GEN_OK(c->malloc(&dstamps[d], max_stamps * sizeof(sim::Stamp)));
    GEN_OK(c->malloc(&scratch[d], kScratch * 2 * prog.threads));
    GEN_OK(c->malloc(&psnap[d], max_pc * sizeof(sim::Stamp)));
    GEN_OK(c->memset_async(dstamps[d], 0, max_stamps * sizeof(sim::Stamp), kLegacyStream));
    GEN_OK(c->memset_async(psnap[d], 0, max_pc * sizeof(sim::Stamp), kLegacyStream));
    GEN_OK(c->device_synchronize());
  }
  use(main_dev, 0);
  struct PeerSnap {
    int stamp;
    uint32_t device;
  };
  std::vector<PeerSnap> pcs(size_t(std::max(max_pc, 1)), PeerSnap{-1, 0});  // -1: index drawn, nothing copied
  std::atomic<int> next_pc{0};

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
  std::vector<HfCopy> hf_copy(size_t(std::max(max_hf, 1)), HfCopy::SameStream);
  // The flags again, in pageable memory: a synchronous copy from pageable
  // memory reads its source when the call is made, not when the stream runs.
  std::vector<uint32_t> hf_page(size_t(std::max(max_hf, 1)), 0);
  std::atomic<int> hf_unfinished{0};
  std::string hf_unfinished_first;  // under log_mu

  std::mutex log_mu;
  std::vector<Logged> log;
  std::atomic<int> next_stamp{0};
  std::barrier sync(prog.threads);

  auto body = [&](int th) {
    std::mt19937_64 rng(seed * 1000003 + uint64_t(th));
    int seq = 0;
    uint32_t cur = 0;  // this thread's current device
    auto make_private = [&](GenStream* g) {
      g->blocking = rng() % 2;
      g->device = uint32_t(rng() % ndev);
      use(cur, g->device);
      GEN_OK(c->stream_create(&g->s, g->blocking ? 0 : kStreamNonBlocking));
      g->sid = next_sid++;
    };
    auto make_event = [&](GenEvent* e) {
      *e = GenEvent{};
      e->device = uint32_t(rng() % ndev);
      use(cur, e->device);
      GEN_OK(c->event_create(&e->e));
    };
    const int npriv = std::max(prog.private_streams, 0);
    std::vector<GenStream> priv(static_cast<size_t>(npriv));
    for (int i = 0; i < npriv; ++i) make_private(&priv[i]);
    GenStream per_thread = shared[0];
    if (prog.per_thread) {
      const uint32_t d = uint32_t(rng() % ndev);
      use(cur, d);
      per_thread = {c->per_thread_stream(), next_sid++, true, false, d};
    }
    GenEvent evs[2];
    for (auto& e : evs) make_event(&e);
    // Any stream; the thread makes its device current first, as a program
    // does before using a stream (and as stream 0 needs: it names the current
    // device's legacy stream).
    auto pick = [&]() -> const GenStream& {
      const unsigned r = unsigned(rng() % (shared.size() + unsigned(npriv) + 1));
      const GenStream& g = r < shared.size() ? shared[r] : r < shared.size() + unsigned(npriv) ? priv[r - shared.size()] : per_thread;
      use(cur, g.device);
      return g;
    };
    // A stream of device d (its legacy stream at least).
    auto pick_on = [&](uint32_t d) -> const GenStream& {
      std::vector<const GenStream*> on;
      for (const auto& g : shared)
        if (g.device == d) on.push_back(&g);
      for (const auto& g : priv)
        if (g.device == d) on.push_back(&g);
      if (per_thread.device == d) on.push_back(&per_thread);
      const GenStream& g = *on[rng() % on.size()];
      use(cur, d);
      return g;
    };
    auto add = [&](Logged l) {
      std::lock_guard lock(log_mu);
      log.push_back(l);
    };
    Logged last{Kind::Stamp};  // this thread's latest stamp (stamp -1: none yet)
    uint64_t covered_sid = 0;  // a stream that waited on an event recorded after `last`
    auto stamp_on = [&](const GenStream& g, int phase) {
      Logged l{Kind::Stamp, th, phase, seq++, g.sid, g.legacy, g.blocking, g.device};
      l.stamp = next_stamp++;
      sim::StampArgs a{dstamps[g.device], uint32_t(l.stamp), uint32_t(rng() % 200)};
      if (rng() % 5 == 0) {
        // As a CUDA graph's launch: one GraphLaunch entry, the graph destroyed
        // at once (the worker keeps it for the launch still in the ring).
        GraphStepWriter w;
        uint64_t h = 0;
        if (rng() % 2 == 0 && c->graph_cond_handle(g.device, &h) == Status::kSuccess) {
          // Half of them with the stamp in the conditional body its handle's
          // default value picks: the worker runs the graph as one program.
          const uint32_t shape = uint32_t(rng() % 3);  // IF, IF/ELSE, SWITCH
          const uint32_t pick = shape == 0 ? 1 : shape == 1 ? uint32_t(rng() % 2) : uint32_t(rng() % 3);
          const uint32_t bodies = shape == 0 ? 1 : shape == 1 ? 2 : 3;
          w.handle({h, pick, kCondAssignDefault});
          w.cond({h, shape == 2 ? uint32_t(CondType::kSwitch) : uint32_t(CondType::kIf), bodies});
          for (uint32_t b = 0; b < bodies; ++b) {
            const size_t at = w.begin_body();
            // The IF's body 0 runs on a nonzero value, its ELSE (body 1) on zero.
            const bool taken = shape == 2 ? b == pick : shape == 0 ? true : (b == 0) == (pick != 0);
            // A body that must not run faults if it does: its kernel writes outside every allocation.
            const sim::FillU32Args bad{0x10, 1, 0, 0};
            if (taken) w.kernel({stamp_k, 0, {1, 1, 1}, {1, 1, 1}, sizeof a, 0}, &a);
            else w.kernel({fill_k, 0, {1, 1, 1}, {1, 1, 1}, sizeof bad, 0}, &bad);
            w.end_body(at);
          }
        } else {
          w.kernel({stamp_k, 0, {1, 1, 1}, {1, 1, 1}, sizeof a, 0}, &a);
        }
        uint32_t graph = 0;
        GEN_OK(c->graph_create(w.bytes().data(), w.bytes().size(), &graph));
        GEN_OK(c->graph_launch(graph, g.s));
        l.pos = guest::last_position(*c);
        GEN_OK(c->graph_destroy(graph));
      } else {
        GEN_OK(c->launch(stamp_k, {1}, {1}, &a, sizeof a, g.s));
        l.pos = guest::last_position(*c);
      }
      add(l);
      last = l;
      covered_sid = 0;
    };
    auto last_addr = [&] { return dstamps[last.device] + uint64_t(last.stamp) * sizeof(sim::Stamp); };
    // Host-side work on g at index idx: if stream work issued now on g follows
    // `last` (C1 or C3), so must it. Then a copy of `last`'s stamp, queued on g
    // just before it, must show that stamp done. Returns whether it follows.
    auto snapshot_last = [&](const GenStream& g, int idx) {
      const bool after = follows_stamp(last, g);
      if (after) GEN_OK(c->memcpy_d2h_async(&hf_snap[idx], last_addr(), sizeof(sim::Stamp), g.s));
      return after;
    };
    // This thread's latest host function and its stream: work issued now on a
    // stream that follows that stream (C1, C3) runs after the function returned.
    int last_hf = -1;
    GenStream last_hf_on;
    auto follows_hf = [&](const GenStream& g) {
      return last_hf >= 0 && follows(last_hf_on.sid, last_hf_on.legacy, last_hf_on.blocking, last_hf_on.device, g)
                 ? last_hf
                 : -1;
    };
    // Streams on the other side of the legacy/blocking boundary from g, on its device.
    auto across_legacy = [&](const GenStream& g) {
      std::vector<const GenStream*> out;
      auto consider = [&](const GenStream& h) {
        if (h.sid != g.sid && follows(g.sid, g.legacy, g.blocking, g.device, h)) out.push_back(&h);
      };
      for (const auto& h : shared) consider(h);
      for (const auto& h : priv) consider(h);
      consider(per_thread);
      return out;
    };
    auto record = [&](GenEvent& e, const GenStream& g) {
      GEN_OK(c->event_record(e.e, g.s));
      e.recorded = true;
      e.rec_sid = g.sid;
      e.rec_end = guest::last_position(*c) + 1;
    };
    auto wait_on = [&](const GenStream& g, GenEvent& e, int phase) {
      GEN_OK(c->stream_wait_event(g.s, e.e));
      Logged l{Kind::Wait, th, phase, seq++, g.sid, g.legacy, g.blocking, g.device};
      l.pos = guest::last_position(*c);
      l.rec_sid = e.rec_sid;
      l.rec_end = e.rec_end;
      add(l);
      if (last.stamp >= 0 && e.rec_sid == last.sid && e.rec_end > last.pos) covered_sid = g.sid;
    };
    // A host function on any stream kind, then a copy of the flag it writes on
    // a stream that must follow it, maybe after a synchronizing call that must
    // cover it.
    auto host_function = [&](GenEvent& ev, int phase) {
      const GenStream& g = pick();
      const int idx = next_hf++;
      if (idx >= max_hf) return;
      const bool after_stamp = snapshot_last(g, idx);
      const int prev = follows_hf(g);
      const uint32_t nap = uint32_t(rng() % 300);
      // By value: the function runs on the client's thread, outside this frame's lifetime guarantees.
      GEN_OK(c->host_func(g.s, [hf_snap, hf_flag, page = hf_page.data(), early = &hf_early, idx, after_stamp, prev, nap] {
        if (after_stamp && hf_snap[idx].end == 0) ++*early;
        if (prev >= 0 && load_flag(&hf_flag[prev]) != uint32_t(prev) + 1) ++*early;
        std::this_thread::sleep_for(std::chrono::microseconds(nap));
        store_flag(&page[idx], uint32_t(idx) + 1);
        store_flag(&hf_flag[idx], uint32_t(idx) + 1);
      }));
      last_hf = idx;
      last_hf_on = g;
      if (rng() % 3 == 0) {  // a synchronizing call that covers the function
        const char* what = nullptr;
        Status st = Status::kSuccess;
        switch (rng() % 5) {
          case 0:
            what = "cudaStreamSynchronize of its stream";
            GEN_OK(st = c->stream_synchronize(g.s));
            add({Kind::StreamSync, th, phase, seq++, g.sid, g.legacy, g.blocking, g.device});
            break;
          case 1:
            what = "cudaDeviceSynchronize";
            GEN_OK(st = c->device_synchronize());
            add({Kind::DeviceSync, th, phase, seq++, 0, false, false, g.device});
            break;
          case 2:
            if (!g.legacy && !g.blocking) break;
            what = "cudaStreamSynchronize of the legacy stream";
            GEN_OK(st = c->stream_synchronize(kLegacyStream));
            add({Kind::StreamSync, th, phase, seq++, shared[g.device].sid, true, true, g.device});
            break;
          case 3:
            if (ev.device != g.device) break;
            what = "cudaEventSynchronize of an event recorded after it";
            record(ev, g);
            GEN_OK(st = c->event_synchronize(ev.e));
            break;
          default:
            what = "cudaStreamQuery of its stream";
            st = c->stream_query(g.s);
            if (st != Status::kSuccess && st != Status::kNotReady) p.add("stream_query failed");
            break;
        }
        if (what && st == Status::kSuccess && load_flag(&hf_flag[idx]) != uint32_t(idx) + 1 && hf_unfinished++ == 0) {
          std::lock_guard lock(log_mu);
          hf_unfinished_first = std::string(what) + " returned before host function " + std::to_string(idx) +
                                " on stream " + std::to_string(g.sid) + (g.legacy ? " (legacy)" : g.blocking ? " (blocking)" : " (non-blocking)") +
                                " returned";
        }
      }
      const GenStream* to = &g;
      HfCopy how = HfCopy::SameStream;
      switch (rng() % 4) {
        case 0:
          break;
        case 1:
          if (const auto other = across_legacy(g); !other.empty()) {
            to = other[rng() % other.size()];
            how = HfCopy::AcrossLegacy;
          }
          break;
        case 2:
          if (g.legacy || g.blocking) how = rng() % 2 ? HfCopy::Synchronous : HfCopy::SynchronousPageable;
          break;
        default:
          if (ev.device == g.device) {
            record(ev, g);
            to = &pick();
            wait_on(*to, ev, phase);
            how = HfCopy::EventWait;
          }
          break;
      }
      hf_copy[size_t(idx)] = how;
      const bool sync = how == HfCopy::Synchronous || how == HfCopy::SynchronousPageable;
      use(cur, sync ? g.device : to->device);
      if (how == HfCopy::SynchronousPageable) GEN_OK(c->memcpy_h2d(hf_dev + uint64_t(idx) * 4, &hf_page[size_t(idx)], 4));
      else if (sync) GEN_OK(c->memcpy_h2d(hf_dev + uint64_t(idx) * 4, &hf_flag[idx], 4));
      else GEN_OK(c->memcpy_h2d_async(hf_dev + uint64_t(idx) * 4, &hf_flag[idx], 4, to->s));
    };
    for (int ph = 0; ph < prog.phases; ++ph) {
      for (int k = 0; k < prog.ops_per_phase; ++k) {
        const int roll = int(rng() % 100);
        GenEvent& ev = evs[rng() % 2];
        GenStream& mine = npriv ? priv[rng() % unsigned(npriv)] : shared[1 + rng() % kShared];
        const bool has_mine = npriv > 0;
        if (roll < 35) {
          stamp_on(pick(), ph);
        } else if (roll < 38) {
          host_function(ev, ph);
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
        } else if (roll < 52) {  // record, or re-record on another stream (of the event's device)
          if (ndev > 1 && rng() % 8 == 0) {
            const GenStream& g = pick();
            if (g.device != ev.device) {
              // CUDA refuses an event of another device, at once; the event keeps its record.
              const Status st = c->event_record(ev.e, g.s);
              if (st != Status::kInvalidResourceHandle)
                p.add("event_record on another device's stream returned " + std::string(status_name(st)));
              continue;
            }
          }
          record(ev, pick_on(ev.device));
        } else if (roll < 61) {  // a wait, by a stream of any device
          if (!ev.recorded) continue;
          wait_on(pick(), ev, ph);
        } else if (roll < 66) {  // destroy with waits pending, then a new event
          GEN_OK(c->event_destroy(ev.e));
          make_event(&ev);
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
            // A new thread starts on device 0; it may switch to another.
            const uint32_t d = uint32_t(rng() % ndev);
            if (d) GEN_OK(c->set_device(d));
            GenStream cs{c->per_thread_stream(), next_sid++, true, false, d};
            for (int n = 1 + int(rng() % 3); n-- > 0;) stamp_on(cs, ph);
          });
          child.join();
          covered_sid = 0;  // `last` is the child's now
        } else if (roll < 84) {
          use(cur, uint32_t(rng() % ndev));
          GEN_OK(c->device_synchronize());
          Logged l{Kind::DeviceSync, th, ph, seq++};
          l.device = cur;
          add(l);
        } else if (roll < 88) {
          const GenStream& g = pick();
          GEN_OK(c->stream_synchronize(g.s));
          add({Kind::StreamSync, th, ph, seq++, g.sid, g.legacy, g.blocking, g.device});
        } else if (roll < 91 && ndev > 1) {  // a peer copy of the last stamp, on a stream that follows it
          std::vector<const GenStream*> after;
          auto consider = [&](const GenStream& g) {
            if (follows_stamp(last, g) || g.sid == covered_sid) after.push_back(&g);
          };
          for (const auto& g : shared) consider(g);
          for (const auto& g : priv) consider(g);
          consider(per_thread);
          if (after.empty()) continue;
          const GenStream& g = *after[rng() % after.size()];
          use(cur, g.device);
          const int idx = next_pc++;
          if (idx >= max_pc) continue;
          const uint32_t to = (g.device + 1 + uint32_t(rng() % (ndev - 1))) % ndev;  // another device's memory
          pcs[size_t(idx)] = {last.stamp, to};
          GEN_OK(c->memcpy_peer_async(psnap[to] + uint64_t(idx) * sizeof(sim::Stamp), to, last_addr(), last.device,
                                      sizeof(sim::Stamp), g.s));
        } else if (roll < 94) {  // copies and fills on the thread's own scratch: every stream op
          const GenStream& g = pick();
          const uint64_t a = scratch[g.device] + uint64_t(th) * 2 * kScratch;
          if (rng() % 2) GEN_OK(c->memset_async(a, uint8_t(rng()), kScratch, g.s));
          else GEN_OK(c->memcpy_d2d_async(a + kScratch, a, kScratch, g.s));
        } else if (roll < 97) {
          host_function(ev, ph);
        } else if (roll < 99) {  // host-to-host cudaMemcpyAsync: synchronous, after what g's next work follows
          const GenStream& g = pick();
          const int idx = next_hf++;
          if (idx >= max_hf) continue;
          const bool after_stamp = snapshot_last(g, idx);
          const int prev = follows_hf(g);
          GEN_OK(c->stream_order_wait(g.s));
          if (after_stamp && hf_snap[idx].end == 0) ++hf_early;
          if (prev >= 0 && load_flag(&hf_flag[prev]) != uint32_t(prev) + 1) ++hf_early;
          store_flag(&hf_flag[idx], uint32_t(idx) + 1);
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

  for (uint32_t d = 0; d < ndev; ++d) {
    use(main_dev, d);
    GEN_OK(c->device_synchronize());
  }
  use(main_dev, 0);
  const int n = next_stamp.load();
  std::vector<sim::Stamp> st(size_t(std::max(n, 1)));
  {
    std::vector<uint32_t> device_of(size_t(std::max(n, 1)));
    for (const Logged& o : log)
      if (o.kind == Kind::Stamp) device_of[size_t(o.stamp)] = o.device;
    std::vector<sim::Stamp> all(size_t(std::max(n, 1)));
    for (uint32_t d = 0; d < ndev && n; ++d) {
      GEN_OK(c->memcpy_d2h(all.data(), dstamps[d], uint64_t(n) * sizeof(sim::Stamp)));
      for (int i = 0; i < n; ++i)
        if (device_of[size_t(i)] == d) st[size_t(i)] = all[size_t(i)];
    }
  }
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
      const bool pair = a->device == b->device &&
                        ((a->legacy && !b->legacy && b->blocking) || (b->legacy && !a->legacy && a->blocking));
      if (pair && hb(*a, *b)) must_precede(*a, *b, "C3 legacy stream");
    }
  for (const Logged& o : log) {
    if (o.kind == Kind::Wait)
      all_precede([&](const Logged& a) { return a.sid == o.rec_sid && a.pos < o.rec_end; },
                  [&](const Logged& b) { return b.sid == o.sid && b.pos > o.pos; }, "C2 event wait");
    if (o.kind == Kind::DeviceSync)
      all_precede([&](const Logged& a) { return a.device == o.device && hb(a, o); },
                  [&](const Logged& b) { return hb(o, b); }, "C4 device sync");
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
      res.first = "C6 host function " + std::to_string(i) + ": the copy of its flag (" +
                  hf_copy_name(hf_copy[size_t(i)]) + ") ran before it returned";
  if (hf_unfinished.load() && res.violations++ == 0)
    res.first = "C6 host function: " + std::to_string(hf_unfinished.load()) + " synchronizing calls returned early; first: " +
                hf_unfinished_first;
  if (hf_early.load() && res.violations++ == 0)
    res.first = "C6 host function: " + std::to_string(hf_early.load()) + " ran before the stream's earlier work (host functions or host-to-host copies)";
  res.host_functions = size_t(hfs);
  const int npcs = std::min(next_pc.load(), max_pc);
  for (uint32_t d = 0; d < ndev && npcs; ++d) {
    std::vector<sim::Stamp> snaps(static_cast<size_t>(npcs));
    GEN_OK(c->memcpy_d2h(snaps.data(), psnap[d], uint64_t(npcs) * sizeof(sim::Stamp)));
    for (int i = 0; i < npcs; ++i) {
      const PeerSnap& pc = pcs[size_t(i)];
      if (pc.device != d || pc.stamp < 0) continue;
      ++res.peer_copies;
      const sim::Stamp& want = st[size_t(pc.stamp)];
      if ((snaps[size_t(i)].start != want.start || snaps[size_t(i)].end != want.end) && res.violations++ == 0)
        res.first = "C8 peer copy " + std::to_string(i) + " to device " + std::to_string(d) + " of stamp " +
                    std::to_string(pc.stamp) + " ran before that stamp ended";
    }
  }
  for (size_t i = ndev; i < shared.size(); ++i) GEN_OK(c->stream_destroy(shared[i].s));
  GEN_OK(c->free(hf_dev));
  GEN_OK(c->free_host(hf_host));
  for (uint32_t d = 0; d < ndev; ++d) {
    GEN_OK(c->free(dstamps[d]));
    GEN_OK(c->free(scratch[d]));
    GEN_OK(c->free(psnap[d]));
  }
  return res;
}

}  // namespace ordo::scenario

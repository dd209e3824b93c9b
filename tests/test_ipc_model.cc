// Random programs over 2 to 4 guest sessions of one region (guest processes,
// each with a worker of its own, sharing one IpcTable as the supervisor's
// parts do) that share device memory and interprocess events (cudaIpc*),
// checked against what CUDA promises across processes (ARCHITECTURE.md,
// "Sessions"; client.h, Client::ipc_*).
//
// What a program draws (Generator below). Every session has the legacy stream,
// one or two blocking and one or two non-blocking streams shared by its one to
// three host threads, and per thread the thread's per-thread stream and a
// private stream that is destroyed with work pending and made again (blocking
// or not). Sessions export device buffers (some of 1 MiB); other sessions open
// them (some twice, some again and closed again mid-program). Interprocess
// events (kEventInterprocess | kEventDisableTiming) are created mid-program and
// exported; their tokens go to other sessions, which open them and may say so
// back. Each event carries a baton: its holder (any session holding the
// event, exporter or importer) acquires the event's current record (a stream
// wait, an event synchronize, or event queries until one says done), writes
// new slots of shared buffers (its own or opened ones) on streams that follow
// the acquire (ordo_stamp, slow, sometimes as a graph; ordo_slow_copy; memset;
// copies from pinned host or device memory), reads slots, records the event
// (maybe twice, on any stream that follows what it wrote), and sends a message
// (the token and the number of the record it just made) to the next holder
// and to observers, through an in-process queue: the pipe a real program would
// use. Mostly a turn is one burst (writes, record, message), as in a pipeline,
// so that the next holder's wait comes while the writes still run. An
// observer acquires the record it was told of and reads slots through its own
// addresses (copies to device, slow copies, copies to pinned and pageable host
// memory, synchronous copies), and may pass the message on. Holders destroy
// their handles: the exporter only once it knows every open happened (a token
// that comes after the destroy must not open; the copies opened before must
// go on working). Noise: writes to private scratch, stream queries and
// synchronizes, device synchronizes.
//
// The model. Every slot is written once. Record k of an event covers (cov(k))
// every slot written before it along the baton's chain: each holder acquires
// the previous record before it writes, and records on a stream that follows
// what it wrote (the same stream, or across the legacy stream's implicit
// synchronization; after a host-side acquire or a copy to host that returned,
// any stream). Only the baton holder records, and a record returns once its
// worker dispatched it, so a wait issued after the message about record r
// captures a record k >= r, and cov(k) includes cov(r): a read that follows
// the acquire must see exactly the final value of its slot. Final values are
// read at the end (through an importer when the owner freed its buffer first)
// and must be what the write wrote (a stamp that ran; a fill's or copy's bytes).
//
// Cases: in-process sessions with WorkerOptions::chaos_seed on one or two
// sessions (it spins: more would starve a 2-core machine), several dispatch
// threads, kernels of 40-260 us or 8 times that; the supervisor's worker
// processes (--sessions 4); and a control with ordering switched off
// (WorkerOptions.ordered = false, ClientOptions.ordered = false) that must see
// violations. The failure report prints the seed, the violated reads and the
// program (one serial order of its actions).
//
// ORDO_IPC_MODEL_ROUNDS sets the in-process rounds (18; sanitizer builds run a
// third of them); ORDO_IPC_MODEL_SEED=N runs seed N alone and
// ORDO_IPC_MODEL_PRINT=1 prints every program.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"
#include "transport/graph_steps.h"
#include "worker/backends/sim/sim_backend.h"
#include "worker/ipc_table.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using sim::Stamp;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr uint32_t kIpcEventFlags = uint32_t(kEventInterprocess | kEventDisableTiming);
constexpr int kSlotsPerBuffer = 96;
constexpr int kMaxSlots = 360;
constexpr int kMaxReads = 900;
constexpr int kMaxEvents = 10;       // per program
constexpr int kMaxLiveEvents = 4;    // at once
constexpr uint64_t kScratch = 4096;  // per thread

enum class SK : uint8_t { Legacy, Blocking, NonBlocking };
enum class Acq : uint8_t { StreamWait, Synchronize, QueryPoll };
enum class WriteHow : uint8_t { Stamp, StampGraph, SlowCopy, Memset, CopyH2D, CopyD2D };
enum class ReadHow : uint8_t { CopyD2D, SlowCopy, CopyD2HPinned, CopyD2HPageable, SyncD2H };
enum class MsgKind : uint8_t { Token, Baton, Notify, StaleToken, Opened };
enum class AK : uint8_t {
  Create,
  Open,
  StaleOpen,
  Acquire,
  Write,
  Record,
  Send,
  Read,
  Destroy,
  Reopen,
  CloseMem,
  Recreate,
  Noise,
  End,
  Ack
};

const char* name(SK k) { return k == SK::Legacy ? "legacy" : k == SK::Blocking ? "blocking" : "non-blocking"; }
const char* name(Acq a) {
  return a == Acq::StreamWait ? "stream wait" : a == Acq::Synchronize ? "event synchronize" : "event query poll";
}
const char* name(WriteHow w) {
  switch (w) {
    case WriteHow::Stamp:
      return "ordo_stamp";
    case WriteHow::StampGraph:
      return "ordo_stamp in a graph";
    case WriteHow::SlowCopy:
      return "ordo_slow_copy from device";
    case WriteHow::Memset:
      return "memset";
    case WriteHow::CopyH2D:
      return "copy from pinned host";
    case WriteHow::CopyD2D:
      return "copy from device";
  }
  return "?";
}
const char* name(ReadHow r) {
  switch (r) {
    case ReadHow::CopyD2D:
      return "copy to device";
    case ReadHow::SlowCopy:
      return "ordo_slow_copy to device";
    case ReadHow::CopyD2HPinned:
      return "async copy to pinned host";
    case ReadHow::CopyD2HPageable:
      return "async copy to pageable host";
    case ReadHow::SyncD2H:
      return "synchronous copy to host";
  }
  return "?";
}
const char* name(MsgKind m) {
  switch (m) {
    case MsgKind::Token:
      return "token";
    case MsgKind::Baton:
      return "baton";
    case MsgKind::Notify:
      return "notify";
    case MsgKind::StaleToken:
      return "stale token";
    case MsgKind::Opened:
      return "opened";
  }
  return "?";
}

struct Msg {
  MsgKind kind;
  int ev, from_s, from_t, to_s, to_t;
  uint64_t record;
};

struct Act {
  AK k;
  int ev = -1, msg = -1, stream = -1, slot = -1, read = -1, buf = -1;
  uint8_t how = 0;
  uint32_t sleep_us = 0;
  uint64_t record = 0;
};

struct SlotInfo {
  int buf, index, s, t, ev, stream;
  WriteHow how;
  uint64_t first_record = 0;  // the first record of `ev` that covers it (0: none)
};
struct ReadInfo {
  int slot, s, t, ev, msg, stream;
  ReadHow how;
  Acq acq;
  uint64_t record;  // the record the reader acquired (at least)
  bool in_turn;
};
struct BufInfo {
  int owner;
  uint64_t size;
  int used = 0;
  std::vector<char> opened, twice;  // per session
};

struct Program {
  uint64_t seed = 0;
  int sessions = 0, nb = 1, nn = 1;
  std::vector<int> threads;
  std::vector<std::vector<SK>> initial_kind;  // [session][stream id]
  std::vector<BufInfo> bufs;
  std::vector<SlotInfo> slots;
  std::vector<ReadInfo> reads;
  std::vector<Msg> msgs;
  int events = 0;
  std::vector<std::vector<std::vector<Act>>> script;  // [session][thread]
  struct Placed {
    int s, t, i;
  };
  std::vector<Placed> order;  // the serial order the generator drew (one valid interleaving)
  bool owners_free_first = false;

  int pt_id(int t) const { return 1 + nb + nn + 2 * t; }
  int priv_id(int t) const { return 2 + nb + nn + 2 * t; }
  int streams(int s) const { return 1 + nb + nn + 2 * threads[size_t(s)]; }
  std::string stream_name(int s, int id) const {
    if (id == 0) return "s" + std::to_string(s) + ":legacy";
    if (id <= nb) return "s" + std::to_string(s) + ":blocking" + std::to_string(id);
    if (id <= nb + nn) return "s" + std::to_string(s) + ":nonblocking" + std::to_string(id - nb);
    const int t = (id - 1 - nb - nn) / 2;
    return "s" + std::to_string(s) + (id == pt_id(t) ? ":per-thread(t" : ":private(t") + std::to_string(t) + ")";
  }
  std::string describe(int s, int t, const Act& a) const;
  std::string listing(size_t max_lines = 600) const;
};

std::string Program::describe(int s, int t, const Act& a) const {
  char buf[320];
  const std::string who = "s" + std::to_string(s) + ".t" + std::to_string(t) + ": ";
  const std::string st = a.stream >= 0 ? stream_name(s, a.stream) : "";
  switch (a.k) {
    case AK::Create:
      std::snprintf(buf, sizeof buf, "create e%d and export it%s", a.ev,
                    a.how ? " (and try to open its own token)" : "");
      break;
    case AK::Open:
      std::snprintf(buf, sizeof buf, "open e%d from msg %d", a.ev, a.msg);
      break;
    case AK::StaleOpen:
      std::snprintf(buf, sizeof buf, "open e%d from msg %d after its exporter destroyed it: must fail", a.ev, a.msg);
      break;
    case AK::Acquire: {
      const Msg& m = msgs[size_t(a.msg)];
      std::snprintf(buf, sizeof buf, "recv msg %d (%s e%d record %llu from s%d.t%d), acquire by %s%s%s", a.msg,
                    name(m.kind), a.ev, (unsigned long long)a.record, m.from_s, m.from_t, name(Acq(a.how)),
                    Acq(a.how) == Acq::StreamWait ? " on " : "", Acq(a.how) == Acq::StreamWait ? st.c_str() : "");
      break;
    }
    case AK::Write: {
      const SlotInfo& sl = slots[size_t(a.slot)];
      std::snprintf(buf, sizeof buf, "write slot %d (buffer %d [%d], of s%d) by %s on %s (e%d's turn)", a.slot, sl.buf,
                    sl.index, bufs[size_t(sl.buf)].owner, name(WriteHow(a.how)), st.c_str(), a.ev);
      break;
    }
    case AK::Record:
      std::snprintf(buf, sizeof buf, "record e%d on %s: record %llu", a.ev, st.c_str(), (unsigned long long)a.record);
      break;
    case AK::Send: {
      const Msg& m = msgs[size_t(a.msg)];
      std::snprintf(buf, sizeof buf, "send msg %d (%s e%d record %llu) to s%d.t%d", a.msg, name(m.kind), m.ev,
                    (unsigned long long)m.record, m.to_s, m.to_t);
      break;
    }
    case AK::Read: {
      const ReadInfo& r = reads[size_t(a.read)];
      std::snprintf(buf, sizeof buf, "read %d: slot %d by %s on %s (e%d record >= %llu)", a.read, r.slot, name(r.how),
                    st.c_str(), r.ev, (unsigned long long)r.record);
      break;
    }
    case AK::Destroy:
      std::snprintf(buf, sizeof buf, "destroy e%d", a.ev);
      break;
    case AK::Reopen:
      std::snprintf(buf, sizeof buf, "open buffer %d again (same address)", a.buf);
      break;
    case AK::CloseMem:
      std::snprintf(buf, sizeof buf, "close buffer %d once", a.buf);
      break;
    case AK::Recreate:
      std::snprintf(buf, sizeof buf, "destroy %s with work pending, create it %s", st.c_str(), name(SK(a.how)));
      break;
    case AK::Noise: {
      static const char* what[] = {"memset scratch on", "stamp scratch on", "stream query of", "stream synchronize of",
                                   "device synchronize"};
      std::snprintf(buf, sizeof buf, "noise: %s %s", what[a.how % 5], a.how == 4 ? "" : st.c_str());
      break;
    }
    case AK::End:
      std::snprintf(buf, sizeof buf, "end e%d's chain (keep the baton)", a.ev);
      break;
    case AK::Ack: {
      const Msg& m = msgs[size_t(a.msg)];
      std::snprintf(buf, sizeof buf, "recv msg %d: s%d opened e%d", a.msg, m.from_s, a.ev);
      break;
    }
  }
  return who + buf;
}

std::string Program::listing(size_t max_lines) const {
  std::string out;
  char head[256];
  std::snprintf(head, sizeof head, "program of seed %llu: %d sessions, threads", (unsigned long long)seed, sessions);
  out += head;
  for (int n : threads) out += " " + std::to_string(n);
  out += ", " + std::to_string(nb) + " blocking and " + std::to_string(nn) + " non-blocking shared streams each";
  out += owners_free_first ? "; owners free their buffers before the final read\n" : "\n";
  for (size_t b = 0; b < bufs.size(); ++b) {
    out += "  buffer " + std::to_string(b) + " of s" + std::to_string(bufs[b].owner) + " (" +
           std::to_string(bufs[b].size) + " bytes), opened by";
    for (int s = 0; s < sessions; ++s)
      if (bufs[b].opened[size_t(s)]) out += " s" + std::to_string(s) + (bufs[b].twice[size_t(s)] ? "(twice)" : "");
    out += "\n";
  }
  size_t n = 0;
  for (const Placed& pl : order) {
    if (++n > max_lines) {
      out += "  ... (" + std::to_string(order.size() - max_lines) + " more)\n";
      break;
    }
    out += "  " + std::to_string(n - 1) + " " + describe(pl.s, pl.t, script[size_t(pl.s)][size_t(pl.t)][size_t(pl.i)]) +
           "\n";
  }
  return out;
}

// ---------------------------------------------------------------------------
// The generator: one serial schedule of all threads' actions, drawn step by
// step, in which every message is sent before it is received. Each thread
// runs its own actions in order and blocks on receives, so the real run
// cannot deadlock (the thread whose next action comes first in the schedule
// can always go on).

class Generator {
 public:
  // `slow`: how much longer the writing kernels run (the readers' do not).
  Generator(uint64_t seed, int sessions, int steps_per_session, uint32_t slow)
      : rng_(seed * 0x9E3779B97F4A7C15ull + 1234567), slow_(slow) {
    p_.seed = seed;
    p_.sessions = sessions;
    int total = 0;
    for (int s = 0; s < sessions; ++s) {
      const int t = std::min(1 + int(r(3)), std::max(1, 8 - total - (sessions - s - 1)));
      p_.threads.push_back(t);
      total += t;
    }
    p_.nb = 1 + int(r(2));
    p_.nn = 1 + int(r(2));
    kind_.resize(size_t(sessions));
    for (int s = 0; s < sessions; ++s) {
      auto& k = kind_[size_t(s)];
      k.push_back(SK::Legacy);
      for (int i = 0; i < p_.nb; ++i) k.push_back(SK::Blocking);
      for (int i = 0; i < p_.nn; ++i) k.push_back(SK::NonBlocking);
      for (int t = 0; t < p_.threads[size_t(s)]; ++t) {
        k.push_back(SK::Blocking);                           // per-thread stream
        k.push_back(r(2) ? SK::Blocking : SK::NonBlocking);  // private
      }
    }
    p_.initial_kind = kind_;
    for (int s = 0; s < sessions; ++s)
      for (int n = 1 + int(r(2)); n-- > 0;) {
        BufInfo b;
        b.owner = s;
        // Now and then a large allocation (the sim's memfd-backed blocks).
        b.size = chance(20) ? uint64_t{1} << 20 : uint64_t(kSlotsPerBuffer) * sizeof(Stamp);
        b.opened.assign(size_t(sessions), 0);
        b.twice.assign(size_t(sessions), 0);
        int opened = 0;
        for (int o = 0; o < sessions; ++o)
          if (o != s && chance(75)) b.opened[size_t(o)] = 1, ++opened;
        if (!opened) b.opened[size_t((s + 1 + int(r(uint32_t(sessions - 1)))) % sessions)] = 1;
        for (int o = 0; o < sessions; ++o)
          if (b.opened[size_t(o)] && chance(25)) b.twice[size_t(o)] = 1;
        p_.bufs.push_back(b);
      }
    p_.owners_free_first = chance(40);
    p_.script.resize(size_t(sessions));
    inbox_.resize(size_t(sessions));
    reopened_.resize(size_t(sessions));
    known_.resize(size_t(sessions));
    for (int s = 0; s < sessions; ++s) {
      known_[size_t(s)].resize(size_t(p_.threads[size_t(s)]));
      p_.script[size_t(s)].resize(size_t(p_.threads[size_t(s)]));
      inbox_[size_t(s)].resize(size_t(p_.threads[size_t(s)]));
      reopened_[size_t(s)].resize(size_t(p_.threads[size_t(s)]));
    }
    steps_ = steps_per_session * sessions;
  }

  Program run() {
    for (int step = 0; step < steps_; ++step) {
      const int s = int(r(uint32_t(p_.sessions)));
      const int t = int(r(uint32_t(p_.threads[size_t(s)])));
      late_ = step > steps_ * 3 / 4;
      this->step(s, t);
    }
    // Every thread closes what it opened again and destroys its handles,
    // whatever messages are still on their way to it.
    for (int s = 0; s < p_.sessions; ++s)
      for (int t = 0; t < p_.threads[size_t(s)]; ++t) {
        for (int b : reopened_[size_t(s)][size_t(t)]) emit(s, t, Act{AK::CloseMem, -1, -1, -1, -1, -1, b});
        for (size_t e = 0; e < evs_.size(); ++e)
          if (evs_[e].owner[size_t(s)] == t && evs_[e].state[size_t(s)] == kOpen &&
              (evs_[e].exporter != s || may_destroy_export(s, t, evs_[e], int(e)))) {  // else the session's end
            Act a{AK::Destroy};
            a.ev = int(e);
            emit(s, t, a);
          }
      }
    p_.events = int(evs_.size());
    return std::move(p_);
  }

 private:
  enum State : int { kNone = 0, kTokenSent, kOpen, kDestroyed, kStale };
  struct Ev {
    int exporter = -1;
    std::vector<int> owner, state, pending;  // per session
    uint64_t records = 0;
    std::vector<std::vector<int>> cov{{}};  // cov[k]: the slots record k covers
    bool in_turn = false, ended = false;
    int turn_s = -1, turn_t = -1;
    std::set<int> after;         // the holder's streams whose next work follows everything of its turn so far
    std::vector<int> held;       // cov of the turn so far
    Acq acq = Acq::Synchronize;  // how the holder acquired (reports only)
  };

  uint32_t r(uint32_t n) { return n ? uint32_t(rng_() % n) : 0; }
  bool chance(int pct) { return int(r(100)) < pct; }
  template <class C>
  typename C::value_type pick(const C& c) {
    auto it = c.begin();
    std::advance(it, r(uint32_t(c.size())));
    return *it;
  }

  void emit(int s, int t, const Act& a) {
    auto& sc = p_.script[size_t(s)][size_t(t)];
    sc.push_back(a);
    p_.order.push_back({s, t, int(sc.size() - 1)});
  }
  SK kind(int s, int id) const { return kind_[size_t(s)][size_t(id)]; }
  std::vector<int> usable(int t) const {
    std::vector<int> u;
    for (int id = 0; id <= p_.nb + p_.nn; ++id) u.push_back(id);
    u.push_back(p_.pt_id(t));
    u.push_back(p_.priv_id(t));
    return u;
  }
  std::set<int> all(int t) const {
    const auto u = usable(t);
    return {u.begin(), u.end()};
  }
  // Work was issued on x, which follows the point `after` stands for: the
  // legacy stream's implicit synchronization carries it to more streams.
  void grow(int s, int t, std::set<int>& after, int x) const {
    if (kind(s, x) == SK::Legacy) {
      for (int id : usable(t))
        if (kind(s, id) == SK::Blocking) after.insert(id);
    } else if (kind(s, x) == SK::Blocking) {
      after.insert(0);
    }
  }
  void send(int s, int t, MsgKind k, int ev, int to_s, int to_t, uint64_t record) {
    const int m = int(p_.msgs.size());
    p_.msgs.push_back({k, ev, s, t, to_s, to_t, record});
    carried_.push_back(known_[size_t(s)][size_t(t)]);
    inbox_[size_t(to_s)][size_t(to_t)].push_back(m);
    ++evs_[size_t(ev)].pending[size_t(to_s)];
    Act a{AK::Send};
    a.ev = ev;
    a.msg = m;
    a.record = record;
    emit(s, t, a);
  }
  int live_events() const {
    int n = 0;
    for (const Ev& e : evs_)
      for (int st : e.state)
        if (st == kOpen || st == kTokenSent) {
          ++n;
          break;
        }
    return n;
  }
  static long opened(int ev, int s) { return long(ev) * 64 + s; }
  // The exporter destroys its event only once it knows (through messages)
  // that every session it sent the token to has opened it: the destroy takes
  // the export back, so an open that does not happen before it fails.
  bool may_destroy_export(int s, int t, const Ev& e, int ev) const {
    for (int o = 0; o < p_.sessions; ++o) {
      if (o == s || e.state[size_t(o)] == kNone || e.state[size_t(o)] == kStale) continue;
      if (!known_[size_t(s)][size_t(t)].count(opened(ev, o))) return false;
    }
    return true;
  }
  bool in_any_turn(int s, int t) const {
    for (const Ev& e : evs_)
      if (e.in_turn && e.turn_s == s && e.turn_t == t) return true;
    return false;
  }
  bool accessible(int s, int slot) const {
    const BufInfo& b = p_.bufs[size_t(p_.slots[size_t(slot)].buf)];
    return b.owner == s || b.opened[size_t(s)];
  }
  int alloc_slot(int s) {
    if (int(p_.slots.size()) >= kMaxSlots) return -1;
    std::vector<int> bs;
    for (size_t b = 0; b < p_.bufs.size(); ++b) {
      const BufInfo& bi = p_.bufs[b];
      if ((bi.owner == s || bi.opened[size_t(s)]) && bi.used < kSlotsPerBuffer) bs.push_back(int(b));
    }
    if (bs.empty()) return -1;
    const int b = pick(bs);
    SlotInfo sl{};
    sl.buf = b;
    sl.index = p_.bufs[size_t(b)].used++;
    p_.slots.push_back(sl);
    return int(p_.slots.size() - 1);
  }

  // An acquire of record `record` of `ev` by (s, t): what follows it.
  std::set<int> acquire(int s, int t, int ev, int msg, uint64_t record) {
    Act a{AK::Acquire};
    a.ev = ev;
    a.msg = msg;
    a.record = record;
    const uint32_t roll = r(10);
    const Acq how = roll < 6 ? Acq::StreamWait : roll < 8 ? Acq::Synchronize : Acq::QueryPoll;
    a.how = uint8_t(how);
    std::set<int> after;
    if (how == Acq::StreamWait) {
      a.stream = pick(usable(t));
      after = {a.stream};
      grow(s, t, after, a.stream);
    } else {
      after = all(t);  // the record completed before the call returned
    }
    emit(s, t, a);
    return after;
  }

  // Reads of slots of `cov` (covered by what `after` follows).
  void reads(int s, int t, int ev, int msg, Acq acq, uint64_t record, const std::vector<int>& cov, std::set<int>& after,
             bool in_turn) {
    std::vector<int> can;
    for (int sl : cov)
      if (accessible(s, sl)) can.push_back(sl);
    if (can.empty()) return;
    // Slots another session wrote just before the record the message named:
    // only the order across sessions makes those reads see the write.
    std::vector<int> fresh;
    for (int sl : can)
      if (p_.slots[size_t(sl)].s != s && p_.slots[size_t(sl)].first_record == record) fresh.push_back(sl);
    for (int n = (in_turn ? 1 : 2) + int(r(3)); n-- > 0 && int(p_.reads.size()) < kMaxReads;) {
      // Mostly the newest slots: those whose order is the closest call.
      const uint32_t roll = r(100);
      const int slot = !fresh.empty() && roll < 60 ? pick(fresh)
                       : roll < 85                 ? can[can.size() - 1 - r(uint32_t(std::min<size_t>(4, can.size())))]
                                                   : pick(can);
      std::vector<ReadHow> hows;
      if (!after.empty())
        hows = {ReadHow::CopyD2D, ReadHow::CopyD2D, ReadHow::SlowCopy, ReadHow::CopyD2HPinned,
                ReadHow::CopyD2HPageable};
      if (after.count(0)) hows.push_back(ReadHow::SyncD2H);
      if (hows.empty()) return;
      const ReadHow how = pick(hows);
      const int x = how == ReadHow::SyncD2H ? 0 : pick(after);
      Act a{AK::Read};
      a.ev = ev;
      a.slot = slot;
      a.stream = x;
      a.read = int(p_.reads.size());
      a.sleep_us = 20 + r(120);
      p_.reads.push_back({slot, s, t, ev, msg, x, how, acq, record, in_turn});
      emit(s, t, a);
      grow(s, t, after, x);
      // A copy to host memory returned once done: what it followed is done too.
      if (how == ReadHow::CopyD2HPageable || how == ReadHow::SyncD2H) after = all(t);
    }
  }

  void receive(int s, int t) {
    auto& in = inbox_[size_t(s)][size_t(t)];
    const size_t i = r(uint32_t(in.size()));
    const int m = in[i];
    in.erase(in.begin() + long(i));
    const Msg msg = p_.msgs[size_t(m)];
    Ev& e = evs_[size_t(msg.ev)];
    --e.pending[size_t(s)];
    known_[size_t(s)][size_t(t)].insert(carried_[size_t(m)].begin(), carried_[size_t(m)].end());
    Act a{};
    a.ev = msg.ev;
    a.msg = m;
    switch (msg.kind) {
      case MsgKind::Token:
        a.k = AK::Open;
        emit(s, t, a);
        e.state[size_t(s)] = kOpen;
        known_[size_t(s)][size_t(t)].insert(opened(msg.ev, s));
        if (chance(50)) send(s, t, MsgKind::Opened, msg.ev, e.exporter, e.owner[size_t(e.exporter)], 0);
        return;
      case MsgKind::Opened:
        a.k = AK::Ack;
        emit(s, t, a);
        return;
      case MsgKind::StaleToken:
        a.k = AK::StaleOpen;
        emit(s, t, a);
        return;
      case MsgKind::Baton: {
        // Nobody records while the baton travels: the wait captures exactly this record.
        e.after = acquire(s, t, msg.ev, m, msg.record);
        e.acq = Acq(p_.script[size_t(s)][size_t(t)].back().how);
        e.held = e.cov[size_t(msg.record)];
        e.in_turn = true;
        e.turn_s = s;
        e.turn_t = t;
        if (chance(80)) reads(s, t, msg.ev, m, e.acq, msg.record, e.held, e.after, true);
        // Mostly the whole turn at once: the writes, the record and the next
        // message follow each other closely, as in a pipeline, so that the
        // next holder's wait comes while the writes still run.
        if (chance(75)) burst(s, t, msg.ev);
        return;
      }
      case MsgKind::Notify: {
        std::set<int> after = acquire(s, t, msg.ev, m, msg.record);
        const Acq how = Acq(p_.script[size_t(s)][size_t(t)].back().how);
        reads(s, t, msg.ev, m, how, msg.record, e.cov[size_t(msg.record)], after, false);
        if (chance(25)) {  // tell another holder in turn: happens-before is transitive
          std::vector<int> to;
          for (int o = 0; o < p_.sessions; ++o)
            if (e.state[size_t(o)] == kOpen) to.push_back(o);
          const int o = pick(to);
          send(s, t, MsgKind::Notify, msg.ev, o, e.owner[size_t(o)], msg.record);
        }
        return;
      }
    }
  }

  void write(int s, int t, int ev) {
    Ev& e = evs_[size_t(ev)];
    if (e.after.empty()) return;
    const int slot = alloc_slot(s);
    if (slot < 0) return;
    const int x = pick(e.after);
    const uint32_t roll = r(100);
    const WriteHow how = roll < 35   ? WriteHow::Stamp
                         : roll < 45 ? WriteHow::StampGraph
                         : roll < 60 ? WriteHow::SlowCopy
                         : roll < 75 ? WriteHow::Memset
                         : roll < 87 ? WriteHow::CopyH2D
                                     : WriteHow::CopyD2D;
    SlotInfo& sl = p_.slots[size_t(slot)];
    sl.s = s;
    sl.t = t;
    sl.ev = ev;
    sl.stream = x;
    sl.how = how;
    Act a{AK::Write};
    a.ev = ev;
    a.slot = slot;
    a.stream = x;
    a.how = uint8_t(how);
    a.sleep_us = (40 + r(220)) * slow_;
    emit(s, t, a);
    e.held.push_back(slot);
    e.after = {x};
    grow(s, t, e.after, x);
  }

  void record(int s, int t, int ev) {
    Ev& e = evs_[size_t(ev)];
    if (e.after.empty()) return;
    Act a{AK::Record};
    a.ev = ev;
    a.stream = pick(e.after);
    a.record = ++e.records;
    e.cov.push_back(e.held);
    for (int sl : e.held)
      if (!p_.slots[size_t(sl)].first_record) p_.slots[size_t(sl)].first_record = a.record;
    emit(s, t, a);
  }

  void burst(int s, int t, int ev) {
    for (int n = int(r(3)) + (chance(80) ? 1 : 0); n-- > 0;) write(s, t, ev);
    Ev& e = evs_[size_t(ev)];
    if (chance(15)) reads(s, t, ev, -1, e.acq, e.records, e.held, e.after, true);
    record(s, t, ev);
    if (chance(20)) record(s, t, ev);  // again, maybe on another stream
    if (chance(90)) pass(s, t, ev);
  }

  void pass(int s, int t, int ev) {
    Ev& e = evs_[size_t(ev)];
    std::vector<int> to;
    for (int o = 0; o < p_.sessions; ++o)
      if (e.state[size_t(o)] == kOpen) to.push_back(o);
    // Mostly to another session: that is where the order is the workers' to keep.
    std::vector<int> others;
    for (int o : to)
      if (o != s) others.push_back(o);
    const int o = !others.empty() && chance(80) ? pick(others) : pick(to);
    send(s, t, MsgKind::Baton, ev, o, e.owner[size_t(o)], e.records);
    for (int n = int(r(3)); n-- > 0;) {
      const int w = !others.empty() && chance(80) ? pick(others) : pick(to);
      send(s, t, MsgKind::Notify, ev, w, e.owner[size_t(w)], e.records);
    }
    e.in_turn = false;
  }

  void create(int s, int t) {
    const int ev = int(evs_.size());
    Ev e;
    e.exporter = s;
    e.owner.assign(size_t(p_.sessions), -1);
    e.state.assign(size_t(p_.sessions), kNone);
    e.pending.assign(size_t(p_.sessions), 0);
    e.owner[size_t(s)] = t;
    e.state[size_t(s)] = kOpen;
    known_[size_t(s)][size_t(t)].insert(opened(ev, s));
    e.in_turn = true;
    e.turn_s = s;
    e.turn_t = t;
    e.after = all(t);
    evs_.push_back(e);
    Act a{AK::Create};
    a.ev = ev;
    a.how = chance(20);
    emit(s, t, a);
    std::vector<int> others;
    for (int o = 0; o < p_.sessions; ++o)
      if (o != s) others.push_back(o);
    std::vector<int> to;
    for (int o : others)
      if (chance(70)) to.push_back(o);
    if (to.empty()) to.push_back(pick(others));
    for (int o : to) {
      Ev& x = evs_[size_t(ev)];
      x.owner[size_t(o)] = int(r(uint32_t(p_.threads[size_t(o)])));
      x.state[size_t(o)] = kTokenSent;
      send(s, t, MsgKind::Token, ev, o, x.owner[size_t(o)], 0);
    }
  }

  void destroy(int s, int t, int ev) {
    Ev& e = evs_[size_t(ev)];
    Act a{AK::Destroy};
    a.ev = ev;
    emit(s, t, a);
    e.state[size_t(s)] = kDestroyed;
    if (e.exporter != s || !chance(50)) return;
    std::vector<int> never;
    for (int o = 0; o < p_.sessions; ++o)
      if (e.state[size_t(o)] == kNone) never.push_back(o);
    if (never.empty()) return;
    const int o = pick(never);
    e.owner[size_t(o)] = int(r(uint32_t(p_.threads[size_t(o)])));
    e.state[size_t(o)] = kStale;
    send(s, t, MsgKind::StaleToken, ev, o, e.owner[size_t(o)], 0);
  }

  void step(int s, int t) {
    std::vector<std::pair<int, std::function<void()>>> can;
    if (!inbox_[size_t(s)][size_t(t)].empty()) can.push_back({45, [=, this] { receive(s, t); }});
    for (size_t i = 0; i < evs_.size(); ++i) {
      const int ev = int(i);
      const Ev& e = evs_[i];
      if (e.in_turn && e.turn_s == s && e.turn_t == t) {
        can.push_back({20, [=, this] { burst(s, t, ev); }});
        can.push_back({6, [=, this] { write(s, t, ev); }});
        can.push_back({4, [=, this] { record(s, t, ev); }});
        can.push_back({2, [=, this] {
                         Ev& x = evs_[size_t(ev)];
                         reads(s, t, ev, -1, x.acq, x.records, x.held, x.after, true);
                       }});
        if (e.records) can.push_back({6, [=, this] { pass(s, t, ev); }});
        if (late_)
          can.push_back({1, [=, this] {
                           Act a{AK::End};
                           a.ev = ev;
                           emit(s, t, a);
                           evs_[size_t(ev)].in_turn = false;
                           evs_[size_t(ev)].ended = true;
                         }});
      }
      if (e.owner[size_t(s)] == t && e.state[size_t(s)] == kOpen && e.pending[size_t(s)] == 0 &&
          !(e.in_turn && e.turn_s == s)) {
        if (e.exporter != s || may_destroy_export(s, t, e, ev))
          can.push_back({e.exporter == s ? 4 : 2, [=, this] { destroy(s, t, ev); }});
      }
    }
    if (live_events() < kMaxLiveEvents && int(evs_.size()) < kMaxEvents && !late_)
      can.push_back({evs_.empty() ? 40 : 5, [=, this] { create(s, t); }});
    std::vector<int> mine;
    for (size_t b = 0; b < p_.bufs.size(); ++b)
      if (p_.bufs[b].opened[size_t(s)]) mine.push_back(int(b));
    if (!mine.empty())
      can.push_back({1, [=, this] {
                       const int b = pick(mine);
                       reopened_[size_t(s)][size_t(t)].push_back(b);
                       emit(s, t, Act{AK::Reopen, -1, -1, -1, -1, -1, b});
                     }});
    if (!reopened_[size_t(s)][size_t(t)].empty())
      can.push_back({2, [=, this] {
                       auto& v = reopened_[size_t(s)][size_t(t)];
                       const size_t i = r(uint32_t(v.size()));
                       const int b = v[i];
                       v.erase(v.begin() + long(i));
                       emit(s, t, Act{AK::CloseMem, -1, -1, -1, -1, -1, b});
                     }});
    if (!in_any_turn(s, t))
      can.push_back({2, [=, this] {
                       Act a{AK::Recreate};
                       a.stream = p_.priv_id(t);
                       a.how = uint8_t(r(2) ? SK::Blocking : SK::NonBlocking);
                       kind_[size_t(s)][size_t(a.stream)] = SK(a.how);
                       emit(s, t, a);
                     }});
    can.push_back({4, [=, this] {
                     Act a{AK::Noise};
                     static constexpr uint8_t kHows[] = {0, 0, 0, 1, 1, 1, 2, 2, 3, 4};  // synchronizes rarely
                     a.how = kHows[r(10)];
                     a.stream = pick(usable(t));
                     a.sleep_us = 20 + r(150);
                     emit(s, t, a);
                   }});
    int total = 0;
    for (auto& c : can) total += c.first;
    int x = int(r(uint32_t(total)));
    for (auto& c : can) {
      if (x < c.first) return c.second();
      x -= c.first;
    }
  }

  std::mt19937_64 rng_;
  Program p_;
  std::vector<std::vector<SK>> kind_;
  std::vector<Ev> evs_;
  std::vector<std::vector<std::vector<int>>> inbox_;     // [s][t]: messages sent, not yet received
  std::vector<std::vector<std::vector<int>>> reopened_;  // [s][t]: buffers opened again, to close
  // [s][t]: the opens (event, session) that happened before the thread's
  // next action, as far as messages tell it; and what each message carried.
  std::vector<std::vector<std::set<long>>> known_;
  std::vector<std::set<long>> carried_;
  int steps_ = 0;
  bool late_ = false;
  uint32_t slow_ = 1;
};

// ---------------------------------------------------------------------------
// The run.

// The in-process queue between the sessions' threads (the pipe a real program uses).
class Mailbox {
 public:
  explicit Mailbox(size_t n) : box_(n) {}
  void post(int m, Client::IpcToken t, uint64_t record) {
    std::lock_guard lk(mu_);
    box_[size_t(m)] = {true, t, record};
    cv_.notify_all();
  }
  bool take(int m, Client::IpcToken* t, uint64_t* record, const std::atomic<bool>& abort) {
    std::unique_lock lk(mu_);
    const auto deadline = Clock::now() + 120s;
    while (!box_[size_t(m)].ready) {
      if (abort.load() || Clock::now() > deadline) return false;
      cv_.wait_for(lk, 50ms);
    }
    *t = box_[size_t(m)].token;
    *record = box_[size_t(m)].record;
    return true;
  }

 private:
  struct Box {
    bool ready = false;
    Client::IpcToken token;
    uint64_t record = 0;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Box> box_;
};

Stamp pattern(int slot) {
  return {0x1000000000000000ull | uint64_t(slot) << 16 | 0xa5, 0xc0de000000000000ull | uint64_t(slot)};
}
Stamp filled(int slot) {
  Stamp s;
  std::memset(&s, 1 + slot % 251, sizeof s);
  return s;
}
constexpr uint8_t kUnread = 0xab;  // what a read's destination holds until the read ran
bool same(const Stamp& a, const Stamp& b) { return a.start == b.start && a.end == b.end; }
std::string show(const Stamp& s) {
  char b[64];
  std::snprintf(b, sizeof b, "{%llx, %llx}", (unsigned long long)s.start, (unsigned long long)s.end);
  return b;
}

struct Outcome {
  size_t reads = 0, cross_reads = 0, writes = 0, records = 0, acquires = 0, messages = 0;
  size_t violations = 0, cross_violations = 0, problems = 0;
  // Reads in another session than the write, of a slot first covered by the
  // very record the reader was told of: those only the order across sessions keeps.
  size_t fresh = 0, fresh_violations = 0;
  std::string first_violations, first_problem;
};

class Runner {
 public:
  Runner(const Program& p, std::vector<Client*> clients) : p_(p), mail_(p.msgs.size() + 1) {
    for (Client* c : clients) {
      rt_.emplace_back();
      rt_.back().c = c;
    }
    host_reads_.assign(p.reads.size() + 1, Stamp{});
    std::memset(host_reads_.data(), kUnread, host_reads_.size() * sizeof(Stamp));
  }

  Outcome run() {
    setup();
    if (!problem_count_) {
      std::vector<std::thread> ts;
      for (int s = 0; s < p_.sessions; ++s)
        for (int t = 0; t < p_.threads[size_t(s)]; ++t) ts.emplace_back([this, s, t] { thread(s, t); });
      for (auto& th : ts) th.join();
    }
    return finish();
  }

 private:
  struct Rt {
    Client* c = nullptr;
    uint32_t stamp_k = 0, copy_k = 0;
    std::vector<Stream> streams;
    std::vector<uint64_t> addr;  // per buffer: this session's address (0: none)
    uint64_t check_dev = 0, src_dev = 0, scratch = 0;
    Stamp* check_pin = nullptr;
    Stamp* src_pin = nullptr;
    std::vector<Event> ev;  // per event: this session's handle (its owner thread's alone)
    std::vector<Client::IpcToken> ev_tok;
  };

  void problem(const std::string& what) {
    std::lock_guard lk(problems_mu_);
    if (problems_.size() < 12) problems_.push_back(what);
    ++problem_count_;
  }
  bool check(Status st, const std::string& what, Status want = Status::kSuccess) {
    if (st == want) return true;
    problem(what + " returned " + std::string(status_name(st)) +
            (want == Status::kSuccess ? "" : ", not " + std::string(status_name(want))));
    return false;
  }
  uint64_t slot_addr(int s, int slot) const {
    const SlotInfo& sl = p_.slots[size_t(slot)];
    return rt_[size_t(s)].addr[size_t(sl.buf)] + uint64_t(sl.index) * sizeof(Stamp);
  }

  void setup() {
    const size_t nslots = std::max<size_t>(p_.slots.size(), 1), nreads = std::max<size_t>(p_.reads.size(), 1);
    buf_tok_.resize(p_.bufs.size());
    for (int s = 0; s < p_.sessions; ++s) {
      Rt& x = rt_[size_t(s)];
      Client& c = *x.c;
      const std::string who = "setup s" + std::to_string(s) + ": ";
      check(c.kernel_lookup("ordo_stamp", &x.stamp_k), who + "kernel_lookup(ordo_stamp)");
      check(c.kernel_lookup("ordo_slow_copy", &x.copy_k), who + "kernel_lookup(ordo_slow_copy)");
      x.streams.assign(size_t(p_.streams(s)), kLegacyStream);
      for (int id = 1; id < p_.streams(s); ++id) {
        if (id > p_.nb + p_.nn && ((id - 1 - p_.nb - p_.nn) % 2) == 0) continue;  // per-thread: the thread's own
        const SK k = p_.initial_kind[size_t(s)][size_t(id)];
        check(c.stream_create(&x.streams[size_t(id)], k == SK::NonBlocking ? kStreamNonBlocking : 0),
              who + "stream_create");
      }
      x.addr.assign(p_.bufs.size(), 0);
      for (size_t b = 0; b < p_.bufs.size(); ++b) {
        if (p_.bufs[b].owner != s) continue;
        check(c.malloc(&x.addr[b], p_.bufs[b].size), who + "malloc");
        check(c.memset_async(x.addr[b], 0, p_.bufs[b].size, kLegacyStream), who + "memset");
      }
      check(c.malloc(&x.check_dev, nreads * sizeof(Stamp)), who + "malloc");
      check(c.memset_async(x.check_dev, kUnread, nreads * sizeof(Stamp), kLegacyStream), who + "memset");
      check(c.malloc(&x.src_dev, nslots * sizeof(Stamp)), who + "malloc");
      check(c.malloc(&x.scratch, kScratch * uint64_t(p_.threads[size_t(s)])), who + "malloc");
      void* pin = nullptr;
      check(c.malloc_host(&pin, (nslots + nreads) * sizeof(Stamp)), who + "malloc_host");
      if (!pin) return;
      x.src_pin = static_cast<Stamp*>(pin);
      x.check_pin = x.src_pin + nslots;
      for (size_t i = 0; i < nslots; ++i) x.src_pin[i] = pattern(int(i));
      std::memset(x.check_pin, kUnread, nreads * sizeof(Stamp));
      check(c.memcpy_h2d(x.src_dev, x.src_pin, nslots * sizeof(Stamp)), who + "memcpy_h2d");
      check(c.device_synchronize(), who + "device_synchronize");
      x.ev.assign(size_t(p_.events), Event{});
      x.ev_tok.assign(size_t(p_.events), Client::IpcToken{});
      // Exports; a second export of the same allocation is the same token.
      for (size_t b = 0; b < p_.bufs.size(); ++b) {
        if (p_.bufs[b].owner != s) continue;
        check(c.ipc_export_mem(x.addr[b], &buf_tok_[b]), who + "ipc_export_mem");
        Client::IpcToken again;
        check(c.ipc_export_mem(x.addr[b] + 16, &again), who + "ipc_export_mem inside the allocation");
        if (again.word != buf_tok_[b].word || again.secret != buf_tok_[b].secret)
          problem(who + "a second export of buffer " + std::to_string(b) + " gave another token");
        uint64_t a = 0, size = 0;
        uint32_t dev = 0;
        check(c.ipc_open_mem(buf_tok_[b], &a, &size, &dev), who + "ipc_open_mem of its own export",
              Status::kInvalidContext);
      }
    }
    for (size_t b = 0; b < p_.bufs.size(); ++b)
      for (int s = 0; s < p_.sessions; ++s) {
        if (!p_.bufs[b].opened[size_t(s)]) continue;
        Rt& x = rt_[size_t(s)];
        const std::string who = "setup s" + std::to_string(s) + ": ipc_open_mem of buffer " + std::to_string(b);
        for (int n = 0; n < (p_.bufs[b].twice[size_t(s)] ? 2 : 1); ++n) {
          uint64_t a = 0, size = 0;
          uint32_t dev = 9;
          if (!check(x.c->ipc_open_mem(buf_tok_[b], &a, &size, &dev), who)) continue;
          if (size != p_.bufs[b].size || dev != 0) problem(who + ": wrong size or device");
          if (n == 1 && a != x.addr[b]) problem(who + " again: another address");
          x.addr[b] = a;
        }
      }
  }

  void thread(int s, int t) {
    Rt& x = rt_[size_t(s)];
    x.streams[size_t(p_.pt_id(t))] = x.c->per_thread_stream();
    const auto& sc = p_.script[size_t(s)][size_t(t)];
    for (const Act& a : sc) {
      if (abort_.load()) return;
      act(s, t, a);
    }
  }

  void act(int s, int t, const Act& a) {
    Rt& x = rt_[size_t(s)];
    Client& c = *x.c;
    const auto what = [&] { return p_.describe(s, t, a); };
    const Stream st = a.stream >= 0 ? x.streams[size_t(a.stream)] : kLegacyStream;
    switch (a.k) {
      case AK::Create: {
        Event& e = x.ev[size_t(a.ev)];
        if (!check(c.event_create(&e, kIpcEventFlags), what() + ": event_create")) break;
        check(c.ipc_export_event(e, &x.ev_tok[size_t(a.ev)]), what() + ": ipc_export_event");
        Client::IpcToken again;
        check(c.ipc_export_event(e, &again), what() + ": ipc_export_event again");
        if (again.word != x.ev_tok[size_t(a.ev)].word || again.secret != x.ev_tok[size_t(a.ev)].secret)
          problem(what() + ": a second export gave another token");
        if (a.how) {
          Event own;
          check(c.ipc_open_event(x.ev_tok[size_t(a.ev)], &own), what() + ": ipc_open_event in the exporter",
                Status::kInvalidContext);
        }
        break;
      }
      case AK::Open:
      case AK::StaleOpen: {
        Client::IpcToken tok;
        uint64_t rec = 0;
        if (!take(a, &tok, &rec, what)) break;
        x.ev_tok[size_t(a.ev)] = tok;
        Event e;
        const Status st2 = c.ipc_open_event(tok, &e);
        if (a.k == AK::StaleOpen) {
          check(st2, what() + ": ipc_open_event", Status::kInvalidResourceHandle);
          if (ok(st2)) c.event_destroy(e);
        } else if (check(st2, what() + ": ipc_open_event")) {
          x.ev[size_t(a.ev)] = e;
        }
        break;
      }
      case AK::Acquire: {
        Client::IpcToken tok;
        uint64_t rec = 0;
        if (!take(a, &tok, &rec, what)) break;
        const Client::IpcToken& mine = x.ev_tok[size_t(a.ev)];
        if (tok.word != mine.word || tok.secret != mine.secret || rec != a.record)
          problem(what() + ": the message is not what was sent");
        acquires_++;
        const Event e = x.ev[size_t(a.ev)];
        switch (Acq(a.how)) {
          case Acq::StreamWait:
            check(c.stream_wait_event(st, e), what() + ": stream_wait_event");
            break;
          case Acq::Synchronize:
            check(c.event_synchronize(e), what() + ": event_synchronize");
            break;
          case Acq::QueryPoll: {
            const auto deadline = Clock::now() + 60s;
            for (;;) {
              const Status q = c.event_query(e);
              if (q == Status::kSuccess) break;
              if (q != Status::kNotReady) {
                check(q, what() + ": event_query");
                break;
              }
              if (Clock::now() > deadline || abort_.load()) {
                problem(what() + ": event_query said not ready for 60 s");
                abort_ = true;
                break;
              }
              std::this_thread::sleep_for(20us);
            }
            break;
          }
        }
        break;
      }
      case AK::Write: {
        const uint64_t dst = slot_addr(s, a.slot);
        Status r = Status::kSuccess;
        switch (WriteHow(a.how)) {
          case WriteHow::Stamp: {
            const sim::StampArgs args{dst, 0, a.sleep_us};
            r = c.launch(x.stamp_k, {1}, {1}, &args, sizeof args, st);
            break;
          }
          case WriteHow::StampGraph: {
            const sim::StampArgs args{dst, 0, a.sleep_us};
            GraphStepWriter w;
            w.kernel({x.stamp_k, 0, {1, 1, 1}, {1, 1, 1}, sizeof args, 0}, &args);
            uint32_t g = 0;
            if (!check(c.graph_create(w.bytes().data(), w.bytes().size(), &g), what() + ": graph_create")) break;
            r = c.graph_launch(g, st);
            check(c.graph_destroy(g), what() + ": graph_destroy");
            break;
          }
          case WriteHow::SlowCopy: {
            const sim::SlowCopyArgs args{dst, x.src_dev + uint64_t(a.slot) * sizeof(Stamp), sizeof(Stamp), a.sleep_us,
                                         0};
            r = c.launch(x.copy_k, {1}, {1}, &args, sizeof args, st);
            break;
          }
          case WriteHow::Memset:
            r = c.memset_async(dst, uint8_t(1 + a.slot % 251), sizeof(Stamp), st);
            break;
          case WriteHow::CopyH2D:
            r = c.memcpy_h2d_async(dst, &x.src_pin[a.slot], sizeof(Stamp), st);
            break;
          case WriteHow::CopyD2D:
            r = c.memcpy_d2d_async(dst, x.src_dev + uint64_t(a.slot) * sizeof(Stamp), sizeof(Stamp), st);
            break;
        }
        check(r, what());
        writes_++;
        break;
      }
      case AK::Record:
        check(c.event_record(x.ev[size_t(a.ev)], st), what());
        records_++;
        break;
      case AK::Send:
        mail_.post(a.msg, x.ev_tok[size_t(a.ev)], a.record);
        messages_++;
        break;
      case AK::Read: {
        const uint64_t src = slot_addr(s, a.slot);
        const ReadInfo& ri = p_.reads[size_t(a.read)];
        Status r = Status::kSuccess;
        switch (ri.how) {
          case ReadHow::CopyD2D:
            r = c.memcpy_d2d_async(x.check_dev + uint64_t(a.read) * sizeof(Stamp), src, sizeof(Stamp), st);
            break;
          case ReadHow::SlowCopy: {
            const sim::SlowCopyArgs args{x.check_dev + uint64_t(a.read) * sizeof(Stamp), src, sizeof(Stamp), a.sleep_us,
                                         0};
            r = c.launch(x.copy_k, {1}, {1}, &args, sizeof args, st);
            break;
          }
          case ReadHow::CopyD2HPinned:
            r = c.memcpy_d2h_async(&x.check_pin[a.read], src, sizeof(Stamp), st);
            break;
          case ReadHow::CopyD2HPageable:
            r = c.memcpy_d2h_async(&host_reads_[size_t(a.read)], src, sizeof(Stamp), st);
            break;
          case ReadHow::SyncD2H:
            r = c.memcpy_d2h(&host_reads_[size_t(a.read)], src, sizeof(Stamp));
            break;
        }
        check(r, what());
        break;
      }
      case AK::Destroy:
        check(c.event_destroy(x.ev[size_t(a.ev)]), what());
        break;
      case AK::Reopen: {
        uint64_t addr = 0, size = 0;
        uint32_t dev = 9;
        if (check(c.ipc_open_mem(buf_tok_[size_t(a.buf)], &addr, &size, &dev), what()) &&
            (addr != x.addr[size_t(a.buf)] || size != p_.bufs[size_t(a.buf)].size || dev != 0))
          problem(what() + ": another address, size or device");
        break;
      }
      case AK::CloseMem:
        check(c.ipc_close_mem(x.addr[size_t(a.buf)]), what());
        break;
      case AK::Recreate:
        check(c.stream_destroy(st), what() + ": stream_destroy");
        check(c.stream_create(&x.streams[size_t(a.stream)], SK(a.how) == SK::NonBlocking ? kStreamNonBlocking : 0),
              what() + ": stream_create");
        break;
      case AK::Noise: {
        const uint64_t mine = x.scratch + uint64_t(t) * kScratch;
        switch (a.how) {
          case 0:
            check(c.memset_async(mine, uint8_t(a.sleep_us), kScratch, st), what());
            break;
          case 1: {
            const sim::StampArgs args{mine, 1, a.sleep_us};
            check(c.launch(x.stamp_k, {1}, {1}, &args, sizeof args, st), what());
            break;
          }
          case 2: {
            const Status q = c.stream_query(st);
            if (q != Status::kSuccess && q != Status::kNotReady) check(q, what());
            break;
          }
          case 3:
            check(c.stream_synchronize(st), what());
            break;
          default:
            check(c.device_synchronize(), what());
            break;
        }
        break;
      }
      case AK::Ack: {
        Client::IpcToken tok;
        uint64_t rec = 0;
        take(a, &tok, &rec, what);
        break;
      }
      case AK::End:
        break;
    }
  }

  template <class F>
  bool take(const Act& a, Client::IpcToken* tok, uint64_t* rec, F what) {
    if (mail_.take(a.msg, tok, rec, abort_)) return true;
    if (!abort_.exchange(true)) problem(what() + ": the message never came");
    return false;
  }

  Outcome finish() {
    Outcome o;
    o.writes = writes_;
    o.records = records_;
    o.acquires = acquires_;
    o.messages = messages_;
    const size_t nreads = std::max<size_t>(p_.reads.size(), 1);
    std::vector<std::vector<Stamp>> dev_reads(size_t(p_.sessions), std::vector<Stamp>(nreads));
    for (int s = 0; s < p_.sessions; ++s) {
      Rt& x = rt_[size_t(s)];
      check(x.c->device_synchronize(), "final device_synchronize of s" + std::to_string(s));
      if (x.check_dev)
        check(x.c->memcpy_d2h(dev_reads[size_t(s)].data(), x.check_dev, nreads * sizeof(Stamp)), "final read");
    }
    // The final values, through the owner; or, when the owner frees its
    // buffer first, through an importer (opened copies outlive the owner's free).
    std::vector<Stamp> truth(p_.slots.size());
    for (size_t b = 0; b < p_.bufs.size(); ++b) {
      const BufInfo& bi = p_.bufs[b];
      Rt& owner = rt_[size_t(bi.owner)];
      int reader = bi.owner;
      if (p_.owners_free_first && owner.addr[b]) {
        for (int s = 0; s < p_.sessions; ++s)
          if (bi.opened[size_t(s)]) reader = s;
        check(owner.c->free(owner.addr[b]), "free of buffer " + std::to_string(b) + " by its owner");
        for (int s = 0; s < p_.sessions; ++s)
          if (s != bi.owner && !bi.opened[size_t(s)]) {
            uint64_t a = 0, size = 0;
            uint32_t dev = 0;
            check(rt_[size_t(s)].c->ipc_open_mem(buf_tok_[b], &a, &size, &dev),
                  "ipc_open_mem of buffer " + std::to_string(b) + " after its owner freed it",
                  Status::kInvalidResourceHandle);
            break;
          }
      }
      if (!bi.used || !rt_[size_t(reader)].addr[b]) continue;
      std::vector<Stamp> v(size_t(bi.used));
      check(rt_[size_t(reader)].c->memcpy_d2h(v.data(), rt_[size_t(reader)].addr[b], v.size() * sizeof(Stamp)),
            "final read of buffer " + std::to_string(b) + " by s" + std::to_string(reader));
      for (size_t i = 0; i < p_.slots.size(); ++i)
        if (p_.slots[i].buf == int(b)) truth[i] = v[size_t(p_.slots[i].index)];
    }
    for (size_t i = 0; i < p_.slots.size(); ++i) {
      const SlotInfo& sl = p_.slots[i];
      const Stamp& v = truth[i];
      bool good;
      switch (sl.how) {
        case WriteHow::Stamp:
        case WriteHow::StampGraph:
          good = v.start > 0 && v.end > v.start && v.end < (uint64_t{1} << 48);
          break;
        case WriteHow::Memset:
          good = same(v, filled(int(i)));
          break;
        default:
          good = same(v, pattern(int(i)));
          break;
      }
      if (!good)
        problem("slot " + std::to_string(i) + " (" + name(sl.how) + " by s" + std::to_string(sl.s) + ".t" +
                std::to_string(sl.t) + ") holds " + show(v) + " at the end: its write did not run as issued");
    }
    for (size_t i = 0; i < p_.reads.size(); ++i) {
      const ReadInfo& ri = p_.reads[i];
      const Rt& x = rt_[size_t(ri.s)];
      Stamp seen;
      switch (ri.how) {
        case ReadHow::CopyD2D:
        case ReadHow::SlowCopy:
          seen = dev_reads[size_t(ri.s)][i];
          break;
        case ReadHow::CopyD2HPinned:
          seen = x.check_pin ? x.check_pin[i] : Stamp{};
          break;
        default:
          seen = host_reads_[i];
          break;
      }
      const SlotInfo& sl = p_.slots[size_t(ri.slot)];
      const bool cross = sl.s != ri.s;
      const bool fresh = cross && sl.first_record == ri.record;
      ++o.reads;
      o.cross_reads += cross;
      o.fresh += fresh;
      if (same(seen, truth[size_t(ri.slot)])) continue;
      ++o.violations;
      o.cross_violations += cross;
      o.fresh_violations += fresh;
      if (o.violations <= 8) {
        char b[700];
        std::snprintf(b, sizeof b,
                      "  read %zu of slot %d by s%d.t%d (%s on %s, %s, after %s of e%d record >= %llu%s%s) saw %s, "
                      "the slot's value is %s (written by s%d.t%d with %s on %s, first covered by e%d record %llu)\n",
                      i, ri.slot, ri.s, ri.t, name(ri.how), p_.stream_name(ri.s, ri.stream).c_str(),
                      ri.in_turn ? "holding the baton" : "observing", name(ri.acq), ri.ev,
                      (unsigned long long)ri.record, ri.msg >= 0 ? ", msg " : "",
                      ri.msg >= 0 ? std::to_string(ri.msg).c_str() : "", show(seen).c_str(),
                      show(truth[size_t(ri.slot)]).c_str(), sl.s, sl.t, name(sl.how),
                      p_.stream_name(sl.s, sl.stream).c_str(), sl.ev, (unsigned long long)sl.first_record);
        o.first_violations += b;
      }
    }
    // Teardown (the sessions' ends would take the rest back too).
    for (int s = 0; s < p_.sessions; ++s) {
      Rt& x = rt_[size_t(s)];
      for (size_t b = 0; b < p_.bufs.size(); ++b) {
        const BufInfo& bi = p_.bufs[b];
        if (!x.addr[b]) continue;
        if (bi.owner == s) {
          if (!p_.owners_free_first) check(x.c->free(x.addr[b]), "free");
        } else if (bi.opened[size_t(s)]) {
          for (int n = 0; n < (bi.twice[size_t(s)] ? 2 : 1); ++n) check(x.c->ipc_close_mem(x.addr[b]), "ipc_close_mem");
          // One close too many is refused.
          check(x.c->ipc_close_mem(x.addr[b]), "ipc_close_mem once more", Status::kInvalidValue);
        }
      }
      for (int id = 1; id < p_.streams(s); ++id)
        if (id > p_.nb + p_.nn && ((id - 1 - p_.nb - p_.nn) % 2) == 0)
          continue;
        else
          check(x.c->stream_destroy(x.streams[size_t(id)]), "stream_destroy");
      if (x.check_dev) check(x.c->free(x.check_dev), "free");
      if (x.src_dev) check(x.c->free(x.src_dev), "free");
      if (x.scratch) check(x.c->free(x.scratch), "free");
      if (x.src_pin) check(x.c->free_host(x.src_pin), "free_host");
    }
    o.problems = problem_count_;
    for (const std::string& p : problems_) o.first_problem += "  " + p + "\n";
    return o;
  }

  const Program& p_;
  Mailbox mail_;
  std::vector<Rt> rt_;
  std::vector<Client::IpcToken> buf_tok_;
  std::vector<Stamp> host_reads_;  // pageable destinations
  std::mutex problems_mu_;
  std::vector<std::string> problems_;  // the first few
  size_t problem_count_ = 0;
  std::atomic<bool> abort_{false};
  std::atomic<size_t> writes_{0}, records_{0}, acquires_{0}, messages_{0};
};

// ---------------------------------------------------------------------------
// Sessions to run a program on.

// Chaos makes a worker's dispatch threads spin: on a machine of two cores,
// more than about three spinning threads starve the guests' threads, so at
// most two sessions hold entries at random, or one with three dispatch threads.
struct Config {
  int sessions = 2;
  bool ordered = true;
  std::vector<uint8_t> chaos;   // per session
  std::vector<uint32_t> lanes;  // per session: dispatch threads
  uint32_t hold_us = 300;       // the longest random hold (WorkerOptions::chaos_max_hold_us)
  uint32_t slow = 1;            // writing kernels run 40..260 us times this
  int steps = 70;               // per session
};

std::string describe(const Config& k) {
  std::string out = std::to_string(k.sessions) + " sessions" + (k.ordered ? "" : ", UNORDERED") + ", holds up to " +
                    std::to_string(k.hold_us) + " us, kernels " + std::to_string(k.slow) + "x slow";
  for (int s = 0; s < k.sessions; ++s) {
    if (!k.chaos[size_t(s)] && k.lanes[size_t(s)] == 1) continue;
    out += ", s" + std::to_string(s) + ":";
    if (k.chaos[size_t(s)]) out += " chaos";
    if (k.lanes[size_t(s)] > 1) out += " " + std::to_string(k.lanes[size_t(s)]) + " dispatch threads";
  }
  return out;
}

Config config_for(uint64_t seed) {
  Config k;
  k.sessions = 2 + int(seed % 3);
  k.chaos.assign(size_t(k.sessions), 0);
  k.lanes.assign(size_t(k.sessions), 1);
  k.hold_us = seed % 2 ? 300 : 1000;
  k.slow = seed % 5 < 2 ? 8 : 1;
  const int a = int(seed / 3 % uint64_t(k.sessions)), b = (a + 1) % k.sessions;
  switch (seed % 4) {
    case 0:
      k.chaos[size_t(a)] = k.chaos[size_t(b)] = 1;
      break;  // two sessions hold entries at random
    case 1:   // one with three dispatch threads
      k.chaos[size_t(a)] = 1;
      for (auto& l : k.lanes) l = 2;
      k.lanes[size_t(a)] = 3;
      break;
    case 2:
      for (auto& l : k.lanes) l = 2;
      break;  // no holds, several dispatch threads
    default:
      k.chaos[size_t(a)] = 1;
      break;
  }
  return k;
}

// The sessions of one region as in-process workers, each a partition of its
// own sharing one IpcTable, as the supervisor's parts do.
struct InProcessSessions {
  InProcessSessions(const Config& k, uint64_t seed) {
    std::string err;
    table = IpcTable::create(&err);
    if (!table) throw std::runtime_error(err);
    for (int s = 0; s < k.sessions; ++s) {
      WorkerOptions o;
      o.ipc = table.get();
      o.partition = uint32_t(s);
      o.ordered = k.ordered;
      o.chaos_seed = k.chaos[size_t(s)] ? seed * 131 + uint64_t(s) + 1 : 0;
      o.dispatch_threads = k.lanes[size_t(s)];
      o.chaos_max_hold_us = k.hold_us;
      workers.push_back(std::make_unique<InProcessWorker>(o, 16u << 20, sim::make_sim_backend(1)));
      ClientOptions co;
      co.ordered = k.ordered;
      co.worker_timeout = 60s;
      clients.push_back(workers.back()->attach(co));
    }
  }
  ~InProcessSessions() {
    clients.clear();  // detach first: each session's end takes back its exports and imports
    workers.clear();
  }
  std::vector<Client*> raw() const {
    std::vector<Client*> v;
    for (auto& c : clients) v.push_back(c.get());
    return v;
  }
  std::unique_ptr<IpcTable> table;
  std::vector<std::unique_ptr<InProcessWorker>> workers;
  std::vector<std::unique_ptr<Client>> clients;
};

Program generate(uint64_t seed, const Config& k) { return Generator(seed, k.sessions, k.steps, k.slow).run(); }

bool print_programs() {
  const char* v = std::getenv("ORDO_IPC_MODEL_PRINT");
  return v && *v && *v != '0';
}

// Runs seed's program and reports it; `expect_clean`: fail the test on any violation or problem.
Outcome run_one(uint64_t seed, const Config& k, const std::vector<Client*>& clients, bool expect_clean) {
  const Program p = generate(seed, k);
  if (print_programs()) std::printf("%s", p.listing(100000).c_str());
  const Outcome o = Runner(p, clients).run();
  if (expect_clean && (o.violations || o.problems)) {
    ADD_FAILURE() << "seed " << seed << " (" << describe(k) << "): " << o.violations << " of " << o.reads
                  << " reads saw another value than the write they must follow\n"
                  << o.first_violations << o.problems << " calls failed or returned what they must not; the first:\n"
                  << o.first_problem << "rerun alone with ORDO_IPC_MODEL_SEED=" << seed << "\n"
                  << p.listing();
  }
  return o;
}

int rounds(int normal) {
  if (const char* v = std::getenv("ORDO_IPC_MODEL_ROUNDS"); v && *v) return std::max(1, std::atoi(v));
  return kSanitized ? std::max(2, normal / 3) : normal;
}

struct Sum {
  size_t reads = 0, cross = 0, writes = 0, records = 0, acquires = 0, messages = 0, violations = 0,
         cross_violations = 0;
  size_t fresh = 0, fresh_violations = 0;
  void add(const Outcome& o) {
    fresh += o.fresh;
    fresh_violations += o.fresh_violations;
    reads += o.reads;
    cross += o.cross_reads;
    writes += o.writes;
    records += o.records;
    acquires += o.acquires;
    messages += o.messages;
    violations += o.violations;
    cross_violations += o.cross_violations;
  }
};

TEST(IpcModel, RandomProgramsKeepEveryCrossSessionOrder) {
  std::vector<uint64_t> seeds;
  if (const char* v = std::getenv("ORDO_IPC_MODEL_SEED"); v && *v)
    seeds.push_back(std::strtoull(v, nullptr, 10));
  else
    for (int i = 0; i < rounds(18); ++i) seeds.push_back(uint64_t(1 + i));
  Sum sum;
  const auto t0 = Clock::now();
  for (uint64_t seed : seeds) {
    const Config k = config_for(seed);
    InProcessSessions ss(k, seed);
    sum.add(run_one(seed, k, ss.raw(), true));
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "%zu programs in %.1f s: %zu writes, %zu records, %zu messages, %zu acquires; %zu reads checked, %zu of "
      "them across sessions, %zu of a slot the message's record was the first to cover\n",
      seeds.size(), secs, sum.writes, sum.records, sum.messages, sum.acquires, sum.reads, sum.cross, sum.fresh);
  if (seeds.size() > 2) {
    EXPECT_GT(sum.reads, 40 * seeds.size());
    EXPECT_GT(sum.cross, sum.reads / 4);
  }
}

// Programs of the same generator on the supervisor's worker processes
// (--sessions 4, two or three of the parts attached): the sim's exports cross
// real process boundaries (/proc/PID/fd), and --chaos and --dispatch-threads
// are the command line's.
TEST(IpcModel, WorkerProcessesKeepEveryCrossSessionOrder) {
  Sum sum;
  for (int i = 0; i < (kSanitized ? 1 : 2); ++i) {
    const uint64_t seed = 1001 + uint64_t(i);
    Config k = config_for(seed);
    // Every part holds entries at random with --chaos (which spins): two
    // sessions with it, then three with two dispatch threads each and none.
    k.sessions = 2 + i;
    k.chaos.assign(size_t(k.sessions), uint8_t(i == 0));
    k.lanes.assign(size_t(k.sessions), 1 + uint32_t(i));
    std::vector<std::string> args = {"--sessions", "4", "--dispatch-threads", std::to_string(1 + i)};
    if (i == 0) args.insert(args.end(), {"--chaos", std::to_string(seed)});
    WorkerProcess w(args, "64M");
    std::vector<std::unique_ptr<Client>> cs;
    for (int s = 0; s < k.sessions; ++s) {
      ClientOptions co;
      co.worker_timeout = 60s;
      cs.push_back(w.attach(co));
    }
    std::vector<Client*> raw;
    for (auto& c : cs) raw.push_back(c.get());
    sum.add(run_one(seed, k, raw, true));
  }
  std::printf("worker processes: %zu reads checked, %zu across sessions\n", sum.reads, sum.cross);
  EXPECT_GT(sum.cross, 0u);
}

// The control: without edges and without the guest's wait for an
// interprocess record's or wait's dispatch, the same kind of programs under
// chaos must show reads that missed the write they were told of.
TEST(IpcModel, WithoutOrderingViolationsAreSeen) {
  Sum sum;
  std::string first;
  size_t problems = 0;
  int runs = 0;
  // Each program reads a dozen or so slots another session wrote just before
  // the message; without ordering some of those reads run before the write
  // (here 1 to 8 of the 24 in the first two programs): runs go on until one
  // did, 12 programs at most.
  for (uint64_t seed = 501; runs < 12 && (sum.fresh_violations == 0 || runs < 2); ++seed, ++runs) {
    Config k = config_for(seed);
    k.ordered = false;
    k.sessions = std::min(k.sessions, 3);
    k.chaos.assign(size_t(k.sessions), 1);
    k.lanes.assign(size_t(k.sessions), 1);
    k.hold_us = 1000;
    k.slow = 8;
    InProcessSessions ss(k, seed);
    const Outcome o = run_one(seed, k, ss.raw(), false);
    sum.add(o);
    problems += o.problems;
    if (first.empty() && o.fresh_violations) {
      // The first violations of a read the order across sessions must keep.
      first = o.first_violations;
    }
  }
  std::printf(
      "without ordering: %d programs, %zu of %zu reads violated (%zu of %zu across sessions, %zu of %zu of a "
      "slot the message's record was the first to cover); %zu calls failed; violations of the first program "
      "with such a one:\n%s",
      runs, sum.violations, sum.reads, sum.cross_violations, sum.cross, sum.fresh_violations, sum.fresh, problems,
      first.c_str());
  EXPECT_GT(sum.fresh_violations, 0u)
      << "the model check must catch sessions whose interprocess records and waits order nothing";
}

}  // namespace
}  // namespace ordo::test

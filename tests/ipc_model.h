// The IPC model (test_ipc_model.cc): random programs over 2 to 4 guest sessions of one region (guest processes,
// each with a worker of its own, sharing one IpcTable as the supervisor's
// parts do) that share device memory and interprocess events (cudaIpc*),
// checked against what CUDA promises across processes (ARCHITECTURE.md,
// "Sessions"; client.h, Client::ipc_*).
//
// What a program draws (ipc_model_generator.cc). Every session has the legacy stream,
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
#pragma once

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

namespace ordo::test::ipc_model {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using sim::Stamp;

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

inline const char* name(SK k) { return k == SK::Legacy ? "legacy" : k == SK::Blocking ? "blocking" : "non-blocking"; }
inline const char* name(Acq a) {
  return a == Acq::StreamWait ? "stream wait" : a == Acq::Synchronize ? "event synchronize" : "event query poll";
}
inline const char* name(WriteHow w) {
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
inline const char* name(ReadHow r) {
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
inline const char* name(MsgKind m) {
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

inline std::string Program::describe(int s, int t, const Act& a) const {
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

inline std::string Program::listing(size_t max_lines) const {
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

struct Outcome {
  size_t reads = 0, cross_reads = 0, writes = 0, records = 0, acquires = 0, messages = 0;
  size_t violations = 0, cross_violations = 0, problems = 0;
  // Reads in another session than the write, of a slot first covered by the
  // very record the reader was told of: those only the order across sessions keeps.
  size_t fresh = 0, fresh_violations = 0;
  std::string first_violations, first_problem;
};

// Seed's program (ipc_model_generator.cc). `slow`: how much longer the
// writing kernels run (the readers' do not).
Program generate(uint64_t seed, int sessions, int steps_per_session, uint32_t slow);
// Runs `p` with clients[s] as session s, checked against the model (ipc_model_runner.cc).
Outcome run(const Program& p, std::vector<Client*> clients);

}  // namespace ordo::test::ipc_model

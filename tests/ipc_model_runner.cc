// The IPC model's run (ipc_model.h): each session's threads play their
// actions against real clients, and every read is checked against the model.
#include "ipc_model.h"

namespace ordo::test::ipc_model {
namespace {

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

}  // namespace

Outcome run(const Program& p, std::vector<Client*> clients) { return Runner(p, std::move(clients)).run(); }

}  // namespace ordo::test::ipc_model

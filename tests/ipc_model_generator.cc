// The IPC model's generator (ipc_model.h): one serial schedule of all
// threads' actions, in which every message is sent before it is received.
#include "ipc_model.h"

namespace ordo::test::ipc_model {
namespace {

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

}  // namespace

Program generate(uint64_t seed, int sessions, int steps_per_session, uint32_t slow) {
  return Generator(seed, sessions, steps_per_session, slow).run();
}

}  // namespace ordo::test::ipc_model

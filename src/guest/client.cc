#include "ordo/client.h"

#include <immintrin.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <boost/interprocess/managed_external_buffer.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <unordered_map>

#include "transport/reply_slot.h"
#include "transport/ring.h"

namespace ordo {

namespace bip = boost::interprocess;

namespace {

std::atomic<uint64_t> g_next_client_id{1};

uint64_t steady_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000 + uint64_t(ts.tv_nsec);
}

uint64_t steady_ms() { return steady_ns() / 1000000; }

constexpr uint64_t align16(uint64_t v) { return (v + 15) & ~uint64_t{15}; }

// Linux lets a sleep of an ordinary thread overrun by its timer slack, 50 us by
// default: more than a small copy takes. While waiting for the worker the
// caller's thread sleeps with 1 us of slack, and gets its own back after.
class TightSleeps {
 public:
  TightSleeps() = default;
  TightSleeps(const TightSleeps&) = delete;
  TightSleeps& operator=(const TightSleeps&) = delete;
  ~TightSleeps() {
    if (saved_ > 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_), 0, 0, 0);
  }
  void sleep_ns(uint64_t ns) {
    if (saved_ == 0) {
      saved_ = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
      if (saved_ > 1000) prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
      else saved_ = -1;  // already tight: nothing to restore
    }
    timespec ts{0, long(ns)};
    nanosleep(&ts, nullptr);
  }

 private:
  long saved_ = 0;
};

}  // namespace

// Guest-private state of one ring. Nothing here is visible to the worker.
struct Client::Ring {
  std::mutex mu;                       // producers on this ring's streams
  RingWriter writer;                   // tail(): the next position to write
  std::atomic<uint64_t> published{0};  // tail, for other threads' edge snapshots
  uint32_t live = 0;                   // guarded by rings_mu_: streams on this ring
  uint64_t released_end = 0;           // guarded by rings_mu_: the fence before the last stream's destroy
  // Per device, the ring's streams of that device: how many live, and where
  // the last one destroyed left its work (the fence before its destroy). A
  // device's legacy stream follows the ring's blocking streams of the device:
  // all the ring published while one lives, else up to that fence, so other
  // streams left on the ring are never waited for; device_synchronize covers
  // the ring likewise for any stream of the device.
  struct Presence {
    std::atomic<uint32_t> live{0};  // changed under rings_mu_
    std::atomic<uint64_t> end{0};   // changed under mu and rings_mu_
  };
  std::array<Presence, kMaxDevices> on;        // every stream of the device
  std::array<Presence, kMaxDevices> blocking;  // its blocking streams
  std::array<uint64_t, kMaxDevices> legacy_seen{};  // under mu: each legacy stream's ring positions already covered by an edge from here
  uint64_t fence_end = 0;              // position just past the last fence
  // Staging window: a byte FIFO released in ring order as entries complete.
  uint64_t stage_head = 0, stage_tail = 0, fence_stage = 0;
  std::deque<std::pair<uint64_t, uint64_t>> stage_marks;  // (position, stage_tail after it)
};

// One stream id. `ring` and `blocking` are fixed while the stream is open.
struct Client::StreamState {
  std::atomic<bool> open{false};
  std::atomic<uint32_t> generation{0};
  std::atomic<uint32_t> ring{kNoRing};
  std::atomic<uint32_t> device{0};
  std::atomic<bool> blocking{false};
  Edge destroyed{};  // guarded by rings_mu_: the last StreamDestroy of this id; the next create follows it
};

struct Client::Bound {
  StreamState* st;
  Ring* g;
  uint32_t r;
  uint32_t id;  // the stream id: kLegacyStream resolved to the current device's legacy stream
};

struct Client::EventState {
  std::mutex mu;
  uint64_t handle = 0;
  uint32_t device = 0;
  bool recorded = false;
  Edge record{};      // the record the next user refers to
  uint64_t number = 0;  // records issued: the worker keeps a record's state while waits on it are to come
  uint64_t waits = 0;   // StreamWaitEvents issued on record `number`
};

struct Client::SlotPool {
  std::mutex mu;
  Client* client = nullptr;  // null once the client is gone
  std::vector<uint32_t> free;
};

struct Client::ThreadState {
  std::shared_ptr<SlotPool> pool;
  uint32_t slot = kNoSlot;      // permanent reply slot, or kNoSlot: lease one per sync call
  uint32_t err_slot = kNoSlot;  // where the worker reports this thread's async errors
  uint64_t seq = 0;
  uint64_t error_seen = 0;
  Status last_error = Status::kSuccess;
  uint64_t last_pos = 0;
  uint32_t device = 0;  // the current device
  std::array<Stream, kMaxDevices> per_thread;  // per device; id kNoStream: none yet
  // The errors already there when this call pushed its first entry (finish_async).
  bool marked = false;
  bool mark_sticky = false;
  uint64_t mark_error_seq = 0;

  ThreadState() { per_thread.fill(Stream{kNoStream, 0}); }
  ~ThreadState() {
    if (!pool) return;
    std::lock_guard lock(pool->mu);
    if (!pool->client) return;
    for (const Stream& s : per_thread)
      if (s.id != kNoStream) pool->client->release_stream(*this, s);
    if (slot != kNoSlot) pool->free.push_back(slot);
  }
};

struct Client::Heap {
  std::mutex mu;
  std::unique_ptr<bip::managed_external_buffer> buf;
};

// Host functions waiting for their stream. The handshake words live in the
// pinned heap (HostFuncWords); one runner thread polls them, since the worker
// cannot wake a thread across the VM boundary.
struct Client::HostFuncs {
  static constexpr uint32_t kSlots = 1024;  // host functions outstanding at once; more wait for one to finish
  // A caller told its host_func failed (a sticky fault, an earlier async error)
  // must be able to free what the function uses, as with CUDA, whose callback
  // then never runs: the function waits for its caller's verdict.
  enum Verdict : int { kUndecided, kRun, kSkip };
  struct Pending {
    uint32_t slot;
    uint64_t ticket;
    std::function<void()> fn;
    std::shared_ptr<std::atomic<int>> verdict;
  };
  std::mutex mu;
  std::condition_variable work_cv;  // the runner: new pending functions, or stop
  std::condition_variable slot_cv;  // callers: a free slot
  HostFuncWords* words = nullptr;   // kSlots of them, or null until the first host function
  std::vector<uint64_t> tickets;
  std::vector<uint32_t> free;
  std::deque<Pending> pending;
  std::atomic<uint64_t> ran{0};  // functions finished: released by the runner, acquired by every wait for the worker
  bool stop = false;
  std::thread runner;
};

namespace {
thread_local std::unordered_map<uint64_t, std::unique_ptr<void, void (*)(void*)>> t_states;
// The state of the client this thread used last: every call needs it, and a
// program has one client, so a compare usually replaces the hash lookup. Client
// ids are never reused and a state lives as long as its thread: never stale.
thread_local uint64_t t_last_id = 0;
thread_local void* t_last_state = nullptr;
}

Client::Client(std::unique_ptr<Region> region, ClientOptions options, uint64_t session)
    : region_(std::move(region)),
      opt_(options),
      bell_(region_->path(), region_->header()),
      session_(region_->header()->session),
      streams_(new StreamState[kMaxStreams]),
      slots_(std::make_shared<SlotPool>()),
      events_(new std::atomic<EventState*>[kMaxEvents]),
      heap_(std::make_unique<Heap>()),
      host_funcs_(std::make_unique<HostFuncs>()),
      id_(g_next_client_id.fetch_add(1)),
      guest_session_(session) {
  const Layout& l = region_->layout();
  device_count_ = region_->header()->device_count.load(std::memory_order_relaxed);  // attach checked it
  rings_.reserve(l.ring_count);
  for (uint32_t r = 0; r < l.ring_count; ++r) {
    auto g = std::make_unique<Ring>();
    g->writer = RingWriter(region_->entries(r), l.ring_capacity, &region_->ring(r));
    g->published.store(g->writer.tail());
    g->fence_end = g->writer.tail();
    rings_.push_back(std::move(g));
  }
  legacy_covered_[0].assign(l.ring_count, 0);
  rings_[kLegacyRing]->live = 1;
  rings_[kLegacyRing]->on[0].live.store(1, std::memory_order_relaxed);
  streams_[kLegacyStreamId].ring.store(kLegacyRing);
  streams_[kLegacyStreamId].open.store(true);
  for (uint32_t id = kMaxDevices; id < kMaxStreams; ++id) free_streams_.push_back(id);
  for (auto& m : smem_optin_) m.store(0, std::memory_order_relaxed);
  // Slot partition: permanent slots for the first threads, a few lease slots
  // for sync calls of the threads after them, and one shared error slot for
  // those threads' async errors (ARCHITECTURE.md, "Threads and slots").
  uint32_t permanent = l.slot_count;
  if (l.slot_count >= 3) {
    shared_slot_ = l.slot_count - 1;
    const uint32_t lease = std::max<uint32_t>(1, l.slot_count / 8);
    permanent = l.slot_count - 1 - lease;
    for (uint32_t s = permanent; s < shared_slot_; ++s) lease_free_.push_back(s);
  }
  for (uint32_t s = permanent; s-- > 0;) slots_->free.push_back(s);
  slots_->client = this;
  for (uint32_t i = 0; i < kMaxEvents; ++i) events_[i].store(nullptr, std::memory_order_relaxed);
  if (l.heap_size >= 4096)
    heap_->buf = std::make_unique<bip::managed_external_buffer>(bip::create_only, region_->heap(), l.heap_size);
  // The worker frees this session's resources when the beat stops (we died).
  heartbeat_ = std::thread([this] {
    std::unique_lock lock(beat_mu_);
    while (!beat_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return beat_stop_; }))
      region_->header()->guest_beat.fetch_add(1, std::memory_order_relaxed);
  });
}

Client::~Client() {
  {
    std::lock_guard lock(host_funcs_->mu);
    host_funcs_->stop = true;
  }
  host_funcs_->work_cv.notify_all();
  host_funcs_->slot_cv.notify_all();
  if (host_funcs_->runner.joinable()) host_funcs_->runner.join();
  {
    std::lock_guard lock(slots_->mu);
    slots_->client = nullptr;
  }
  {
    std::lock_guard lock(beat_mu_);
    beat_stop_ = true;
  }
  beat_cv_.notify_one();
  heartbeat_.join();
  // Detach: the worker frees whatever this session still holds.
  uint64_t mine = guest_session_;
  region_->header()->guest_session.compare_exchange_strong(mine, 0, std::memory_order_release);
  notify_worker();
  for (uint32_t i = 0; i < kMaxEvents; ++i) delete events_[i].load();
}

std::unique_ptr<Client> Client::attach(const std::string& spec, std::string* error, ClientOptions options) {
  const std::string path = resolve_region(spec, error);
  if (path.empty()) return nullptr;
  auto whole = Region::map(path, error);
  if (!whole) return nullptr;
  if (!whole->validate(error)) return nullptr;
  if (const char* u = std::getenv("ORDO_UNORDERED"); u && *u == '1') options.ordered = false;
  // One guest process (session) per part of the region, each part with a
  // worker process of its own. A part is claimed with a compare-and-swap, so
  // processes attaching at the same instant each get their own: first a free
  // part, else one whose guest stopped its heartbeat (it died without detaching).
  std::vector<std::unique_ptr<Region>> parts;
  for (uint32_t k = 0; k < whole->partitions(); ++k) {
    auto part = whole->partition(k, error);
    if (!part) return nullptr;
    parts.push_back(std::move(part));
  }
  std::random_device rd;
  const uint64_t session = (uint64_t{rd()} << 32 | rd()) | 1;
  auto serving = [](const Region& r) {
    const uint32_t s = r.header()->worker_state.load(std::memory_order_acquire);
    return s == uint32_t(WorkerState::kServing) || s == uint32_t(WorkerState::kIdle);
  };
  auto claim = [&](Region& r, uint64_t from) {
    return serving(r) && r.header()->guest_session.compare_exchange_strong(from, session, std::memory_order_acq_rel);
  };
  std::unique_ptr<Region> region;
  for (auto& p : parts)
    if (!region && claim(*p, 0)) region = std::move(p);
  if (!region) {
    std::vector<uint64_t> owner(parts.size()), beat(parts.size());
    bool any_serving = false;
    for (size_t k = 0; k < parts.size(); ++k) {
      if (!parts[k]) continue;
      any_serving |= serving(*parts[k]);
      owner[k] = parts[k]->header()->guest_session.load(std::memory_order_acquire);
      beat[k] = parts[k]->header()->guest_beat.load(std::memory_order_relaxed);
    }
    if (!any_serving) {
      if (error) *error = "no worker is serving region " + path + " (start ordo-worker --region " + path + ")";
      return nullptr;
    }
    usleep(300000);  // a live guest beats every 100 ms
    // Freed meanwhile (by its process, or by its worker once the heartbeat
    // timed out), or still held by a silent one.
    for (size_t k = 0; k < parts.size() && !region; ++k)
      if (parts[k] && (claim(*parts[k], 0) || (parts[k]->header()->guest_beat.load(std::memory_order_relaxed) == beat[k] &&
                                               claim(*parts[k], owner[k]))))
        region = std::move(parts[k]);
    if (!region) {
      if (error)
        *error = "region " + path + " is in use by " +
                 (parts.size() == 1 ? "another live guest process (its worker serves one: start ordo-worker with "
                                      "--sessions 2 or more)"
                                    : std::to_string(parts.size()) + " live guest processes, as many as it has "
                                      "sessions (start ordo-worker with a larger --sessions)");
      return nullptr;
    }
  }
  RegionHeader* h = region->header();
  WorkerBell bell(path, h);
  const uint64_t deadline = steady_ms() + uint64_t(options.attach_timeout.count());
  while (h->attached_session.load(std::memory_order_acquire) != session) {
    if (steady_ms() > deadline) {
      uint64_t mine = session;
      h->guest_session.compare_exchange_strong(mine, 0);  // the part is free again
      if (error) *error = "worker on " + path + " did not accept the guest session within " +
                          std::to_string(options.attach_timeout.count()) + " ms (is ordo-worker still running?)";
      return nullptr;
    }
    // A worker restarting (after a kernel fault on a GPU) resets the header:
    // ask again.
    uint64_t none = 0;
    h->guest_session.compare_exchange_strong(none, session, std::memory_order_acq_rel);
    bell.ring();
    usleep(200);
  }
  const uint32_t devices = h->device_count.load(std::memory_order_acquire);
  if (devices == 0 || devices > kMaxDevices) {
    uint64_t mine = session;
    h->guest_session.compare_exchange_strong(mine, 0);
    if (error) *error = "worker on " + path + " reports " + std::to_string(devices) + " devices (1 to " +
                        std::to_string(kMaxDevices) + " expected): is it an ordo-worker of the same version?";
    return nullptr;
  }
  return std::unique_ptr<Client>(new Client(std::move(region), options, session));
}

std::unique_ptr<Client> Client::attach_from_env(std::string* error, ClientOptions options) {
  const char* p = std::getenv("ORDO_REGION");
  if (!p || !*p) {
    if (error) *error = "ORDO_REGION is not set (set it to the region path the worker serves, e.g. /dev/shm/ordo)";
    return nullptr;
  }
  return attach(p, error, options);
}

std::unique_ptr<Client> Client::attach_for_cuda(std::string_view library, Status* status) {
  std::string err;
  auto c = attach_from_env(&err);
  if (c) return c;
  const char* region = std::getenv("ORDO_REGION");
  *status = region && *region && err.find("worker") != std::string::npos ? Status::kDevicesUnavailable
                                                                          : Status::kInitializationError;
  std::fprintf(stderr,
               "ordo: cannot reach the host GPU: %s\n"
               "ordo: this %.*s; it needs ORDO_REGION set to the region an ordo-worker serves (e.g. ordo-worker "
               "--region /dev/shm/ordo, then ORDO_REGION=/dev/shm/ordo). Every CUDA call will fail with error %d.\n",
               err.c_str(), int(library.size()), library.data(), int(*status));
  return nullptr;
}

[[gnu::always_inline]] inline Client::ThreadState& Client::thread() {
  if (t_last_id == id_) [[likely]] return *static_cast<ThreadState*>(t_last_state);
  return thread_slow();
}

Client::ThreadState& Client::thread_slow() {
  auto it = t_states.find(id_);
  if (it != t_states.end()) {
    t_last_id = id_;
    t_last_state = it->second.get();
    return *static_cast<ThreadState*>(t_last_state);
  }
  auto* t = new ThreadState();
  t->pool = slots_;
  {
    std::lock_guard lock(slots_->mu);
    if (!slots_->free.empty()) {
      t->slot = slots_->free.back();
      slots_->free.pop_back();
    }
  }
  // Threads beyond the permanent slots send their async entries with the shared
  // error slot and borrow a lease slot for each sync call (more threads than
  // slots is normal: thread pools, one thread per request).
  t->err_slot = t->slot != kNoSlot ? t->slot : shared_slot_;
  if (t->slot != kNoSlot) t->seq = region_->slot(t->slot).request.seq.load(std::memory_order_relaxed);
  if (t->err_slot != kNoSlot) t->error_seen = region_->slot(t->err_slot).error_seq.load(std::memory_order_acquire);
  auto [pos, _] = t_states.emplace(id_, std::unique_ptr<void, void (*)(void*)>(
                                            t, [](void* p) {
                                              if (t_last_state == p) t_last_id = 0, t_last_state = nullptr;
                                              delete static_cast<ThreadState*>(p);
                                            }));
  t_last_id = id_;
  t_last_state = pos->second.get();
  return *static_cast<ThreadState*>(t_last_state);
}

Status Client::check_async_error(ThreadState& t) {
  if (t.err_slot == kNoSlot) return Status::kSuccess;
  ReplySlot& s = region_->slot(t.err_slot);
  const uint64_t seq = s.error_seq.load(std::memory_order_acquire);
  if (seq == t.error_seen) return Status::kSuccess;
  t.error_seen = seq;
  return Status(s.error);
}

Status Client::sticky_error() const {
  return Status(region_->header()->sticky_error.load(std::memory_order_acquire));
}

Status Client::finish(ThreadState& t, Status own) {
  t.marked = false;
  if (lost_.load(std::memory_order_relaxed)) own = Status::kDevicesUnavailable;
  else if (const Status f = sticky_error(); !ok(f)) own = f;
  const Status async = check_async_error(t);
  const Status result = ok(own) ? async : own;
  if (!ok(result) && result != Status::kNotReady) t.last_error = result;
  return result;
}

Status Client::finish_own(ThreadState& t, Status own) {
  // Calls that create something answer for themselves: mixing in an earlier
  // async error would report a failure for a handle that exists (and leaks),
  // and callers that cache a lookup's result would keep that error forever.
  // The async error stays pending for the thread's next call.
  t.marked = false;
  if (lost_.load(std::memory_order_relaxed)) own = Status::kDevicesUnavailable;
  else if (const Status f = sticky_error(); !ok(f)) own = f;
  if (!ok(own) && own != Status::kNotReady) t.last_error = own;
  return own;
}

Status Client::finish_async(ThreadState& t) {
  // An async call returns the errors that were there when it enqueued, never
  // the one its own work causes, however fast the worker ran it: that one is
  // the next call's, as on a GPU.
  if (!t.marked) return finish(t, Status::kSuccess);
  t.marked = false;
  Status result = Status::kSuccess;
  if (lost_.load(std::memory_order_relaxed)) result = Status::kDevicesUnavailable;
  else if (t.mark_sticky) result = sticky_error();
  else if (t.mark_error_seq != t.error_seen) result = check_async_error(t);
  if (!ok(result)) t.last_error = result;
  return result;
}

Status Client::get_last_error() {
  ThreadState& t = thread();
  finish(t, Status::kSuccess);
  const Status s = t.last_error;
  // A kernel fault stays: cudaGetLastError keeps returning it, as CUDA's does.
  t.last_error = sticky_error();
  return s;
}

Status Client::peek_last_error() {
  ThreadState& t = thread();
  finish(t, Status::kSuccess);
  return t.last_error;
}

uint32_t Client::ring_of_stream(Stream s) {
  Bound b;
  return bind(s, &b) ? b.r : kNoRing;
}

uint64_t Client::last_position(Stream) const {
  auto it = t_states.find(id_);
  return it == t_states.end() ? 0 : static_cast<ThreadState*>(it->second.get())->last_pos;
}

void Client::notify_worker() {
  // No full fence between the store just published and this load: the worker
  // polls once more a grace period after announcing its sleep, by when the
  // store has left this core's store buffer (ARCHITECTURE.md, "Idle"). The
  // sfence flushes a write-combined BAR mapping's buffer, which has no such bound.
  _mm_sfence();
  if (region_->header()->worker_sleeping.load(std::memory_order_relaxed)) bell_.ring();
}

bool Client::worker_alive() {
  const RegionHeader* h = region_->header();
  return h->session == session_ &&
         h->worker_state.load(std::memory_order_acquire) == uint32_t(WorkerState::kServing) &&
         h->attached_session.load(std::memory_order_acquire) == guest_session_;
}

Status Client::wait_worker(const std::atomic<uint64_t>& word, uint64_t target) {
  // A worker found dead stays dead for this session: fail at once, not after
  // another timeout per call.
  if (lost_.load(std::memory_order_relaxed)) return Status::kDevicesUnavailable;
  uint64_t beat = region_->header()->heartbeat_ns.load(std::memory_order_relaxed);
  uint64_t beat_changed_ms = 0;
  uint64_t slept_since = 0;
  TightSleeps sleeps;
  for (uint64_t i = 0;; ++i) {
    if (word.load(std::memory_order_acquire) >= target) {
      // What the worker reports may follow a host function's `done` (through
      // another process): make what the function did visible here too.
      host_funcs_->ran.load(std::memory_order_acquire);
      return Status::kSuccess;
    }
    if (i < 2000) {
      _mm_pause();
      continue;
    }
    if (i < 2100) {
      sched_yield();
      continue;
    }
    // A guest cannot be woken across the VM boundary: poll. Each sleep is an
    // eighth of the time slept so far (2 to 500 us), so a wait ends at most
    // about 12% after the worker's answer, however long it took (doubling
    // sleeps overran a 300 us GPU copy by 200 us).
    const uint64_t now_ns = steady_ns();
    if (!slept_since) slept_since = now_ns;
    sleeps.sleep_ns(std::clamp<uint64_t>((now_ns - slept_since) / 8, 2000, 500000));
    if ((i & 63) == 0) {
      notify_worker();
      const uint64_t now = steady_ms();
      const uint64_t b = region_->header()->heartbeat_ns.load(std::memory_order_relaxed);
      if (b != beat || beat_changed_ms == 0) {
        beat = b;
        beat_changed_ms = now;
      }
      if (!worker_alive() || now - beat_changed_ms > uint64_t(opt_.worker_timeout.count())) {
        lost_.store(true, std::memory_order_relaxed);
        return Status::kDevicesUnavailable;
      }
    }
  }
}

[[gnu::always_inline]] inline bool Client::bind(Stream s, Bound* out) {
  uint32_t id = s.id;
  if (id == kLegacyStreamId) {
    id = thread().device;  // as stream 0 in CUDA: the current device's legacy stream (set_device opened it)
  } else if (id < kMaxDevices || id >= kMaxStreams) {
    return false;  // another device's legacy stream is never named by its id
  }
  StreamState& st = streams_[id];
  if (!st.open.load(std::memory_order_acquire) ||
      (id >= kMaxDevices && st.generation.load(std::memory_order_relaxed) != s.generation))
    return false;
  out->st = &st;
  out->r = st.ring.load(std::memory_order_relaxed);
  out->g = rings_[out->r].get();
  out->id = id;
  return true;
}

[[gnu::always_inline]] inline Entry* Client::claim_slot(Ring& g) {
  Entry* slot = g.writer.claim();
  if (!slot) [[unlikely]] {
    notify_worker();
    // Backpressure: the worker dispatches without guest help (edges point back), so this ends.
    if (!ok(wait_worker(g.writer.head(), g.writer.room_at()))) return nullptr;  // session lost: finish() says so
    slot = g.writer.claim();
  }
  return slot;
}

[[gnu::always_inline]] inline void Client::commit_slot(Ring& g) {
  // After notify_worker's sfence: on a write-combined BAR mapping the entry's
  // publishing store may otherwise still wait in this core's write-combining
  // buffer when another thread reads `published`, names the entry in an edge,
  // and the worker rejects that edge as naming an unpublished entry.
  notify_worker();
  g.published.store(g.writer.tail(), std::memory_order_release);
}

void Client::write_entry(Ring& g, const Entry& e) {
  Entry* slot = claim_slot(g);
  if (!slot) return;
  g.writer.publish(slot, e);
  commit_slot(g);
}

[[gnu::always_inline]] inline void Client::legacy_edges(Ring& g, uint32_t r, uint32_t stream, EdgeList* edges) {
  const StreamState& st = streams_[stream];
  const uint32_t d = st.device.load(std::memory_order_relaxed);
  if (stream < kMaxDevices) {
    // Legacy stream work follows everything published on its device's
    // blocking streams (on its own ring, ring order does that).
    std::vector<uint64_t>& covered = legacy_covered_[d];  // under this ring's mu, as every push on the stream
    for (uint32_t q = 0; q < rings_.size(); ++q) {
      if (q == r) continue;
      Ring& o = *rings_[q];
      const uint64_t p = o.blocking[d].live.load(std::memory_order_acquire) ? o.published.load(std::memory_order_acquire)
                                                                             : o.blocking[d].end.load(std::memory_order_acquire);
      if (p > covered[q]) {
        edges->push_back({q, 0, p});
        covered[q] = p;
      }
    }
  } else if (st.blocking.load(std::memory_order_relaxed)) {
    // Blocking stream work follows everything published on its device's legacy stream.
    const StreamState& legacy = streams_[d];
    if (!legacy.open.load(std::memory_order_acquire)) return;
    const uint32_t lr = legacy.ring.load(std::memory_order_relaxed);
    if (lr == r) return;
    const uint64_t p = rings_[lr]->published.load(std::memory_order_acquire);
    if (p > g.legacy_seen[d]) {
      edges->push_back({lr, 0, p});
      g.legacy_seen[d] = p;
    }
  }
}

[[gnu::always_inline]] inline void Client::mark_errors(ThreadState& t) {
  if (t.marked) return;  // before the worker can see this call's entry, let alone fail it
  t.marked = true;
  t.mark_sticky = !ok(sticky_error());
  t.mark_error_seq = t.err_slot == kNoSlot ? t.error_seen
                                           : region_->slot(t.err_slot).error_seq.load(std::memory_order_acquire);
}

uint64_t Client::push_locked(ThreadState& t, Ring& g, uint32_t r, uint32_t stream, const Entry& call,
                             EventState* ev) {
  mark_errors(t);
  // Inline storage: no heap allocation unless an entry needs more than 16 edges.
  // (Not a reused thread_local vector: a thread_local with a destructor is gone
  // before the static destructors and atexit handlers that may still push.)
  EdgeList edges;
  for (unsigned k = 0; k < call.edge_count && k < kMaxEdges; ++k) edges.push_back(call.edges[k]);
  if (ev) return push_event_locked(t, g, r, stream, call, *ev, edges);
  if (opt_.ordered && info(static_cast<Op>(call.op)).order != Order::None) legacy_edges(g, r, stream, &edges);
  return push_edges_locked(t, g, stream, call, edges);
}

uint64_t Client::push_event_locked(ThreadState& t, Ring& g, uint32_t r, uint32_t stream, const Entry& call,
                                   EventState& ev, EdgeList& edges) {
  // Numbered under the event's lock, so numbers and wait counts follow the
  // order in which records and waits replaced and used the event's state.
  // A re-record needs no edge to the record it replaces or its waits: the
  // worker keeps that record in a backend event of its own while waits on it
  // are to come (EventTable), so nothing CUDA would not hold holds it.
  std::lock_guard lock(ev.mu);
  const bool record = static_cast<Op>(call.op) == Op::EventRecord;
  Entry e = call;
  e.arg[1] = record ? ev.number + 1 : ev.number;
  e.arg[2] = record ? ev.waits : 0;
  if (opt_.ordered) {
    legacy_edges(g, r, stream, &edges);
    if (!record && ev.recorded) edges.push_back(ev.record);
  }
  const uint64_t pos = push_edges_locked(t, g, stream, e, edges);
  if (record) {
    ev.recorded = true;
    ev.record = {r, 0, pos + 1};
    ev.number++;
    ev.waits = 0;
  } else {
    ev.waits++;
  }
  return pos;
}

uint64_t Client::push_edges_locked(ThreadState& t, Ring& g, uint32_t stream, const Entry& call,
                                   const EdgeList& edges) {
  // By reference, then copied: a 64-byte-aligned argument passed by value is
  // copied with `rep movs`, on every call.
  Entry e = call;
  e.thread = t.err_slot;
  e.stream = stream;
  size_t i = 0;
  // More edges than fit: earlier Nop entries on the same ring carry the rest.
  while (edges.size() - i > kMaxEdges) {
    Entry nop{};
    nop.op = uint16_t(Op::Nop);
    nop.thread = t.err_slot;
    nop.stream = stream;
    nop.edge_count = kMaxEdges;
    for (uint32_t k = 0; k < kMaxEdges; ++k) nop.edges[k] = edges[i++];
    write_entry(g, nop);
  }
  e.edge_count = uint8_t(edges.size() - i);
  for (uint32_t k = 0; i < edges.size(); ++k) e.edges[k] = edges[i++];
  const uint64_t pos = g.writer.tail();
  write_entry(g, e);
  t.last_pos = pos;
  return pos;
}

[[gnu::always_inline]] inline uint64_t Client::push_launch_locked(ThreadState& t, Ring& g, uint32_t r, uint32_t stream,
                                                                  const uint64_t (&arg)[6]) {
  static_assert(info(Op::Launch).order == Order::Stream);
  static_assert(offsetof(Entry, stream) == offsetof(Entry, thread) + 4 && offsetof(Entry, arg) % 16 == 0);
  // Each store a launch makes queues behind the previous launch's entry line
  // while the worker's core holds that line; past a few dozen the queue is
  // full and the launch waits out the line's trip (ARCHITECTURE.md, "The
  // launch path"). So the common case writes its fields in the slot, once,
  // in four stores and the publishing one.
  mark_errors(t);
  EdgeList edges;
  if (opt_.ordered) legacy_edges(g, r, stream, &edges);
  if (!edges.empty()) [[unlikely]] return push_launch_edges_locked(t, g, stream, arg, edges);
  Entry* slot = claim_slot(g);
  t.last_pos = g.writer.tail();
  if (!slot) return t.last_pos;  // session lost: finish() says so
  const uint64_t who = t.err_slot | uint64_t{stream} << 32;
  std::memcpy(reinterpret_cast<char*>(slot) + offsetof(Entry, thread), &who, sizeof who);  // thread, stream
  for (int k = 0; k < 6; k += 2)
    _mm_store_si128(reinterpret_cast<__m128i*>(&slot->arg[k]), _mm_set_epi64x(int64_t(arg[k + 1]), int64_t(arg[k])));
  g.writer.publish_in_place(slot, uint64_t(Op::Launch));
  commit_slot(g);
  return t.last_pos;
}

uint64_t Client::push_launch_edges_locked(ThreadState& t, Ring& g, uint32_t stream,
                                          const uint64_t (&arg)[6], const EdgeList& edges) {
  Entry e{};
  e.op = uint16_t(Op::Launch);
  std::copy(std::begin(arg), std::end(arg), e.arg);
  return push_edges_locked(t, g, stream, e, edges);
}

uint64_t Client::push_fence_locked(ThreadState& t, Ring& g, uint32_t r) {
  Entry e{};
  e.op = uint16_t(Op::Fence);
  const uint64_t keep = t.last_pos;  // a fence is bookkeeping, not the caller's call
  push_locked(t, g, r, kLegacyStreamId, e, nullptr);  // a fence covers the ring, whatever stream it names
  t.last_pos = keep;
  g.fence_end = g.writer.tail();
  g.fence_stage = g.stage_tail;
  return g.fence_end;
}

Status Client::wait_completed(uint32_t r, uint64_t pos) { return wait_worker(region_->ring(r).completed, pos); }

void Client::reclaim_staging(Ring& g, uint32_t r) {
  const uint64_t done = region_->ring(r).completed.load(std::memory_order_acquire);
  while (!g.stage_marks.empty() && g.stage_marks.front().first < done) {
    g.stage_head = g.stage_marks.front().second;
    g.stage_marks.pop_front();
  }
}

bool Client::try_alloc_staging(Ring& g, uint32_t r, uint64_t size, uint64_t* offset) {
  const uint64_t w = region_->layout().staging_per_ring;
  reclaim_staging(g, r);
  const uint64_t cur = g.stage_tail % w;
  const uint64_t skip = cur + size > w ? w - cur : 0;
  if (g.stage_tail + skip + size - g.stage_head > w) return false;
  g.stage_tail += skip;
  *offset = g.stage_tail % w;
  g.stage_tail += size;
  return true;
}

bool Client::alloc_staging(ThreadState& t, Ring& g, uint32_t r, uint64_t size, uint64_t* offset) {
  size = align16(size);
  if (size > region_->layout().staging_per_ring / 2) return false;
  while (!try_alloc_staging(g, r, size, offset)) {
    // Full: staging comes back as entries complete, which we learn at fences.
    if (g.fence_end < g.writer.tail()) push_fence_locked(t, g, r);
    const uint64_t want = g.stage_marks.empty() ? g.fence_end : g.stage_marks.front().first + 1;
    if (!ok(wait_completed(r, want))) return false;
  }
  return true;
}

// Pageable copies move through staging in chunks: a quarter of the copy, at
// least 64 KiB (a chunk costs an entry and, for D2H, a fence) and at most a
// quarter of the ring's window, so that up to four are in flight.
uint64_t Client::staging_chunk(uint64_t size) const {
  const uint64_t w = region_->layout().staging_per_ring;
  // The window's quarter wins over the 64 KiB floor (a small region's window is 4 KiB).
  return std::min<uint64_t>(std::max<uint64_t>((size / 4 + 4095) & ~uint64_t{4095}, 64 << 10), w / 4);
}

Status Client::stream_op(Stream s, Entry e, EventState* ev) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  // CUDA records an event only on a stream of the event's device.
  if (ev && static_cast<Op>(e.op) == Op::EventRecord && b.st->device.load(std::memory_order_relaxed) != ev->device)
    return finish(t, Status::kInvalidResourceHandle);
  std::lock_guard lock(b.g->mu);
  push_locked(t, *b.g, b.r, b.id, e, ev);
  return finish_async(t);
}

// ---- devices ---------------------------------------------------------------

uint32_t Client::choose_ring_locked() const {
  // The ring with the fewest streams: its own ring while streams are fewer
  // than rings, shared ones after that (ARCHITECTURE.md, "Streams and rings").
  // Among those, one whose destroyed streams' work completed: that work may
  // be a host function the program has not let return, and the ring holds
  // every later entry behind it, a new stream's too.
  auto rank = [&](uint32_t q) {
    const Ring& g = *rings_[q];
    const bool pending = region_->ring(q).completed.load(std::memory_order_acquire) < g.released_end;
    return uint64_t{g.live} * 2 + pending;
  };
  uint32_t r = 0;
  for (uint32_t q = 1; q < rings_.size(); ++q)
    if (!r || rank(q) < rank(r)) r = q;
  return r;
}

Status Client::open_legacy(ThreadState& t, uint32_t d) {
  std::lock_guard lock(rings_mu_);
  StreamState& st = streams_[d];
  if (st.open.load(std::memory_order_relaxed)) return Status::kSuccess;
  const uint32_t r = choose_ring_locked();
  Ring& g = *rings_[r];
  ++g.live;
  g.on[d].live.fetch_add(1, std::memory_order_release);
  legacy_covered_[d].assign(rings_.size(), 0);
  st.ring.store(r, std::memory_order_relaxed);
  st.device.store(d, std::memory_order_relaxed);
  // Opened under rings_mu_: a thread reaches device d's legacy stream only
  // after its own set_device(d), which waits here, so nothing is pushed on the
  // stream before its create below.
  st.open.store(true, std::memory_order_release);
  region_->header()->ring_open[r / 64].fetch_or(uint64_t{1} << (r % 64), std::memory_order_release);
  Entry e{};
  e.op = uint16_t(Op::StreamCreate);
  e.arg[0] = kStreamLegacy;
  e.arg[2] = d;
  std::lock_guard rl(g.mu);
  push_locked(t, g, r, d, e, nullptr);
  return Status::kSuccess;
}

Status Client::set_device(uint32_t device) {
  ThreadState& t = thread();
  if (device >= device_count_) return finish_own(t, Status::kInvalidDevice);
  if (device == t.device) return Status::kSuccess;
  if (Status s = open_legacy(t, device); !ok(s)) return finish_own(t, s);
  t.device = device;
  return finish_own(t, Status::kSuccess);
}

uint32_t Client::current_device() { return thread().device; }

bool Client::device_of(Stream s, uint32_t* device) {
  Bound b;
  if (!bind(s, &b)) return false;
  *device = b.st->device.load(std::memory_order_relaxed);
  return true;
}

namespace {
Entry peer_request(uint32_t device, uint32_t peer, PeerCmd cmd) {
  Entry e{};
  e.op = uint16_t(Op::PeerAccess);
  e.arg[0] = device;
  e.arg[1] = peer;
  e.arg[2] = uint64_t(cmd);
  return e;
}
}  // namespace

Status Client::can_access_peer(int* can, uint32_t device, uint32_t peer) {
  ThreadState& t = thread();
  if (!can) return finish_own(t, Status::kInvalidValue);
  if (device >= device_count_ || peer >= device_count_) return finish_own(t, Status::kInvalidDevice);
  if (device == peer) {  // as CUDA: a device is not its own peer
    *can = 0;
    return finish_own(t, Status::kSuccess);
  }
  uint64_t r0 = 0;
  const Status s = call(peer_request(device, peer, PeerCmd::kQuery), &r0);
  if (ok(s)) *can = r0 ? 1 : 0;
  return finish_own(t, s);
}

Status Client::peer_access(uint32_t peer, PeerCmd cmd) {
  ThreadState& t = thread();
  if (peer >= device_count_ || peer == t.device) return finish(t, Status::kInvalidDevice);
  return finish(t, call(peer_request(t.device, peer, cmd)));
}

Status Client::enable_peer_access(uint32_t peer) { return peer_access(peer, PeerCmd::kEnable); }
Status Client::disable_peer_access(uint32_t peer) { return peer_access(peer, PeerCmd::kDisable); }

// ---- streams ---------------------------------------------------------------

Status Client::stream_create(Stream* out, uint64_t flags, int priority) {
  ThreadState& t = thread();
  if (!out || (flags & ~kStreamNonBlocking)) return finish_own(t, Status::kInvalidValue);
  // After a kernel fault the context is dead: CUDA creates nothing and says so.
  if (const Status f = sticky_error(); !ok(f)) return finish_own(t, f);
  const bool blocking = !(flags & kStreamNonBlocking);
  const uint32_t d = t.device;
  uint32_t id, r = 0, generation;
  Entry e{};
  e.op = uint16_t(Op::StreamCreate);
  e.arg[0] = flags;
  e.arg[1] = uint64_t(int64_t(priority));
  e.arg[2] = d;
  {
    std::lock_guard lock(rings_mu_);
    if (free_streams_.empty() || rings_.size() < 2) return finish_own(t, Status::kMemoryAllocation);
    r = choose_ring_locked();
    id = free_streams_.front();
    free_streams_.pop_front();
    StreamState& st = streams_[id];
    ++rings_[r]->live;
    rings_[r]->on[d].live.fetch_add(1, std::memory_order_release);
    if (blocking) rings_[r]->blocking[d].live.fetch_add(1, std::memory_order_release);
    // The worker knows a stream id only once the StreamDestroy of its previous
    // stream (maybe on another ring) has been dispatched.
    if (st.destroyed.pos && st.destroyed.ring != r) e.edges[e.edge_count++] = st.destroyed;
    st.ring.store(r, std::memory_order_relaxed);
    st.device.store(d, std::memory_order_relaxed);
    st.blocking.store(blocking, std::memory_order_relaxed);
    generation = st.generation.fetch_add(1, std::memory_order_relaxed) + 1;
    st.open.store(true, std::memory_order_release);
  }
  region_->header()->ring_open[r / 64].fetch_or(uint64_t{1} << (r % 64), std::memory_order_release);
  Ring& g = *rings_[r];
  {
    std::lock_guard lock(g.mu);
    push_locked(t, g, r, id, e, nullptr);
  }
  *out = {id, generation};
  return finish_own(t, Status::kSuccess);
}

Status Client::release_stream(ThreadState& t, Stream s) {
  std::lock_guard lock(rings_mu_);
  const uint32_t id = s.id;
  StreamState& st = streams_[id];
  // Checked again under the lock: two destroys of one handle release it once.
  if (!st.open.load(std::memory_order_relaxed) || st.generation.load(std::memory_order_relaxed) != s.generation)
    return Status::kInvalidResourceHandle;
  const uint32_t r = st.ring.load(std::memory_order_relaxed);
  Ring& g = *rings_[r];
  std::lock_guard rl(g.mu);
  // CUDA defers the destroy: the stream's work still runs. The fence lets the
  // ring's later fences (device-wide waits) cover that work once the stream is gone.
  if (g.fence_end != g.writer.tail()) push_fence_locked(t, g, r);
  const uint32_t d = st.device.load(std::memory_order_relaxed);
  g.on[d].end.store(g.fence_end, std::memory_order_release);
  g.on[d].live.fetch_sub(1, std::memory_order_release);
  g.released_end = g.fence_end;
  if (st.blocking.load(std::memory_order_relaxed)) {
    g.blocking[d].end.store(g.fence_end, std::memory_order_release);
    g.blocking[d].live.fetch_sub(1, std::memory_order_release);
  }
  Entry e{};
  e.op = uint16_t(Op::StreamDestroy);
  const uint64_t pos = push_locked(t, g, r, id, e, nullptr);
  st.destroyed = {r, 0, pos + 1};
  st.open.store(false, std::memory_order_release);
  --g.live;
  free_streams_.push_back(id);
  return Status::kSuccess;
}

Status Client::stream_destroy(Stream s) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b) || b.id < kMaxDevices) return finish(t, Status::kInvalidResourceHandle);
  for (Stream& p : t.per_thread)
    if (p.id == s.id && p.generation == s.generation)
      p = Stream{kNoStream, 0};  // destroyed by hand: the thread's exit has nothing left to release
  return finish(t, release_stream(t, s));
}

Stream Client::per_thread_stream() {
  ThreadState& t = thread();
  Stream& p = t.per_thread[t.device];
  if (p.id == kNoStream) {
    Stream s;
    if (ok(stream_create(&s, 0, 0))) p = s;
  }
  // No stream: an invalid handle, never a silent switch to the legacy stream
  // (that would change what the program's calls synchronize with).
  return p;
}

Status Client::stream_synchronize(Stream s) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  bool shared;
  {
    std::lock_guard lock(rings_mu_);
    shared = b.g->live > 1;
  }
  if (shared) {
    // A fence would also wait for the ring-mates' work: ask for this stream
    // alone, once everything it published so far was dispatched.
    Entry req{};
    req.op = uint16_t(Op::StreamSynchronize);
    req.arg[0] = b.id;
    const uint64_t end = b.g->published.load(std::memory_order_acquire);
    if (end) req.edges[req.edge_count++] = {b.r, 0, end};
    const Status st = call(req);
    // A legacy stream (past device 0's, it may share a ring) also covers its
    // device's blocking streams, which the request does not.
    if (!ok(st) || !opt_.ordered || b.id >= kMaxDevices) return finish(t, st);
    std::vector<std::pair<uint32_t, uint64_t>> targets;
    legacy_targets(t, b.id, &targets);
    return wait_targets(t, targets);
  }
  std::vector<std::pair<uint32_t, uint64_t>> targets;
  fence_target(t, b.r, &targets);
  if (opt_.ordered && b.id < kMaxDevices) legacy_targets(t, b.id, &targets);
  return wait_targets(t, targets);
}

// Synchronizing or querying the legacy stream covers every blocking stream's
// work issued before it too, as a launch there would: measured on an H200
// (driver 580), cudaStreamSynchronize(0) waited for blocking-stream work issued
// after the legacy stream's last work, and cudaStreamQuery(0) said not ready.
void Client::legacy_targets(ThreadState& t, uint32_t device, std::vector<std::pair<uint32_t, uint64_t>>* targets) {
  for (uint32_t r = 0; r < rings_.size(); ++r) presence_target(t, r, device, true, targets);
}

Status Client::stream_query(Stream s) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  if (opt_.ordered && b.id < kMaxDevices) {
    std::vector<std::pair<uint32_t, uint64_t>> targets;
    fence_target(t, b.r, &targets);
    legacy_targets(t, b.id, &targets);
    for (auto [r, pos] : targets)
      if (region_->ring(r).completed.load(std::memory_order_acquire) < pos) return finish(t, Status::kNotReady);
    return finish(t, Status::kSuccess);
  }
  std::lock_guard lock(b.g->mu);
  if (region_->ring(b.r).completed.load(std::memory_order_acquire) >= b.g->writer.tail()) return finish(t, Status::kSuccess);
  if (b.g->fence_end != b.g->writer.tail()) push_fence_locked(t, *b.g, b.r);
  return finish(t, Status::kNotReady);
}

// ---- events ----------------------------------------------------------------

Client::EventState* Client::event_of(Event e) {
  const uint32_t idx = uint32_t(e.handle);
  if (idx >= kMaxEvents) return nullptr;
  EventState* ev = events_[idx].load(std::memory_order_acquire);
  if (!ev || ev->handle != e.handle) return nullptr;
  return ev;
}

Status Client::event_create(Event* out, uint32_t flags) {
  ThreadState& t = thread();
  if (!out) return finish_own(t, Status::kInvalidValue);
  Entry e{};
  e.op = uint16_t(Op::EventCreate);
  e.arg[0] = flags;
  e.arg[1] = t.device;
  uint64_t h = 0;
  Status s = call(e, &h);
  if (!ok(s)) return finish_own(t, s);
  const uint32_t idx = uint32_t(h);
  if (idx >= kMaxEvents) return finish_own(t, Status::kIllegalState);
  std::lock_guard lock(events_mu_);
  EventState* ev = events_[idx].load();
  if (!ev) {
    ev = new EventState();
    events_[idx].store(ev, std::memory_order_release);
  }
  std::lock_guard el(ev->mu);
  ev->handle = h;
  ev->device = t.device;
  ev->recorded = false;
  ev->number = 0;
  ev->waits = 0;
  out->handle = h;
  return finish_own(t, Status::kSuccess);
}

namespace {
Entry event_request(Op op, uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
  Entry e{};
  e.op = uint16_t(op);
  e.arg[0] = a;
  e.arg[1] = b;
  e.arg[2] = c;
  e.arg[3] = d;
  return e;
}
}  // namespace

Status Client::event_destroy(Event e) {
  ThreadState& t = thread();
  EventState* ev = event_of(e);
  if (!ev) return finish(t, Status::kInvalidResourceHandle);
  Entry req{};
  {
    // CUDA defers the destroy: the record and every wait already issued on
    // the event keep their meaning. The worker answers at once and carries
    // the destroy out once every wait on it was dispatched (EventTable), so
    // nothing here waits for stream work, as cudaEventDestroy does not.
    std::lock_guard lock(ev->mu);
    req = event_request(Op::EventDestroy, e.handle, ev->number, ev->waits);
  }
  Status s = call(req);
  if (ok(s)) {
    // Stale handles fail event_of from now on. Another thread's event_create
    // may already have been given this index (with a new generation) once the
    // worker freed it: leave that one alone.
    std::lock_guard lock(ev->mu);
    if (ev->handle == e.handle) ev->handle = 0;
  }
  return finish(t, s);
}

Status Client::event_record(Event e, Stream s) {
  EventState* ev = event_of(e);
  if (!ev) return finish(thread(), Status::kInvalidResourceHandle);
  Entry en{};
  en.op = uint16_t(Op::EventRecord);
  en.arg[0] = e.handle;
  return stream_op(s, en, ev);
}

Status Client::stream_wait_event(Stream s, Event e) {
  EventState* ev = event_of(e);
  if (!ev) return finish(thread(), Status::kInvalidResourceHandle);
  Entry en{};
  en.op = uint16_t(Op::StreamWaitEvent);
  en.arg[0] = e.handle;
  return stream_op(s, en, ev);
}

Status Client::event_synchronize(Event e) {
  ThreadState& t = thread();
  EventState* ev = event_of(e);
  if (!ev) return finish(t, Status::kInvalidResourceHandle);
  Entry req;
  {
    std::lock_guard lock(ev->mu);
    req = event_request(Op::EventSynchronize, e.handle, ev->number);
    if (opt_.ordered && ev->recorded) req.edges[req.edge_count++] = ev->record;
  }
  return finish(t, call(req));
}

Status Client::event_query(Event e) {
  ThreadState& t = thread();
  EventState* ev = event_of(e);
  if (!ev) return finish(t, Status::kInvalidResourceHandle);
  Entry req;
  {
    std::lock_guard lock(ev->mu);
    req = event_request(Op::EventQuery, e.handle, ev->number);
    if (opt_.ordered && ev->recorded) req.edges[req.edge_count++] = ev->record;
  }
  return finish(t, call(req));
}

Status Client::event_elapsed(float* ms, Event start, Event end) {
  ThreadState& t = thread();
  EventState* a = event_of(start);
  EventState* b = event_of(end);
  if (!ms) return finish(t, Status::kInvalidValue);
  if (!a || !b) return finish(t, Status::kInvalidResourceHandle);
  Entry req = event_request(Op::EventElapsed, start.handle, end.handle);
  for (int k = 0; k < 2; ++k) {
    EventState* ev = k ? b : a;
    std::lock_guard lock(ev->mu);
    req.arg[2 + k] = ev->number;
    if (opt_.ordered && ev->recorded) req.edges[req.edge_count++] = ev->record;
  }
  uint64_t bits = 0;
  Status s = call(req, &bits);
  if (ok(s)) {
    uint32_t b32 = uint32_t(bits);
    std::memcpy(ms, &b32, sizeof(float));
  }
  return finish(t, s);
}

// ---- memory ----------------------------------------------------------------

Status Client::malloc(uint64_t* device_addr, uint64_t size) {
  ThreadState& t = thread();
  if (!device_addr) return finish_own(t, Status::kInvalidValue);
  Entry e{};
  e.op = uint16_t(Op::Malloc);
  e.arg[0] = size;
  e.arg[1] = t.device;
  return finish_own(t, call(e, device_addr));
}

Status Client::free(uint64_t device_addr) {
  ThreadState& t = thread();
  // cudaFree synchronizes: nothing issued before, on any device (a peer's
  // kernels may use the memory), may still use it.
  if (Status s = synchronize_all(t); !ok(s)) return s;
  Entry e{};
  e.op = uint16_t(Op::Free);
  e.arg[0] = device_addr;
  return finish(t, call(e));
}

Status Client::malloc_host(void** ptr, uint64_t size) {
  ThreadState& t = thread();
  if (!ptr) return finish_own(t, Status::kInvalidValue);
  void* p = heap_alloc(size ? size : 1);
  if (!p && reclaim_pool(true)) p = heap_alloc(size ? size : 1);  // blocks of finished copies, waited for
  if (!p) return finish_own(t, Status::kMemoryAllocation);
  *ptr = p;
  return finish_own(t, Status::kSuccess);
}

void* Client::heap_alloc(uint64_t size) {
  std::lock_guard lock(heap_->mu);
  return heap_->buf ? heap_->buf->allocate_aligned(size, 64, std::nothrow) : nullptr;
}

void Client::heap_free(void* p) {
  std::lock_guard lock(heap_->mu);
  heap_->buf->deallocate(p);
}

// ---- the staging pool ------------------------------------------------------
//
// Large pageable copies stage through blocks of the pinned heap instead of
// the ring's fixed window (64 KiB chunks at a 64 MiB region): a copy of
// megabytes moves in chunks of up to kPoolChunkMax, and streams that copy
// nothing hold none. Larger chunks measured slower (less overlap, out of
// cache). A block an unfinished H2D copy still reads is freed once its ring
// completed past the block's fence (reclaim_pool).

namespace {
constexpr uint64_t kPoolCopyMin = uint64_t{1} << 20;
constexpr uint64_t kPoolChunkMin = uint64_t{256} << 10;
constexpr uint64_t kPoolChunkMax = uint64_t{1} << 20;
constexpr unsigned kPoolBlocks = 8;  // chunks in flight per copy
}  // namespace

unsigned Client::pool_blocks(uint64_t size, uint64_t* chunk, std::byte** blocks) {
  if (size < kPoolCopyMin) return 0;
  *chunk = std::clamp<uint64_t>((size / kPoolBlocks + 4095) & ~uint64_t{4095}, kPoolChunkMin, kPoolChunkMax);
  const unsigned want = unsigned(std::min<uint64_t>(kPoolBlocks, (size + *chunk - 1) / *chunk));
  reclaim_pool(false);
  unsigned n = 0;
  for (; n < want; ++n)
    if (!(blocks[n] = static_cast<std::byte*>(heap_alloc(*chunk)))) break;
  // One block would serialize the guest's copy with the device's: the window does as well.
  if (n == 1) heap_free(blocks[--n]);
  return n;
}

bool Client::reclaim_pool(bool wait) {
  std::vector<PoolBlock> done;
  {
    std::lock_guard lock(pool_mu_);
    for (size_t i = 0; i < pool_pending_.size();) {
      const PoolBlock& b = pool_pending_[i];
      if (wait) wait_completed(b.ring, b.fence);  // its fence is pushed: needs nothing more from the guest
      if (region_->ring(b.ring).completed.load(std::memory_order_acquire) >= b.fence || lost_.load()) {
        done.push_back(b);
        pool_pending_[i] = pool_pending_.back();
        pool_pending_.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (const PoolBlock& b : done) heap_free(b.block);
  return !done.empty();
}

void Client::release_pool_block(uint32_t r, uint64_t fence, std::byte* block) {
  if (region_->ring(r).completed.load(std::memory_order_acquire) >= fence) return heap_free(block);
  std::lock_guard lock(pool_mu_);
  pool_pending_.push_back({r, fence, block});
}

Status Client::free_host(void* ptr) {
  ThreadState& t = thread();
  if (!ptr) return finish(t, Status::kSuccess);
  if (!is_pinned(ptr, 1)) return finish(t, Status::kInvalidValue);
  // Any device's copies may still read or write it.
  if (Status s = synchronize_all(t); !ok(s)) return s;
  heap_free(ptr);
  return finish(t, Status::kSuccess);
}

bool Client::is_pinned(const void* p, uint64_t size) const {
  const auto* b = static_cast<const std::byte*>(p);
  const std::byte* h = region_->heap();
  const uint64_t hs = region_->layout().heap_size;
  return b >= h && uint64_t(b - h) <= hs && size <= hs - uint64_t(b - h);
}

Status Client::memcpy_h2d_async(uint64_t dst, const void* src, uint64_t size, Stream s) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  Ring* g = b.g;
  const uint32_t r = b.r;
  if (size == 0) return finish(t, Status::kSuccess);
  if (!src) return finish(t, Status::kInvalidValue);
  std::lock_guard lock(g->mu);
  Entry e{};
  e.op = uint16_t(Op::Memcpy);
  if (is_pinned(src, size)) {
    e.flags = mem_flags(MemKind::Device, MemKind::Pinned);
    e.arg[0] = dst;
    e.arg[1] = uint64_t(static_cast<const std::byte*>(src) - region_->heap());
    e.arg[2] = size;
    push_locked(t, *g, r, b.id, e, nullptr);
    return finish(t, Status::kSuccess);
  }
  // Pageable memory: copied into staging now, so the caller may reuse it on
  // return (as CUDA). The worker copies chunk k while the guest fills k + 1.
  uint64_t chunk = 0;
  std::byte* blocks[kPoolBlocks];
  if (const unsigned nb = pool_blocks(size, &chunk, blocks)) {
    // Block i % nb is reused once the device copy that read it completed.
    uint64_t fences[kPoolBlocks] = {};
    Status st = Status::kSuccess;
    for (uint64_t done = 0, i = 0; done < size && ok(st); ++i) {
      const unsigned k = unsigned(i % nb);
      if (fences[k] && !ok(st = wait_completed(r, fences[k]))) break;
      const uint64_t n = std::min(chunk, size - done);
      std::memcpy(blocks[k], static_cast<const std::byte*>(src) + done, n);
      e.flags = mem_flags(MemKind::Device, MemKind::Pinned);
      e.arg[0] = dst + done;
      e.arg[1] = uint64_t(blocks[k] - region_->heap());
      e.arg[2] = n;
      push_locked(t, *g, r, b.id, e, nullptr);
      fences[k] = push_fence_locked(t, *g, r);
      done += n;
    }
    for (unsigned k = 0; k < nb; ++k) fences[k] ? release_pool_block(r, fences[k], blocks[k]) : heap_free(blocks[k]);
    return ok(st) ? finish_async(t) : finish(t, st);
  }
  const uint64_t w = region_->layout().staging_per_ring;
  chunk = staging_chunk(size);
  for (uint64_t done = 0; done < size;) {
    const uint64_t n = std::min(chunk, size - done);
    uint64_t off;
    if (!alloc_staging(t, *g, r, n, &off)) return finish(t, Status::kDevicesUnavailable);
    std::memcpy(region_->staging(r) + off, static_cast<const std::byte*>(src) + done, n);
    e.flags = mem_flags(MemKind::Device, MemKind::Staging);
    e.arg[0] = dst + done;
    e.arg[1] = off;
    e.arg[2] = n;
    const uint64_t pos = push_locked(t, *g, r, b.id, e, nullptr);
    g->stage_marks.push_back({pos, g->stage_tail});
    if (g->stage_tail - g->fence_stage > w / 4) push_fence_locked(t, *g, r);
    done += n;
  }
  return finish_async(t);
}

Status Client::memcpy_d2h_async(void* dst, uint64_t src, uint64_t size, Stream s) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  Ring* g = b.g;
  const uint32_t r = b.r;
  if (size == 0) return finish(t, Status::kSuccess);
  if (!dst) return finish(t, Status::kInvalidValue);
  std::lock_guard lock(g->mu);
  Entry e{};
  e.op = uint16_t(Op::Memcpy);
  if (is_pinned(dst, size)) {
    e.flags = mem_flags(MemKind::Pinned, MemKind::Device);
    e.arg[0] = uint64_t(static_cast<std::byte*>(dst) - region_->heap());
    e.arg[1] = src;
    e.arg[2] = size;
    push_locked(t, *g, r, b.id, e, nullptr);
    return finish(t, Status::kSuccess);
  }
  // Pageable destination: like CUDA, return only once the data is there.
  // Chunks are issued ahead, each with a fence, as far as staging allows, and
  // the guest copies chunk k out while the device fills the later ones. A
  // chunk's staging is released (its mark pushed) only once it was copied out:
  // completion alone would let the next chunk overwrite it first.
  uint64_t chunk = 0;
  std::byte* blocks[kPoolBlocks];
  if (const unsigned nb = pool_blocks(size, &chunk, blocks)) {
    // Chunk i lands in block i % nb; the guest copies it out, in order, before
    // the block takes chunk i + nb.
    struct Pending {
      uint64_t fence, at, n;
    };
    Pending q[kPoolBlocks];
    Status st = Status::kSuccess;
    uint64_t issued = 0, drained = 0;
    for (uint64_t i = 0, j = 0; drained < size && ok(st);) {
      if (issued < size && i - j < nb) {
        const unsigned k = unsigned(i % nb);
        const uint64_t n = std::min(chunk, size - issued);
        e.flags = mem_flags(MemKind::Pinned, MemKind::Device);
        e.arg[0] = uint64_t(blocks[k] - region_->heap());
        e.arg[1] = src + issued;
        e.arg[2] = n;
        push_locked(t, *g, r, b.id, e, nullptr);
        q[k] = {push_fence_locked(t, *g, r), issued, n};
        issued += n;
        ++i;
        continue;
      }
      const unsigned k = unsigned(j % nb);
      if (!ok(st = wait_completed(r, q[k].fence))) break;
      std::memcpy(static_cast<std::byte*>(dst) + q[k].at, blocks[k], q[k].n);
      drained += q[k].n;
      ++j;
    }
    // On a lost session the worker is gone: nothing writes the blocks any more.
    for (unsigned k = 0; k < nb; ++k) heap_free(blocks[k]);
    return finish(t, st);
  }
  struct InFlight {
    uint64_t fence, pos, end, off, at, n;
  };
  InFlight q[8];
  unsigned head = 0, count = 0;
  chunk = staging_chunk(size);
  auto drain = [&]() -> Status {
    const InFlight& f = q[head % 8];
    if (Status st = wait_completed(r, f.fence); !ok(st)) {
      for (; count; --count, ++head) g->stage_marks.push_back({q[head % 8].pos, q[head % 8].end});
      return st;
    }
    std::memcpy(static_cast<std::byte*>(dst) + f.at, region_->staging(r) + f.off, f.n);
    g->stage_marks.push_back({f.pos, f.end});
    ++head;
    --count;
    return Status::kSuccess;
  };
  for (uint64_t issued = 0; issued < size || count;) {
    if (issued < size && count < 8) {
      const uint64_t n = std::min(chunk, size - issued);
      uint64_t off;
      bool got = try_alloc_staging(*g, r, align16(n), &off);
      // Nothing of ours to copy out: wait for other entries' staging instead.
      if (!got && !count) {
        if (!alloc_staging(t, *g, r, n, &off)) return finish(t, Status::kDevicesUnavailable);
        got = true;
      }
      if (got) {
        e.flags = mem_flags(MemKind::Staging, MemKind::Device);
        e.arg[0] = off;
        e.arg[1] = src + issued;
        e.arg[2] = n;
        const uint64_t pos = push_locked(t, *g, r, b.id, e, nullptr);
        q[(head + count) % 8] = {push_fence_locked(t, *g, r), pos, g->stage_tail, off, issued, n};
        ++count;
        issued += n;
        continue;
      }
    }
    if (Status st = drain(); !ok(st)) return finish(t, st);
  }
  return finish(t, Status::kSuccess);
}

Status Client::memcpy_d2d_async(uint64_t dst, uint64_t src, uint64_t size, Stream s) {
  Entry e{};
  e.op = uint16_t(Op::Memcpy);
  e.flags = mem_flags(MemKind::Device, MemKind::Device);
  e.arg[0] = dst;
  e.arg[1] = src;
  e.arg[2] = size;
  return stream_op(s, e);
}

Status Client::memcpy_peer_async(uint64_t dst, uint32_t dst_device, uint64_t src, uint32_t src_device, uint64_t size,
                                 Stream s) {
  // With unified addressing a peer copy is a device-to-device copy: the
  // addresses say which devices; the worker checks they are this session's.
  if (dst_device >= device_count_ || src_device >= device_count_) return finish(thread(), Status::kInvalidDevice);
  return memcpy_d2d_async(dst, src, size, s);
}

Status Client::memset_async(uint64_t dst, uint8_t value, uint64_t size, Stream s) {
  Entry e{};
  e.op = uint16_t(Op::Memset);
  e.arg[0] = dst;
  e.arg[1] = value;
  e.arg[2] = size;
  return stream_op(s, e);
}

// cudaMemcpy is legacy-stream work (ARCHITECTURE.md rule 4): it follows the
// blocking streams through the legacy edges, not non-blocking streams.
Status Client::memcpy_h2d(uint64_t dst, const void* src, uint64_t size, Stream s) {
  // From pageable memory CUDA synchronizes before the copy starts, and the
  // async path reads the source into staging at once: wait for what the copy
  // follows first (a host function may still be writing the source).
  if (!is_pinned(src, size))
    if (Status st = stream_order_wait(s); !ok(st)) return st;
  if (Status st = memcpy_h2d_async(dst, src, size, s); !ok(st)) return st;
  return stream_synchronize(s);
}

Status Client::memcpy_d2h(void* dst, uint64_t src, uint64_t size) {
  if (Status s = memcpy_d2h_async(dst, src, size, kLegacyStream); !ok(s)) return s;
  return stream_synchronize(kLegacyStream);
}

// ---- kernels and device-wide calls -----------------------------------------

Status Client::kernel_lookup(uint32_t module, const std::string& name, uint32_t* kernel, bool* runnable) {
  ThreadState& t = thread();
  if (!kernel || name.empty() || name.size() >= kSlotPayload) return finish_own(t, Status::kInvalidValue);
  Entry e{};
  e.op = uint16_t(Op::KernelLookup);
  e.arg[0] = module;
  uint64_t id = 0, cannot_run = 0;
  Status s = call(e, &id, &cannot_run, &name);
  if (ok(s)) *kernel = uint32_t(id);
  if (ok(s) && runnable) *runnable = cannot_run == 0;
  return finish_own(t, s);
}

Status Client::module_load(const void* image, uint64_t size, uint32_t* module) {
  ThreadState& t = thread();
  if (!image || !module || size == 0) return finish_own(t, Status::kInvalidValue);
  if (size > kMaxModuleImage) return finish_own(t, Status::kInvalidKernelImage);
  // The image travels through the pinned heap: one request, however large.
  void* staged = nullptr;
  if (Status s = malloc_host(&staged, size); !ok(s)) return s;
  std::memcpy(staged, image, size);
  Entry e{};
  e.op = uint16_t(Op::ModuleLoad);
  e.arg[0] = uint64_t(static_cast<std::byte*>(staged) - region_->heap());
  e.arg[1] = size;
  uint64_t id = 0;
  const Status s = call(e, &id);
  heap_free(staged);  // the worker copied it out before answering
  if (ok(s)) *module = uint32_t(id);
  return finish_own(t, s);
}

Status Client::module_unload(uint32_t module) {
  ThreadState& t = thread();
  // Like cudaFree: no work issued before, on any device, may still use the module's kernels.
  if (Status s = synchronize_all(t); !ok(s)) return s;
  Entry e{};
  e.op = uint16_t(Op::ModuleUnload);
  e.arg[0] = module;
  return finish(t, call(e));
}

Status Client::module_global(uint32_t module, const std::string& name, uint64_t size_hint, uint64_t* addr,
                             uint64_t* size) {
  ThreadState& t = thread();
  if (!addr || !size || name.empty() || name.size() >= kSlotPayload) return finish_own(t, Status::kInvalidValue);
  Entry e{};
  e.op = uint16_t(Op::ModuleGlobal);
  e.arg[0] = module;
  e.arg[1] = size_hint;
  e.arg[2] = t.device;
  return finish_own(t, call(e, addr, size, &name));
}

Status Client::fetch_device_info(uint32_t device, DeviceInfo* out) {
  if (device >= device_count_) return Status::kInvalidDevice;
  Entry e{};
  e.op = uint16_t(Op::DeviceInfo);
  e.arg[0] = device;
  DeviceInfo info{};
  const Status s = call(e, nullptr, nullptr, nullptr, &info, sizeof info);
  if (ok(s)) {
    *out = info;
    out->name[sizeof(out->name) - 1] = 0;
  }
  return s;
}

Status Client::device_attributes(uint32_t device, uint32_t first, int32_t* out) {
  ThreadState& t = thread();
  if (!out) return finish(t, Status::kInvalidValue);
  if (device >= device_count_) return finish(t, Status::kInvalidDevice);
  Entry e{};
  e.op = uint16_t(Op::DeviceAttributes);
  e.arg[0] = device;
  e.arg[1] = first;
  return finish(t, call(e, nullptr, nullptr, nullptr, out, kDeviceAttributesPerCall * sizeof(int32_t)));
}

Status Client::device_info(uint32_t device, DeviceInfo* out) {
  ThreadState& t = thread();
  if (!out) return finish(t, Status::kInvalidValue);
  return finish(t, fetch_device_info(device, out));
}

Status Client::launch(uint32_t kernel, Dim3 grid, Dim3 block, const void* args, uint32_t args_size, Stream s,
                      uint32_t shared_mem) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  Ring* g = b.g;
  const uint32_t r = b.r;
  // CUDA's launch limits on every device since compute capability 3.0: refused
  // by the launch itself (cudaErrorInvalidConfiguration), not by a later sync.
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || threads > 1024 || block.z > 64 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return finish(t, Status::kInvalidConfiguration);
  if (args_size && !args) return finish(t, Status::kInvalidValue);
  // Every device allows 48 KiB; above that, what this device allows any kernel
  // (a kernel's own opt-in limit is the driver's to check, at dispatch).
  if (shared_mem > 48 * 1024) {
    const uint32_t d = b.st->device.load(std::memory_order_relaxed);
    uint64_t limit = smem_optin_[d].load(std::memory_order_relaxed);
    if (limit == 0) {
      DeviceInfo info{};
      if (Status st = fetch_device_info(d, &info); !ok(st)) return finish(t, st);  // not finish()ed twice
      limit = std::max<uint64_t>(info.shared_mem_per_block_optin, 48 * 1024);
      smem_optin_[d].store(limit, std::memory_order_relaxed);
    }
    if (shared_mem > limit) return finish(t, Status::kInvalidValue);
  }
  std::lock_guard lock(g->mu);
  uint64_t off = 0;
  if (args_size) {
    if (!alloc_staging(t, *g, r, args_size, &off)) return finish(t, Status::kInvalidValue);
    std::memcpy(region_->staging(r) + off, args, args_size);
  }
  const uint64_t arg[6] = {kernel,
                           grid.x | uint64_t{grid.y} << 32,
                           grid.z | uint64_t{block.x} << 32,
                           block.y | uint64_t{block.z} << 32,
                           off,
                           args_size | uint64_t{shared_mem} << 32};
  const uint64_t pos = push_launch_locked(t, *g, r, b.id, arg);
  if (args_size) {
    g->stage_marks.push_back({pos, g->stage_tail});
    if (g->stage_tail - g->fence_stage > region_->layout().staging_per_ring / 4) push_fence_locked(t, *g, r);
  }
  return finish_async(t);
}

void Client::fence_target(ThreadState& t, uint32_t r, std::vector<std::pair<uint32_t, uint64_t>>* targets) {
  // Ring-wide: a fence waits for every stream on the ring, destroyed ones included.
  Ring& g = *rings_[r];
  std::lock_guard lock(g.mu);
  const uint64_t tail = g.writer.tail();
  if (region_->ring(r).completed.load(std::memory_order_acquire) >= tail) return;
  targets->push_back({r, g.fence_end == tail ? tail : push_fence_locked(t, g, r)});
}

void Client::presence_target(ThreadState& t, uint32_t r, uint32_t device, bool blocking_only,
                             std::vector<std::pair<uint32_t, uint64_t>>* targets) {
  const Ring::Presence& p = blocking_only ? rings_[r]->blocking[device] : rings_[r]->on[device];
  if (p.live.load(std::memory_order_acquire)) return fence_target(t, r, targets);
  // Only destroyed streams' work, covered by the fence before the last destroy.
  const uint64_t end = p.end.load(std::memory_order_acquire);
  if (region_->ring(r).completed.load(std::memory_order_acquire) < end) targets->push_back({r, end});
}

Status Client::wait_targets(ThreadState& t, const std::vector<std::pair<uint32_t, uint64_t>>& targets) {
  for (auto [r, pos] : targets)
    if (Status s = wait_completed(r, pos); !ok(s)) return finish(t, s);
  // With nothing left to wait for (the rings had completed already), what
  // finished host functions did must still be visible here, as after a wait
  // (wait_worker): a synchronous copy from pageable memory reads it next.
  host_funcs_->ran.load(std::memory_order_acquire);
  return finish(t, Status::kSuccess);
}

Status Client::device_synchronize() {
  ThreadState& t = thread();
  // Fence every ring with outstanding work of the device first, so they drain in parallel.
  std::vector<std::pair<uint32_t, uint64_t>> targets;
  for (uint32_t r = 0; r < rings_.size(); ++r) presence_target(t, r, t.device, false, &targets);
  return wait_targets(t, targets);
}

Status Client::synchronize_all(ThreadState& t) {
  std::vector<std::pair<uint32_t, uint64_t>> targets;
  for (uint32_t r = 0; r < rings_.size(); ++r) fence_target(t, r, &targets);
  return wait_targets(t, targets);
}

Status Client::stream_order_wait(Stream s) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  // What stream work issued now on `s` would wait for: the stream itself and,
  // through the legacy stream's implicit synchronization, the legacy stream
  // (from a blocking stream) or every blocking stream, destroyed ones with
  // pending work included (from the legacy stream).
  std::vector<std::pair<uint32_t, uint64_t>> targets;
  fence_target(t, b.r, &targets);
  const uint32_t d = b.st->device.load(std::memory_order_relaxed);
  if (opt_.ordered && b.id < kMaxDevices) {
    legacy_targets(t, d, &targets);
  } else if (opt_.ordered && b.st->blocking.load(std::memory_order_relaxed)) {
    fence_target(t, streams_[d].ring.load(std::memory_order_relaxed), &targets);
  }
  return wait_targets(t, targets);
}

Status Client::host_func(Stream s, std::function<void()> fn) {
  ThreadState& t = thread();
  Bound b;
  if (!bind(s, &b)) return finish(t, Status::kInvalidResourceHandle);
  if (!fn) return finish(t, Status::kInvalidValue);
  HostFuncs& h = *host_funcs_;
  uint32_t slot;
  uint64_t ticket;
  auto verdict = std::make_shared<std::atomic<int>>(HostFuncs::kUndecided);
  {
    std::unique_lock lock(h.mu);
    if (!h.words) {
      void* p = nullptr;
      if (Status st = malloc_host(&p, sizeof(HostFuncWords) * HostFuncs::kSlots); !ok(st)) return finish(t, st);
      h.words = static_cast<HostFuncWords*>(p);
      for (uint32_t i = 0; i < HostFuncs::kSlots; ++i) {
        h.words[i].reached.store(0, std::memory_order_relaxed);
        h.words[i].done.store(0, std::memory_order_relaxed);
        h.free.push_back(HostFuncs::kSlots - 1 - i);
      }
      h.tickets.assign(HostFuncs::kSlots, 0);
      h.runner = std::thread([this] { run_host_funcs(); });
    }
    // All slots taken: one frees once its function ran, which needs only the worker.
    while (h.free.empty()) {
      if (lost_.load(std::memory_order_relaxed) || h.stop) return finish(t, Status::kDevicesUnavailable);
      h.slot_cv.wait_for(lock, std::chrono::milliseconds(100));
    }
    slot = h.free.back();
    h.free.pop_back();
    ticket = ++h.tickets[slot];
    h.pending.push_back({slot, ticket, std::move(fn), verdict});
  }
  h.work_cv.notify_one();
  Entry e{};
  e.op = uint16_t(Op::HostFunc);
  e.arg[0] = uint64_t(reinterpret_cast<std::byte*>(&h.words[slot]) - region_->heap());
  e.arg[1] = ticket;
  {
    std::lock_guard lock(b.g->mu);
    push_locked(t, *b.g, b.r, b.id, e, nullptr);
  }
  const Status r = finish_async(t);
  verdict->store(ok(r) ? HostFuncs::kRun : HostFuncs::kSkip, std::memory_order_release);
  return r;
}

void Client::run_host_funcs() {
  HostFuncs& h = *host_funcs_;
  std::unique_lock lock(h.mu);
  uint32_t idle = 0;
  while (!h.stop) {
    if (h.pending.empty()) {
      idle = 0;
      h.work_cv.wait(lock, [&] { return h.stop || !h.pending.empty(); });
      continue;
    }
    // Any that was reached, not only the oldest: streams progress independently.
    auto it = std::find_if(h.pending.begin(), h.pending.end(), [&](const HostFuncs::Pending& p) {
      return h.words[p.slot].reached.load(std::memory_order_acquire) >= p.ticket &&
             p.verdict->load(std::memory_order_acquire) != HostFuncs::kUndecided;
    });
    if (it == h.pending.end()) {
      if (lost_.load(std::memory_order_relaxed)) {
        h.work_cv.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      // Poll with capped backoff, as wait_worker does.
      lock.unlock();
      if (++idle < 64) {
        _mm_pause();
      } else {
        timespec ts{0, long(std::min<uint32_t>(2u << std::min<uint32_t>(idle - 64, 8), 500)) * 1000};
        nanosleep(&ts, nullptr);
      }
      lock.lock();
      continue;
    }
    idle = 0;
    HostFuncs::Pending p = std::move(*it);
    h.pending.erase(it);
    lock.unlock();
    try {
      if (p.verdict->load(std::memory_order_acquire) == HostFuncs::kRun) p.fn();
    } catch (...) {
      // A throwing host function must not end the runner (CUDA's would terminate the program).
    }
    h.ran.fetch_add(1, std::memory_order_release);
    h.words[p.slot].done.store(p.ticket, std::memory_order_release);
    // Rung like a publish: a sleeping worker would otherwise hold the stream's
    // next work, and the legacy stream's, for up to its max_sleep.
    notify_worker();
    lock.lock();
    h.free.push_back(p.slot);
    h.slot_cv.notify_one();
  }
}

Status Client::null_call() {
  Entry e{};
  e.op = uint16_t(Op::Null);
  return finish(thread(), call(e));
}

Status Client::call(Entry e, uint64_t* r0, uint64_t* r1, const std::string* payload, void* reply_payload,
                    size_t reply_size) {
  ThreadState& t = thread();
  const bool leased = t.slot == kNoSlot;
  uint32_t slot = t.slot;
  if (leased) {
    // A lease is held for one call only, and a call ends once the worker
    // answers, so waiting for one needs nothing from this thread's peers.
    std::unique_lock lock(lease_mu_);
    if (shared_slot_ == kNoSlot) return Status::kLaunchOutOfResources;  // a layout too small to lease from
    lease_cv_.wait(lock, [&] { return !lease_free_.empty(); });
    slot = lease_free_.back();
    lease_free_.pop_back();
  }
  struct Release {
    Client* c;
    uint32_t slot;
    bool leased;
    ~Release() {
      if (!leased) return;
      {
        std::lock_guard lock(c->lease_mu_);
        c->lease_free_.push_back(slot);
      }
      c->lease_cv_.notify_one();
    }
  } release{this, slot, leased};
  ReplySlot& s = region_->slot(slot);
  if (payload) {
    std::memset(s.payload, 0, kSlotPayload);
    std::memcpy(s.payload, payload->data(), payload->size());
  }
  // Only this thread (or the lease holder) writes request.seq: read it back.
  const uint64_t seq = (leased ? s.request.seq.load(std::memory_order_relaxed) : t.seq) + 1;
  if (!leased) t.seq = seq;
  write_request(s, e, seq);
  // A slot the worker watches needs no post: it reads request.seq itself, and
  // goes on reading it for a heartbeat after it says it stopped, so a stale
  // `watched` read here loses nothing (ARCHITECTURE.md, "Sync calls").
  if (!s.watched.load(std::memory_order_relaxed)) post_slot(region_->header(), slot);
  notify_worker();
  if (Status st = wait_worker(s.reply_seq, seq); !ok(st)) return st;
  if (reply_payload) std::memcpy(reply_payload, s.payload, std::min(reply_size, kSlotPayload));
  return read_reply(s, r0, r1);
}

}  // namespace ordo

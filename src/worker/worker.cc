// The engine's dispatch loop: polls slots and rings, spins, then sleeps on the
// doorbell; a thread of its own beats the heartbeat.
#include "worker.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <condition_variable>
#include <sstream>
#include <stop_token>
#include <thread>

#include "clock.h"

namespace ordo {
namespace {

// How long a store a guest issued before reading `worker_sleeping` may still be
// on its way (a store buffer drains in well under a microsecond; VM exits and
// interrupts only drain it sooner). Costs an idle worker one extra wake-up per sleep.
constexpr std::chrono::microseconds kSleepGrace{50};

// Sleeps while *word == value, at most `limit`: an extra lane's park.
void futex_wait(std::atomic<uint32_t>& word, uint32_t value, std::chrono::microseconds limit) {
  const timespec ts{time_t(limit.count() / 1000000), long(limit.count() % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

}  // namespace

uint32_t default_dispatch_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return uint32_t(std::clamp(cpus / 2, 1, 8));
}

Worker::Worker(Region& region, Backend& backend, WorkerOptions options)
    : region_(region),
      backend_(backend),
      opt_(options),
      layout_(region.layout()),
      rings_(layout_.ring_count),
      slots_(layout_.slot_count),
      devices_(std::clamp<uint32_t>(backend.device_count(), 1, kMaxDevices)),
      events_(backend, options.ordered, uint64_t{layout_.ring_count} * layout_.ring_capacity) {
  const uint32_t lanes = std::clamp<uint32_t>(opt_.dispatch_threads, 1, std::min(kMaxDispatchThreads, layout_.ring_count));
  for (uint32_t i = 0; i < lanes; ++i) {
    lanes_.push_back(std::make_unique<Lane>());
    lanes_.back()->index = i;
    lanes_.back()->chaos_rng.seed(options.chaos_seed + i);
  }
  for (uint32_t r = 0; r < layout_.ring_count; ++r) fresh_ring(r);
  if (opt_.ipc) opt_.ipc->revoke_all(opt_.partition);  // what this part's previous process exported
  if (opt_.trace) tracer_ = std::make_unique<Tracer>();
  backend_.set_error_sink([this](const OpTag& tag, Status s) { async_error(tag, s); });
  // Copies name host memory inside the region only; the cuda backend pins it.
  const bool mapped = backend_.register_host_memory(region_.base(), region_.size());
  RegionHeader* h = region_.header();
  h->heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
  h->mapped_base.store(mapped ? uint64_t(uintptr_t(region_.base())) : 0, std::memory_order_relaxed);
  h->device_count.store(devices_, std::memory_order_relaxed);  // published by the state below, before any attach
  h->worker_state.store(uint32_t(WorkerState::kServing), std::memory_order_release);
}

Worker::~Worker() {
  // EventSynchronize callbacks still queued in the backend point at this worker
  // (those on other processes' records are answered now).
  backend_.ipc_abandon();
  for (uint32_t n; (n = pending_notifies_.load(std::memory_order_acquire)) != 0;) pending_notifies_.wait(n);
  backend_.set_error_sink(nullptr);
  region_.header()->worker_state.store(uint32_t(WorkerState::kStopped), std::memory_order_release);
}

void Worker::log_bad(const char* where, uint32_t idx, uint64_t pos, const std::string& why) {
  counters_.errors.fetch_add(1, std::memory_order_relaxed);
  // Bounded: a hostile guest must not be able to fill the host's disk.
  if (opt_.quiet || logged_.load(std::memory_order_relaxed) >= 100) return;
  const uint32_t n = logged_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n > 100) return;
  if (n == 100) std::fprintf(stderr, "ordo-worker: further bad-entry messages suppressed\n");
  std::fprintf(stderr, "ordo-worker: rejected %s %u position %" PRIu64 ": %s\n", where, idx, pos, why.c_str());
}

void Worker::async_error(const OpTag& tag, Status s) {
  counters_.errors.fetch_add(1, std::memory_order_relaxed);
  if (sticky(s)) {
    // As CUDA's context after a kernel fault: every thread's next call fails.
    int32_t none = 0;
    if (sticky_.compare_exchange_strong(none, int32_t(s)))
      region_.header()->sticky_error.store(int32_t(s), std::memory_order_release);
  }
  if (tag.thread >= layout_.slot_count) return;
  std::lock_guard lock(error_mu_);
  ReplySlot& slot = region_.slot(tag.thread);
  slot.error = int32_t(s);
  slot.error_op = tag.op;
  slot.error_pos = tag.pos;
  slot.error_ring = tag.ring;
  slot.error_seq.store(slot.error_seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

bool Worker::poll_lane(Lane& lane) {
  bool progressed = false;
  const RegionHeader* h = region_.header();
  for (uint32_t w = 0; w * 64 < layout_.ring_count; ++w) {
    uint64_t open = h->ring_open[w].load(std::memory_order_acquire);
    if (w == 0) open |= 1;
    while (open) {
      const uint32_t r = w * 64 + uint32_t(__builtin_ctzll(open));
      open &= open - 1;
      if (r >= layout_.ring_count) continue;
      RingState& rs = rings_[r];
      // An idle ring costs one load here, not a call (its head was published
      // when it was last busy).
      uint64_t word;
      const uint32_t owner = lane_of(r);
      if (owner == lane.index) {
        if (rs.staged || rs.reader.published(rs.head.load(std::memory_order_relaxed), &word)) progressed |= poll_ring(r, lane);
      } else if (lane.index == 0 && lanes_[owner]->parked.load(std::memory_order_relaxed) &&
                 rs.reader.published(rs.head.load(std::memory_order_acquire), &word) && !rs.held()) {
        // Lane 0 sees every ring: work for a parked lane wakes it. A lane that
        // parks just as the entry arrives is seen parked on a later pass, at
        // the latest on the one after lane 0 announces its own sleep, which
        // waits for every lane to park.
        wake_lane(*lanes_[owner]);
      }
    }
  }
  return progressed;
}

bool Worker::poll_once() {
  if (!attached_) {
    check_session(now_ns());
    if (!attached_) return false;
  }
  bool progressed = poll_slots();
  progressed |= poll_lane(*lanes_[0]);
  // Slots whose edges just became ready by the ring pass.
  return poll_slots() || progressed;
}

void Worker::wake_lane(Lane& lane) {
  if (lane.parked.exchange(0, std::memory_order_relaxed) != 1) return;
  parked_lanes_.fetch_sub(1, std::memory_order_relaxed);
  futex_wake(lane.parked);
}

void Worker::wake_waiting_lanes() {
  if (!threads_running_) return;
  // Our head store before their parked flags, as their flags before their
  // last look at our head.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (parked_lanes_.load(std::memory_order_relaxed) == 0) return;
  for (auto& l : lanes_)
    if (l->waiting.load(std::memory_order_relaxed)) wake_lane(*l);
}

bool Worker::all_lanes_parked() const {
  return !threads_running_ || parked_lanes_.load(std::memory_order_relaxed) + 1 >= lanes_.size();
}

void Worker::pause_lanes() {
  if (!threads_running_) return;
  pause_.store(1, std::memory_order_seq_cst);
  for (size_t i = 1; i < lanes_.size(); ++i) wake_lane(*lanes_[i]);
  for (uint32_t n; (n = paused_lanes_.load(std::memory_order_acquire)) + 1 < lanes_.size();) paused_lanes_.wait(n);
}

void Worker::resume_lanes() {
  if (!threads_running_) return;
  pause_.store(0, std::memory_order_release);
  pause_.notify_all();
}

void Worker::start_lanes() {
  // Without threads to spare, lane 0 serves every ring. Set before they
  // start, which orders it before their reads; no session is served yet, so
  // lanes that started before a failure did nothing.
  threads_running_ = lanes_.size() > 1;
  try {
    for (size_t i = 1; i < lanes_.size(); ++i)
      lane_threads_.emplace_back([this, &lane = *lanes_[i]](std::stop_token st) { serve_lane(lane, st); });
  } catch (const std::system_error&) {
    stop_lanes();
  }
}

void Worker::stop_lanes() {
  for (auto& t : lane_threads_) t.request_stop();
  for (size_t i = 1; i < lanes_.size(); ++i) wake_lane(*lanes_[i]);
  pause_.notify_all();
  lane_threads_.clear();  // joins
  threads_running_ = false;
}

void Worker::serve_lane(Lane& lane, std::stop_token stop) {
  uint64_t idle_since = 0;
  uint32_t pass = 0;
  auto backoff = kSleepGrace;
  while (!stop.stop_requested()) {
    if (pause_.load(std::memory_order_acquire)) {
      // Lane 0 attaches or resets the session: stand still until it is done.
      paused_lanes_.fetch_add(1, std::memory_order_acq_rel);
      paused_lanes_.notify_all();
      pause_.wait(1, std::memory_order_acquire);
      paused_lanes_.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    const bool serving = serving_.load(std::memory_order_acquire) != 0;
    if (serving && poll_lane(lane)) {
      idle_since = 0;
      backoff = kSleepGrace;
      continue;
    }
    if ((++pass & 15) != 0) {
      _mm_pause();
      continue;
    }
    const uint64_t now = now_ns();
    if (idle_since == 0) idle_since = now;
    const bool chaos_pending = opt_.chaos_seed != 0 && serving;
    if (now - idle_since < uint64_t(opt_.spin.count()) * 1000 || chaos_pending) {
      _mm_pause();
      continue;
    }
    // Park: announce, fence, look once more, sleep. A lane with an entry that
    // waits for edges is woken by other lanes' progress, and looks again with
    // a growing period (a host function's end wakes nobody).
    bool waiting = false;
    for (uint32_t r = lane.index; r < layout_.ring_count; r += uint32_t(lanes_.size())) waiting |= rings_[r].staged;
    lane.waiting.store(waiting, std::memory_order_relaxed);
    lane.parked.store(1, std::memory_order_relaxed);
    parked_lanes_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!pause_.load(std::memory_order_relaxed) && !(serving && poll_lane(lane))) {
      // Without a session only pause_lanes() (attach) has work for it.
      const std::chrono::microseconds limit = !serving ? std::chrono::seconds(1) : waiting ? backoff : opt_.max_sleep;
      futex_wait(lane.parked, 1, limit);
      if (waiting) backoff = std::min(backoff * 2, opt_.max_sleep);
    }
    if (lane.parked.exchange(0, std::memory_order_relaxed) == 1) parked_lanes_.fetch_sub(1, std::memory_order_relaxed);
    lane.waiting.store(false, std::memory_order_relaxed);
    idle_since = 0;
  }
}

// True when the doorbell rang.
static bool sleep_on(DoorbellWaiter* doorbell, std::chrono::microseconds limit) {
  if (doorbell) return doorbell->wait(limit);
  timespec ts{0, long(std::min<int64_t>(limit.count(), 1000) * 1000)};
  nanosleep(&ts, nullptr);
  return false;
}

void Worker::run(DoorbellWaiter* doorbell) {
  RegionHeader* h = region_.header();
  // The heartbeat says that this process lives, not that its dispatch loop is
  // quick: guests give a session up for good when it stops, and a dispatch
  // thread held in one long backend call (a module's JIT compile, the sim
  // joining a thousand stream threads on a loaded host) is not a dead worker.
  // So a thread of its own stores it (ARCHITECTURE.md, "Idle").
  std::jthread beater;
  try {
    beater = std::jthread([this](std::stop_token stop) { beat(stop); });
  } catch (const std::system_error&) {
    // No thread to spare (a thread limit): the loop below beats instead.
  }
  start_lanes();
  uint64_t idle_since = 0;
  uint64_t last_beat = 0;
  uint32_t pass = 0;
  bool worked = false;  // since the last clock pass
  while (!stop_.load(std::memory_order_relaxed)) {
    // The clock is read on every 16th pass only, busy or idle: the sweep needs
    // 100 ms resolution and the spin limit 200 us, and a clock_gettime
    // on every idle pass (8% of the worker's time in a sync round trip) only
    // delays the pass that finds the next request.
    if ((++pass & 15) != 0) {
      if (poll_once()) worked = true;
      else _mm_pause();
      continue;
    }
    const uint64_t now = now_ns();
    loop_passes_.store(pass, std::memory_order_relaxed);
    if (now - last_beat > 100'000'000) {
      if (!beater.joinable()) h->heartbeat_ns.store(now, std::memory_order_relaxed);
      last_beat = now;
      sweep(now);
    } else if (h->guest_session.load(std::memory_order_relaxed) != attached_) {
      check_session(now);
    }
    if (poll_once() || worked) {
      worked = false;
      idle_since = 0;
      continue;
    }
    if (idle_since == 0) idle_since = now;
    // Chaos keeps a serving worker awake (a held entry is work); with no guest it sleeps.
    const bool chaos_pending = opt_.chaos_seed != 0 && attached_;
    // The doorbell wakes lane 0 only: it sleeps once every other lane has
    // parked (a busy lane's rings get no bell while it runs).
    if (now - idle_since < uint64_t(opt_.spin.count()) * 1000 || chaos_pending || !all_lanes_parked()) {
      _mm_pause();
      continue;
    }
    // Sleep handshake: announce, fence, look once more, sleep through a grace
    // period, look again, then sleep. A guest publishes, then checks the flag
    // without a fence of its own: a guest that read 0 stored its entry before
    // the flag was set, and that store is visible well within the grace
    // period, so the second look finds it (ARCHITECTURE.md, "Idle").
    h->worker_sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!poll_once()) {
      bump(counters_.sleeps);
      const auto grace = std::min(kSleepGrace, opt_.max_sleep);
      bool rang = sleep_on(doorbell, grace);
      if (!rang && !poll_once()) rang = sleep_on(doorbell, opt_.max_sleep - grace);
      if (rang) bump(counters_.wakeups);
    }
    // What rang may be a host function's end that a parked lane's entry waits for.
    if (threads_running_)
      for (size_t i = 1; i < lanes_.size(); ++i)
        if (lanes_[i]->waiting.load(std::memory_order_relaxed)) wake_lane(*lanes_[i]);
    h->worker_sleeping.store(0, std::memory_order_relaxed);
    idle_since = 0;
  }
  // Stopping ends the guest's session: its device resources go with it.
  if (attached_) reset_session();
  stop_lanes();
}

void Worker::beat(std::stop_token stop) {
  // Guests wait out a dispatch thread held in a backend call; an operator
  // should still hear of one held for long (a hung driver call).
  constexpr uint32_t kStallBeats = 300;  // 30 s
  RegionHeader* h = region_.header();
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  uint32_t seen = 0, still = 0;
  while (!stop.stop_requested()) {
    h->heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
    const uint32_t passes = loop_passes_.load(std::memory_order_relaxed);
    if (passes != seen || h->attached_session.load(std::memory_order_relaxed) == 0) {
      seen = passes;
      still = 0;
    } else if (++still == kStallBeats && !opt_.quiet) {
      std::fprintf(stderr,
                   "ordo-worker: the dispatch thread has been in one call for %u s (a backend call that does not "
                   "return?); its guest's calls wait for it\n",
                   kStallBeats / 10);
    }
    cv.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
  }
}

bool Worker::write_trace(const std::string& path, std::string* error) const {
  if (!tracer_) {
    if (error) *error = "tracing was not enabled";
    return false;
  }
  return tracer_->write(path, error);
}

WorkerStats Worker::stats() const {
  WorkerStats s;
  for (const auto& l : lanes_) {
    for (size_t i = 0; i < kOpCount; ++i) s.ops[i] += l->ops[i].load(std::memory_order_relaxed);
    s.entries += l->entries.load(std::memory_order_relaxed);
    s.edge_waits += l->edge_waits.load(std::memory_order_relaxed);
  }
  s.slot_requests = counters_.slot_requests.load(std::memory_order_relaxed);
  s.slot_posts = counters_.slot_posts.load(std::memory_order_relaxed);
  s.errors = counters_.errors.load(std::memory_order_relaxed);
  s.sleeps = counters_.sleeps.load(std::memory_order_relaxed);
  s.wakeups_by_doorbell = counters_.wakeups.load(std::memory_order_relaxed);
  s.sessions = counters_.sessions.load(std::memory_order_relaxed);
  s.sessions_lost = counters_.sessions_lost.load(std::memory_order_relaxed);
  s.allocations = counters_.allocations.load(std::memory_order_relaxed);
  return s;
}

std::string WorkerStats::table() const {
  std::ostringstream o;
  o << "ring entries dispatched  " << entries << "\n"
    << "sync requests            " << slot_requests << " (" << slot_posts << " found by their posted bit)\n"
    << "entries that waited      " << edge_waits << "\n"
    << "errors                   " << errors << "\n"
    << "idle sleeps              " << sleeps << " (" << wakeups_by_doorbell << " ended by doorbell)\n"
    << "guest sessions           " << sessions << " (" << sessions_lost << " lost their heartbeat)\n"
    << "live allocations         " << allocations << "\n";
  for (size_t i = 0; i < kOpCount; ++i)
    if (ops[i]) o << "  " << kOps[i].name << std::string(24 - std::min<size_t>(22, kOps[i].name.size()), ' ') << ops[i] << "\n";
  return o.str();
}

std::string WorkerStats::json() const {
  std::ostringstream o;
  o << "{\"entries\":" << entries << ",\"sync_requests\":" << slot_requests << ",\"sync_requests_posted\":" << slot_posts << ",\"edge_waits\":" << edge_waits
    << ",\"errors\":" << errors << ",\"sleeps\":" << sleeps << ",\"doorbell_wakeups\":" << wakeups_by_doorbell
    << ",\"sessions\":" << sessions << ",\"sessions_lost\":" << sessions_lost << ",\"allocations\":" << allocations
    << ",\"ops\":{";
  bool first = true;
  for (size_t i = 0; i < kOpCount; ++i) {
    if (!ops[i]) continue;
    o << (first ? "" : ",") << "\"" << kOps[i].name << "\":" << ops[i];
    first = false;
  }
  o << "}}";
  return o.str();
}

}  // namespace ordo

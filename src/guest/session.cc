#include "guest/session.h"

#include <sched.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <vector>

namespace ordo::guest {

namespace {

uint64_t steady_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000 + uint64_t(ts.tv_nsec);
}

uint64_t steady_ms() { return steady_ns() / 1000000; }

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

bool serving(const Region& r) {
  const uint32_t s = r.header()->worker_state.load(std::memory_order_acquire);
  return s == uint32_t(WorkerState::kServing) || s == uint32_t(WorkerState::kIdle);
}

bool claim_part(Region& r, uint64_t from, uint64_t session) {
  return serving(r) && r.header()->guest_session.compare_exchange_strong(from, session, std::memory_order_acq_rel);
}

// One guest process (session) per part of the region, each part with a
// worker process of its own. A part is claimed with a compare-and-swap, so
// processes attaching at the same instant each get their own: first a free
// part, else one whose guest stopped its heartbeat (it died without detaching).
std::unique_ptr<Region> claim_any_part(std::vector<std::unique_ptr<Region>>& parts, uint64_t session,
                                       const std::string& path, std::string* error) {
  for (auto& p : parts)
    if (claim_part(*p, 0, session)) return std::move(p);
  std::vector<uint64_t> owner(parts.size()), beat(parts.size());
  bool any_serving = false;
  for (size_t k = 0; k < parts.size(); ++k) {
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
  for (size_t k = 0; k < parts.size(); ++k)
    if (claim_part(*parts[k], 0, session) ||
        (parts[k]->header()->guest_beat.load(std::memory_order_relaxed) == beat[k] &&
         claim_part(*parts[k], owner[k], session)))
      return std::move(parts[k]);
  if (error)
    *error = "region " + path + " is in use by " +
             (parts.size() == 1 ? "another live guest process (its worker serves one: start ordo-worker with "
                                  "--sessions 2 or more)"
                                : std::to_string(parts.size()) + " live guest processes, as many as it has "
                                  "sessions (start ordo-worker with a larger --sessions)");
  return nullptr;
}

// Waits until the worker of the claimed part `r` accepts `session`; on
// failure the part is free again.
bool await_acceptance(Region& r, uint64_t session, const std::string& path, std::chrono::milliseconds timeout,
                      std::string* error) {
  RegionHeader* h = r.header();
  WorkerBell bell(path, h);
  const uint64_t deadline = steady_ms() + uint64_t(timeout.count());
  while (h->attached_session.load(std::memory_order_acquire) != session) {
    if (steady_ms() > deadline) {
      uint64_t mine = session;
      h->guest_session.compare_exchange_strong(mine, 0);  // the part is free again
      if (error) *error = "worker on " + path + " did not accept the guest session within " +
                          std::to_string(timeout.count()) + " ms (is ordo-worker still running?)";
      return false;
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
    return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<Region> Session::claim(const std::string& spec, std::string* error, ClientOptions* options,
                                       uint64_t* session) {
  const std::string path = resolve_region(spec, error);
  if (path.empty()) return nullptr;
  auto whole = Region::map(path, error);
  if (!whole) return nullptr;
  if (!whole->validate(error)) return nullptr;
  if (const char* u = std::getenv("ORDO_UNORDERED"); u && *u == '1') options->ordered = false;
  std::vector<std::unique_ptr<Region>> parts;
  for (uint32_t k = 0; k < whole->partitions(); ++k) {
    auto part = whole->partition(k, error);
    if (!part) return nullptr;
    parts.push_back(std::move(part));
  }
  std::random_device rd;
  *session = (uint64_t{rd()} << 32 | rd()) | 1;
  auto region = claim_any_part(parts, *session, path, error);
  if (!region || !await_acceptance(*region, *session, path, options->attach_timeout, error)) return nullptr;
  return region;
}

namespace {

// Under unified addressing a pinned pointer is a device pointer too: with the
// part mapped where the worker maps it, kernels can take pinned pointers. If
// that cannot be, the session still works, without mapped pinned memory.
std::unique_ptr<Region> map_as_worker(std::unique_ptr<Region> region, std::string* unmapped_why) {
  const uint64_t at = region->header()->mapped_base.load(std::memory_order_acquire);
  if (!at) *unmapped_why = "the worker's backend cannot map host memory for kernels (ordo-worker --backend cuda "
                           "without mapped registration of the region)";
  else region->rebase(at, unmapped_why);
  return region;
}

}  // namespace

Session::Session(std::unique_ptr<Region> region, ClientOptions options, uint64_t session)
    : region_(map_as_worker(std::move(region), &unmapped_why_)),
      opt_(options),
      bell_(region_->path(), region_->header()),
      worker_session_(region_->header()->session),
      guest_session_(session),
      device_count_(region_->header()->device_count.load(std::memory_order_relaxed)) {  // claim() checked it
  // The worker frees this session's resources when the beat stops (we died).
  heartbeat_ = std::thread([this] {
    std::unique_lock lock(beat_mu_);
    while (!beat_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return beat_stop_; }))
      region_->header()->guest_beat.fetch_add(1, std::memory_order_relaxed);
  });
}

Session::~Session() { detach(); }

void Session::detach() {
  if (detached_) return;
  detached_ = true;
  {
    std::lock_guard lock(beat_mu_);
    beat_stop_ = true;
  }
  beat_cv_.notify_one();
  heartbeat_.join();
  uint64_t mine = guest_session_;
  region_->header()->guest_session.compare_exchange_strong(mine, 0, std::memory_order_release);
  notify_worker();
}

bool Session::worker_alive() const {
  const RegionHeader* h = region_->header();
  return h->session == worker_session_ &&
         h->worker_state.load(std::memory_order_acquire) == uint32_t(WorkerState::kServing) &&
         h->attached_session.load(std::memory_order_acquire) == guest_session_;
}

Status Session::wait_worker(const std::atomic<uint64_t>& word, uint64_t target, const std::atomic<uint32_t>* unless) {
  // A worker found dead stays dead for this session: fail at once, not after
  // another timeout per call.
  if (lost()) return Status::kDevicesUnavailable;
  uint64_t beat = region_->header()->heartbeat_ns.load(std::memory_order_relaxed);
  uint64_t beat_changed_ms = 0;
  uint64_t slept_since = 0;
  TightSleeps sleeps;
  for (uint64_t i = 0;; ++i) {
    if (word.load(std::memory_order_acquire) >= target) {
      see_host_functions();
      return Status::kSuccess;
    }
    if (unless && unless->load(std::memory_order_acquire)) return Status::kNotReady;
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

}  // namespace ordo::guest

// The guest's session: a claimed part of a region and the worker that serves
// it (ARCHITECTURE.md, "Sessions"). Attaching claims the part; a heartbeat
// tells the worker this process lives; every wait for the worker notices when
// the worker died or dropped the session.
#pragma once

#include <immintrin.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ordo/client.h"
#include "ordo/doorbell.h"
#include "ordo/layout.h"
#include "ordo/region.h"
#include "ordo/status.h"

namespace ordo::guest {

class Session {
 public:
  // Claims a part of the region `spec` names for a new session and waits until
  // its worker accepts it: the part, and the session id in *session.
  // ORDO_UNORDERED=1 clears options->ordered.
  static std::unique_ptr<Region> claim(const std::string& spec, std::string* error, ClientOptions* options,
                                       uint64_t* session);

  // `region`: a part claim() returned, with the session id it was claimed with.
  Session(std::unique_ptr<Region> region, ClientOptions options, uint64_t session);
  ~Session();  // detach()
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Stops the heartbeat and gives the part back: the worker frees whatever
  // the session still holds. Once.
  void detach();

  Region& region() const { return *region_; }
  const Layout& layout() const { return region_->layout(); }
  const ClientOptions& options() const { return opt_; }
  uint32_t device_count() const { return device_count_; }
  // Whether pinned heap pointers are device pointers (mapped pinned memory);
  // if not, why not.
  bool host_mapped() const { return unmapped_why_.empty(); }
  const std::string& unmapped_why() const { return unmapped_why_; }
  // The worker died or dropped this session: every call fails with kDevicesUnavailable.
  bool lost() const { return lost_.load(std::memory_order_relaxed); }
  // The kernel fault that ended this session's device context, or kSuccess.
  Status sticky_error() const {
    return Status(region_->header()->sticky_error.load(std::memory_order_acquire));
  }
  uint64_t completed(uint32_t r) const { return region_->ring(r).completed.load(std::memory_order_acquire); }

  [[gnu::always_inline]] void notify_worker() {
    // No full fence between the store just published and this load: the worker
    // polls once more a grace period after announcing its sleep, by when the
    // store has left this core's store buffer (ARCHITECTURE.md, "Idle"). The
    // sfence flushes a write-combined BAR mapping's buffer, which has no such bound.
    _mm_sfence();
    if (region_->header()->worker_sleeping.load(std::memory_order_relaxed)) bell_.ring();
  }
  // Until `word` reaches `target`; kDevicesUnavailable once the worker is found
  // gone. `unless`: stop waiting (kNotReady) as soon as it is nonzero.
  Status wait_worker(const std::atomic<uint64_t>& word, uint64_t target, const std::atomic<uint32_t>* unless = nullptr);
  Status wait_completed(uint32_t r, uint64_t pos) { return wait_worker(region_->ring(r).completed, pos); }

  // Host functions finished: the runner releases each, and every wait for the
  // worker acquires them. What the worker reports may follow a host function's
  // `done` (through another process), so what the function did must be visible
  // to the waiting thread too (ARCHITECTURE.md, "Host functions").
  void host_function_ran() { host_functions_ran_.fetch_add(1, std::memory_order_release); }
  void see_host_functions() const { host_functions_ran_.load(std::memory_order_acquire); }
  // Host functions issued that have not returned: a ring holds the entries
  // behind one until it did, and other rings' entries with edges to those.
  std::atomic<uint32_t>& host_functions_pending() { return host_functions_pending_; }

 private:
  bool worker_alive() const;

  std::string unmapped_why_;  // before region_: set while it is initialized
  std::unique_ptr<Region> region_;
  const ClientOptions opt_;
  WorkerBell bell_;
  const uint64_t worker_session_;  // the worker's session id at attach: a restarted worker has another
  const uint64_t guest_session_;   // ours, as claimed in the header
  const uint32_t device_count_;    // the worker's word, checked at attach
  std::atomic<bool> lost_{false};
  std::atomic<uint64_t> host_functions_ran_{0};
  std::atomic<uint32_t> host_functions_pending_{0};
  std::thread heartbeat_;
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool beat_stop_ = false;
  bool detached_ = false;
};

}  // namespace ordo::guest

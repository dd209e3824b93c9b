// The client's calling threads: each one's state (its reply slot, current
// device, per-thread streams, last error), the sync calls it makes through its
// slot, and what a call returns (ARCHITECTURE.md, "Threads and slots").
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "guest/session.h"
#include "ordo/client.h"
#include "ordo/layout.h"
#include "ordo/status.h"

namespace ordo::guest {

class Streams;

// What a thread's state shares with its client, which may be gone by the time
// the thread exits.
struct ThreadHome {
  std::mutex mu;
  Streams* streams = nullptr;  // null once the client is gone
  std::vector<uint32_t> free;  // permanent reply slots
};

struct ThreadState {
  std::shared_ptr<ThreadHome> home;
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
  ~ThreadState();  // releases the thread's per-thread streams and its slot, if the client is still there
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
};

namespace detail {
// The state of the client this thread used last: every call needs it, and a
// program has one client, so a compare usually replaces the hash lookup. Client
// ids are never reused and a state lives as long as its thread: never stale.
// (Hidden: the local-dynamic TLS model in libcuda.so.1.)
[[gnu::visibility("hidden")]] inline thread_local uint64_t t_last_id = 0;
[[gnu::visibility("hidden")]] inline thread_local void* t_last_state = nullptr;
}  // namespace detail

class Threads {
 public:
  explicit Threads(Session& session);
  ~Threads();  // orphan()
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;

  // The calling thread's state, made on its first call.
  [[gnu::always_inline]] ThreadState& current() {
    if (detail::t_last_id == id_) [[likely]] return *static_cast<ThreadState*>(detail::t_last_state);
    return current_slow();
  }
  // The calling thread's state if it made a call already, else null.
  ThreadState* find_current() const;
  // Where exiting threads release their per-thread streams; orphan(): the
  // client is going, they release nothing more.
  void set_streams(Streams* streams);
  void orphan();

  // A sync call: posts `e` in the calling thread's reply slot (a leased one
  // for threads without one) and waits for the worker's answer, with an
  // optional name in the slot's payload and an optional reply payload.
  Status call(const Entry& e, uint64_t* r0 = nullptr, uint64_t* r1 = nullptr, const std::string* payload = nullptr,
              void* reply_payload = nullptr, size_t reply_size = 0);

  // What a call returns. finish: its own status, else an async error of the
  // thread's earlier work; both recorded as the last error.
  Status finish(ThreadState& t, Status own);
  // finish for a call that creates something: the async error stays pending.
  Status finish_own(ThreadState& t, Status own);
  // finish for a call that only enqueued: the errors present when it pushed its first entry.
  Status finish_async(ThreadState& t);
  // Notes those errors, before the worker can see the call's entry (every push).
  [[gnu::always_inline]] void mark_errors(ThreadState& t) {
    if (t.marked) return;  // before the worker can see this call's entry, let alone fail it
    t.marked = true;
    t.mark_sticky = !ok(session_.sticky_error());
    t.mark_error_seq = t.err_slot == kNoSlot ? t.error_seen : error_seq(t.err_slot);
  }
  Status get_last_error();   // returns and clears the thread's last error (a kernel fault stays)
  Status peek_last_error();

 private:
  ThreadState& current_slow();
  Status check_async_error(ThreadState& t);
  uint64_t error_seq(uint32_t slot) const {
    return session_.region().slot(slot).error_seq.load(std::memory_order_acquire);
  }

  Session& session_;
  const uint64_t id_;  // this client's key in each thread's map of states
  std::shared_ptr<ThreadHome> home_;
  uint32_t shared_slot_ = kNoSlot;  // async errors of threads without a permanent slot
  std::mutex lease_mu_;
  std::condition_variable lease_cv_;
  std::vector<uint32_t> lease_free_;  // slots lent to those threads for one sync call
};

}  // namespace ordo::guest

#include "guest/threads.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_map>

#include "guest/streams.h"
#include "transport/reply_slot.h"

namespace ordo::guest {

namespace {
std::atomic<uint64_t> g_next_client_id{1};
thread_local std::unordered_map<uint64_t, std::unique_ptr<void, void (*)(void*)>> t_states;
}  // namespace

ThreadState::~ThreadState() {
  if (!home) return;
  std::lock_guard lock(home->mu);
  if (!home->streams) return;
  for (const Stream& s : per_thread)
    if (s.id != kNoStream) home->streams->release(*this, s);
  if (slot != kNoSlot) home->free.push_back(slot);
}

Threads::Threads(Session& session)
    : session_(session), id_(g_next_client_id.fetch_add(1)), home_(std::make_shared<ThreadHome>()) {
  // Slot partition: permanent slots for the first threads, a few lease slots
  // for sync calls of the threads after them, and one shared error slot for
  // those threads' async errors (ARCHITECTURE.md, "Threads and slots").
  const uint32_t slots = session.layout().slot_count;
  uint32_t permanent = slots;
  if (slots >= 3) {
    shared_slot_ = slots - 1;
    const uint32_t lease = std::max<uint32_t>(1, slots / 8);
    permanent = slots - 1 - lease;
    for (uint32_t s = permanent; s < shared_slot_; ++s) lease_free_.push_back(s);
  }
  for (uint32_t s = permanent; s-- > 0;) home_->free.push_back(s);
}

Threads::~Threads() { orphan(); }

void Threads::set_streams(Streams* streams) {
  std::lock_guard lock(home_->mu);
  home_->streams = streams;
}

void Threads::orphan() { set_streams(nullptr); }

ThreadState& Threads::current_slow() {
  auto it = t_states.find(id_);
  if (it != t_states.end()) {
    detail::t_last_id = id_;
    detail::t_last_state = it->second.get();
    return *static_cast<ThreadState*>(detail::t_last_state);
  }
  auto* t = new ThreadState();
  t->home = home_;
  {
    std::lock_guard lock(home_->mu);
    if (!home_->free.empty()) {
      t->slot = home_->free.back();
      home_->free.pop_back();
    }
  }
  // Threads beyond the permanent slots send their async entries with the shared
  // error slot and borrow a lease slot for each sync call (more threads than
  // slots is normal: thread pools, one thread per request).
  t->err_slot = t->slot != kNoSlot ? t->slot : shared_slot_;
  if (t->slot != kNoSlot) t->seq = session_.region().slot(t->slot).request.seq.load(std::memory_order_relaxed);
  if (t->err_slot != kNoSlot) t->error_seen = error_seq(t->err_slot);
  auto forget = [](void* p) {
    if (detail::t_last_state == p) detail::t_last_id = 0, detail::t_last_state = nullptr;
    delete static_cast<ThreadState*>(p);
  };
  auto [pos, _] = t_states.emplace(id_, std::unique_ptr<void, void (*)(void*)>(t, forget));
  detail::t_last_id = id_;
  detail::t_last_state = pos->second.get();
  return *static_cast<ThreadState*>(detail::t_last_state);
}

ThreadState* Threads::find_current() const {
  auto it = t_states.find(id_);
  return it == t_states.end() ? nullptr : static_cast<ThreadState*>(it->second.get());
}

Status Threads::check_async_error(ThreadState& t) {
  if (t.err_slot == kNoSlot) return Status::kSuccess;
  ReplySlot& s = session_.region().slot(t.err_slot);
  const uint64_t seq = s.error_seq.load(std::memory_order_acquire);
  if (seq == t.error_seen) return Status::kSuccess;
  t.error_seen = seq;
  return Status(s.error);
}

Status Threads::finish(ThreadState& t, Status own) {
  t.marked = false;
  if (session_.lost()) own = Status::kDevicesUnavailable;
  else if (const Status f = session_.sticky_error(); !ok(f)) own = f;
  const Status async = check_async_error(t);
  const Status result = ok(own) ? async : own;
  if (!ok(result) && result != Status::kNotReady) t.last_error = result;
  return result;
}

Status Threads::finish_own(ThreadState& t, Status own) {
  // Calls that create something answer for themselves: mixing in an earlier
  // async error would report a failure for a handle that exists (and leaks),
  // and callers that cache a lookup's result would keep that error forever.
  // The async error stays pending for the thread's next call.
  t.marked = false;
  if (session_.lost()) own = Status::kDevicesUnavailable;
  else if (const Status f = session_.sticky_error(); !ok(f)) own = f;
  if (!ok(own) && own != Status::kNotReady) t.last_error = own;
  return own;
}

Status Threads::finish_async(ThreadState& t) {
  // An async call returns the errors that were there when it enqueued, never
  // the one its own work causes, however fast the worker ran it: that one is
  // the next call's, as on a GPU.
  if (!t.marked) return finish(t, Status::kSuccess);
  t.marked = false;
  Status result = Status::kSuccess;
  if (session_.lost()) result = Status::kDevicesUnavailable;
  else if (t.mark_sticky) result = session_.sticky_error();
  else if (t.mark_error_seq != t.error_seen) result = check_async_error(t);
  if (!ok(result)) t.last_error = result;
  return result;
}

Status Threads::get_last_error() {
  ThreadState& t = current();
  finish(t, Status::kSuccess);
  const Status s = t.last_error;
  // A kernel fault stays: cudaGetLastError keeps returning it, as CUDA's does.
  t.last_error = session_.sticky_error();
  return s;
}

Status Threads::peek_last_error() {
  ThreadState& t = current();
  finish(t, Status::kSuccess);
  return t.last_error;
}

Status Threads::call(const Entry& e, uint64_t* r0, uint64_t* r1, const std::string* payload, void* reply_payload,
                     size_t reply_size) {
  ThreadState& t = current();
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
    Threads* threads;
    uint32_t slot;
    bool leased;
    ~Release() {
      if (!leased) return;
      {
        std::lock_guard lock(threads->lease_mu_);
        threads->lease_free_.push_back(slot);
      }
      threads->lease_cv_.notify_one();
    }
  } release{this, slot, leased};
  ReplySlot& s = session_.region().slot(slot);
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
  if (!s.watched.load(std::memory_order_relaxed)) post_slot(session_.region().header(), slot);
  session_.notify_worker();
  if (Status st = session_.wait_worker(s.reply_seq, seq); !ok(st)) return st;
  if (reply_payload) std::memcpy(reply_payload, s.payload, std::min(reply_size, kSlotPayload));
  return read_reply(s, r0, r1);
}

}  // namespace ordo::guest

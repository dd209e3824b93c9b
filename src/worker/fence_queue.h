// A ring's fences in flight, in ring order. Streams that share a ring finish
// their work independently, so fence k can complete before fence k-1:
// `completed` moves only to the end of the longest prefix of completed fences,
// and so never passes unfinished work of any stream on the ring. Shared with
// the backend's callbacks, which may outlive the session (then `dead`).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>

#include "ordo/layout.h"

namespace ordo {

struct FenceQueue {
  explicit FenceQueue(RingControl* c) : ctl(c) {}
  struct Pending {
    uint64_t end;        // ring position just past the fence
    uint32_t remaining;  // streams (plus one for the dispatch itself) still running earlier work
  };
  RingControl* const ctl;
  std::mutex mu;
  std::deque<Pending> queue;  // guarded by mu
  uint64_t first = 0;         // guarded by mu: sequence number of queue.front()
  bool dead = false;          // guarded by mu

  uint64_t push(uint64_t end, uint32_t count) {
    std::lock_guard lock(mu);
    queue.push_back({end, count});
    return first + queue.size() - 1;
  }
  void done(uint64_t seq) {
    std::lock_guard lock(mu);
    if (dead) return;
    --queue[seq - first].remaining;
    uint64_t end = 0;
    for (; !queue.empty() && queue.front().remaining == 0; ++first) {
      end = queue.front().end;
      queue.pop_front();
    }
    if (end) ctl->completed.store(end, std::memory_order_release);
  }
  bool empty() {
    std::lock_guard lock(mu);
    return queue.empty();
  }
  void kill() {  // callbacks still queued in the backend belong to an old session
    std::lock_guard lock(mu);
    dead = true;
  }
};

}  // namespace ordo

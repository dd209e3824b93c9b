// What synchronizing calls wait for: ring positions ("ring R completed p"),
// reached by fences. A fence completes once everything before it on its ring
// ran, so waiting for one covers every stream on the ring, destroyed ones
// included (ARCHITECTURE.md, "Ordering rules", 4 and 5).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "guest/edges.h"
#include "guest/ring_producer.h"
#include "guest/session.h"
#include "guest/threads.h"

namespace ordo::guest {

using Targets = std::vector<std::pair<uint32_t, uint64_t>>;  // (ring, position) pairs to wait for

class Waits {
 public:
  Waits(Session& session, Threads& threads, RingProducer& producer, Edges& edges)
      : session_(session), threads_(threads), producer_(producer), edges_(edges) {}

  // Ring r's work so far, if it has unfinished work: its last fence, pushing one if needed.
  void fence_target(ThreadState& t, uint32_t r, Targets* targets);
  // fence_target for the work of some of ring r's streams (a device's, or its
  // blocking ones), destroyed ones included: RingOrder::Presence.
  void presence_target(ThreadState& t, uint32_t r, uint32_t device, bool blocking_only, Targets* targets);
  // What `device`'s legacy-stream work follows: its blocking streams' work.
  void legacy_targets(ThreadState& t, uint32_t device, Targets* targets);
  // Waits for every target, then finish()es.
  Status wait(ThreadState& t, const Targets& targets);

  Status device_synchronize();            // the current device's work
  Status synchronize_all(ThreadState& t);  // every device's work (cudaFree)

 private:
  Session& session_;
  Threads& threads_;
  RingProducer& producer_;
  Edges& edges_;
};

}  // namespace ordo::guest

#include "guest/waits.h"

namespace ordo::guest {

void Waits::fence_target(ThreadState& t, uint32_t r, Targets* targets) {
  // Ring-wide: a fence waits for every stream on the ring, destroyed ones included.
  Ring& g = producer_.ring(r);
  std::lock_guard lock(g.mu);
  const uint64_t tail = g.writer.tail();
  if (session_.completed(r) >= tail) return;
  targets->push_back({r, g.fence_end == tail ? tail : producer_.push_fence(t, g)});
}

void Waits::presence_target(ThreadState& t, uint32_t r, uint32_t device, bool blocking_only, Targets* targets) {
  const RingOrder::Presence& p = blocking_only ? edges_.ring(r).blocking[device] : edges_.ring(r).on[device];
  if (p.live.load(std::memory_order_acquire)) return fence_target(t, r, targets);
  // Only destroyed streams' work, covered by the fence before the last destroy.
  const uint64_t end = p.end.load(std::memory_order_acquire);
  if (session_.completed(r) < end) targets->push_back({r, end});
}

// Synchronizing or querying the legacy stream covers every blocking stream's
// work issued before it too, as a launch there would: measured on an H200
// (driver 580), cudaStreamSynchronize(0) waited for blocking-stream work issued
// after the legacy stream's last work, and cudaStreamQuery(0) said not ready.
void Waits::legacy_targets(ThreadState& t, uint32_t device, Targets* targets) {
  for (uint32_t r = 0; r < producer_.size(); ++r) presence_target(t, r, device, true, targets);
}

Status Waits::wait(ThreadState& t, const Targets& targets) {
  for (auto [r, pos] : targets)
    if (Status s = session_.wait_completed(r, pos); !ok(s)) return threads_.finish(t, s);
  // With nothing left to wait for (the rings had completed already), what
  // finished host functions did must still be visible here, as after a wait
  // (wait_worker): a synchronous copy from pageable memory reads it next.
  session_.see_host_functions();
  return threads_.finish(t, Status::kSuccess);
}

Status Waits::device_synchronize() {
  ThreadState& t = threads_.current();
  // Fence every ring with outstanding work of the device first, so they drain in parallel.
  Targets targets;
  for (uint32_t r = 0; r < producer_.size(); ++r) presence_target(t, r, t.device, false, &targets);
  return wait(t, targets);
}

Status Waits::synchronize_all(ThreadState& t) {
  Targets targets;
  for (uint32_t r = 0; r < producer_.size(); ++r) fence_target(t, r, &targets);
  return wait(t, targets);
}

}  // namespace ordo::guest

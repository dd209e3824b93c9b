// Streams, fences and host functions: the ops that give a ring's entries their
// stream and tell the guest when a ring or a stream got somewhere.
#include <memory>
#include <mutex>

#include "../fence_queue.h"
#include "../worker.h"

namespace ordo {

Status Worker::op_Nop(const RingCall&) { return Status::kSuccess; }

Status Worker::op_Fence(const RingCall& c) {
  RingState& rs = c.rs;
  // One count per stream that got work since the last fence, and one for this
  // dispatch, dropped last: the fence cannot complete while callbacks are queued.
  std::shared_ptr<FenceQueue> fq = rs.fences;
  const uint64_t seq = fq->push(c.pos + 1, uint32_t(rs.dirty.size()) + 1);
  // Not stream work: a fence on the legacy stream sees what cudaStreamSynchronize sees.
  for (uint32_t st : rs.dirty) backend_.stream_notify(st, [fq, seq] { fq->done(seq); });
  rs.dirty.clear();
  ++rs.fence_count;
  fq->done(seq);
  return Status::kSuccess;
}

Status Worker::op_StreamCreate(const RingCall& c) {
  const auto a = decode<Op::StreamCreate>(c.e.arg);
  const uint32_t st = c.e.stream;
  const uint64_t device = a.device;
  if (device >= devices_) return Status::kInvalidDevice;
  std::lock_guard lock(streams_mu_);  // a guest may name one id on two rings at once
  if (st >= kMaxStreams || streams_.bound(st)) return Status::kInvalidResourceHandle;
  if (a.flags & kStreamLegacy) {
    // A device's legacy stream exists in the backend already: the guest
    // only chooses its ring. Device 0's is on ring 0 from the start.
    if (st != device || st == kLegacyStreamId) return Status::kInvalidResourceHandle;
  } else if (st < kMaxDevices) {
    return Status::kInvalidResourceHandle;
  } else if (Status s = backend_.stream_create(st, uint32_t(device), !(a.flags & kStreamNonBlocking),
                                               int(a.priority));
             !ok(s)) {
    return s;
  }
  streams_.bind(st, c.ring, uint32_t(device));
  return Status::kSuccess;
}

Status Worker::op_StreamDestroy(const RingCall& c) {
  const uint32_t st = c.e.stream;
  std::lock_guard lock(streams_mu_);
  if (Status s = stream_of(c.e, c.ring); !ok(s) || st < kMaxDevices) return Status::kInvalidResourceHandle;
  // The guest fences before a destroy; work queued since then (none from a
  // correct guest) is not waited for by later fences of the ring.
  if (streams_.mark(st) == c.rs.fence_count + 1) std::erase(c.rs.dirty, st);
  streams_.unbind(st);
  return backend_.stream_destroy(st);
}

Status Worker::op_HostFunc(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  // The guest runs the function (CUDA runs it on a runtime thread of the
  // program): a callback tells it when the stream got there, and the ring
  // dispatches nothing more until the guest says done (poll_ring). Nothing
  // waits on the device, so a guest that never says done stalls only its
  // own ring, and a session reset simply drops the hold.
  const auto a = decode<Op::HostFunc>(c.e.arg);
  auto* w = reinterpret_cast<HostFuncWords*>(region_.heap() + a.words);  // check_entry: in the heap, aligned
  const uint64_t ticket = a.ticket;
  backend_.host_callback(c.e.stream, [w, ticket] { w->reached.store(ticket, std::memory_order_release); });
  c.rs.hold_ticket.store(ticket, std::memory_order_relaxed);
  c.rs.hold.store(w, std::memory_order_release);  // before the head passes it (poll_ring)
  return Status::kSuccess;
}

void Worker::op_StreamSynchronize(const SlotCall& c) {
  // The stream alone, not its ring-mates (a fence would wait for them too).
  const uint64_t id = decode<Op::StreamSynchronize>(c.e.arg).stream;
  if (!streams_.bound(id)) return reply(c, Status::kInvalidResourceHandle);
  backend_.stream_notify(uint32_t(id), deferred_reply(c.slot, c.seq));
}

}  // namespace ordo

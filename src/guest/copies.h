// Copies and memsets as stream work. Host memory in the pinned heap is copied
// zero-copy; other (pageable) host memory passes through staging: the ring's
// window, or pinned-heap blocks for large copies (staging.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "guest/pinned_heap.h"
#include "guest/ring_producer.h"
#include "guest/session.h"
#include "guest/staging.h"
#include "guest/streams.h"
#include "guest/threads.h"

namespace ordo::guest {

class Copies {
 public:
  Copies(Session& session, Threads& threads, Streams& streams, RingProducer& producer, Staging& staging,
         StagingPool& pool, PinnedHeap& heap)
      : session_(session),
        threads_(threads),
        streams_(streams),
        producer_(producer),
        staging_(staging),
        pool_(pool),
        heap_(heap) {}

  Status h2d_async(uint64_t dst, const void* src, uint64_t size, Stream s);
  Status d2h_async(void* dst, uint64_t src, uint64_t size, Stream s);  // pageable dst: returns when done
  Status d2d_async(uint64_t dst, uint64_t src, uint64_t size, Stream s);
  Status memset_async(uint64_t dst, uint8_t value, uint64_t size, Stream s);
  Status peer_async(uint64_t dst, uint32_t dst_device, uint64_t src, uint32_t src_device, uint64_t size, Stream s);
  // Legacy-stream work (or `s`'s) that returns once it is done.
  Status h2d(uint64_t dst, const void* src, uint64_t size, Stream s);
  Status d2h(void* dst, uint64_t src, uint64_t size);

 private:
  // The pageable paths, with the ring's lock held; they finish() the call.
  Status h2d_pool(ThreadState& t, const Bound& b, uint64_t dst, const std::byte* src, uint64_t size, uint64_t chunk,
                  std::byte** blocks, unsigned nb);
  Status h2d_window(ThreadState& t, const Bound& b, uint64_t dst, const std::byte* src, uint64_t size);
  Status d2h_pool(ThreadState& t, const Bound& b, std::byte* dst, uint64_t src, uint64_t size, uint64_t chunk,
                  std::byte** blocks, unsigned nb);
  Status d2h_window(ThreadState& t, const Bound& b, std::byte* dst, uint64_t src, uint64_t size);

  Session& session_;
  Threads& threads_;
  Streams& streams_;
  RingProducer& producer_;
  Staging& staging_;
  StagingPool& pool_;
  PinnedHeap& heap_;
};

}  // namespace ordo::guest

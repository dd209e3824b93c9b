// Kernels: modules (loaded from images through the pinned heap), looking
// kernels and device variables up, and launches, the hot path of stream work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "guest/devices.h"
#include "guest/memory.h"
#include "guest/pinned_heap.h"
#include "guest/ring_producer.h"
#include "guest/staging.h"
#include "guest/streams.h"
#include "guest/threads.h"
#include "guest/waits.h"
#include "ordo/device_info.h"

namespace ordo::guest {

class Kernels {
 public:
  Kernels(Threads& threads, Streams& streams, RingProducer& producer, Staging& staging, Waits& waits,
          Devices& devices, Memory& memory, PinnedHeap& heap)
      : threads_(threads),
        streams_(streams),
        producer_(producer),
        staging_(staging),
        waits_(waits),
        devices_(devices),
        memory_(memory),
        heap_(heap) {}

  Status lookup(uint32_t module, const std::string& name, uint32_t* kernel, bool* runnable);
  Status module_load(const void* image, uint64_t size, uint32_t* module);
  Status module_unload(uint32_t module);
  Status module_global(uint32_t module, const std::string& name, uint64_t size_hint, uint64_t* addr, uint64_t* size);
  Status attributes(uint32_t kernel, uint32_t device, int32_t* out);
  Status occupancy(uint32_t kernel, uint32_t device, uint32_t threads, uint32_t smem, uint16_t shape, uint64_t mode,
                   uint32_t* out);
  Status launch(uint32_t kernel, Dim3 grid, Dim3 block, const void* args, uint32_t args_size, Stream s,
                uint32_t shared_mem, uint16_t shape);

  // A module image goes in one request when it is at most 1/kImageHeapShare of
  // the pinned heap, else in pieces of that size (ModuleChunk), halved while
  // the heap has no room for one, down to kMinImagePiece.
  static constexpr uint64_t kImageHeapShare = 4;
  static constexpr uint64_t kMinImagePiece = 4096;

 private:
  // Sends `image` through `block` (`piece` bytes of the heap), in pieces when it is larger.
  Status send_image(const std::byte* image, uint64_t size, void* block, uint64_t piece, uint64_t* id);

  Threads& threads_;
  Streams& streams_;
  RingProducer& producer_;
  Staging& staging_;
  Waits& waits_;
  Devices& devices_;
  Memory& memory_;
  PinnedHeap& heap_;
  std::mutex pieces_mu_;  // held while an image goes in pieces: the worker keeps one pending per session
};

}  // namespace ordo::guest

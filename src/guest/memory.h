// Allocations: device memory (a sync call each) and the pinned heap
// (cudaMallocHost). Freeing either waits for all work first, as CUDA does.
#pragma once

#include <cstdint>

#include "guest/pinned_heap.h"
#include "guest/staging.h"
#include "guest/threads.h"
#include "guest/waits.h"

namespace ordo::guest {

class Memory {
 public:
  Memory(Threads& threads, Waits& waits, PinnedHeap& heap, StagingPool& pool)
      : threads_(threads), waits_(waits), heap_(heap), pool_(pool) {}

  Status malloc(uint64_t* device_addr, uint64_t size);
  Status free(uint64_t device_addr);
  Status malloc_host(void** ptr, uint64_t size);
  // malloc_host's block without its status bookkeeping: null when the heap
  // has no room, even after taking back the blocks of finished copies.
  void* alloc_host(uint64_t size);
  Status free_host(void* ptr);

 private:
  Threads& threads_;
  Waits& waits_;
  PinnedHeap& heap_;
  StagingPool& pool_;
};

}  // namespace ordo::guest

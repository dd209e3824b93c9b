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

  // Virtual memory management (client.h): each a sync call the worker checks.
  Status vmm_reserve(uint64_t size, uint64_t alignment, uint64_t hint, uint64_t* addr);
  Status vmm_address_free(uint64_t addr, uint64_t size);
  Status vmm_create(uint32_t device, uint64_t size, uint64_t* handle);
  Status vmm_release(uint64_t handle);
  Status vmm_map(uint64_t addr, uint64_t size, uint64_t handle);
  Status vmm_unmap(uint64_t addr, uint64_t size);
  Status vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access);

  // Interprocess memory (client.h): sync calls; the last close waits for all work first, as free.
  Status ipc_export(uint64_t device_addr, Client::IpcToken* out);
  Status ipc_open(const Client::IpcToken& t, uint64_t* device_addr, uint64_t* size, uint32_t* device);
  Status ipc_close(uint64_t device_addr);
  Status ipc_export_vmm(uint64_t handle, Client::IpcToken* out);
  Status ipc_open_vmm(const Client::IpcToken& t, uint64_t* handle, uint64_t* size, uint32_t* device);

 private:
  Threads& threads_;
  Waits& waits_;
  PinnedHeap& heap_;
  StagingPool& pool_;
};

}  // namespace ordo::guest

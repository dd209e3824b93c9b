// Graphs: a CUDA graph's device work sent once (GraphCreate) and then run by
// one GraphLaunch entry per launch, ordered like any stream work. The steps
// are transport/graph_steps.h's; libcuda.so.1 decides which of a graph's
// nodes become steps (src/guest/cuda/graph.cc).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "guest/memory.h"
#include "guest/pinned_heap.h"
#include "guest/ring_producer.h"
#include "guest/streams.h"
#include "guest/threads.h"

namespace ordo::guest {

class Graphs {
 public:
  Graphs(Threads& threads, Streams& streams, RingProducer& producer, Memory& memory, PinnedHeap& heap)
      : threads_(threads), streams_(streams), producer_(producer), memory_(memory), heap_(heap) {}

  Status create(const void* steps, uint64_t size, uint32_t* graph);
  Status launch(uint32_t graph, Stream s);
  // Answered at once; the worker frees the graph once every launch issued
  // before was dispatched.
  Status destroy(uint32_t graph);
  Status cond_handle(uint32_t device, uint64_t* handle);

 private:
  Threads& threads_;
  Streams& streams_;
  RingProducer& producer_;
  Memory& memory_;
  PinnedHeap& heap_;
  std::mutex mu_;
  std::map<uint32_t, uint64_t> launches_;  // live graphs: the GraphLaunch entries pushed
};

}  // namespace ordo::guest

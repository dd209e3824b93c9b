// The units one Client is made of, wired in construction order: each takes
// the units it uses, which come before it. Client (include/ordo/client.h) is
// the facade over them; libordo_guest's own code and its tests reach them
// through core_of().
#pragma once

#include <cstdint>
#include <memory>

#include "guest/copies.h"
#include "guest/devices.h"
#include "guest/edges.h"
#include "guest/events.h"
#include "guest/graphs.h"
#include "guest/host_functions.h"
#include "guest/kernels.h"
#include "guest/memory.h"
#include "guest/pinned_heap.h"
#include "guest/ring_producer.h"
#include "guest/session.h"
#include "guest/staging.h"
#include "guest/streams.h"
#include "guest/threads.h"
#include "guest/waits.h"
#include "ordo/client.h"

namespace ordo::guest {

struct Core {
  // `region`: a part Session::claim() returned for `session`.
  Core(std::unique_ptr<Region> region, ClientOptions options, uint64_t session);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  Session session;
  Threads threads;
  Edges edges;
  RingProducer producer;
  PinnedHeap heap;
  StagingPool pool;
  Staging staging;
  Waits waits;
  Streams streams;
  Events events;
  Devices devices;
  Memory memory;
  Copies copies;
  Kernels kernels;
  Graphs graphs;
  HostFunctions host_functions;
};

}  // namespace ordo::guest

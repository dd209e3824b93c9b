// A generator of random multi-threaded CUDA-style programs over the whole
// stream/event API, checked against CUDA's documented ordering guarantees.
#pragma once

#include <cstdint>

#include "scenarios.h"

namespace ordo::scenario {

struct GenProgram {
  int threads = 6;        // may exceed the region's reply slots
  int phases = 6;         // barrier-separated: earlier phases happen before later ones
  int ops_per_phase = 12;
  // Streams per thread, alive at once; beyond the region's rings they share
  // rings (ARCHITECTURE.md, "Streams and rings").
  int private_streams = 2;
  bool per_thread = true;   // the thread's per-thread stream, and children with their own
  // Devices the program spreads its streams, events and memory over (at most
  // the worker's): threads switch devices, wait on other devices' events and
  // copy between devices.
  int devices = 1;
};

ModelResult run_generated(Client& c, uint64_t seed, Problems& p, const GenProgram& prog = {});

}  // namespace ordo::scenario

// The ordering scenarios and the randomized model check, written against a
// Client only, so that the same code runs in gtest (guest and worker processes
// on this host) and inside a QEMU guest over ivshmem (tests/vm).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ordo/client.h"

namespace ordo::scenario {

// Collects call failures from any thread; a scenario with failures proves nothing.
class Problems {
 public:
  void add(std::string what) {
    std::lock_guard lock(mu_);
    if (list_.size() < 20) list_.push_back(std::move(what));
    ++count_;
  }
  bool empty() const { return count_ == 0; }
  size_t count() const { return count_; }
  std::string first() const { return list_.empty() ? "" : list_.front(); }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> list_;
  size_t count_ = 0;
};

// Each returns how many of `iterations` runs violated the order a native CUDA
// program is guaranteed (0 when ordo works).
int seed_violations(Client& c, int iterations, Problems& p);
int legacy_violations(Client& c, int iterations, bool legacy_first, Problems& p);
int rerecord_violations(Client& c, int iterations, Problems& p);

struct ModelResult {
  size_t stamps = 0;      // kernels checked
  size_t violations = 0;  // ordered pairs that broke a rule
  size_t host_functions = 0;  // host functions and host-to-host copies checked (generator)
  size_t peer_copies = 0;     // copies to another device's memory checked (generator)
  std::string first;      // the first broken rule, for the log
};
struct ModelProgram {
  int threads = 4, phases = 24, ops_per_phase = 4, events = 4;
};
ModelResult run_model(Client& c, uint64_t seed, Problems& p, const ModelProgram& prog = {});

}  // namespace ordo::scenario

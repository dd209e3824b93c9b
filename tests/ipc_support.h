// What the IPC suites share (test_ipc_table.cc, test_ipc_memory.cc,
// test_ipc_events.cc): a fresh table, exports whose words say which they are,
// and two guest sessions of one region (Pair), each a worker of its own
// sharing one table as the supervisor's parts do.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"
#include "worker/backends/sim/sim_backend.h"
#include "worker/ipc_table.h"

namespace ordo::test {

inline constexpr uint32_t kIpcEventFlags = uint32_t(kEventInterprocess | kEventDisableTiming);

inline std::unique_ptr<IpcTable> new_table() {
  std::string err;
  auto t = IpcTable::create(&err);
  EXPECT_NE(t, nullptr) << err;
  return t;
}

// An export whose every word says which it is: a reader that mixes two
// exports (a torn read) sees words that disagree with its size.
inline IpcExport stamped(uint64_t n, uint32_t partition, IpcKind kind = IpcKind::kMemory) {
  IpcExport x{.kind = kind, .device = uint32_t(n % 7), .partition = partition, .size = n};
  for (size_t k = 0; k < std::size(x.blob.words); ++k) x.blob.words[k] = n * 0x9e3779b97f4a7c15ull + k;
  return x;
}

inline bool consistent(const IpcExport& x) {
  for (size_t k = 0; k < std::size(x.blob.words); ++k)
    if (x.blob.words[k] != x.size * 0x9e3779b97f4a7c15ull + k) return false;
  return x.device == uint32_t(x.size % 7);
}

inline bool same(const IpcExport& a, const IpcExport& b) {
  return a.kind == b.kind && a.device == b.device && a.partition == b.partition && a.size == b.size &&
         std::memcmp(&a.blob, &b.blob, sizeof a.blob) == 0;
}

inline IpcToken with_generation(IpcToken t, uint64_t g) { return {g << 32 | (t.word & 0xffffffffu), t.secret}; }
inline uint64_t generation(const IpcToken& t) { return t.word >> 32; }
inline uint64_t cell(const IpcToken& t) { return t.word & 0xffffffffu; }

// Two guest sessions of one region: partitions 0 (A) and 1 (B), each served
// by a worker of its own, sharing one table. `o`: both workers' options.
struct Pair {
  explicit Pair(WorkerOptions o = {}, ClientOptions co = {}, uint32_t devices = 1, uint32_t sessions = 2) {
    table = new_table();
    if (!table) throw std::runtime_error("no IPC table");
    for (uint32_t p = 0; p < sessions; ++p) {
      WorkerOptions wo = o;
      wo.ipc = table.get();
      wo.partition = p;
      workers.push_back(std::make_unique<InProcessWorker>(wo, 16u << 20, sim::make_sim_backend(devices)));
      clients.push_back(workers.back()->attach(co));
    }
  }
  Client& a() { return *clients[0]; }
  Client& b() { return *clients[1]; }
  std::unique_ptr<IpcTable> table;
  std::vector<std::unique_ptr<InProcessWorker>> workers;
  std::vector<std::unique_ptr<Client>> clients;
};

inline std::vector<uint32_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), seed);
  return v;
}

inline std::vector<uint32_t> read_back(Client& c, uint64_t addr, size_t n) {
  std::vector<uint32_t> v(n, 0xdeadbeef);
  EXPECT_EQ(c.memcpy_d2h(v.data(), addr, n * 4), Status::kSuccess);
  return v;
}

// Copies from and into `addr`, which the session must refuse: a synchronous one,
// and stream work whose error comes back by the next synchronizing call at the
// latest; neither is a fault.
inline void expect_refused(Client& c, uint64_t addr, const char* what) {
  uint32_t v = 0;
  EXPECT_EQ(c.memcpy_d2h(&v, addr, 4), Status::kInvalidDevicePointer) << what;
  EXPECT_EQ(c.get_last_error(), Status::kInvalidDevicePointer) << what;
  const Status issued = c.memcpy_h2d_async(addr, &v, 4, kLegacyStream);
  ASSERT_TRUE(issued == Status::kSuccess || issued == Status::kInvalidDevicePointer) << what << ": " << status_name(issued);
  if (issued == Status::kSuccess) {
    EXPECT_EQ(c.stream_synchronize(kLegacyStream), Status::kInvalidDevicePointer) << what;
    EXPECT_EQ(c.get_last_error(), Status::kInvalidDevicePointer) << what;
  } else {
    EXPECT_EQ(c.get_last_error(), Status::kInvalidDevicePointer) << what;
  }
  EXPECT_EQ(c.device_synchronize(), Status::kSuccess) << what << ": not a fault";
}

}  // namespace ordo::test

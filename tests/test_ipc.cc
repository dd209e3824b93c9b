// Interprocess memory and events (cudaIpc*): the region's table of exports
// (IpcTable) on its own, then two guest sessions of one region, each a worker
// of its own sharing one table as the supervisor's parts do (WorkerOptions::ipc,
// ::partition). Both workers run in this process on the sim, whose exports
// are memfds the other worker opens through /proc/PID/fd; one test runs them
// as the supervisor's worker processes. The CUDA programs' view of the same
// (two processes through libcuda.so.1, --chaos, --unordered): tests/cuda/ipc.cu.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "guest/core.h"
#include "harness.h"
#include "ordo/sim.h"
#include "transport/op_args.h"
#include "worker/backends/null/null_backend.h"
#include "worker/backends/sim/sim_backend.h"
#include "worker/ipc_table.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kIpcEventFlags = uint32_t(kEventInterprocess | kEventDisableTiming);

std::unique_ptr<IpcTable> new_table() {
  std::string err;
  auto t = IpcTable::create(&err);
  EXPECT_NE(t, nullptr) << err;
  return t;
}

// An export whose every word says which it is: a reader that mixes two
// exports (a torn read) sees words that disagree with its size.
IpcExport stamped(uint64_t n, uint32_t partition, IpcKind kind = IpcKind::kMemory) {
  IpcExport x{.kind = kind, .device = uint32_t(n % 7), .partition = partition, .size = n};
  for (size_t k = 0; k < std::size(x.blob.words); ++k) x.blob.words[k] = n * 0x9e3779b97f4a7c15ull + k;
  return x;
}

bool consistent(const IpcExport& x) {
  for (size_t k = 0; k < std::size(x.blob.words); ++k)
    if (x.blob.words[k] != x.size * 0x9e3779b97f4a7c15ull + k) return false;
  return x.device == uint32_t(x.size % 7);
}

bool same(const IpcExport& a, const IpcExport& b) {
  return a.kind == b.kind && a.device == b.device && a.partition == b.partition && a.size == b.size &&
         std::memcmp(&a.blob, &b.blob, sizeof a.blob) == 0;
}

IpcToken with_generation(IpcToken t, uint64_t g) { return {g << 32 | (t.word & 0xffffffffu), t.secret}; }
uint64_t generation(const IpcToken& t) { return t.word >> 32; }
uint64_t cell(const IpcToken& t) { return t.word & 0xffffffffu; }

TEST(IpcTable, PublishedExportsAreFoundOnlyByTheirWholeToken) {
  auto table = new_table();
  ASSERT_TRUE(table);
  const IpcExport x = stamped(12345, 3, IpcKind::kEvent);
  IpcToken t;
  ASSERT_EQ(table->publish(x, &t), Status::kSuccess);
  EXPECT_NE(t.secret, 0u);
  EXPECT_EQ(generation(t) % 2, 0u) << "a token names a settled (even) generation";
  EXPECT_LT(cell(t), IpcTable::kCells);
  IpcExport got;
  ASSERT_EQ(table->find(t, &got), Status::kSuccess);
  EXPECT_TRUE(same(got, x));

  IpcExport untouched = stamped(1, 1);
  const IpcExport before = untouched;
  auto refused = [&](IpcToken bad, const char* what) {
    EXPECT_EQ(table->find(bad, &untouched), Status::kInvalidResourceHandle) << what;
    EXPECT_TRUE(same(untouched, before)) << what << ": a refused find writes nothing";
  };
  refused({t.word, t.secret ^ 1}, "a secret one bit off");
  refused({t.word, 0}, "secret 0");
  refused({t.word, t.secret + 0x100000000ull}, "another secret");
  refused(with_generation(t, generation(t) + 2), "a later generation");
  refused(with_generation(t, generation(t) - 2), "an earlier generation");
  refused(with_generation(t, generation(t) + 1), "an odd generation (a cell being written)");
  refused(with_generation(t, generation(t) - 1), "the odd generation before");
  refused({generation(t) << 32 | IpcTable::kCells, t.secret}, "cell kCells");
  refused({generation(t) << 32 | 0xffffffffu, t.secret}, "cell 2^32-1");
  refused({generation(t) << 32 | ((cell(t) + 1) % IpcTable::kCells), t.secret}, "the next cell");
  refused({0, 0}, "the zero token");

  // Only the exporting partition takes it back.
  table->revoke(t, 2);
  table->revoke(t, 4);
  ASSERT_EQ(table->find(t, &got), Status::kSuccess) << "revoked by a partition that did not export it";
  table->revoke(with_generation(t, generation(t) + 2), 3);
  ASSERT_EQ(table->find(t, &got), Status::kSuccess) << "revoked through another generation's token";
  table->revoke({t.word | 0xffffffffu, t.secret}, 3);  // a cell past the table: nothing
  table->revoke(t, 3);
  refused(t, "after its revoke");

  // The cell filled again: the old token stays dead, the new one differs.
  std::vector<IpcToken> again;
  IpcToken t2;
  bool reused = false;
  for (int i = 0; i < 4 && !reused; ++i) {
    ASSERT_EQ(table->publish(stamped(777 + i, 3), &t2), Status::kSuccess);
    reused = cell(t2) == cell(t);
  }
  ASSERT_TRUE(reused) << "a free cell is used again";
  EXPECT_NE(generation(t2), generation(t));
  refused(t, "the old token of a refilled cell");
  refused({t2.word, t.secret}, "the old secret with the new generation");
  ASSERT_EQ(table->find(t2, &got), Status::kSuccess);
}

TEST(IpcTable, RevokeAllTakesOnlyThatPartitionsExports) {
  auto table = new_table();
  ASSERT_TRUE(table);
  std::vector<IpcToken> tokens;
  for (uint32_t i = 0; i < 30; ++i) {
    IpcToken t;
    ASSERT_EQ(table->publish(stamped(100 + i, i % 3), &t), Status::kSuccess);
    tokens.push_back(t);
  }
  table->revoke_all(1);
  for (uint32_t i = 0; i < 30; ++i) {
    IpcExport got;
    const Status s = table->find(tokens[i], &got);
    if (i % 3 == 1) {
      EXPECT_EQ(s, Status::kInvalidResourceHandle) << i;
    } else {
      ASSERT_EQ(s, Status::kSuccess) << i;
      EXPECT_TRUE(same(got, stamped(100 + i, i % 3))) << i;
    }
  }
  table->revoke_all(7);  // a partition with no exports
  for (uint32_t i = 0; i < 30; ++i) {
    IpcExport got;
    EXPECT_EQ(table->find(tokens[i], &got), i % 3 == 1 ? Status::kInvalidResourceHandle : Status::kSuccess) << i;
  }
}

TEST(IpcTable, AFullTableRefusesUntilACellIsFree) {
  auto table = new_table();
  ASSERT_TRUE(table);
  std::vector<IpcToken> tokens(IpcTable::kCells);
  std::set<uint64_t> cells;
  for (uint32_t i = 0; i < IpcTable::kCells; ++i) {
    ASSERT_EQ(table->publish(stamped(i + 1, 0), &tokens[i]), Status::kSuccess) << i;
    cells.insert(cell(tokens[i]));
  }
  EXPECT_EQ(cells.size(), size_t(IpcTable::kCells)) << "every cell once";
  IpcToken extra;
  EXPECT_EQ(table->publish(stamped(99999, 1), &extra), Status::kMemoryAllocation);
  EXPECT_EQ(table->publish(stamped(99999, 0), &extra), Status::kMemoryAllocation);
  table->revoke(tokens[1234], 1);  // not its exporter: still full
  EXPECT_EQ(table->publish(stamped(99999, 1), &extra), Status::kMemoryAllocation);
  table->revoke(tokens[1234], 0);
  ASSERT_EQ(table->publish(stamped(99999, 1), &extra), Status::kSuccess);
  EXPECT_EQ(cell(extra), cell(tokens[1234]));
  IpcExport got;
  ASSERT_EQ(table->find(extra, &got), Status::kSuccess);
  EXPECT_TRUE(same(got, stamped(99999, 1)));
  EXPECT_EQ(table->find(tokens[1234], &got), Status::kInvalidResourceHandle);
  for (uint32_t i : {0u, 1233u, 1235u, IpcTable::kCells - 1}) {
    ASSERT_EQ(table->find(tokens[i], &got), Status::kSuccess) << i;
    EXPECT_TRUE(same(got, stamped(i + 1, 0))) << i;
  }
  table->revoke_all(0);
  for (uint32_t i = 0; i < IpcTable::kCells; i += 97) EXPECT_EQ(table->find(tokens[i], &got), Status::kInvalidResourceHandle);
  ASSERT_EQ(table->find(extra, &got), Status::kSuccess) << "partition 1's export stays";
}

// Writers of three partitions publish and revoke in a few cells while readers
// look up tokens, live and revoked: a reader finds exactly what was published
// under a token, or nothing; never another export's words, nor a mix.
TEST(IpcTable, ConcurrentReadersNeverSeeATornOrForeignExport) {
  auto table = new_table();
  ASSERT_TRUE(table);
  constexpr int kWriters = 3, kReaders = 3, kSlots = 8;
  struct Published {
    std::mutex mu;
    IpcToken token;
    uint64_t n = 0;  // 0: none yet
  };
  std::vector<Published> slots(kWriters * kSlots);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> finds{0}, found{0}, wrong{0}, writer_errors{0};
  std::vector<std::thread> ts;
  for (int w = 0; w < kWriters; ++w) {
    ts.emplace_back([&, w] {
      uint64_t n = uint64_t(w + 1) << 40;
      std::vector<IpcToken> mine(kSlots);
      for (uint64_t round = 0; !stop.load(std::memory_order_relaxed); ++round) {
        const int k = int(round % kSlots);
        if (round >= kSlots) table->revoke(mine[k], uint32_t(w));  // the slot's previous export
        IpcToken t;
        const IpcExport x = stamped(++n, uint32_t(w));
        if (table->publish(x, &t) != Status::kSuccess) {
          ++writer_errors;
          continue;
        }
        mine[k] = t;
        Published& p = slots[w * kSlots + k];
        std::lock_guard lock(p.mu);
        p.token = t;
        p.n = n;
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    ts.emplace_back([&, r] {
      std::mt19937_64 rng(r);
      std::vector<std::pair<IpcToken, uint64_t>> seen;  // older tokens, mostly revoked by now
      while (!stop.load(std::memory_order_relaxed)) {
        Published& p = slots[rng() % slots.size()];
        IpcToken t;
        uint64_t n;
        {
          std::lock_guard lock(p.mu);
          t = p.token;
          n = p.n;
        }
        if (!n) continue;
        if (seen.size() < 4096) seen.push_back({t, n});
        for (auto [tok, want] : {std::pair{t, n}, seen[rng() % seen.size()]}) {
          IpcExport got;
          ++finds;
          if (table->find(tok, &got) != Status::kSuccess) continue;
          ++found;
          if (got.size != want || !consistent(got) || got.kind != IpcKind::kMemory ||
              got.partition != uint32_t(want >> 40) - 1)
            ++wrong;
        }
      }
    });
  }
  std::this_thread::sleep_for(300ms);
  stop = true;
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0u) << "of " << found.load() << " found in " << finds.load() << " finds";
  EXPECT_EQ(writer_errors.load(), 0u) << "24 live exports fit the table";
  EXPECT_GT(found.load(), 100u) << "the readers found live exports";
  EXPECT_LT(found.load(), finds.load()) << "and missed revoked ones";
}

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

std::vector<uint32_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), seed);
  return v;
}

std::vector<uint32_t> read_back(Client& c, uint64_t addr, size_t n) {
  std::vector<uint32_t> v(n, 0xdeadbeef);
  EXPECT_EQ(c.memcpy_d2h(v.data(), addr, n * 4), Status::kSuccess);
  return v;
}

// Copies from and into `addr`, which the session must refuse: a synchronous one,
// and stream work whose error comes back by the next synchronizing call at the
// latest; neither is a fault.
void expect_refused(Client& c, uint64_t addr, const char* what) {
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

TEST(IpcMemory, WithoutATableEveryCallIsNotSupported) {
  InProcessWorker w;  // no WorkerOptions::ipc
  auto c = w.attach();
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 4096), Status::kSuccess);
  Client::IpcToken t;
  EXPECT_EQ(c->ipc_export_mem(d, &t), Status::kNotSupported);
  uint64_t addr = 0, size = 0;
  uint32_t dev = 0;
  EXPECT_EQ(c->ipc_open_mem({1ull << 33 | 5, 42}, &addr, &size, &dev), Status::kNotSupported);
  Event e;
  ASSERT_EQ(c->event_create(&e, kIpcEventFlags), Status::kSuccess);
  EXPECT_EQ(c->ipc_export_event(e, &t), Status::kNotSupported);
  EXPECT_EQ(c->ipc_open_event({1ull << 33 | 5, 42}, &e), Status::kNotSupported);
  EXPECT_EQ(c->null_call(), Status::kSuccess);
}

TEST(IpcMemory, TheOtherSessionReadsAndWritesTheExportersBytes) {
  Pair p;
  constexpr size_t kN = 16384;  // 64 KiB
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, kN * 4), Status::kSuccess);
  const auto in = pattern(kN, 7);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), kN * 4), Status::kSuccess);
  Client::IpcToken t, inner;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  // The whole allocation, whichever address of it was named: the same token.
  ASSERT_EQ(p.a().ipc_export_mem(x + 4 * 1000 + 3, &inner), Status::kSuccess);
  EXPECT_EQ(inner.word, t.word);
  EXPECT_EQ(inner.secret, t.secret);
  // The exporter's own memory goes on as before.
  EXPECT_EQ(read_back(p.a(), x, kN), in);

  uint64_t y = 0, size = 0;
  uint32_t dev = 99;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(size, kN * 4);
  EXPECT_EQ(dev, 0u);
  EXPECT_EQ(read_back(p.b(), y, kN), in) << "B reads A's bytes";

  // B writes (a copy and a kernel): A sees it.
  const auto mine = pattern(1024, 1u << 20);
  ASSERT_EQ(p.b().memcpy_h2d(y + 8192, mine.data(), mine.size() * 4), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x + 8192, mine.size()), mine);
  Stream s;
  ASSERT_EQ(p.b().stream_create(&s), Status::kSuccess);
  const sim::FillU32Args fill{y + 4 * 100, 50, 0xabcdu, 0};
  ASSERT_EQ(p.b().launch(kernel(p.b(), "ordo_fill_u32"), {1}, {1}, &fill, sizeof fill, s), Status::kSuccess);
  ASSERT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x + 4 * 100, 50), std::vector<uint32_t>(50, 0xabcdu));
  EXPECT_EQ(read_back(p.a(), x + 4 * 150, 1), std::vector<uint32_t>{in[150]}) << "the fill's end";
  // A device-to-device copy inside B's session, from its own memory into A's.
  uint64_t own = 0;
  ASSERT_EQ(p.b().malloc(&own, 64), Status::kSuccess);
  ASSERT_EQ(p.b().memset_async(own, 0x5a, 64, s), Status::kSuccess);
  ASSERT_EQ(p.b().memcpy_d2d_async(y, own, 64, s), Status::kSuccess);
  ASSERT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x, 16), std::vector<uint32_t>(16, 0x5a5a5a5au));
  // A range past the allocation is no more B's than A's.
  uint32_t v = 0;
  EXPECT_EQ(p.b().memcpy_d2h(&v, y + kN * 4 - 2, 4), Status::kInvalidDevicePointer);
  EXPECT_EQ(p.b().get_last_error(), Status::kInvalidDevicePointer);
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
  EXPECT_EQ(p.b().stream_destroy(s), Status::kSuccess);
}

TEST(IpcMemory, OpensAreCountedUntilAsManyClosesThenTheAddressIsRefused) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 3);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y1 = 0, y2 = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y1, &size, &dev), Status::kSuccess);
  ASSERT_EQ(p.b().ipc_open_mem(t, &y2, &size, &dev), Status::kSuccess);
  EXPECT_EQ(y1, y2) << "opened twice: the same address";
  EXPECT_EQ(size, 4096u);
  EXPECT_EQ(p.b().ipc_close_mem(y1), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y1, 1024), in) << "one close of two: still open";
  EXPECT_EQ(p.b().ipc_close_mem(y1), Status::kSuccess);
  expect_refused(p.b(), y1, "after the last close");
  expect_refused(p.b(), y1 + 2048, "inside it, after the last close");
  EXPECT_EQ(p.b().ipc_close_mem(y1), Status::kInvalidValue) << "a third close";
  EXPECT_EQ(p.b().get_last_error(), Status::kInvalidValue);
  // Opened again: A's bytes (which A changed meanwhile), once more counted from one.
  const auto later = pattern(1024, 1000);
  ASSERT_EQ(p.a().memcpy_h2d(x, later.data(), 4096), Status::kSuccess);
  uint64_t y3 = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y3, &size, &dev), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y3, 1024), later);
  EXPECT_EQ(p.b().ipc_close_mem(y3), Status::kSuccess);
  expect_refused(p.b(), y3, "reopened and closed once");
  // A's own memory is untouched by all of B's closes.
  EXPECT_EQ(read_back(p.a(), x, 1024), later);
  EXPECT_EQ(p.a().free(x), Status::kSuccess);
}

TEST(IpcMemory, TheExporterCannotOpenItsOwnExports) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(p.a().ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(p.a().ipc_export_event(e, &te), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  EXPECT_EQ(p.a().ipc_open_mem(tm, &y, &size, &dev), Status::kInvalidContext);
  Event opened;
  EXPECT_EQ(p.a().ipc_open_event(te, &opened), Status::kInvalidContext);
  // The other session can.
  EXPECT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(p.b().ipc_open_event(te, &opened), Status::kSuccess);
  // And B's opens are not A's to close.
  EXPECT_EQ(p.a().ipc_close_mem(y), Status::kInvalidValue);
  EXPECT_EQ(p.a().ipc_close_mem(x), Status::kInvalidValue) << "an allocation is not an opened export";
  EXPECT_EQ(p.b().free(y), Status::kInvalidDevicePointer) << "an opened export is not B's allocation";
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
}

TEST(IpcMemory, AFreedAllocationCannotBeOpenedButWhatWasOpenedStays) {
  Pair p(WorkerOptions{}, ClientOptions{}, 1, 3);  // C: a third session, which never opened it
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 8192), Status::kSuccess);
  const auto in = pattern(2048, 11);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 8192), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  IpcExport in_table;
  ASSERT_EQ(p.table->find(IpcToken{t.word, t.secret}, &in_table), Status::kSuccess);
  EXPECT_EQ(in_table.partition, 0u);
  EXPECT_EQ(in_table.size, 8192u);
  ASSERT_EQ(p.a().free(x), Status::kSuccess);
  EXPECT_EQ(p.table->find(IpcToken{t.word, t.secret}, &in_table), Status::kInvalidResourceHandle)
      << "the free took the export out of the region's table";
  uint64_t z = 0;
  EXPECT_EQ(p.clients[2]->ipc_open_mem(t, &z, &size, &dev), Status::kInvalidResourceHandle) << "freed: not opened again";
  EXPECT_EQ(read_back(p.b(), y, 2048), in) << "a mapping opened before stays";
  const auto mine = pattern(2048, 99);
  EXPECT_EQ(p.b().memcpy_h2d(y, mine.data(), 8192), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y, 2048), mine);
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
  EXPECT_EQ(p.b().ipc_open_mem(t, &z, &size, &dev), Status::kInvalidResourceHandle) << "closed, then freed: gone";
  // A's next allocation and export are new.
  uint64_t x2 = 0;
  ASSERT_EQ(p.a().malloc(&x2, 8192), Status::kSuccess);
  Client::IpcToken t2;
  ASSERT_EQ(p.a().ipc_export_mem(x2, &t2), Status::kSuccess);
  EXPECT_FALSE(t2.word == t.word && t2.secret == t.secret);
  ASSERT_EQ(p.b().ipc_open_mem(t2, &z, &size, &dev), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), z, 4), std::vector<uint32_t>(4, 0)) << "the sim's fresh memory";
  EXPECT_EQ(p.b().ipc_open_mem(t, &z, &size, &dev), Status::kInvalidResourceHandle);
}

TEST(IpcMemory, AnEndedSessionsExportsAndOpensAreGone) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 5);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(p.a().ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(p.a().ipc_export_event(e, &te), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  // A's process goes; its worker's next session (attach waits for the reset) exports nothing.
  IpcExport in_table;
  ASSERT_EQ(p.table->find(IpcToken{tm.word, tm.secret}, &in_table), Status::kSuccess);
  ASSERT_EQ(p.table->find(IpcToken{te.word, te.secret}, &in_table), Status::kSuccess);
  p.clients[0].reset();
  p.clients[0] = p.workers[0]->attach();
  EXPECT_EQ(p.table->find(IpcToken{tm.word, tm.secret}, &in_table), Status::kInvalidResourceHandle)
      << "the session's end took its memory export out of the region's table";
  EXPECT_EQ(p.table->find(IpcToken{te.word, te.secret}, &in_table), Status::kInvalidResourceHandle)
      << "and its event export";
  Event opened;
  EXPECT_EQ(p.b().ipc_open_event(te, &opened), Status::kInvalidResourceHandle);
  EXPECT_EQ(read_back(p.b(), y, 1024), in) << "what B opened stays";
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
  EXPECT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kInvalidResourceHandle);
  // Nor does A's new session reach them.
  EXPECT_EQ(p.a().ipc_close_mem(y), Status::kInvalidValue);
  uint32_t v = 0;
  EXPECT_EQ(p.a().memcpy_d2h(&v, x, 4), Status::kInvalidDevicePointer);
}

// B's session ends with an export open: its next session neither reaches the
// address nor inherits the count (one open, one close, refused).
TEST(IpcMemory, AnEndedSessionsOpensAreClosed) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 21);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  p.clients[1].reset();
  p.clients[1] = p.workers[1]->attach();
  uint32_t v = 0;
  EXPECT_EQ(p.b().memcpy_d2h(&v, y, 4), Status::kInvalidDevicePointer) << "the last session's open";
  EXPECT_EQ(p.b().get_last_error(), Status::kInvalidDevicePointer);
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kInvalidValue);
  uint64_t y2 = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y2, &size, &dev), Status::kSuccess) << "A's export lives on";
  EXPECT_EQ(read_back(p.b(), y2, 1024), in);
  EXPECT_EQ(p.b().ipc_close_mem(y2), Status::kSuccess);
  expect_refused(p.b(), y2, "one open, one close");
  EXPECT_EQ(read_back(p.a(), x, 1024), in) << "A's memory was never B's to free";
}

// A guest that writes its own requests: forged tokens, the wrong kind, addresses
// and devices it does not have. Each gets CUDA's error and the session goes on.
TEST(IpcMemory, ForgedRequestsGetErrorsAndTheSessionGoesOn) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 8);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(p.a().ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(p.a().ipc_export_event(e, &te), Status::kSuccess);
  auto& bt = guest::core_of(p.b()).threads;
  auto& at = guest::core_of(p.a()).threads;
  auto open_mem = [&](uint64_t word, uint64_t secret, uint64_t device = 0) {
    uint64_t r0 = 0, r1 = 0;
    return bt.call(make_entry<Op::IpcOpenMem>({.token = word, .secret = secret, .device = device}), &r0, &r1);
  };
  auto open_event = [&](uint64_t word, uint64_t secret) {
    uint64_t r0 = 0, r1 = 0;
    return bt.call(make_entry<Op::IpcOpenEvent>({.token = word, .secret = secret}), &r0, &r1);
  };
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20; ++i) {
    const uint64_t secret = rng() | 1;
    if (secret == tm.secret || secret == te.secret) continue;
    EXPECT_EQ(open_mem(tm.word, secret), Status::kInvalidResourceHandle) << "a random secret";
    EXPECT_EQ(open_event(te.word, secret), Status::kInvalidResourceHandle) << "a random secret";
    EXPECT_EQ(open_mem(rng(), rng()), Status::kInvalidResourceHandle) << "a random token";
  }
  EXPECT_EQ(open_mem(te.word, te.secret), Status::kInvalidResourceHandle) << "an event's token as memory";
  EXPECT_EQ(open_event(tm.word, tm.secret), Status::kInvalidResourceHandle) << "memory's token as an event";
  EXPECT_EQ(open_mem(tm.word + (uint64_t{2} << 32), tm.secret), Status::kInvalidResourceHandle) << "a later generation";
  EXPECT_EQ(open_mem(tm.word + (uint64_t{1} << 32), tm.secret), Status::kInvalidResourceHandle) << "an odd generation";
  EXPECT_EQ(open_mem((tm.word >> 32 << 32) | IpcTable::kCells, tm.secret), Status::kInvalidResourceHandle)
      << "a cell past the table";
  EXPECT_EQ(open_mem(tm.word, tm.secret, 1), Status::kInvalidDevice) << "device 1 of 1";
  EXPECT_EQ(open_mem(tm.word, tm.secret, kMaxDevices), Status::kInvalidDevice);
  EXPECT_EQ(open_mem(tm.word, tm.secret, UINT64_MAX), Status::kInvalidDevice);
  uint64_t r0 = 0, r1 = 0;
  EXPECT_EQ(bt.call(make_entry<Op::IpcCloseMem>({.addr = x}), &r0, &r1), Status::kInvalidValue)
      << "A's address, never opened in B";
  EXPECT_EQ(bt.call(make_entry<Op::IpcCloseMem>({.addr = 0}), &r0, &r1), Status::kInvalidValue);
  EXPECT_EQ(bt.call(make_entry<Op::IpcCloseMem>({.addr = UINT64_MAX}), &r0, &r1), Status::kInvalidValue);
  // Exports of what the session does not hold.
  for (uint64_t addr : {uint64_t{0}, x + 4096, x - 1, UINT64_MAX}) {
    EXPECT_EQ(at.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kMemory), .handle = addr}), &r0, &r1),
              Status::kInvalidValue)
        << "an export of " << addr << ", in no allocation";
  }
  EXPECT_EQ(bt.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kMemory), .handle = x}), &r0, &r1),
            Status::kInvalidValue)
      << "A's allocation exported by B";
  EXPECT_NE(bt.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kEvent), .handle = e.handle}), &r0, &r1),
            Status::kSuccess)
      << "A's event exported by B";
  EXPECT_EQ(at.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kEvent), .handle = e.handle + 12345}), &r0,
                    &r1),
            Status::kInvalidResourceHandle)
      << "an event never made";
  for (uint64_t kind : {uint64_t{7}, uint64_t{1} << 32, UINT64_MAX})
    EXPECT_EQ(at.call(make_entry<Op::IpcExport>({.kind = kind, .handle = x}), &r0, &r1), Status::kInvalidValue)
        << "kind " << kind;
  // Both sessions serve on: the real tokens open, the bytes are A's.
  EXPECT_EQ(p.b().null_call(), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y, 1024), in);
  Event opened;
  EXPECT_EQ(p.b().ipc_open_event(te, &opened), Status::kSuccess);
  Client::IpcToken again;
  ASSERT_EQ(p.a().ipc_export_mem(x, &again), Status::kSuccess);
  EXPECT_EQ(again.word, tm.word);
  EXPECT_EQ(p.a().sticky_error(), Status::kSuccess);
  EXPECT_EQ(p.b().sticky_error(), Status::kSuccess);
}

// Memory of device 0 opened on device 1: the import is device 0's, and a
// kernel of device 1 reaches it (the lazy peer access CUDA's flag enables).
TEST(IpcMemory, AnotherDevicesMemoryIsReachedThroughPeerAccess) {
  Pair p(WorkerOptions{}, ClientOptions{}, 2);
  ASSERT_EQ(p.b().device_count(), 2u);
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);  // device 0
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  ASSERT_EQ(p.b().set_device(1), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 9;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(dev, 0u) << "the exporter's device";
  Stream s;
  ASSERT_EQ(p.b().stream_create(&s), Status::kSuccess);  // on device 1
  const sim::FillU32Args fill{y, 1024, 0x77u, 0};
  ASSERT_EQ(p.b().launch(kernel(p.b(), "ordo_fill_u32"), {1}, {1}, &fill, sizeof fill, s), Status::kSuccess);
  ASSERT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(p.b().sticky_error(), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x, 1024), std::vector<uint32_t>(1024, 0x77u));
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
}

// A backend that would export, open and create anything: what it is asked
// shows the rules the worker keeps itself (the cuda backend's driver calls
// come after them), and the words the table gives it.
class PermissiveIpc final : public NullBackend {
 public:
  bool supports_ipc() const override { return true; }
  Status event_create(uint32_t, uint32_t, uint32_t flags) override {
    std::lock_guard lock(mu);
    created_flags.push_back(flags);
    return Status::kSuccess;
  }
  Status ipc_export_mem(uint64_t addr, IpcBlob* out, uint32_t* device) override {
    std::lock_guard lock(mu);
    exported_addrs.push_back(addr);
    *out = IpcBlob{};
    out->words[0] = addr;
    *device = 0;
    return Status::kSuccess;
  }
  Status ipc_export_event(uint32_t, IpcBlob* out) override {
    std::lock_guard lock(mu);
    ++exported_events;
    *out = IpcBlob{};
    return Status::kSuccess;
  }
  Status ipc_open_mem(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* addr) override {
    std::lock_guard lock(mu);
    opened.push_back({blob.words[0], device, size});
    *addr = 0x9000'0000'0000ull + 0x100000 * opened.size();
    return Status::kSuccess;
  }
  Status ipc_close_mem(uint64_t addr) override {
    std::lock_guard lock(mu);
    closed.push_back(addr);
    return Status::kSuccess;
  }
  Status ipc_open_event(uint32_t, uint32_t device, const IpcBlob&) override {
    std::lock_guard lock(mu);
    opened_event_devices.push_back(device);
    return Status::kSuccess;
  }
  struct Open {
    uint64_t blob0;
    uint32_t device;
    uint64_t size;
  };
  std::mutex mu;
  std::vector<uint32_t> created_flags;
  std::vector<uint64_t> exported_addrs;
  int exported_events = 0;
  std::vector<Open> opened;
  std::vector<uint64_t> closed;
  std::vector<uint32_t> opened_event_devices;
};

TEST(IpcWorker, TheWorkerKeepsCudasRulesBeforeTheBackendIsAsked) {
  auto table = new_table();
  ASSERT_TRUE(table);
  auto backend = std::make_unique<PermissiveIpc>();
  PermissiveIpc& be = *backend;
  InProcessWorker w(WorkerOptions{.ipc = table.get(), .partition = 1}, 16u << 20, std::move(backend));
  auto c = w.attach();
  // An interprocess event keeps no time; only such an event is exported.
  Event e;
  EXPECT_EQ(c->event_create(&e, uint32_t(kEventInterprocess)), Status::kInvalidValue);
  {
    std::lock_guard lock(be.mu);
    EXPECT_TRUE(be.created_flags.empty()) << "refused before the backend made it";
  }
  Event plain, ipc;
  ASSERT_EQ(c->event_create(&plain, uint32_t(kEventDisableTiming)), Status::kSuccess);
  Client::IpcToken t;
  EXPECT_EQ(c->ipc_export_event(plain, &t), Status::kInvalidResourceHandle);
  ASSERT_EQ(c->event_create(&ipc, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(c->ipc_export_event(ipc, &t), Status::kSuccess);
  ASSERT_EQ(c->ipc_export_event(ipc, &t), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.exported_events, 1) << "the plain event never reached the backend; the second export is the first's";
  }
  // Memory: the allocation's first address, whichever of its addresses was named.
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 8192), Status::kSuccess);
  ASSERT_EQ(c->ipc_export_mem(d + 4000, &t), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.exported_addrs, std::vector<uint64_t>{d});
  }
  IpcExport x;
  ASSERT_EQ(table->find(IpcToken{t.word, t.secret}, &x), Status::kSuccess);
  EXPECT_EQ(x.partition, 1u);
  EXPECT_EQ(x.size, 8192u);
  EXPECT_EQ(x.kind, IpcKind::kMemory);
  EXPECT_EQ(x.blob.words[0], d) << "what the backend wrote";

  // Exports of another part (the test publishes them as partition 0): the
  // backend gets the table's words, never the guest's; an export of a device
  // this session lacks is refused before the backend.
  IpcExport other = stamped(0, 0);
  other.size = 65536;
  other.device = 0;
  other.blob = IpcBlob{};
  other.blob.words[0] = 0xfeed;
  IpcToken ot;
  ASSERT_EQ(table->publish(other, &ot), Status::kSuccess);
  uint64_t addr = 0, size = 0;
  uint32_t dev = 7;
  ASSERT_EQ(c->ipc_open_mem({ot.word, ot.secret}, &addr, &size, &dev), Status::kSuccess);
  EXPECT_EQ(size, 65536u);
  EXPECT_EQ(dev, 0u);
  {
    std::lock_guard lock(be.mu);
    ASSERT_EQ(be.opened.size(), 1u);
    EXPECT_EQ(be.opened[0].blob0, 0xfeedu);
    EXPECT_EQ(be.opened[0].size, 65536u);
  }
  uint32_t v = 5;
  EXPECT_EQ(c->memcpy_h2d(addr + 65532, &v, 4), Status::kSuccess) << "the import's last word";
  EXPECT_EQ(c->memcpy_h2d(addr + 65534, &v, 4), Status::kInvalidDevicePointer) << "past it";
  EXPECT_EQ(c->get_last_error(), Status::kInvalidDevicePointer);
  other.device = 3;  // this session has one device
  IpcToken far;
  ASSERT_EQ(table->publish(other, &far), Status::kSuccess);
  uint64_t refused = 0;
  EXPECT_EQ(c->ipc_open_mem({far.word, far.secret}, &refused, &size, &dev), Status::kInvalidDevice);
  other.kind = IpcKind::kEvent;
  IpcToken far_event;
  ASSERT_EQ(table->publish(other, &far_event), Status::kSuccess);
  Event opened;
  EXPECT_EQ(c->ipc_open_event({far_event.word, far_event.secret}, &opened), Status::kInvalidDevice);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.opened.size(), 1u) << "the far device's memory never reached the backend";
    EXPECT_TRUE(be.opened_event_devices.empty());
  }
  // Closes reach the backend once the count is down, at the address it gave.
  uint64_t again = 0;
  ASSERT_EQ(c->ipc_open_mem({ot.word, ot.secret}, &again, &size, &dev), Status::kSuccess);
  EXPECT_EQ(again, addr);
  ASSERT_EQ(c->ipc_close_mem(addr), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_TRUE(be.closed.empty());
  }
  ASSERT_EQ(c->ipc_close_mem(addr), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.closed, std::vector<uint64_t>{addr});
  }
  // The session's end takes its exports out of the table, and leaves the other part's.
  c.reset();
  c = w.attach();
  EXPECT_EQ(table->find(IpcToken{t.word, t.secret}, &x), Status::kInvalidResourceHandle);
  EXPECT_EQ(table->find(ot, &x), Status::kSuccess);
}

// Events.

TEST(IpcEvents, OnlyAnInterprocessEventWithoutTimingIsExported) {
  Pair p;
  Event e;
  EXPECT_EQ(p.a().event_create(&e, uint32_t(kEventInterprocess)), Status::kInvalidValue) << "CUDA's rule";
  EXPECT_EQ(p.a().event_create(&e, uint32_t(kEventInterprocess | kEventBlockingSync)), Status::kInvalidValue);
  Client::IpcToken t;
  for (uint32_t flags : {0u, uint32_t(kEventDisableTiming), uint32_t(kEventBlockingSync | kEventDisableTiming)}) {
    Event plain;
    ASSERT_EQ(p.a().event_create(&plain, flags), Status::kSuccess);
    EXPECT_EQ(p.a().ipc_export_event(plain, &t), Status::kInvalidResourceHandle) << "flags " << flags;
    EXPECT_EQ(p.a().event_destroy(plain), Status::kSuccess);
  }
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(p.a().ipc_export_event(e, &t), Status::kSuccess);
  Client::IpcToken again;
  ASSERT_EQ(p.a().ipc_export_event(e, &again), Status::kSuccess);
  EXPECT_EQ(again.word, t.word) << "exported twice: one token";
  EXPECT_EQ(again.secret, t.secret);
  // A's other interprocess event: another token.
  Event e2;
  ASSERT_EQ(p.a().event_create(&e2, kIpcEventFlags), Status::kSuccess);
  Client::IpcToken t2;
  ASSERT_EQ(p.a().ipc_export_event(e2, &t2), Status::kSuccess);
  EXPECT_NE(t2.word, t.word);
  // A never-recorded event is complete everywhere.
  Event opened;
  ASSERT_EQ(p.b().ipc_open_event(t, &opened), Status::kSuccess);
  EXPECT_EQ(p.b().event_query(opened), Status::kSuccess);
  EXPECT_EQ(p.b().event_synchronize(opened), Status::kSuccess);
  EXPECT_EQ(p.b().stream_wait_event(kLegacyStream, opened), Status::kSuccess);
  EXPECT_EQ(p.b().device_synchronize(), Status::kSuccess);
  // No timing: elapsed time is refused (CUDA: cudaErrorInvalidResourceHandle).
  float ms = 0;
  EXPECT_NE(p.b().event_elapsed(&ms, opened, opened), Status::kSuccess);
}

struct SlowRound {
  uint64_t x = 0, src = 0;  // A's exported buffer and the kernel's source
  Client::IpcToken t;
};

// A: a buffer B opens (x, 0 until the kernel copies src into it).
SlowRound slow_setup(Pair& p, uint32_t words) {
  SlowRound r;
  EXPECT_EQ(p.a().malloc(&r.x, words * 4), Status::kSuccess);
  EXPECT_EQ(p.a().malloc(&r.src, words * 4), Status::kSuccess);
  EXPECT_EQ(p.a().ipc_export_mem(r.x, &r.t), Status::kSuccess);
  return r;
}

// A's stream: a kernel that sleeps, then copies src (filled with `value`) into x; then a record of `e`.
void slow_then_record(Pair& p, const SlowRound& r, uint32_t words, uint32_t value, uint32_t sleep_us, Stream s,
                      Event e) {
  std::vector<uint32_t> v(words, value), zero(words, 0);
  ASSERT_EQ(p.a().memcpy_h2d(r.src, v.data(), words * 4), Status::kSuccess);
  ASSERT_EQ(p.a().memcpy_h2d(r.x, zero.data(), words * 4), Status::kSuccess);
  const sim::SlowCopyArgs a{r.x, r.src, words * 4ull, sleep_us, 0};
  ASSERT_EQ(p.a().launch(kernel(p.a(), "ordo_slow_copy"), {1}, {1}, &a, sizeof a, s), Status::kSuccess);
  ASSERT_EQ(p.a().event_record(e, s), Status::kSuccess);
}

// A's interprocess event, opened by B; a stream each; B's view of A's buffer.
struct SharedRound {
  SlowRound r;
  Event e, eb;
  Stream sa, sb;
  uint64_t y = 0;  // r.x, opened by B
};

SharedRound shared_setup(Pair& p, uint32_t words) {
  SharedRound m;
  m.r = slow_setup(p, words);
  EXPECT_EQ(p.a().event_create(&m.e, kIpcEventFlags), Status::kSuccess);
  Client::IpcToken te;
  EXPECT_EQ(p.a().ipc_export_event(m.e, &te), Status::kSuccess);
  EXPECT_EQ(p.a().stream_create(&m.sa), Status::kSuccess);
  EXPECT_EQ(p.b().stream_create(&m.sb), Status::kSuccess);
  EXPECT_EQ(p.b().ipc_open_event(te, &m.eb), Status::kSuccess);
  uint64_t size = 0;
  uint32_t dev = 0;
  EXPECT_EQ(p.b().ipc_open_mem(m.r.t, &m.y, &size, &dev), Status::kSuccess);
  return m;
}

// A records after a slow kernel; B, told only afterwards (this thread), waits
// on its own stream and copies: it sees the kernel's result. Its queries say
// not ready while the kernel runs.
TEST(IpcEvents, AWaitInTheOtherSessionFollowsTheRecord) {
  Pair p;
  constexpr uint32_t kWords = 256;
  const SharedRound m = shared_setup(p, kWords);
  ASSERT_FALSE(HasFailure());
  const auto& [r, e, eb, sa, sb, y] = m;
  for (uint32_t round = 1; round <= 3; ++round) {
    slow_then_record(p, r, kWords, 1000 + round, 250000, sa, e);
    EXPECT_EQ(p.b().event_query(eb), Status::kNotReady) << "round " << round << ": the kernel runs for 250 ms";
    ASSERT_EQ(p.b().stream_wait_event(sb, eb), Status::kSuccess);
    std::vector<uint32_t> got(kWords, 0);
    ASSERT_EQ(p.b().memcpy_d2h_async(got.data(), y, kWords * 4, sb), Status::kSuccess);  // pageable: returns when done
    EXPECT_EQ(got, std::vector<uint32_t>(kWords, 1000 + round)) << "round " << round;
    EXPECT_EQ(p.b().event_query(eb), Status::kSuccess) << "round " << round;
    EXPECT_EQ(p.a().event_query(e), Status::kSuccess) << "round " << round;
  }
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
}

TEST(IpcEvents, SynchronizeInTheOtherSessionReturnsAfterTheRecordCompletes) {
  Pair p;
  constexpr uint32_t kWords = 64;
  const SharedRound m = shared_setup(p, kWords);
  ASSERT_FALSE(HasFailure());
  const auto& [r, e, eb, sa, sb, y] = m;
  for (uint32_t round = 1; round <= 2; ++round) {
    const auto t0 = Clock::now();
    slow_then_record(p, r, kWords, 50 + round, 200000, sa, e);
    EXPECT_EQ(p.b().event_query(eb), Status::kNotReady) << "round " << round;
    ASSERT_EQ(p.b().event_synchronize(eb), Status::kSuccess);
    EXPECT_GE(Clock::now() - t0, 190ms) << "round " << round << ": returned before the kernel could have ended";
    EXPECT_EQ(p.b().event_query(eb), Status::kSuccess);
    EXPECT_EQ(read_back(p.b(), y, kWords), std::vector<uint32_t>(kWords, 50 + round)) << "round " << round;
  }
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
}

// A destroys its event: nobody opens the token again, and the event B opened
// before still shares records (B's own, now).
TEST(IpcEvents, DestroyRevokesTheExportButNotWhatWasOpened) {
  Pair p(WorkerOptions{}, ClientOptions{}, 1, 3);
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  Client::IpcToken te;
  ASSERT_EQ(p.a().ipc_export_event(e, &te), Status::kSuccess);
  Event eb, ec;
  ASSERT_EQ(p.b().ipc_open_event(te, &eb), Status::kSuccess);
  ASSERT_EQ(p.clients[2]->ipc_open_event(te, &ec), Status::kSuccess);
  IpcExport in_table;
  ASSERT_EQ(p.table->find(IpcToken{te.word, te.secret}, &in_table), Status::kSuccess);
  EXPECT_EQ(in_table.kind, IpcKind::kEvent);
  ASSERT_EQ(p.a().event_destroy(e), Status::kSuccess);
  EXPECT_EQ(p.table->find(IpcToken{te.word, te.secret}, &in_table), Status::kInvalidResourceHandle)
      << "the destroy took the export out of the region's table";
  Event again;
  EXPECT_EQ(p.b().ipc_open_event(te, &again), Status::kInvalidResourceHandle);
  EXPECT_EQ(p.a().ipc_export_event(e, &te), Status::kInvalidResourceHandle) << "destroyed";
  // B records after a slow kernel of its own; C, which opened the same event, waits for it.
  uint64_t scratch = 0;
  ASSERT_EQ(p.b().malloc(&scratch, 8), Status::kSuccess);
  Stream sb;
  ASSERT_EQ(p.b().stream_create(&sb), Status::kSuccess);
  const sim::SlowCopyArgs slow{scratch, scratch, 0, 200000, 0};
  const auto t0 = Clock::now();
  ASSERT_EQ(p.b().launch(kernel(p.b(), "ordo_slow_copy"), {1}, {1}, &slow, sizeof slow, sb), Status::kSuccess);
  ASSERT_EQ(p.b().event_record(eb, sb), Status::kSuccess);
  EXPECT_EQ(p.b().event_query(eb), Status::kNotReady);
  EXPECT_EQ(p.clients[2]->event_query(ec), Status::kNotReady) << "C shares B's records";
  ASSERT_EQ(p.clients[2]->event_synchronize(ec), Status::kSuccess);
  EXPECT_GE(Clock::now() - t0, 190ms);
  EXPECT_EQ(p.b().event_query(eb), Status::kSuccess);
  EXPECT_EQ(p.b().event_destroy(eb), Status::kSuccess);
  EXPECT_EQ(p.clients[2]->event_destroy(ec), Status::kSuccess);
}

// B's stream waits on A's record behind a long kernel when B's process ends:
// B's session resets (and its part takes the next guest) without waiting for
// A's kernel, as a killed process frees its part natively. It used to wait
// until the record completed, forever where it never does.
TEST(IpcEvents, AnEndedSessionDoesNotWaitForAnotherProcesssRecord) {
  Pair p;
  constexpr uint32_t kWords = 16;
  const SharedRound m = shared_setup(p, kWords);
  ASSERT_FALSE(HasFailure());
  slow_then_record(p, m.r, kWords, 7, 4000000, m.sa, m.e);  // 4 s
  ASSERT_EQ(p.b().stream_wait_event(m.sb, m.eb), Status::kSuccess);
  uint32_t v = 0;
  ASSERT_EQ(p.b().memcpy_h2d_async(m.y, &v, 4, m.sb), Status::kSuccess);
  p.clients[1].reset();
  p.clients[1] = p.workers[1]->attach();
  // Had B's reset waited for A's record, A's kernel would be over by now.
  EXPECT_EQ(p.a().event_query(m.e), Status::kNotReady) << "B's reset waited for A's kernel";
  EXPECT_EQ(p.b().device_synchronize(), Status::kSuccess);
}

// Rounds of A's slow kernel + record against B's wait + copy, under chaos
// (each worker holds entries a random while). `ordered`: both workers and
// clients keep the rules. Returns the rounds in which B read stale bytes.
int stale_rounds(bool ordered, int rounds) {
  WorkerOptions o;
  o.ordered = ordered;
  o.chaos_seed = 1234;
  o.chaos_max_hold_us = 2000;
  Pair p(o, ClientOptions{.ordered = ordered});
  constexpr uint32_t kWords = 16;
  const SharedRound m = shared_setup(p, kWords);
  const auto& [r, e, eb, sa, sb, y] = m;
  int stale = 0;
  for (int round = 1; round <= rounds; ++round) {
    slow_then_record(p, r, kWords, uint32_t(round), 5000, sa, e);
    EXPECT_EQ(p.b().stream_wait_event(sb, eb), Status::kSuccess);
    std::vector<uint32_t> got(kWords, 0);
    EXPECT_EQ(p.b().memcpy_d2h_async(got.data(), y, kWords * 4, sb), Status::kSuccess);
    stale += got != std::vector<uint32_t>(kWords, uint32_t(round));
    EXPECT_EQ(p.a().stream_synchronize(sa), Status::kSuccess);
  }
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
  return stale;
}

TEST(IpcEvents, OrderedUnderChaosNoWaitMissesItsRecord) { EXPECT_EQ(stale_rounds(true, 20), 0); }

// The control: without the rules (and without the guest's wait for the
// record's dispatch), B's wait is often dispatched before A's record and
// waits for nothing. Shows the test above can see a violation.
TEST(IpcEvents, UnorderedUnderChaosWaitsMissTheirRecord) { EXPECT_GT(stale_rounds(false, 10), 0); }

// Found by review of the first version, each failing before its fix.

// cudaEventRecord and cudaStreamWaitEvent are asynchronous. ordo makes a
// record of (or a wait on) an interprocess event return only once the worker
// dispatched it, and a ring's next entry is not dispatched while a host
// function before it runs: a program whose host function waits for something
// the host thread does after the record hung (here a watchdog releases it
// after 2 s), until the wait stopped behind the process's own host functions.
TEST(IpcEvents, ARecordBehindARunningHostFunctionReturnsAtOnce) {
  Pair p;
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  Stream s;
  ASSERT_EQ(p.a().stream_create(&s), Status::kSuccess);
  for (bool wait : {false, true}) {
    std::atomic<bool> go{false};
    ASSERT_EQ(p.a().host_func(s, [&go] {
      while (!go.load()) std::this_thread::sleep_for(1ms);
    }), Status::kSuccess);
    std::promise<void> returned;
    std::thread watchdog([&go, f = returned.get_future()] {
      f.wait_for(2s);
      go = true;
    });
    const auto t0 = Clock::now();
    const Status st = wait ? p.a().stream_wait_event(s, e) : p.a().event_record(e, s);
    const auto took = Clock::now() - t0;
    go = true;
    returned.set_value();
    watchdog.join();
    EXPECT_EQ(st, Status::kSuccess);
    EXPECT_LT(took, 1s) << (wait ? "stream_wait_event" : "event_record")
                        << " waited for the host function before it (the program would hang)";
    ASSERT_EQ(p.a().stream_synchronize(s), Status::kSuccess);
  }
}

// Memory of device 0 opened from device 0, then again from device 1: the
// second open returned the first's address (counted once more) without the
// lazy peer access a first open from device 1 enables, so a kernel of device 1
// faulted on it.
TEST(IpcMemory, ASecondOpenFromAnotherDeviceReachesTheMemoryToo) {
  Pair p(WorkerOptions{}, ClientOptions{}, 2);
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y0 = 0, y1 = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y0, &size, &dev), Status::kSuccess);  // from device 0
  ASSERT_EQ(p.b().set_device(1), Status::kSuccess);
  ASSERT_EQ(p.b().ipc_open_mem(t, &y1, &size, &dev), Status::kSuccess);
  Stream s;
  ASSERT_EQ(p.b().stream_create(&s), Status::kSuccess);  // device 1's
  const sim::FillU32Args fill{y1, 1024, 0x99u, 0};
  ASSERT_EQ(p.b().launch(kernel(p.b(), "ordo_fill_u32"), {1}, {1}, &fill, sizeof fill, s), Status::kSuccess);
  EXPECT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(p.b().sticky_error(), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x, 4), std::vector<uint32_t>(4, 0x99u));
}

// A part's worker process that dies while it fills a cell (between the odd
// and the even generation: draw_secret's getrandom lies in between) leaves the
// cell odd. The restarted part's revoke_all cleared it by adding two, so it
// stayed odd, and every later publish into it issued a token of odd
// generation, which find always refuses: the cell (the first free one, so
// the one most exports land in) was broken for the region's life.
TEST(IpcTable, AnExporterKilledMidPublishLeavesNoBrokenCell) {
  auto table = new_table();
  ASSERT_TRUE(table);
  constexpr uint32_t kPart = 3;
  int broken = 0;
  for (int crash = 0; crash < 30; ++crash) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the part's worker: exports and takes them back, until killed
      std::string err;
      auto mine = IpcTable::attach(table->fd(), &err);
      if (!mine) _exit(1);
      for (uint64_t n = 1;; ++n) {
        IpcToken t;
        if (mine->publish(stamped(n, kPart), &t) == Status::kSuccess) mine->revoke(t, kPart);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 + 97 * crash));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    table->revoke_all(kPart);  // what the part's next process does first (Worker::Worker)
    IpcToken t;
    ASSERT_EQ(table->publish(stamped(42, kPart), &t), Status::kSuccess);
    IpcExport got;
    if (table->find(t, &got) != Status::kSuccess) {
      ++broken;
      ADD_FAILURE() << "crash " << crash << ": an export just published is not found (token generation "
                    << generation(t) << ", cell " << cell(t) << ")";
    }
    table->revoke(t, kPart);
  }
  EXPECT_EQ(broken, 0);
}

// The supervisor's worker processes: one table across processes (--ipc-fd),
// the sim's exports opened through the other process's /proc/PID/fd.
TEST(IpcProcesses, TwoWorkerProcessesShareMemoryAndEvents) {
  WorkerProcess w({"--sessions", "2"}, "32M");
  auto a = w.attach();
  auto b = w.attach();
  constexpr uint32_t kWords = 1024;
  uint64_t x = 0, src = 0;
  ASSERT_EQ(a->malloc(&x, kWords * 4), Status::kSuccess);
  ASSERT_EQ(a->malloc(&src, kWords * 4), Status::kSuccess);
  const auto in = pattern(kWords, 77);
  ASSERT_EQ(a->memcpy_h2d(src, in.data(), kWords * 4), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(a->ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(a->event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(a->ipc_export_event(e, &te), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(b->ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(size, kWords * 4);
  Event eb;
  ASSERT_EQ(b->ipc_open_event(te, &eb), Status::kSuccess);
  uint64_t own = 0;
  EXPECT_EQ(a->ipc_open_mem(tm, &own, &size, &dev), Status::kInvalidContext);
  Stream sa, sb;
  ASSERT_EQ(a->stream_create(&sa), Status::kSuccess);
  ASSERT_EQ(b->stream_create(&sb), Status::kSuccess);
  const sim::SlowCopyArgs slow{x, src, kWords * 4, 200000, 0};
  ASSERT_EQ(a->launch(kernel(*a, "ordo_slow_copy"), {1}, {1}, &slow, sizeof slow, sa), Status::kSuccess);
  ASSERT_EQ(a->event_record(e, sa), Status::kSuccess);
  EXPECT_EQ(b->event_query(eb), Status::kNotReady);
  ASSERT_EQ(b->stream_wait_event(sb, eb), Status::kSuccess);
  std::vector<uint32_t> got(kWords, 0);
  ASSERT_EQ(b->memcpy_d2h_async(got.data(), y, kWords * 4, sb), Status::kSuccess);
  EXPECT_EQ(got, in);
  EXPECT_EQ(b->event_query(eb), Status::kSuccess);
  // B writes; A reads it.
  const auto back = pattern(kWords, 5000);
  ASSERT_EQ(b->memcpy_h2d(y, back.data(), kWords * 4), Status::kSuccess);
  EXPECT_EQ(read_back(*a, x, kWords), back);
  EXPECT_EQ(b->ipc_close_mem(y), Status::kSuccess);
  expect_refused(*b, y, "closed");
  // A's process ends: its part's exports go with it.
  a.reset();
  auto a2 = w.attach();
  EXPECT_EQ(b->ipc_open_mem(tm, &y, &size, &dev), Status::kInvalidResourceHandle);
  Event again;
  EXPECT_EQ(b->ipc_open_event(te, &again), Status::kInvalidResourceHandle);
}

}  // namespace
}  // namespace ordo::test

// The region's table of exports (IpcTable) on its own: tokens found only
// whole, partitions revoked apart, a full table, readers racing writers, and
// an exporter killed mid-publish. The sessions that use it:
// test_ipc_memory.cc and test_ipc_events.cc.
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
#include "ipc_support.h"
#include "ordo/sim.h"
#include "transport/op_args.h"
#include "worker/backends/null/null_backend.h"
#include "worker/backends/sim/sim_backend.h"
#include "worker/ipc_table.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

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

}  // namespace
}  // namespace ordo::test

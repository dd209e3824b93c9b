// Several guest processes on one region (ordo-worker --sessions N): each its
// own session, served by a worker process of its own, attached at the same
// instant, ordered under chaos, isolated from one another, and reclaimed alone
// when killed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "generator.h"
#include "harness.h"
#include "ordo/sim.h"
#include "scenarios.h"

namespace ordo::test {
namespace {

// Exit codes of a guest process.
constexpr int kPassed = 0, kViolations = 1, kNoAttach = 2, kProblems = 3, kCallFailed = 4;

// A guest process: forked now, blocked until go() so that all attach at the
// same instant, then runs `body` on its own Client and exits with its code.
class Guest {
 public:
  Guest(const std::string& region, std::function<int(Client&)> body) {
    int go[2], ready[2];
    if (pipe(go) != 0 || pipe(ready) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      close(go[1]);
      close(ready[0]);
      char b;
      if (read(go[0], &b, 1) != 1) _exit(kNoAttach);
      std::string err;
      auto c = Client::attach(region, &err);
      if (!c) {
        std::fprintf(stderr, "guest %d: %s\n", int(getpid()), err.c_str());
        _exit(kNoAttach);
      }
      ready_fd_ = ready[1];
      const int rc = body(*c);
      c.reset();  // detaches
      _exit(rc);
    }
    close(go[0]);
    close(ready[1]);
    go_ = go[1];
    ready_ = ready[0];
  }
  ~Guest() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(go_);
    close(ready_);
  }
  void go() { [[maybe_unused]] auto n = write(go_, "g", 1); }
  // Waits for the guest's signal() (false if it exited first).
  bool wait_signal() {
    char b;
    return read(ready_, &b, 1) == 1;
  }
  // Called in the guest: wakes wait_signal().
  static void signal() { [[maybe_unused]] auto n = write(ready_fd_, "r", 1); }
  int wait() {
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  void kill_now() { kill(pid_, SIGKILL); }

 private:
  pid_t pid_ = -1;
  int go_ = -1, ready_ = -1;
  static inline int ready_fd_ = -1;
};

// A generated program (every stream and event API, several threads). Without
// edges its calls may fail too (an event destroyed before its record ran):
// `unordered` counts only the violations then.
int generated(Client& c, uint64_t seed, bool unordered = false) {
  scenario::Problems p;
  scenario::GenProgram prog;
  prog.threads = 4;
  auto r = scenario::run_generated(c, seed, p, prog);
  if (!p.empty() && !unordered) {
    std::fprintf(stderr, "guest seed %llu: %zu problems, first: %s\n", (unsigned long long)seed, p.count(),
                 p.first().c_str());
    return kProblems;
  }
  if (r.violations) std::fprintf(stderr, "guest seed %llu: %s\n", (unsigned long long)seed, r.first.c_str());
  return r.violations ? kViolations : kPassed;
}

TEST(Sessions, FourProcessesAttachAtOnceAndEachKeepsItsOrderUnderChaos) {
  WorkerProcess w({"--sessions", "4", "--chaos", "41"}, "64M");
  std::vector<std::unique_ptr<Guest>> guests;
  for (uint64_t k = 0; k < 4; ++k)
    guests.push_back(std::make_unique<Guest>(w.region(), [k](Client& c) { return generated(c, 100 + k); }));
  for (auto& g : guests) g->go();
  for (size_t k = 0; k < guests.size(); ++k) EXPECT_EQ(guests[k]->wait(), kPassed) << "guest " << k;
  const std::string log = w.stop();
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(log.find("session part " + std::to_string(k) + " of 4"), std::string::npos) << log;
}

TEST(Sessions, TheSameProcessesBreakWithoutEdges) {
  WorkerProcess w({"--sessions", "4", "--chaos", "41", "--unordered"}, "64M");
  std::vector<std::unique_ptr<Guest>> guests;
  for (uint64_t k = 0; k < 4; ++k)
    guests.push_back(std::make_unique<Guest>(w.region(), [k](Client& c) { return generated(c, 100 + k, true); }));
  for (auto& g : guests) g->go();
  int broken = 0;
  for (auto& g : guests) {
    const int rc = g->wait();
    EXPECT_TRUE(rc == kPassed || rc == kViolations) << rc;
    broken += rc == kViolations;
  }
  EXPECT_GT(broken, 0) << "the generated programs must catch a worker that drops edges";
}

TEST(Sessions, OneMoreProcessThanSessionsIsRefusedClearly) {
  WorkerProcess w({"--sessions", "2"}, "32M");
  auto a = w.attach();
  auto b = w.attach();
  std::string err;
  EXPECT_EQ(Client::attach(w.region(), &err), nullptr);
  EXPECT_NE(err.find("in use by 2 live guest processes"), std::string::npos) << err;
  EXPECT_NE(err.find("--sessions"), std::string::npos) << err;
  b.reset();  // detached: its part is free at once
  EXPECT_NE(w.attach(), nullptr);
}

// A process's handles mean nothing in another session: the same device
// address, stream and event numbers are refused there.
TEST(Sessions, HandlesBelongToTheirSession) {
  WorkerProcess w({"--sessions", "2"}, "32M");
  auto a = w.attach();
  auto b = w.attach();
  uint64_t dev = 0;
  ASSERT_EQ(a->malloc(&dev, 4096), Status::kSuccess);
  Stream s{};
  ASSERT_EQ(a->stream_create(&s), Status::kSuccess);
  const uint64_t v = 7;
  EXPECT_EQ(b->memcpy_h2d(dev, &v, 8), Status::kInvalidDevicePointer) << "another session's device address";
  EXPECT_EQ(b->free(dev), Status::kInvalidDevicePointer);
  EXPECT_EQ(a->memcpy_h2d(dev, &v, 8), Status::kSuccess) << "untouched in its own session";
  uint64_t back = 0;
  ASSERT_EQ(a->memcpy_d2h(&back, dev, 8), Status::kSuccess);
  EXPECT_EQ(back, v);
}

// One process floods its stream with a second of kernels; another's calls and
// kernels go through meanwhile, while the first's queue is still long.
TEST(Sessions, OneSessionsLongQueueDoesNotStallAnother) {
  WorkerProcess w({"--sessions", "2"}, "32M");
  auto a = w.attach();
  auto b = w.attach();
  const uint32_t stamp_a = kernel(*a, "ordo_stamp");
  uint64_t stamps = 0;
  ASSERT_EQ(a->malloc(&stamps, 1000 * sizeof(sim::Stamp)), Status::kSuccess);
  Stream sa{};
  ASSERT_EQ(a->stream_create(&sa), Status::kSuccess);
  for (uint32_t i = 0; i < 1000; ++i) {
    const sim::StampArgs args{stamps, i, 1000};  // 1 ms each
    ASSERT_EQ(a->launch(stamp_a, {1}, {1}, &args, sizeof args, sa), Status::kSuccess);
  }
  const uint32_t stamp_b = kernel(*b, "ordo_stamp");
  uint64_t stamps_b = 0;
  ASSERT_EQ(b->malloc(&stamps_b, sizeof(sim::Stamp)), Status::kSuccess);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(b->null_call(), Status::kSuccess);
  const sim::StampArgs args{stamps_b, 0, 0};
  ASSERT_EQ(b->launch(stamp_b, {1}, {1}, &args, sizeof args, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(b->device_synchronize(), Status::kSuccess);
  EXPECT_EQ(a->stream_query(sa), Status::kNotReady) << "session A's second of work should still be queued";
  ASSERT_EQ(a->stream_destroy(sa), Status::kSuccess);
}

// A guest process killed mid-run: its part is reclaimed (its streams, events
// and memory freed) while the other processes keep running and pass, and a
// new process can take the part.
TEST(Sessions, AKilledProcessIsReclaimedWhileTheOthersPass) {
  WorkerProcess w({"--sessions", "4", "--chaos", "43", "--guest-timeout", "1000"}, "64M");
  Guest victim(w.region(), [](Client& c) {
    uint32_t stamp = 0;
    if (!ok(c.kernel_lookup("ordo_stamp", &stamp))) return kCallFailed;
    uint64_t d = 0;
    if (!ok(c.malloc(&d, 64 << 20))) return kCallFailed;
    Stream s{};
    Event e{};
    if (!ok(c.stream_create(&s)) || !ok(c.event_create(&e))) return kCallFailed;
    Guest::signal();
    for (uint32_t i = 0;; ++i) {
      const sim::StampArgs args{d, i % 1024, 200};
      if (!ok(c.launch(stamp, {1}, {1}, &args, sizeof args, s)) || !ok(c.event_record(e, s)) ||
          !ok(c.stream_wait_event(kLegacyStream, e)))
        return kCallFailed;
    }
  });
  std::vector<std::unique_ptr<Guest>> others;
  for (uint64_t k = 0; k < 3; ++k)
    others.push_back(std::make_unique<Guest>(w.region(), [k](Client& c) { return generated(c, 200 + k); }));
  victim.go();
  for (auto& g : others) g->go();
  ASSERT_TRUE(victim.wait_signal()) << "the victim did not start";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  victim.kill_now();
  EXPECT_EQ(victim.wait(), 128 + SIGKILL);
  for (size_t k = 0; k < others.size(); ++k) EXPECT_EQ(others[k]->wait(), kPassed) << "guest " << k;
  // Its worker frees the session once the heartbeat has been silent for 1 s.
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    freed = w.log().find("freeing its streams, events and memory") != std::string::npos;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(freed) << w.log();
  // Then a new process can take the part: four attach again, so it must be among them.
  std::vector<std::unique_ptr<Client>> again;
  for (int k = 0; k < 4; ++k) {
    std::string err;
    again.push_back(Client::attach(w.region(), &err));
    ASSERT_NE(again.back(), nullptr) << err;
    EXPECT_EQ(again.back()->null_call(), Status::kSuccess);
  }
}

}  // namespace
}  // namespace ordo::test

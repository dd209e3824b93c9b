// Dead peers: a worker killed under a waiting guest, a worker restarted on the
// same region, guests killed at random points and their resources reclaimed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <regex>
#include <thread>

#include "harness.h"
#include "ordo/sim.h"
#include "worker/backends/null/null_backend.h"

namespace ordo::test {
namespace {

// `key` from the last counters line in a worker log.
uint64_t stat_of(const std::string& log, const char* key) {
  const size_t p = log.rfind("{\"entries\"");
  if (p == std::string::npos) return ~0ull;
  const std::string line = log.substr(p, log.find('\n', p) - p);
  std::smatch m;
  std::regex re(std::string("\"") + key + "\":([0-9]+)");
  return std::regex_search(line, m, re) ? std::stoull(m[1]) : ~0ull;
}

TEST(Peers, KilledWorkerFailsWaitingCallsInsteadOfHanging) {
  WorkerProcess w;
  ClientOptions o;
  o.worker_timeout = std::chrono::milliseconds(500);
  auto c = w.attach(o);
  const uint32_t stamp = kernel(*c, "ordo_stamp");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, sizeof(sim::Stamp)), Status::kSuccess);
  sim::StampArgs a{d, 0, 3'000'000};  // 3 s: the worker dies long before it ends
  ASSERT_EQ(c->launch(stamp, {1}, {1}, &a, sizeof a, kLegacyStream), Status::kSuccess);
  std::thread killer([&] {
    usleep(100000);
    kill(w.pid(), SIGKILL);
  });
  EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kDevicesUnavailable);
  killer.join();
  EXPECT_EQ(c->null_call(), Status::kDevicesUnavailable) << "later calls fail too, without hanging";
}

// A backend whose allocations hold the worker's dispatch thread, as a long
// backend call does (a module's JIT compile, a slow driver call).
class StallingBackend : public NullBackend {
 public:
  explicit StallingBackend(std::chrono::milliseconds stall) : stall_(stall) {}
  Status malloc(uint32_t device, uint64_t size, uint64_t* addr) override {
    std::this_thread::sleep_for(stall_);
    return NullBackend::malloc(device, size, addr);
  }

 private:
  std::chrono::milliseconds stall_;
};

// The heartbeat says the worker lives, not that it is quick: a dispatch thread
// held three times the guest's timeout makes neither the call that holds it nor
// a call queued behind it fail, and the session goes on.
TEST(Peers, ADispatchThreadHeldLongerThanTheTimeoutIsNotADeadWorker) {
  InProcessWorker w({}, 16u << 20, std::make_unique<StallingBackend>(std::chrono::milliseconds(1500)));
  ClientOptions o;
  o.worker_timeout = std::chrono::milliseconds(500);
  auto c = w.attach(o);
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  Status queued = Status::kNotReady;
  std::thread behind([&] {
    usleep(200000);  // while the allocation holds the dispatch thread
    queued = c->null_call();
  });
  uint64_t d = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c->malloc(&d, 4096), Status::kSuccess);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1400)) << "the stall happened";
  behind.join();
  EXPECT_EQ(queued, Status::kSuccess);
  EXPECT_EQ(c->null_call(), Status::kSuccess) << "the session goes on";
}

TEST(Peers, RestartedWorkerServesANewGuest) {
  std::string region;
  std::unique_ptr<Client> old;
  ClientOptions o;
  o.worker_timeout = std::chrono::milliseconds(500);
  {
    auto w = std::make_unique<WorkerProcess>();
    region = w->region();
    old = w->attach(o);
    ASSERT_EQ(old->null_call(), Status::kSuccess);
    kill(w->pid(), SIGKILL);
    w->keep_region();
  }
  // The new worker reuses the file in place (a VM may still map it).
  WorkerProcess w2({}, "16M", region);
  EXPECT_EQ(old->null_call(), Status::kDevicesUnavailable) << "the old session is gone";
  auto c = w2.attach(o);
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 64), Status::kSuccess);
  const char msg[] = "restarted";
  char back[sizeof msg] = {};
  ASSERT_EQ(c->memcpy_h2d(d, msg, sizeof msg), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h(back, d, sizeof msg), Status::kSuccess);
  EXPECT_STREQ(back, msg);
  old.reset();  // its detach must not disturb the new session
  EXPECT_EQ(c->null_call(), Status::kSuccess);
}

// A guest process that allocates, creates streams and events, and then keeps
// the worker busy until it is killed.
[[noreturn]] void busy_guest(const std::string& region) {
  std::string err;
  auto c = Client::attach(region, &err);
  if (!c) _exit(3);
  uint32_t add = 0;
  if (!ok(c->kernel_lookup("ordo_add_u64", &add))) _exit(4);
  uint64_t d = 0;
  for (int i = 0; i < 4; ++i) c->malloc(&d, 1 << 20);
  Stream s;
  c->stream_create(&s);
  Event e;
  c->event_create(&e);
  std::vector<uint8_t> buf(8192, 1);
  for (uint64_t i = 0;; ++i) {
    sim::AddU64Args a{d, i};
    c->launch(add, {1}, {1}, &a, sizeof a, s);
    if (i % 7 == 0) c->memcpy_h2d_async(d + 8, buf.data(), buf.size(), s);
    if (i % 13 == 0) c->event_record(e, s);
    if (i % 29 == 0) c->stream_wait_event(kLegacyStream, e);
    if (i % 101 == 0) c->stream_synchronize(s);
  }
}

TEST(Peers, GuestsKilledAtRandomPointsAreReclaimed) {
  WorkerProcess w({"--guest-timeout", "300"});
  std::mt19937 rng(12345);
  constexpr int kKills = 5;
  for (int k = 0; k < kKills; ++k) {
    pid_t pid = fork();
    if (pid == 0) busy_guest(w.region());
    usleep(20000 + rng() % 200000);
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFSIGNALED(st)) << "guest " << k << " exited early with status " << WEXITSTATUS(st);
    // The worker notices the silent heartbeat and frees the session.
    std::string err;
    auto r = Region::map(w.region(), &err);
    ASSERT_TRUE(r && r->validate(&err)) << err;
    int waited = 0;
    while (r->header()->attached_session.load() != 0 && waited < 5000) {
      usleep(10000);
      waited += 10;
    }
    ASSERT_EQ(r->header()->attached_session.load(), 0u) << "dead guest " << k << " was never reclaimed";
  }
  const std::string mid = w.stats_now();
  EXPECT_EQ(stat_of(mid, "sessions_lost"), uint64_t(kKills)) << mid;
  EXPECT_EQ(stat_of(mid, "allocations"), 0u) << "every allocation of every dead guest was freed: " << mid;
  {
    // A new guest attaches and works normally.
    auto c = w.attach();
    uint64_t d = 0;
    ASSERT_EQ(c->malloc(&d, 4096), Status::kSuccess);
    std::vector<uint8_t> in(4096, 0x5a), out(4096);
    ASSERT_EQ(c->memcpy_h2d(d, in.data(), in.size()), Status::kSuccess);
    ASSERT_EQ(c->memcpy_d2h(out.data(), d, out.size()), Status::kSuccess);
    EXPECT_EQ(in, out);
  }
  const std::string log = w.stop();
  EXPECT_EQ(stat_of(log, "sessions_lost"), uint64_t(kKills)) << log;
  EXPECT_EQ(stat_of(log, "sessions"), uint64_t(kKills + 1)) << log;
}

TEST(Peers, SecondLiveGuestIsRefused) {
  WorkerProcess w;
  auto c = w.attach();
  std::string err;
  auto c2 = Client::attach(w.region(), &err);
  EXPECT_EQ(c2, nullptr);
  EXPECT_NE(err.find("in use by another live guest process"), std::string::npos) << err;
  EXPECT_NE(err.find("--sessions 2"), std::string::npos) << err;
  EXPECT_EQ(c->null_call(), Status::kSuccess);
}

}  // namespace
}  // namespace ordo::test

// The program tests/vm/vm_test.sh boots inside a QEMU guest. It attaches to the
// ivshmem BAR (ORDO_REGION, default "ivshmem") and runs the ordering scenarios,
// the randomized model check and two measurements against the worker on the
// host, printing one "ordo-vm:" line per check and a final RESULT line.
//   ordo-vm-guest [--quick]     checks (quick: fewer iterations)
//   ordo-vm-guest --hostile     writes garbage into the region, then dies
//   ... --idle N                also N sync calls, each after 50 ms of idling (the
//                               worker sleeps; only a doorbell wakes it at once)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "guest/testing.h"
#include "ordo/client.h"
#include "ordo/ops.h"
#include "ordo/sim.h"
#include "scenarios.h"
#include "transport/reply_slot.h"
#include "transport/ring.h"

using namespace ordo;
using Clock = std::chrono::steady_clock;

namespace {

bool g_pass = true;

void report(const char* what, bool good, const std::string& detail) {
  std::printf("ordo-vm: %-28s %s  %s\n", what, good ? "ok  " : "FAIL", detail.c_str());
  std::fflush(stdout);
  g_pass &= good;
}

// A hostile guest: scribbles entries, laps and slot requests, then exits
// without detaching. The worker must reject it all, keep serving other VMs,
// and reclaim this session when the heartbeat stops.
int hostile(Client& c) {
  Region& r = guest::region_of(c);
  const Layout& l = r.layout();
  std::mt19937_64 rng(42);
  std::vector<uint64_t> tails(l.ring_count);
  for (int round = 0; round < 2000; ++round) {
    const uint32_t ring = rng() % l.ring_count;
    Entry e;
    for (auto* p = reinterpret_cast<uint64_t*>(&e); p < reinterpret_cast<uint64_t*>(&e + 1); ++p) *p = rng();
    if (round % 3 == 0) e.op = uint16_t(rng() % kOpCount), e.edge_count = uint8_t(rng() % 6);
    const uint64_t t = tails[ring]++;
    Entry* at = &r.entries(ring)[t & (l.ring_capacity - 1)];
    publish_entry(at, e, t, l.ring_capacity);
    if (round % 50 == 0) entry_word(at).store(rng());  // and now and then a lap that is not its position's
    r.header()->ring_open[ring / 64].store(rng());
    const uint32_t slot = uint32_t(rng() % l.slot_count);
    ReplySlot& s = r.slot(slot);
    write_request(s, e, s.request.seq.load() + 1);
    if (round % 2) post_slot(r.header(), slot);
    else r.header()->slot_posted[rng() % (kMaxSlots / 64)].store(rng());
  }
  std::printf("ordo-vm: hostile guest wrote 2000 garbage entries and dies now\n");
  std::fflush(stdout);
  _exit(0);  // no detach: the worker must notice the silent heartbeat
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool quick = mode == "--quick";
  int idle_calls = 0;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--idle") == 0) idle_calls = std::atoi(argv[i + 1]);
  const char* spec = std::getenv("ORDO_REGION");
  std::string err;
  const auto t0 = Clock::now();
  auto c = Client::attach(spec && *spec ? spec : "ivshmem", &err);
  if (!c) {
    std::printf("ordo-vm: attach failed: %s\nordo-vm: RESULT FAIL\n", err.c_str());
    return 1;
  }
  report("attach", true,
         guest::region_of(*c).path() + ", " + std::to_string(c->layout().region_size >> 20) + " MiB, " +
             std::to_string(std::chrono::duration<double, std::milli>(Clock::now() - t0).count()) + " ms");
  if (mode == "--hostile") return hostile(*c);

  const int n = quick ? 5 : 30;
  {
    scenario::Problems p;
    const int v = scenario::seed_violations(*c, n, p);
    report("seed scenario", v == 0 && p.empty(), std::to_string(v) + " of " + std::to_string(n) + " runs violated " + p.first());
  }
  if (!quick) {
    scenario::Problems p;
    const int v = scenario::legacy_violations(*c, 15, false, p) + scenario::legacy_violations(*c, 15, true, p);
    report("legacy default stream", v == 0 && p.empty(), std::to_string(v) + " of 30 runs violated " + p.first());
    const int rr = scenario::rerecord_violations(*c, 20, p);
    report("event re-record", rr == 0 && p.empty(), std::to_string(rr) + " of 20 runs violated " + p.first());
    size_t stamps = 0, bad = 0;
    scenario::ModelProgram prog;
    prog.phases = 12;
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      auto r = scenario::run_model(*c, seed, p, prog);
      stamps += r.stamps;
      bad += r.violations;
    }
    report("randomized model check", bad == 0 && p.empty(),
           std::to_string(bad) + " violations over " + std::to_string(stamps) + " kernels " + p.first());
  }
  {
    const int calls = quick ? 200 : 2000;
    for (int i = 0; i < 50; ++i) c->null_call();
    const auto a = Clock::now();
    bool good = true;
    for (int i = 0; i < calls; ++i) good &= ok(c->null_call());
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - a).count() / calls;
    report("sync round trip", good, std::to_string(us) + " us per null call (TCG guest)");
  }
  {
    uint32_t k = 0;
    bool good = ok(c->kernel_lookup("ordo_noop", &k));
    Stream s;
    good &= ok(c->stream_create(&s, kStreamNonBlocking));
    const int calls = quick ? 2000 : 20000;
    const auto a = Clock::now();
    for (int i = 0; i < calls && good; ++i) good &= ok(c->launch(k, {1}, {1}, nullptr, 0, s));
    good &= ok(c->stream_synchronize(s));
    const double secs = std::chrono::duration<double>(Clock::now() - a).count();
    report("async throughput", good, std::to_string(int(calls / secs)) + " launches/s (TCG guest)");
  }
  if (idle_calls > 0) {
    std::vector<double> us;
    bool good = true;
    for (int i = 0; i < idle_calls; ++i) {
      usleep(50000);
      const auto a = Clock::now();
      good &= ok(c->null_call());
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
    }
    std::sort(us.begin(), us.end());
    report("sync call after idle", good,
           "median " + std::to_string(int(us[us.size() / 2])) + " us, max " + std::to_string(int(us.back())) +
               " us over " + std::to_string(idle_calls) + " calls (TCG guest)");
  }
  std::printf("ordo-vm: RESULT %s\n", g_pass ? "PASS" : "FAIL");
  return g_pass ? 0 : 1;
}

// ordo-demo: a guest program that shows what ordo does, step by step.
// Run it against a worker: ORDO_REGION=/dev/shm/ordo-x build/src/guest/ordo-demo
// (scripts/demo.sh starts the worker and runs it for you).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ordo/client.h"
#include "ordo/layout.h"
#include "ordo/sim.h"
#include "ordo/status.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Prints "FAIL" for a failed call and returns false, so steps read as a chain of checks.
bool check(ordo::Status s, const char* what) {
  if (ordo::ok(s)) return true;
  const std::string name(ordo::status_name(s));
  std::printf("  FAIL  %s: %s (%d)\n", what, name.c_str(), int(s));
  return false;
}
#define CHECK(call)                      \
  do {                                   \
    if (!check((call), #call)) return false; \
  } while (0)

void report(bool pass, const char* step, double ms, const std::string& detail) {
  std::printf("%s  %-28s %9.1f ms  %s\n", pass ? "PASS" : "FAIL", step, ms, detail.c_str());
  std::fflush(stdout);
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

// (1) c = a + b on 1M floats: pageable H2D copies, a kernel launch, a D2H copy back.
bool vector_add(ordo::Client& c) {
  const auto t0 = Clock::now();
  constexpr uint64_t n = 1u << 20;
  constexpr uint64_t bytes = n * sizeof(float);
  uint32_t vec_add = 0;
  CHECK(c.kernel_lookup("ordo_vec_add", &vec_add));
  std::vector<float> a(n), b(n), out(n, -1.0f);
  for (uint64_t i = 0; i < n; ++i) {
    a[i] = float(i);
    b[i] = float(2 * (i % 1000)) + 0.5f;
  }
  uint64_t da = 0, db = 0, dc = 0;
  CHECK(c.malloc(&da, bytes));
  CHECK(c.malloc(&db, bytes));
  CHECK(c.malloc(&dc, bytes));
  ordo::Stream s;
  CHECK(c.stream_create(&s, ordo::kStreamNonBlocking));
  CHECK(c.memcpy_h2d_async(da, a.data(), bytes, s));
  CHECK(c.memcpy_h2d_async(db, b.data(), bytes, s));
  ordo::sim::VecAddArgs args{da, db, dc, n};
  CHECK(c.launch(vec_add, {uint32_t(n / 256)}, {256}, &args, sizeof args, s));
  CHECK(c.memcpy_d2h_async(out.data(), dc, bytes, s));  // pageable destination: returns when done
  CHECK(c.stream_synchronize(s));
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += out[i] != a[i] + b[i];
  CHECK(c.stream_destroy(s));
  CHECK(c.free(da));
  CHECK(c.free(db));
  CHECK(c.free(dc));
  report(bad == 0, "vector add (1M floats)", ms_since(t0),
         bad == 0 ? fmt("c[i] == a[i] + b[i] for all %.0f elements; c[12345] = %.1f", double(n), out[12345])
                  : fmt("%.0f of %.0f elements wrong", double(bad), double(n)));
  return bad == 0;
}

// After the race of (2): OUT must hold the old X, and X the new data.
bool ordering_verdict(const std::vector<uint32_t>& out, const std::vector<uint32_t>& x_now,
                      const std::vector<uint32_t>& old_x, const std::vector<uint32_t>& new_x, std::string* detail) {
  const bool out_old = out == old_x;
  if (out_old && x_now == new_x) {
    *detail = "OUT holds the old X";
    return true;
  }
  if (out == new_x) {
    *detail = "OUT holds the NEW X: the copy on S2 overtook the kernel on S (ordering violated)";
  } else {
    *detail = out_old ? "OUT is right but X does not hold the new data" : "OUT holds neither the old nor the new X";
  }
  return false;
}

// (2) Cross-thread ordering. Thread A launches a slow kernel on S that reads X
// late (after 20 ms) and returns at once. Thread B, after A has returned, records
// an event on S, makes S2 wait for it and overwrites X from S2. The event edge
// must hold B's copy back until A's kernel has read X: OUT must hold the OLD X.
bool ordering(ordo::Client& c) {
  const auto t0 = Clock::now();
  constexpr uint32_t kSleepUs = 20000;
  constexpr uint64_t count = 64 * 1024;
  constexpr uint64_t bytes = count * sizeof(uint32_t);
  uint32_t slow_copy = 0;
  CHECK(c.kernel_lookup("ordo_slow_copy", &slow_copy));
  std::vector<uint32_t> old_x(count), new_x(count), out(count, 0);
  for (uint64_t i = 0; i < count; ++i) {
    old_x[i] = 0x01d00000u + uint32_t(i);
    new_x[i] = 0x0e500000u + uint32_t(i);
  }
  uint64_t x = 0, dout = 0;
  CHECK(c.malloc(&x, bytes));
  CHECK(c.malloc(&dout, bytes));
  CHECK(c.memcpy_h2d(x, old_x.data(), bytes));
  CHECK(c.memset_async(dout, 0, bytes, ordo::kLegacyStream));
  CHECK(c.device_synchronize());
  ordo::Stream s, s2;
  CHECK(c.stream_create(&s, ordo::kStreamNonBlocking));
  CHECK(c.stream_create(&s2, ordo::kStreamNonBlocking));
  ordo::Event ev;
  CHECK(c.event_create(&ev));

  std::mutex mu;
  std::condition_variable cv;
  bool a_returned = false;
  ordo::Status a_status = ordo::Status::kSuccess;
  ordo::Status b_status[3] = {};
  double a_launch_us = 0, b_done_ms = 0;
  const auto start = Clock::now();
  std::thread thread_a([&] {
    ordo::sim::SlowCopyArgs args{dout, x, bytes, kSleepUs, 0};
    const auto t = Clock::now();
    const ordo::Status st = c.launch(slow_copy, {1}, {1}, &args, sizeof args, s);
    a_launch_us = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
    std::lock_guard lock(mu);
    a_status = st;
    a_returned = true;
    cv.notify_one();
  });
  std::thread thread_b([&] {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return a_returned; });
    }
    b_status[0] = c.event_record(ev, s);
    b_status[1] = c.stream_wait_event(s2, ev);
    b_status[2] = c.memcpy_h2d_async(x, new_x.data(), bytes, s2);
    if (ordo::ok(c.stream_synchronize(s2))) b_done_ms = ms_since(start);
  });
  thread_a.join();
  thread_b.join();
  CHECK(a_status);
  CHECK(b_status[0]);
  CHECK(b_status[1]);
  CHECK(b_status[2]);
  CHECK(c.stream_synchronize(s));
  CHECK(c.stream_synchronize(s2));
  CHECK(c.memcpy_d2h(out.data(), dout, bytes));
  std::vector<uint32_t> x_now(count, 0);
  CHECK(c.memcpy_d2h(x_now.data(), x, bytes));
  std::string detail;
  const bool pass = ordering_verdict(out, x_now, old_x, new_x, &detail);
  if (pass)
    detail += fmt(": launch returned in %.0f us, S2's copy waited %.1f ms for the event", a_launch_us, b_done_ms);
  report(pass, "cross-thread event ordering", ms_since(t0), detail);
  CHECK(c.event_destroy(ev));
  CHECK(c.stream_destroy(s));
  CHECK(c.stream_destroy(s2));
  CHECK(c.free(x));
  CHECK(c.free(dout));
  return pass;
}

void progress(const char* what, uint64_t done, uint64_t total, double secs, bool tty, bool last) {
  const double mib = double(done) / (1 << 20);
  const double rate = secs > 0 ? mib * 1.048576 / secs : 0;  // MB/s (10^6 bytes)
  if (tty) {
    std::fprintf(stderr, "\r  %s %5.1f / %.0f MiB  %7.0f MB/s%s", what, mib, double(total) / (1 << 20), rate,
                 last ? "\n" : "");
  } else if (last) {
    std::fprintf(stderr, "  %s %.0f MiB in %.1f ms: %.0f MB/s\n", what, mib, secs * 1e3, rate);
  }
}

// (3) A 64 MiB copy in 1 MiB chunks from pageable memory: every byte goes
// through staging in the shared region (blocks of the pinned heap, a chunk's
// quarters in flight while the next is filled). Then back again.
bool large_copy(ordo::Client& c) {
  const auto t0 = Clock::now();
  constexpr uint64_t total = 64u << 20, chunk = 1u << 20;
  const bool tty = isatty(2);
  std::vector<uint8_t> src(total), dst(total, 0);
  for (uint64_t i = 0; i < total; ++i) src[i] = uint8_t(i * 131 + (i >> 12));
  uint64_t d = 0;
  CHECK(c.malloc(&d, total));
  ordo::Stream s;
  CHECK(c.stream_create(&s, ordo::kStreamNonBlocking));
  // Written once first, as a program's buffers are before they are reused:
  // the sim maps device memory on first touch, and faulting in 64 MiB would
  // otherwise be most of the H2D time.
  CHECK(c.memset_async(d, 0, total, s));
  CHECK(c.stream_synchronize(s));

  auto t = Clock::now();
  for (uint64_t done = 0; done < total; done += chunk) {
    CHECK(c.memcpy_h2d_async(d + done, src.data() + done, chunk, s));
    progress("H2D", done + chunk, total, std::chrono::duration<double>(Clock::now() - t).count(), tty, false);
  }
  CHECK(c.stream_synchronize(s));
  const double h2d_s = std::chrono::duration<double>(Clock::now() - t).count();
  progress("H2D", total, total, h2d_s, tty, true);

  t = Clock::now();
  for (uint64_t done = 0; done < total; done += chunk) {
    CHECK(c.memcpy_d2h_async(dst.data() + done, d + done, chunk, s));  // pageable: returns when done
    progress("D2H", done + chunk, total, std::chrono::duration<double>(Clock::now() - t).count(), tty, false);
  }
  CHECK(c.stream_synchronize(s));
  const double d2h_s = std::chrono::duration<double>(Clock::now() - t).count();
  progress("D2H", total, total, d2h_s, tty, true);

  const bool pass = src == dst;
  CHECK(c.stream_destroy(s));
  CHECK(c.free(d));
  const double mb = double(total) / 1e6;
  report(pass, "64 MiB copy, 1 MiB chunks", ms_since(t0),
         pass ? fmt("H2D %.0f MB/s, D2H %.0f MB/s, data intact", mb / h2d_s, mb / d2h_s)
              : std::string("data read back differs from data written"));
  return pass;
}

// (4) The cost of one synchronous call: guest -> worker -> guest.
bool round_trip(ordo::Client& c) {
  const auto t0 = Clock::now();
  constexpr int kCalls = 10000;
  for (int i = 0; i < 100; ++i) CHECK(c.null_call());  // warm up
  std::vector<double> us(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    const auto t = Clock::now();
    CHECK(c.null_call());
    us[i] = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  }
  double sum = 0;
  for (double v : us) sum += v;
  std::sort(us.begin(), us.end());
  report(true, "sync round trip (null_call)", ms_since(t0),
         fmt("%.0f calls: mean %.2f us, median %.2f us", double(kCalls), sum / kCalls, us[kCalls / 2]) +
             fmt(", p99 %.2f us", us[kCalls * 99 / 100]));
  return true;
}

}  // namespace

int main() {
  std::string err;
  auto client = ordo::Client::attach_from_env(&err);
  if (!client) {
    std::fprintf(stderr, "ordo-demo: cannot attach to the worker: %s\n", err.c_str());
    return 1;
  }
  const char* region = std::getenv("ORDO_REGION");
  std::printf("ordo-demo: attached to %s (%u rings, %llu KiB staging per ring)\n", region ? region : "?",
              client->layout().ring_count, (unsigned long long)(client->layout().staging_per_ring >> 10));
  std::fflush(stdout);
  int failed = 0;
  failed += !vector_add(*client);
  failed += !ordering(*client);
  failed += !large_copy(*client);
  failed += !round_trip(*client);
  if (failed == 0) {
    std::printf("ordo-demo: all 4 steps passed\n");
    return 0;
  }
  std::printf("ordo-demo: %d of 4 steps FAILED\n", failed);
  return 1;
}

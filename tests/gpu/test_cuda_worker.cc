// The whole path on a GPU: an ordo::Client against `ordo-worker --backend cuda`
// (a separate process, as in production): built-in and guest-module kernels,
// pageable and pinned (region heap, registered with CUDA) copies, events,
// device properties, and the worker's own checks. Exits 77 (skipped) without a device.
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu.h"
#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;

TEST(CudaWorker, VecAddWithPageableAndPinnedCopies) {
  WorkerProcess w({"--backend", "cuda"}, "256M");
  auto c = w.attach();
  const uint64_t n = 4 << 20;  // 16 MiB per vector: many staging chunks
  std::vector<float> a(n), b(n), out(n, -1.0f);
  for (uint64_t i = 0; i < n; ++i) {
    a[i] = float(i % 1000);
    b[i] = 0.25f * float(i % 77);
  }
  uint64_t da = 0, db = 0, dc = 0;
  ASSERT_EQ(c->malloc(&da, n * 4), Status::kSuccess);
  ASSERT_EQ(c->malloc(&db, n * 4), Status::kSuccess);
  ASSERT_EQ(c->malloc(&dc, n * 4), Status::kSuccess);
  ordo::Stream s;
  ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  ASSERT_EQ(c->memcpy_h2d_async(da, a.data(), n * 4, s), Status::kSuccess);  // pageable: staged
  void* pinned = nullptr;
  ASSERT_EQ(c->malloc_host(&pinned, n * 4), Status::kSuccess);  // the region's heap: DMA in place
  std::memcpy(pinned, b.data(), n * 4);
  ASSERT_EQ(c->memcpy_h2d_async(db, pinned, n * 4, s), Status::kSuccess);
  uint32_t vec_add = 0;
  ASSERT_EQ(c->kernel_lookup("ordo_vec_add", &vec_add), Status::kSuccess);
  sim::VecAddArgs args{da, db, dc, n};
  ASSERT_EQ(c->launch(vec_add, {256}, {256}, &args, sizeof args, s), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h_async(out.data(), dc, n * 4, s), Status::kSuccess);
  ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
  std::memset(pinned, 0, n * 4);
  ASSERT_EQ(c->memcpy_d2h_async(pinned, dc, n * 4, s), Status::kSuccess);
  ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(std::memcmp(pinned, out.data(), n * 4), 0);
  EXPECT_EQ(c->free_host(pinned), Status::kSuccess);
  EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
  EXPECT_EQ(c->free(da), Status::kSuccess);
}

TEST(CudaWorker, GuestModuleKernelAndDeviceInfo) {
  WorkerProcess w({"--backend", "cuda"}, "256M");
  auto c = w.attach();
  DeviceInfo info{};
  ASSERT_EQ(c->device_info(&info), Status::kSuccess);
  EXPECT_GE(info.major, 7);
  EXPECT_GT(std::strlen(info.name), 0u);
  const auto img = read_image("ORDO_TEST_FATBIN");
  uint32_t m = 0, fill = 0;
  ASSERT_EQ(c->module_load(img.data(), img.size(), &m), Status::kSuccess);
  ASSERT_EQ(c->kernel_lookup(m, "fill", &fill), Status::kSuccess);
  uint32_t nope = 0;
  EXPECT_EQ(c->kernel_lookup(m, "no_such_kernel", &nope), Status::kInvalidDeviceFunction);
  const uint64_t n = 1 << 16;
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, n * 4), Status::kSuccess);
  struct {
    uint64_t p;
    uint32_t value, pad;
    uint64_t n;
  } args{d, 0x5EED, 0, n};
  ASSERT_EQ(c->launch(fill, {32}, {256}, &args, sizeof args, kLegacyStream), Status::kSuccess);
  std::vector<uint32_t> out(n);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, n * 4), Status::kSuccess);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 0x5EEDu) << i;
  EXPECT_EQ(c->module_unload(m), Status::kSuccess);
  // A launch through the unloaded module's kernel fails, reported like any async error.
  const Status issued = c->launch(fill, {1}, {1}, &args, sizeof args, kLegacyStream);
  const Status synced = c->stream_synchronize(kLegacyStream);
  EXPECT_TRUE(issued == Status::kInvalidDeviceFunction || synced == Status::kInvalidDeviceFunction)
      << int(issued) << " " << int(synced);
}

TEST(CudaWorker, EventSynchronizeWhileTheKernelRuns) {
  WorkerProcess w({"--backend", "cuda"}, "256M");
  auto c = w.attach();
  uint64_t src = 0, dst = 0;
  ASSERT_EQ(c->malloc(&src, 4096), Status::kSuccess);
  ASSERT_EQ(c->malloc(&dst, 4096), Status::kSuccess);
  ordo::Stream s;
  ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  Event start, end;
  ASSERT_EQ(c->event_create(&start), Status::kSuccess);
  ASSERT_EQ(c->event_create(&end), Status::kSuccess);
  uint32_t slow = 0;
  ASSERT_EQ(c->kernel_lookup("ordo_slow_copy", &slow), Status::kSuccess);
  ASSERT_EQ(c->event_record(start, s), Status::kSuccess);
  sim::SlowCopyArgs args{dst, src, 4096, 200000, 0};  // 200 ms
  ASSERT_EQ(c->launch(slow, {1}, {64}, &args, sizeof args, s), Status::kSuccess);
  ASSERT_EQ(c->event_record(end, s), Status::kSuccess);
  EXPECT_EQ(c->event_query(end), Status::kNotReady);
  // Another guest thread's calls are served while this one waits on the GPU.
  std::thread other([&] {
    for (int i = 0; i < 100; ++i) ASSERT_EQ(c->null_call(), Status::kSuccess);
  });
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(c->event_synchronize(end), Status::kSuccess);
  other.join();
  EXPECT_GT(std::chrono::steady_clock::now() - t0, 100ms);
  float ms = 0;
  ASSERT_EQ(c->event_elapsed(&ms, start, end), Status::kSuccess);
  EXPECT_GT(ms, 150.0f);
  EXPECT_EQ(c->event_query(end), Status::kSuccess);
}

TEST(CudaWorker, CopiesOutsideTheGuestsAllocationsAreRejected) {
  WorkerProcess w({"--backend", "cuda"}, "256M");
  auto c = w.attach();
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 4096), Status::kSuccess);
  uint32_t x[16] = {};
  const Status issued = c->memcpy_h2d_async(d + 4090, x, sizeof x, kLegacyStream);
  const Status synced = c->stream_synchronize(kLegacyStream);
  EXPECT_TRUE(issued == Status::kInvalidDevicePointer || synced == Status::kInvalidDevicePointer)
      << int(issued) << " " << int(synced);
  EXPECT_EQ(c->free(d + 16), Status::kInvalidDevicePointer);
  // Still serving this guest.
  ASSERT_EQ(c->memcpy_h2d(d, x, sizeof x), Status::kSuccess);
}

}  // namespace
}  // namespace ordo::test

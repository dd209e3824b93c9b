// The guest library against a real worker: the device's memory and copies
// into and out of it (pageable ones staged through the ring's window or the
// pinned heap, pinned ones zero-copy), and the device it describes. The rest
// of the guest API against a worker: kernels and modules in
// test_client_kernels.cc; streams, events and errors in test_client_streams.cc;
// the worker's sleep and wake-ups in test_client_idle.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

TEST(Client, MallocCopyRoundTrip) {
  InProcessWorker w;
  auto c = w.attach();
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 4096), Status::kSuccess);
  std::vector<uint8_t> in(4096), out(4096, 0);
  std::iota(in.begin(), in.end(), 7);
  ASSERT_EQ(c->memcpy_h2d(d, in.data(), in.size()), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, out.size()), Status::kSuccess);
  EXPECT_EQ(in, out);
  EXPECT_EQ(c->free(d), Status::kSuccess);
  EXPECT_EQ(c->free(d), Status::kInvalidDevicePointer);
}

TEST(Client, LargePageableCopiesGoThroughStagingInChunks) {
  InProcessWorker w;
  auto c = w.attach();
  const uint64_t n = 3 * c->layout().staging_per_ring + 12345;  // several windows, odd size
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, n), Status::kSuccess);
  std::vector<uint8_t> in(n), out(n, 0);
  for (uint64_t i = 0; i < n; ++i) in[i] = uint8_t(i * 131 + (i >> 9));
  Stream s;
  ASSERT_EQ(c->stream_create(&s), Status::kSuccess);
  ASSERT_EQ(c->memcpy_h2d_async(d, in.data(), n, s), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h_async(out.data(), d, n, s), Status::kSuccess);  // pageable: returns when done
  EXPECT_EQ(in, out);
  EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
}

// Pageable copies are split into chunks that are in flight together (D2H: the
// guest copies chunk k out while later chunks land in staging). Every size
// around the chunk and window boundaries, from two threads whose streams may
// share a ring, must arrive byte for byte.
void pageable_copies_of_every_size(uint64_t region_size) {
  InProcessWorker w({}, region_size);
  auto c = w.attach();
  const uint64_t win = c->layout().staging_per_ring;
  const std::vector<uint64_t> sizes = {1, 15, 4096, 65535, 65537, win / 4 - 1, win / 4 + 1, win / 2,
                                       win + 4097, 3 * win + 12345};
  auto run = [&](uint32_t salt) {
    Stream s;
    ASSERT_EQ(c->stream_create(&s, salt % 2 ? kStreamNonBlocking : 0), Status::kSuccess);
    for (int round = 0; round < 3; ++round)
    for (uint64_t n : sizes) {
      uint64_t d = 0;
      ASSERT_EQ(c->malloc(&d, n), Status::kSuccess);
      std::vector<uint8_t> in(n), out(n, 0);
      for (uint64_t i = 0; i < n; ++i) in[i] = uint8_t(i * 131 + (i >> 9) + salt + round);
      ASSERT_EQ(c->memcpy_h2d_async(d, in.data(), n, s), Status::kSuccess);
      ASSERT_EQ(c->memcpy_d2h_async(out.data(), d, n, s), Status::kSuccess);
      ASSERT_EQ(in, out) << "size " << n << ", thread " << salt << ", round " << round;
      ASSERT_EQ(c->free(d), Status::kSuccess);
    }
    EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
  };
  std::thread other(run, 1u);
  run(2u);
  other.join();
}
TEST(Client, PageableCopiesOfEverySizeArriveIntact) { pageable_copies_of_every_size(16u << 20); }

// Copies of a megabyte and more stage through blocks of the pinned heap (the
// staging pool) in chunks of up to 1 MiB instead of the ring's window (64 KiB
// chunks at 64 MiB). The source is the caller's again on return; the
// heap's blocks go back once the device copies completed.
TEST(Client, LargePageableCopiesStageThroughThePinnedHeap) {
  InProcessWorker w({}, 64u << 20);
  auto c = w.attach();
  Stream s;
  ASSERT_EQ(c->stream_create(&s), Status::kSuccess);
  const auto memcpys = [&] { return w.worker().stats().ops[size_t(Op::Memcpy)]; };
  for (uint64_t n : {uint64_t{1} << 20, (uint64_t{1} << 20) + 1, (uint64_t{4} << 20) - 1, (uint64_t{16} << 20) + 12345}) {
    uint64_t d = 0;
    ASSERT_EQ(c->malloc(&d, n), Status::kSuccess);
    std::vector<uint8_t> in(n), want, out(n, 0);
    for (uint64_t i = 0; i < n; ++i) in[i] = uint8_t(i * 131 + (i >> 9) + n);
    want = in;
    const uint64_t before = memcpys();
    ASSERT_EQ(c->memcpy_h2d_async(d, in.data(), n, s), Status::kSuccess);
    std::fill(in.begin(), in.end(), 0xee);  // the copy consumed it
    ASSERT_EQ(c->memcpy_d2h_async(out.data(), d, n, s), Status::kSuccess);
    ASSERT_EQ(want, out) << "size " << n;
    // An eighth of the copy, 256 KiB to 1 MiB: at most max(8, n / 1 MiB) + 1
    // chunks each way; the window's 64 KiB chunks would take twice as many and more.
    EXPECT_LE(memcpys() - before, 2 * (std::max<uint64_t>(8, (n + (1u << 20) - 1) >> 20) + 1)) << "size " << n;
    ASSERT_EQ(c->free(d), Status::kSuccess);
  }
  // A heap the program filled: the window carries the copy instead.
  void* hog = nullptr;
  ASSERT_EQ(c->malloc_host(&hog, c->layout().heap_size - (512u << 10)), Status::kSuccess);
  const uint64_t n = uint64_t{4} << 20;
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, n), Status::kSuccess);
  std::vector<uint8_t> in(n, 0x5a), out(n, 0);
  ASSERT_EQ(c->memcpy_h2d_async(d, in.data(), n, s), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h_async(out.data(), d, n, s), Status::kSuccess);
  EXPECT_EQ(in, out);
  ASSERT_EQ(c->free_host(hog), Status::kSuccess);
  // Blocks an unfinished copy still reads are the program's again once it
  // finished: malloc_host of (nearly) the whole heap waits for them.
  uint64_t scratch = 0;
  ASSERT_EQ(c->malloc(&scratch, 8), Status::kSuccess);
  const sim::SlowCopyArgs slow{scratch, scratch, 0, 300000, 0};  // holds the stream 300 ms
  ASSERT_EQ(c->launch(kernel(*c, "ordo_slow_copy"), {1}, {1}, &slow, sizeof slow, s), Status::kSuccess);
  std::vector<uint8_t> big(uint64_t{16} << 20, 0x11);
  ASSERT_EQ(c->memcpy_h2d_async(d, big.data(), n, s), Status::kSuccess);  // returns at once; its blocks stay busy
  ASSERT_EQ(c->malloc_host(&hog, c->layout().heap_size - (512u << 10)), Status::kSuccess);
  ASSERT_EQ(c->free_host(hog), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h_async(out.data(), d, n, s), Status::kSuccess);
  EXPECT_EQ(out[n - 1], 0x11);
  EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
}
// A 1 MiB region has 4 KiB windows: chunks are a kilobyte.
TEST(Client, PageableCopiesOfEverySizeArriveIntactThroughASmallWindow) { pageable_copies_of_every_size(1u << 20); }

TEST(Client, PinnedMemoryIsZeroCopy) {
  InProcessWorker w;
  auto c = w.attach();
  void* p = nullptr;
  ASSERT_EQ(c->malloc_host(&p, 1 << 16), Status::kSuccess);
  ASSERT_TRUE(c->is_pinned(p, 1 << 16));
  auto* h = static_cast<uint32_t*>(p);
  for (uint32_t i = 0; i < (1 << 14); ++i) h[i] = i * 3;
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 1 << 16), Status::kSuccess);
  Stream s;
  ASSERT_EQ(c->stream_create(&s), Status::kSuccess);
  ASSERT_EQ(c->memcpy_h2d_async(d, p, 1 << 16, s), Status::kSuccess);
  ASSERT_EQ(c->memset_async(d, 0, 4, s), Status::kSuccess);
  ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);  // only now may the buffer change (as in CUDA)
  std::memset(p, 0xee, 1 << 16);
  ASSERT_EQ(c->memcpy_d2h_async(p, d, 1 << 16, s), Status::kSuccess);
  ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(h[0], 0u) << "the memset after the copy";
  for (uint32_t i = 1; i < (1 << 14); ++i) ASSERT_EQ(h[i], i * 3) << i;
  EXPECT_EQ(c->free_host(p), Status::kSuccess);
  EXPECT_EQ(c->free(d), Status::kSuccess);
}

TEST(Client, DeviceInfoDescribesTheSimDevice) {
  InProcessWorker w;
  auto c = w.attach();
  DeviceInfo d{};
  ASSERT_EQ(c->device_info(&d), Status::kSuccess);
  EXPECT_STREQ(d.name, "ordo sim device 0");
  EXPECT_EQ(d.warp_size, 32);
  EXPECT_EQ(d.max_threads_per_block, 1024);
  EXPECT_GT(d.total_global_mem, uint64_t{1} << 30);
  EXPECT_EQ(c->device_info(nullptr), Status::kInvalidValue);
}

}  // namespace
}  // namespace ordo::test

// The guest library against a real worker: data paths, errors, backpressure.
#include <gtest/gtest.h>

#include <unistd.h>

#include <barrier>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "guest/testing.h"
#include "harness.h"
#include "ordo/sim.h"
#include "transport/launch_shape.h"

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

TEST(Client, KernelLaunchFillsMemory) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t fill = kernel(*c, "ordo_fill_u32");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 1024 * 4), Status::kSuccess);
  sim::FillU32Args a{d, 1024, 0xabcd1234u, 0};
  ASSERT_EQ(c->launch(fill, {4}, {256}, &a, sizeof a, kLegacyStream), Status::kSuccess);
  std::vector<uint32_t> out(1024);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, 4096), Status::kSuccess);
  for (uint32_t v : out) ASSERT_EQ(v, 0xabcd1234u);
  // A CUDA launch sends the packed buffer: it ends with the last parameter,
  // without the struct's tail padding (LaunchParams, src/worker/backend.h).
  // The kernel reads it the same.
  a.value = 0x5150u;
  ASSERT_EQ(c->launch(fill, {4}, {256}, &a, offsetof(sim::FillU32Args, pad), kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, 4096), Status::kSuccess);
  for (uint32_t v : out) ASSERT_EQ(v, 0x5150u);
}

// Cluster and cooperative launches (LaunchShape in the entry's flags): a
// cluster that tiles the grid runs the whole grid; a cooperative grid larger
// than the device holds at once fails in stream order with CUDA's error, and
// the stream goes on.
TEST(Client, ClusterAndCooperativeLaunches) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t fill = kernel(*c, "ordo_fill_u32");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 1024 * 4), Status::kSuccess);
  Stream s;
  ASSERT_EQ(c->stream_create(&s), Status::kSuccess);
  std::vector<uint32_t> out(1024);
  uint32_t value = 1;
  for (LaunchShape shape : {LaunchShape{{2, 1, 1}, false}, LaunchShape{{4, 1, 1}, true}, LaunchShape{{1, 1, 1}, true}}) {
    sim::FillU32Args a{d, 1024, ++value, 0};
    ASSERT_EQ(c->launch(fill, {4}, {256}, &a, sizeof a, s, 0, shape.flags()), Status::kSuccess);
    ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
    ASSERT_EQ(c->memcpy_d2h(out.data(), d, 4096), Status::kSuccess);
    for (uint32_t v : out) ASSERT_EQ(v, value);
  }
  sim::FillU32Args a{d, 1024, 99, 0};
  ASSERT_EQ(c->launch(fill, {1u << 20}, {1024}, &a, sizeof a, s, 0, LaunchShape{{1, 1, 1}, true}.flags()),
            Status::kSuccess);
  EXPECT_EQ(c->stream_synchronize(s), Status::kCooperativeLaunchTooLarge);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, 4096), Status::kSuccess);
  for (uint32_t v : out) ASSERT_EQ(v, value) << "the refused launch ran";
  ASSERT_EQ(c->launch(fill, {4}, {256}, &a, sizeof a, s, 0, LaunchShape{{2, 1, 1}, false}.flags()), Status::kSuccess);
  ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, 4096), Status::kSuccess);
  for (uint32_t v : out) ASSERT_EQ(v, 99u);
  EXPECT_EQ(c->stream_destroy(s), Status::kSuccess);
  EXPECT_EQ(c->free(d), Status::kSuccess);
}

// A kernel's attributes (Op::KernelAttributes): the sim's built-ins are host
// code and use nothing of the device; the cuda backend's (the stacked pair)
// are compiled, and use what their cubin says. A kernel id or device the
// session does not have is refused, and the session goes on.
TEST(Client, KernelAttributes) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t fill = kernel(*c, "ordo_fill_u32");
  int32_t a[kKernelAttributeCount];
  std::fill(a, a + kKernelAttributeCount, -7);
  ASSERT_EQ(c->kernel_attributes(fill, 0, a), Status::kSuccess);
  DeviceInfo d{};
  ASSERT_EQ(c->device_info(0, &d), Status::kSuccess);
  EXPECT_GE(a[kKernelNumRegs], 0);
  EXPECT_LE(a[kKernelNumRegs], 255);
  EXPECT_GT(a[kKernelMaxThreadsPerBlock], 0);
  EXPECT_LE(a[kKernelMaxThreadsPerBlock], d.max_threads_per_block);
  if (a[kKernelNumRegs] == 0) {
    EXPECT_EQ(a[kKernelMaxThreadsPerBlock], d.max_threads_per_block) << "no registers, no bound";
  }
  EXPECT_EQ(a[kKernelSharedSizeBytes], 0);
  EXPECT_EQ(a[kKernelBinaryVersion], d.major * 10 + d.minor);
  EXPECT_EQ(a[kKernelMaxDynamicSharedSizeBytes], 48 * 1024);
  EXPECT_EQ(c->kernel_attributes(1u << 30, 0, a), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->kernel_attributes(fill, 9, a), Status::kInvalidDevice);
  EXPECT_EQ(c->kernel_attributes(fill, 0, nullptr), Status::kInvalidValue);
  uint64_t p = 0;
  EXPECT_EQ(c->malloc(&p, 64), Status::kSuccess) << "the session goes on";
  EXPECT_EQ(c->free(p), Status::kSuccess);
}

// Occupancy as the device counts it (Op::KernelOccupancy): blocks per
// multiprocessor and active clusters; cluster sizes CUDA refuses, and
// queries out of range, are errors and the session goes on.
TEST(Client, KernelOccupancy) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t fill = kernel(*c, "ordo_fill_u32");
  DeviceInfo d{};
  ASSERT_EQ(c->device_info(0, &d), Status::kSuccess);
  uint32_t blocks = 0, clusters = 0;
  ASSERT_EQ(c->kernel_occupancy(fill, 0, 256, 0, 0, 0, &blocks), Status::kSuccess);
  EXPECT_GE(blocks, 1u);
  EXPECT_LE(blocks * 256, uint32_t(d.max_threads_per_multiprocessor));
  const LaunchShape pair{{2, 1, 1}, false}, wide{{16, 1, 1}, false};
  ASSERT_EQ(c->kernel_occupancy(fill, 0, 256, 0, pair.flags(), kOccupancyClusters, &clusters), Status::kSuccess);
  EXPECT_GE(clusters, 1u);
  EXPECT_LE(clusters * 2, blocks * uint32_t(d.multi_processor_count));
  EXPECT_EQ(c->kernel_occupancy(fill, 0, 256, 0, wide.flags(), kOccupancyClusters, &clusters),
            Status::kInvalidClusterSize) << "past 8 blocks without the kernel's permission";
  EXPECT_EQ(c->kernel_occupancy(fill, 0, 256, 0, wide.flags(), kOccupancyClusters | kOccupancyNonPortable, &clusters),
            Status::kSuccess);
  // Shared memory: more per block, fewer blocks; more than a block may have
  // (past the opt-in limit), no blocks or the device's refusal.
  uint32_t fewer = 0, none = 7;
  ASSERT_EQ(c->kernel_occupancy(fill, 0, 256, 64 * 1024, 0, 0, &fewer), Status::kSuccess);
  EXPECT_LT(fewer, blocks);
  const Status too_much = c->kernel_occupancy(fill, 0, 256, uint32_t(d.shared_mem_per_multiprocessor), 0, 0, &none);
  EXPECT_TRUE(too_much == Status::kInvalidValue || (too_much == Status::kSuccess && none == 0)) << int(too_much);
  // Out of range: refused by the worker, nothing else changes.
  EXPECT_NE(c->kernel_occupancy(fill, 0, 0, 0, 0, 0, &blocks), Status::kSuccess);
  EXPECT_NE(c->kernel_occupancy(fill, 0, 2048, 0, 0, 0, &blocks), Status::kSuccess);
  EXPECT_NE(c->kernel_occupancy(fill, 0, 256, 0, 1u << 12, 0, &blocks), Status::kSuccess) << "a cooperative shape";
  EXPECT_NE(c->kernel_occupancy(fill, 0, 256, 0, 1u << 13, 0, &blocks), Status::kSuccess) << "a bit no shape sets";
  EXPECT_NE(c->kernel_occupancy(fill, 0, 256, 0, 0, 8, &blocks), Status::kSuccess);
  EXPECT_EQ(c->kernel_occupancy(1u << 30, 0, 256, 0, 0, 0, &blocks), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->kernel_occupancy(fill, 9, 256, 0, 0, 0, &blocks), Status::kInvalidDevice);
  uint64_t p = 0;
  EXPECT_EQ(c->malloc(&p, 64), Status::kSuccess) << "the session goes on";
  EXPECT_EQ(c->free(p), Status::kSuccess);
}

// Mapped pinned memory: a kernel takes a pinned pointer as a device pointer
// and writes the guest's memory through it, with no copy. `c` on the sim.
void kernel_writes_pinned_memory(Client& c) {
  std::string why;
  ASSERT_TRUE(c.pinned_is_mapped(&why)) << why;
  void* p = nullptr;
  ASSERT_EQ(c.malloc_host(&p, 4096), Status::kSuccess);
  std::memset(p, 0, 4096);
  Stream s;
  ASSERT_EQ(c.stream_create(&s), Status::kSuccess);
  const sim::FillU32Args a{uint64_t(uintptr_t(p)) + 64, 512, 0x600dcafeu, 0};
  ASSERT_EQ(c.launch(kernel(c, "ordo_fill_u32"), {2}, {256}, &a, sizeof a, s), Status::kSuccess);
  ASSERT_EQ(c.stream_synchronize(s), Status::kSuccess);
  const auto* h = static_cast<const uint32_t*>(p);
  for (uint32_t i = 0; i < 16; ++i) ASSERT_EQ(h[i], 0u) << i;
  for (uint32_t i = 16; i < 16 + 512; ++i) ASSERT_EQ(h[i], 0x600dcafeu) << i;
  for (uint32_t i = 16 + 512; i < 1024; ++i) ASSERT_EQ(h[i], 0u) << i;
  // Outside the region it is no device memory: the kernel faults, as a GPU would.
  std::vector<uint32_t> heap(16);
  const sim::FillU32Args bad{uint64_t(uintptr_t(heap.data())), 16, 1, 0};
  ASSERT_EQ(c.launch(kernel(c, "ordo_fill_u32"), {1}, {16}, &bad, sizeof bad, s), Status::kSuccess);
  EXPECT_EQ(c.stream_synchronize(s), Status::kIllegalAddress);
}

TEST(Client, KernelsReachPinnedMemoryAtItsHostAddress) {
  if (const char* b = std::getenv("ORDO_TEST_BACKEND"); b && std::string(b) == "cuda") {
    // The stacked pair's cuda backend registers its region through ordo's own
    // libcuda.so.1, which cannot map it for kernels: the session says so.
    InProcessWorker w;
    auto c = w.attach();
    std::string why;
    EXPECT_FALSE(c->pinned_is_mapped(&why));
    EXPECT_NE(why.find("cannot map host memory"), std::string::npos) << why;
    return;
  }
  {
    SCOPED_TRACE("worker in this process: the guest shares its mapping");
    InProcessWorker w;
    auto c = w.attach();
    kernel_writes_pinned_memory(*c);
  }
  {
    SCOPED_TRACE("worker in another process: the guest maps the region at the worker's address");
    WorkerProcess w;
    auto c = w.attach();
    kernel_writes_pinned_memory(*c);
  }
}

TEST(Client, UnknownKernelAndBadHandlesAreErrors) {
  InProcessWorker w;
  auto c = w.attach();
  uint32_t k = 0;
  EXPECT_EQ(c->kernel_lookup("no_such_kernel", &k), Status::kInvalidDeviceFunction);
  EXPECT_EQ(c->stream_synchronize(Stream{5, 77}), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->event_record(Event{12345}, kLegacyStream), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->launch(0, {0}, {1}, nullptr, 0, kLegacyStream), Status::kInvalidConfiguration);
  EXPECT_EQ(c->get_last_error(), Status::kInvalidConfiguration);
  EXPECT_EQ(c->get_last_error(), Status::kSuccess);
}

TEST(Client, ModulesLoadLookUpAndUnload) {
  InProcessWorker w;
  auto c = w.attach();
  // The sim keeps no code: a module's kernels are the registered kernels, by name.
  std::vector<std::byte> image(100000, std::byte{0x5a});
  uint32_t m = 0, m2 = 0, k = 0, k0 = 0;
  ASSERT_EQ(c->module_load(image.data(), image.size(), &m), Status::kSuccess);
  ASSERT_EQ(c->module_load(image.data(), image.size(), &m2), Status::kSuccess);
  EXPECT_NE(m, m2);
  EXPECT_EQ(c->kernel_lookup(m, "ordo_fill_u32", &k), Status::kSuccess);
  EXPECT_EQ(c->kernel_lookup("ordo_fill_u32", &k0), Status::kSuccess);
  EXPECT_EQ(k, k0);
  bool runnable = false;
  EXPECT_EQ(c->kernel_lookup(m, "ordo_fill_u32", &k, &runnable), Status::kSuccess);
  EXPECT_TRUE(runnable);
  // The sim cannot read an image: any other name is taken to be one of the
  // module's kernels that has no host twin. Found, not runnable, and its launch
  // fails in stream order with cudaErrorNoKernelImageForDevice.
  uint32_t missing = 0;
  EXPECT_EQ(c->kernel_lookup(m, "no_such_kernel", &missing, &runnable), Status::kSuccess);
  EXPECT_FALSE(runnable);
  EXPECT_EQ(c->kernel_lookup(0, "no_such_kernel_either", &missing), Status::kInvalidDeviceFunction);
  EXPECT_EQ(c->kernel_lookup(m, "no_such_kernel", &missing), Status::kSuccess);
  EXPECT_EQ(c->launch(missing, {1, 1, 1}, {1, 1, 1}, nullptr, 0, kLegacyStream), Status::kSuccess);
  EXPECT_EQ(c->device_synchronize(), Status::kNoKernelImage);
  EXPECT_EQ(c->device_synchronize(), Status::kSuccess);  // not a fault: the context lives on
  // A device variable (cudaMemcpyToSymbol, cuBLAS's deviceConstants): the sim
  // gives it zeroed memory of the size the guest read from the symbol table,
  // the same address every time, and copies reach it.
  uint64_t var = 0, var_size = 0, again = 0;
  EXPECT_EQ(c->module_global(m2, "deviceConstants", 112, &var, &var_size), Status::kSuccess);
  EXPECT_EQ(var_size, 112u);
  EXPECT_EQ(c->module_global(m2, "deviceConstants", 0, &again, &var_size), Status::kSuccess);
  EXPECT_EQ(again, var);
  EXPECT_EQ(c->module_global(m2, "not_in_the_symbol_table", 0, &again, &var_size), Status::kInvalidDeviceFunction);
  std::vector<uint8_t> in(112), out(112, 0xff);
  for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i * 7);
  EXPECT_EQ(c->memcpy_d2h(out.data(), var, 112), Status::kSuccess);
  EXPECT_EQ(out, std::vector<uint8_t>(112, 0));
  EXPECT_EQ(c->memcpy_h2d(var, in.data(), 112), Status::kSuccess);
  EXPECT_EQ(c->memcpy_d2h(out.data(), var, 112), Status::kSuccess);
  EXPECT_EQ(out, in);
  EXPECT_EQ(c->module_unload(m), Status::kSuccess);
  EXPECT_EQ(c->kernel_lookup(m, "ordo_fill_u32", &k), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->module_unload(m), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->kernel_lookup(m2, "ordo_fill_u32", &k), Status::kSuccess);
  // Nothing, or more than the worker takes, is refused before it is sent.
  EXPECT_EQ(c->module_load(image.data(), 0, &m), Status::kInvalidValue);
  EXPECT_EQ(c->module_load(image.data(), kMaxModuleImage + 1, &m), Status::kInvalidKernelImage);
  // The staging copy went back to the heap: many loads do not exhaust it.
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(c->module_load(image.data(), image.size(), &m), Status::kSuccess) << i;
    ASSERT_EQ(c->module_unload(m), Status::kSuccess);
  }
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

TEST(Client, AsyncErrorReachesTheIssuingThreadsNextCall) {
  InProcessWorker w;
  auto c = w.attach();
  // A copy into memory that was never allocated is accepted by the guest (it
  // cannot know) and rejected by the worker: the error comes back asynchronously,
  // at the latest by this thread's next synchronizing call.
  uint32_t x = 1;
  // The worker may be fast enough that the call itself already sees the error.
  const Status issued = c->memcpy_h2d_async(0xdead0000, &x, sizeof x, kLegacyStream);
  ASSERT_TRUE(issued == Status::kSuccess || issued == Status::kInvalidDevicePointer) << int(issued);
  if (issued == Status::kSuccess) {
    EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kInvalidDevicePointer);
  } else {
    EXPECT_EQ(c->stream_synchronize(kLegacyStream), Status::kSuccess) << "an error is reported once";
  }
  EXPECT_EQ(c->get_last_error(), Status::kInvalidDevicePointer);
  EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  EXPECT_EQ(c->device_synchronize(), Status::kSuccess) << "an error is reported once";
  // The next async call may already see it (the worker is fast) or not yet.
  const Status first = c->memcpy_h2d_async(0xdead0000, &x, sizeof x, kLegacyStream);
  ASSERT_TRUE(first == Status::kSuccess || first == Status::kInvalidDevicePointer) << int(first);
  std::thread([&] { EXPECT_EQ(c->device_synchronize(), Status::kSuccess) << "not this thread's error"; }).join();
  if (first == Status::kSuccess) {
    EXPECT_EQ(c->device_synchronize(), Status::kInvalidDevicePointer);
  }
  EXPECT_EQ(c->peek_last_error(), Status::kInvalidDevicePointer);
}

TEST(Client, EventsQuerySynchronizeAndTime) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t stamp = kernel(*c, "ordo_stamp");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, sizeof(sim::Stamp)), Status::kSuccess);
  Stream s;
  ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  Event a, b;
  ASSERT_EQ(c->event_create(&a), Status::kSuccess);
  ASSERT_EQ(c->event_create(&b), Status::kSuccess);
  ASSERT_EQ(c->event_record(a, s), Status::kSuccess);
  sim::StampArgs args{d, 0, 30000};
  ASSERT_EQ(c->launch(stamp, {1}, {1}, &args, sizeof args, s), Status::kSuccess);
  ASSERT_EQ(c->event_record(b, s), Status::kSuccess);
  EXPECT_EQ(c->event_query(b), Status::kNotReady);
  ASSERT_EQ(c->event_synchronize(b), Status::kSuccess);
  EXPECT_EQ(c->event_query(b), Status::kSuccess);
  float ms = 0;
  ASSERT_EQ(c->event_elapsed(&ms, a, b), Status::kSuccess);
  EXPECT_GE(ms, 25.0f);
  EXPECT_EQ(c->event_destroy(a), Status::kSuccess);
  EXPECT_EQ(c->event_destroy(a), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->event_destroy(b), Status::kSuccess);
}

TEST(Client, StreamQueryAndPerThreadStreams) {
  InProcessWorker w;
  auto c = w.attach();
  const uint32_t stamp = kernel(*c, "ordo_stamp");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 4 * sizeof(sim::Stamp)), Status::kSuccess);
  std::vector<std::thread> ts;
  std::vector<uint32_t> rings(4);
  // All four streams live at once: a thread that exited first would release
  // its stream's ring to the next one (TSan's timing showed it).
  std::barrier all_created(4);
  for (uint32_t i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      Stream s = c->per_thread_stream();
      rings[i] = guest::ring_of_stream(*c, s);
      all_created.arrive_and_wait();
      sim::StampArgs a{d, i, 20000};
      EXPECT_EQ(c->launch(stamp, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
      EXPECT_EQ(c->stream_query(s), Status::kNotReady);
      EXPECT_EQ(c->stream_synchronize(s), Status::kSuccess);
      EXPECT_EQ(c->stream_query(s), Status::kSuccess);
    });
  for (auto& t : ts) t.join();
  std::sort(rings.begin(), rings.end());
  EXPECT_EQ(std::unique(rings.begin(), rings.end()), rings.end()) << "each thread gets its own stream";
  EXPECT_NE(rings[0], kLegacyRing);
}

TEST(Client, SixteenThreadsExhaustRingsAndStagingWithoutLoss) {
  // Small region: rings of 256 entries and 64 KiB staging windows fill up fast.
  InProcessWorker w({}, 4u << 20);
  auto c = w.attach();
  const uint32_t add = kernel(*c, "ordo_add_u64");
  constexpr int kThreads = 16, kCalls = 20000;
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, kThreads * 8), Status::kSuccess);
  ASSERT_EQ(c->memset_async(d, 0, kThreads * 8, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
  // Two threads per stream: they also contend for the stream's guest lock.
  std::vector<Stream> streams(kThreads / 2);
  for (auto& s : streams) ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      const Stream s = streams[t % streams.size()];
      for (int i = 1; i <= kCalls; ++i) {
        sim::AddU64Args a{d + 8 * uint64_t(t), uint64_t(i)};
        ASSERT_EQ(c->launch(add, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
      }
      ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
    });
  for (auto& t : ts) t.join();
  std::vector<uint64_t> out(kThreads);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, kThreads * 8), Status::kSuccess);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(out[t], uint64_t(kCalls) * (kCalls + 1) / 2) << "thread " << t;
}

}  // namespace
}  // namespace ordo::test

namespace ordo::test {
namespace {

TEST(Client, IdleWorkerSleepsAndTheDoorbellWakesIt) {
  InProcessWorker w;
  auto c = w.attach();
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  const RegionHeader* h = w.region().header();
  bool asleep = false;
  for (int i = 0; i < 2000 && !asleep; ++i) {
    asleep = h->worker_sleeping.load() == 1;
    if (!asleep) usleep(1000);
  }
  ASSERT_TRUE(asleep) << "an idle worker must stop spinning and sleep on its doorbell";
  const uint64_t before = w.worker().stats().wakeups_by_doorbell;
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  EXPECT_GT(w.worker().stats().wakeups_by_doorbell, before) << "the guest's call should have rung the doorbell";
}

// A thread that calls is watched: its next sync calls post nothing and the
// worker finds them by reading the slot's request line. Idle for a heartbeat,
// the slot is told it is no longer watched; a heartbeat later the worker stops
// reading it, and its calls are found by their posts again.
TEST(Client, SyncCallsOfAWatchedSlotNeedNoPost) {
  InProcessWorker w;
  auto c = w.attach();
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  auto watched = [&] {
    uint32_t n = 0;
    for (uint32_t s = 0; s < w.region().layout().slot_count; ++s) n += w.region().slot(s).watched.load();
    return n;
  };
  EXPECT_EQ(watched(), 1u) << "the calling thread's slot";
  const WorkerStats before = w.worker().stats();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(c->null_call(), Status::kSuccess);
  const WorkerStats after = w.worker().stats();
  EXPECT_EQ(after.slot_requests - before.slot_requests, 1000u);
  EXPECT_EQ(after.slot_posts, before.slot_posts) << "a watched slot's calls should not be posted";
  // Two heartbeats (100 ms each) without a call: no longer watched.
  bool left = false;
  for (int i = 0; i < 300 && !left; ++i) {
    left = watched() == 0;
    if (!left) usleep(10000);
  }
  ASSERT_TRUE(left) << "an idle slot should stop being watched";
  usleep(250000);  // the worker still reads it for a heartbeat after saying so, then drops it
  ASSERT_EQ(c->null_call(), Status::kSuccess);
  EXPECT_EQ(w.worker().stats().slot_posts, after.slot_posts + 1) << "an unwatched slot posts its request";
  EXPECT_EQ(watched(), 1u) << "and is watched again";
}

// The guest publishes without a full fence before it reads worker_sleeping; the
// worker's grace re-poll is what keeps a publish racing its sleep from being
// lost (ARCHITECTURE.md, "Idle"). A worker that sleeps after every idle pass and
// would otherwise sleep a minute: each async launch, issued at a random point
// of the worker's sleep transition, must be dispatched without any guest help
// (no sync call, no wait that nudges the doorbell).
TEST(Client, AsyncPublishRacingTheWorkersSleepIsNeverLost) {
  WorkerOptions o;
  o.spin = std::chrono::microseconds(0);
  o.max_sleep = std::chrono::seconds(60);
  InProcessWorker w(o);
  auto c = w.attach();
  Stream s{};
  ASSERT_EQ(c->stream_create(&s), Status::kSuccess);
  const uint32_t add = kernel(*c, "ordo_add_u64");
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 8), Status::kSuccess);
  const uint64_t zero = 0;
  ASSERT_EQ(c->memcpy_h2d(d, &zero, 8), Status::kSuccess);
  const RingControl& ring = w.region().ring(guest::ring_of_stream(*c, s));
  std::mt19937 rng(12);
  constexpr int kLaunches = 4000;
  for (int i = 0; i < kLaunches; ++i) {
    const sim::AddU64Args a{d, 1};
    ASSERT_EQ(c->launch(add, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
    const uint64_t want = guest::last_position(*c) + 1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ring.head.load() < want)
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "launch " << i << " was never dispatched: a lost wake-up";
    // Land the next publish anywhere from "worker still awake" to "asleep".
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(rng() % 40000);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
  uint64_t sum = 0;
  ASSERT_EQ(c->memcpy_d2h(&sum, d, 8), Status::kSuccess);
  EXPECT_EQ(sum, uint64_t(kLaunches));
  EXPECT_GT(w.worker().stats().sleeps, uint64_t(kLaunches / 10)) << "the worker should have slept between most launches";
}

}  // namespace
}  // namespace ordo::test

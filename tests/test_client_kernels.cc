// The guest library's kernels against a real worker: launches (packed
// parameters, clusters, cooperative grids), a kernel's attributes and
// occupancy, kernels that write pinned memory at its host address, lookups
// and bad handles, and modules loaded, looked up and unloaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"
#include "transport/launch_shape.h"

namespace ordo::test {
namespace {

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

}  // namespace
}  // namespace ordo::test

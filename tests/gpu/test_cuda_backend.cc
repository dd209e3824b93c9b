// The cuda backend itself, on a real GPU: modules, launches, copies, memset,
// events, stream order, and the checks that keep a hostile guest inside its own
// allocations; then devices: which host devices a backend serves, and (on a
// machine with two or more) streams, modules, copies, events and peer access
// across them. Exits 77 (skipped) without a device.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu.h"
#include "ordo/sim.h"
#include "worker/backend.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kHostBytes = 64ull << 20;
constexpr uint32_t kEventDisableTiming = 0x2;

// Stream ids the tests create: those below kMaxDevices are the devices' legacy streams.
constexpr uint32_t S(uint32_t n) { return kMaxDevices + n; }

struct FillArgs {  // fill(uint32_t* p, uint32_t value, uint64_t n): offsets 0, 8, 16
  uint64_t p;
  uint32_t value;
  uint32_t pad;
  uint64_t n;
};
struct AddOneArgs {
  uint64_t p, n;
};
struct SpinArgs {  // spin_then_write(uint64_t* p, uint64_t value, uint32_t us)
  uint64_t p, value;
  uint32_t us;
  uint32_t pad = 0;
};
struct ScaleArgs {  // scale(float* p, float f, int n)
  uint64_t p;
  float f;
  int32_t n;
};
struct BumpArgs {  // bump(uint64_t by)
  uint64_t by;
};

// The host ordinal of the device that holds `addr`, as CUDA sees it; -1 if none.
int device_of(uint64_t addr) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, reinterpret_cast<void*>(addr)) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    b_ = make_backend("cuda", &err);
    ASSERT_TRUE(b_) << err;
    attach_host();
  }
  // Collects async errors and registers the host memory copies use.
  void attach_host() {
    b_->set_error_sink([this](const OpTag& t, Status s) {
      std::lock_guard lk(mu_);
      errors_.emplace_back(t, s);
    });
    void* p = mmap(nullptr, kHostBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    host_ = static_cast<std::byte*>(p);
    b_->register_host_memory(host_, kHostBytes);
  }
  void TearDown() override {
    b_.reset();
    if (host_) munmap(host_, kHostBytes);
    std::lock_guard lk(mu_);
    for (auto& [t, s] : errors_) ADD_FAILURE() << "unexpected async error " << int(s) << " on ring " << t.ring;
  }

  MemOperand host(uint64_t off) const { return {false, reinterpret_cast<uintptr_t>(host_ + off)}; }
  static MemOperand dev(uint64_t addr) { return {true, addr}; }

  // Waits (here, not on the dispatch thread) until everything queued on `stream` has run.
  void sync(uint32_t stream) {
    std::promise<void> done;
    auto f = done.get_future();
    b_->host_callback(stream, [&] { done.set_value(); });
    ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "stream " << stream << " never drained";
  }

  uint32_t load(uint32_t module, const char* var) {
    const auto img = read_image(var);
    EXPECT_EQ(b_->module_load(module, img), Status::kSuccess) << var;
    return module;
  }
  uint32_t kernel(uint32_t module, const char* name) {
    uint32_t k = ~0u;
    EXPECT_EQ(b_->kernel_lookup(module, name, &k), Status::kSuccess) << name;
    return k;
  }
  template <class A>
  Status launch(uint32_t stream, uint32_t k, const A& args, Dim3 grid = {64}, Dim3 block = {256}) {
    LaunchParams p;
    p.kernel = k;
    p.grid = grid;
    p.block = block;
    p.args = reinterpret_cast<const std::byte*>(&args);
    p.args_size = sizeof args;
    return b_->launch(stream, p, OpTag{stream, 0, 0, 0});
  }
  uint64_t alloc(uint64_t size, uint32_t device = 0) {
    uint64_t a = 0;
    EXPECT_EQ(b_->malloc(device, size, &a), Status::kSuccess);
    return a;
  }
  template <class T>
  T* at(uint64_t off) const {
    return reinterpret_cast<T*>(host_ + off);
  }

  std::unique_ptr<Backend> b_;
  std::byte* host_ = nullptr;
  std::mutex mu_;
  std::vector<std::pair<OpTag, Status>> errors_;
};

TEST_F(CudaBackendTest, DeviceInfoDescribesTheGpu) {
  DeviceInfo d{};
  ASSERT_EQ(b_->device_info(0, &d), Status::kSuccess);
  EXPECT_GT(std::strlen(d.name), 0u);
  EXPECT_LT(std::strlen(d.name), sizeof d.name);
  EXPECT_GE(d.major, 7);
  EXPECT_EQ(d.warp_size, 32);
  EXPECT_GT(d.multi_processor_count, 0);
  EXPECT_GT(d.total_global_mem, uint64_t{1} << 30);
  EXPECT_GE(d.max_threads_per_block, 1024);
  EXPECT_GT(d.clock_rate_khz, 0);
  std::printf("device: %s, sm_%d%d, %d SMs, %.1f GiB\n", d.name, d.major, d.minor, d.multi_processor_count,
              double(d.total_global_mem) / (1 << 30));
}

TEST_F(CudaBackendTest, FatbinKernelFillsAndCopiesBack) {
  const uint32_t m = load(1, "ORDO_TEST_FATBIN");
  const uint32_t k = kernel(m, "fill");
  const uint64_t n = 1 << 20;
  const uint64_t d = alloc(n * 4);
  ASSERT_EQ(launch(0, k, FillArgs{d, 0xC0FFEE, 0, n}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(0), dev(d), n * 4, {}), Status::kSuccess);
  sync(0);
  const uint32_t* h = at<uint32_t>(0);
  for (uint64_t i = 0; i < n; i += 4099) ASSERT_EQ(h[i], 0xC0FFEEu) << i;
  EXPECT_EQ(h[n - 1], 0xC0FFEEu);
  EXPECT_EQ(b_->free(d), Status::kSuccess);
}

TEST_F(CudaBackendTest, CubinPtxAndMangledNames) {
  DeviceInfo info{};
  ASSERT_EQ(b_->device_info(0, &info), Status::kSuccess);
  const uint64_t n = 4096;
  const uint64_t d = alloc(n * 4);
  ASSERT_EQ(b_->memset(0, d, 0, n * 4, {}), Status::kSuccess);
  uint32_t expect = 0;
  // The sm_90 cubin only loads on sm_90; PTX is compiled by the driver for any device.
  if (info.major == 9 && info.minor == 0) {
    ASSERT_EQ(launch(0, kernel(load(2, "ORDO_TEST_CUBIN"), "add_one"), AddOneArgs{d, n}), Status::kSuccess);
    ++expect;
  } else {
    std::printf("sm_%d%d: not loading the sm_90 cubin\n", info.major, info.minor);
  }
  ASSERT_EQ(launch(0, kernel(load(3, "ORDO_TEST_PTX"), "add_one"), AddOneArgs{d, n}), Status::kSuccess);
  ++expect;
  ASSERT_EQ(b_->memcpy(0, host(0), dev(d), n * 4, {}), Status::kSuccess);
  sync(0);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(at<uint32_t>(0)[i], expect) << i;

  // A C++ kernel by its mangled name.
  const uint32_t scale = kernel(load(4, "ORDO_TEST_FATBIN"), "_Z5scalePffi");
  float* f = at<float>(0);
  for (int i = 0; i < 1000; ++i) f[i] = float(i);
  const uint64_t df = alloc(1000 * sizeof(float));
  ASSERT_EQ(b_->memcpy(0, dev(df), host(0), 1000 * sizeof(float), {}), Status::kSuccess);
  ASSERT_EQ(launch(0, scale, ScaleArgs{df, 2.5f, 1000}, {4}, {256}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(8192), dev(df), 1000 * sizeof(float), {}), Status::kSuccess);
  sync(0);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(at<float>(8192)[i], 2.5f * float(i)) << i;
}

TEST_F(CudaBackendTest, BuiltinKernelsMatchTheSimulator) {
  const uint64_t n = 100000;
  const uint64_t a = alloc(n * 4), b = alloc(n * 4), c = alloc(n * 4);
  float* x = at<float>(0);
  float* y = at<float>(n * 4);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = float(i);
    y[i] = 0.5f * float(i);
  }
  ASSERT_EQ(b_->memcpy(0, dev(a), host(0), n * 4, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, dev(b), host(n * 4), n * 4, {}), Status::kSuccess);
  ASSERT_EQ(launch(0, kernel(0, "ordo_vec_add"), sim::VecAddArgs{a, b, c, n}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(2 * n * 4), dev(c), n * 4, {}), Status::kSuccess);
  sync(0);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(at<float>(2 * n * 4)[i], 1.5f * float(i)) << i;

  const uint64_t counter = alloc(8);
  ASSERT_EQ(b_->memset(0, counter, 0, 8, {}), Status::kSuccess);
  for (int i = 0; i < 10; ++i)
    ASSERT_EQ(launch(0, kernel(0, "ordo_add_u64"), sim::AddU64Args{counter, 3}, {8}, {128}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(0), dev(counter), 8, {}), Status::kSuccess);
  sync(0);
  EXPECT_EQ(*at<uint64_t>(0), 30u) << "add_u64 must add once per launch, whatever the launch shape";

  uint32_t k = 0;
  EXPECT_EQ(b_->kernel_lookup(0, "no_such_builtin", &k), Status::kInvalidDeviceFunction);
}

TEST_F(CudaBackendTest, CopiesBothWaysDeviceToDeviceAndMemset) {
  const uint64_t n = 3 << 20;
  for (uint64_t i = 0; i < n; ++i) at<uint8_t>(0)[i] = uint8_t(i * 7 + 1);
  const uint64_t d1 = alloc(n), d2 = alloc(n);
  ASSERT_EQ(b_->memcpy(0, dev(d1), host(0), n, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, dev(d2), dev(d1), n, {}), Status::kSuccess);
  ASSERT_EQ(b_->memset(0, d2 + 1000, 0xAB, 5000, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(8 << 20), dev(d2), n, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(16 << 20), host(8 << 20), n, {}), Status::kSuccess);  // host to host
  sync(0);
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t want = i >= 1000 && i < 6000 ? 0xAB : uint8_t(i * 7 + 1);
    ASSERT_EQ(at<uint8_t>(8 << 20)[i], want) << i;
    ASSERT_EQ(at<uint8_t>(16 << 20)[i], want) << i;
  }
  EXPECT_EQ(b_->memcpy(0, dev(d1), host(0), 0, {}), Status::kSuccess);  // zero bytes: nothing to check or do
}

TEST_F(CudaBackendTest, EventsTimeWorkAndNotifyWithoutBlocking) {
  const uint32_t k = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8);
  ASSERT_EQ(b_->stream_create(S(1), 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(1, 0, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(2, 0, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_query(1), Status::kSuccess) << "an event never recorded is complete";
  ASSERT_EQ(b_->event_record(S(1), 1), Status::kSuccess);
  ASSERT_EQ(launch(S(1), k, SpinArgs{d, 1, 300000}, {1}, {1}), Status::kSuccess);  // 300 ms
  ASSERT_EQ(b_->event_record(S(1), 2), Status::kSuccess);

  std::promise<void> notified;
  auto f = notified.get_future();
  const auto t0 = std::chrono::steady_clock::now();
  b_->event_notify(2, [&] { notified.set_value(); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 50ms) << "event_notify waited for the GPU";
  EXPECT_EQ(b_->event_query(2), Status::kNotReady);
  float ms = 0;
  EXPECT_EQ(b_->event_elapsed(1, 2, &ms), Status::kNotReady);
  // A re-record after the notify must not move what the notify waits for.
  ASSERT_EQ(b_->event_record(S(1), 2), Status::kSuccess);
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  sync(S(1));
  EXPECT_EQ(b_->event_query(2), Status::kSuccess);
  ASSERT_EQ(b_->event_elapsed(1, 2, &ms), Status::kSuccess);
  EXPECT_GT(ms, 250.0f);
  EXPECT_LT(ms, 5000.0f);

  // Timing disabled: no elapsed time, as in CUDA.
  ASSERT_EQ(b_->event_create(3, 0, kEventDisableTiming), Status::kSuccess);
  ASSERT_EQ(b_->event_record(S(1), 3), Status::kSuccess);
  sync(S(1));
  EXPECT_NE(b_->event_elapsed(1, 3, &ms), Status::kSuccess);
  EXPECT_EQ(b_->event_create(4, 0, 0x4 /* cudaEventInterprocess */), Status::kInvalidValue);
  EXPECT_EQ(b_->event_create(1, 0, 0), Status::kInvalidResourceHandle);  // already exists
  EXPECT_EQ(b_->event_destroy(3), Status::kSuccess);
  EXPECT_EQ(b_->event_destroy(3), Status::kInvalidResourceHandle);

  // A notify on an event nobody recorded runs at once (or nearly).
  ASSERT_EQ(b_->event_create(5, 0, 0), Status::kSuccess);
  std::promise<void> at_once;
  b_->event_notify(5, [&] { at_once.set_value(); });
  EXPECT_EQ(at_once.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_EQ(b_->stream_destroy(S(1)), Status::kSuccess);
}

TEST_F(CudaBackendTest, StreamWaitEventOrdersStreams) {
  const uint32_t k = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8);
  ASSERT_EQ(b_->memset(0, d, 0, 8, {}), Status::kSuccess);
  sync(0);
  ASSERT_EQ(b_->stream_create(S(1), 0, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(S(2), 0, false, -1), Status::kSuccess);
  ASSERT_EQ(b_->event_create(7, 0, 0), Status::kSuccess);
  ASSERT_EQ(launch(S(1), k, SpinArgs{d, 42, 100000}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->event_record(S(1), 7), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(S(2), 7), Status::kSuccess);
  *at<uint64_t>(0) = 0;
  ASSERT_EQ(b_->memcpy(S(2), host(0), dev(d), 8, {}), Status::kSuccess);
  sync(S(2));
  EXPECT_EQ(*at<uint64_t>(0), 42u) << "stream 2 read before the kernel on stream 1 it waited for";
}

TEST_F(CudaBackendTest, LegacyStreamWaitsForBlockingStreams) {
  const uint32_t k = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8);
  ASSERT_EQ(b_->memset(0, d, 0, 8, {}), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(S(3), 0, true, 0), Status::kSuccess);  // blocking
  ASSERT_EQ(launch(S(3), k, SpinArgs{d, 5, 100000}, {1}, {1}), Status::kSuccess);
  *at<uint64_t>(0) = 0;
  ASSERT_EQ(b_->memcpy(0, host(0), dev(d), 8, {}), Status::kSuccess);  // legacy stream
  sync(0);
  EXPECT_EQ(*at<uint64_t>(0), 5u) << "the legacy stream did not wait for a blocking stream";
}

TEST_F(CudaBackendTest, HostCallbackRunsAfterEarlierWorkAndDoesNotBlock) {
  const uint32_t k = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8);
  ASSERT_EQ(b_->stream_create(S(1), 0, false, 0), Status::kSuccess);
  ASSERT_EQ(launch(S(1), k, SpinArgs{d, 9, 200000}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(S(1), host(0), dev(d), 8, {}), Status::kSuccess);
  std::promise<uint64_t> seen;
  const auto t0 = std::chrono::steady_clock::now();
  b_->host_callback(S(1), [&] { seen.set_value(*at<uint64_t>(0)); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 50ms) << "host_callback waited for the GPU";
  auto f = seen.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(f.get(), 9u);
}

TEST_F(CudaBackendTest, HostileOperandsAreRejected) {
  const uint64_t d = alloc(4096);
  // Device ranges must lie inside one live allocation.
  EXPECT_EQ(b_->memcpy(0, dev(d + 4000), host(0), 97, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memcpy(0, host(0), dev(d - 1), 8, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memcpy(0, host(0), dev(d + 4096), 1, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memcpy(0, dev(d), dev(d + 8), 4096, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memcpy(0, dev(d), host(0), ~uint64_t{0}, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memset(0, d + 1, 0, 4096, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memset(0, 0x1000, 0, 8, {}), Status::kInvalidDevicePointer);
  // Host ranges must lie inside registered memory.
  uint64_t local = 0;
  EXPECT_EQ(b_->memcpy(0, dev(d), {false, reinterpret_cast<uintptr_t>(&local)}, 8, {}), Status::kInvalidValue);
  EXPECT_EQ(b_->memcpy(0, host(kHostBytes - 4), dev(d), 8, {}), Status::kInvalidValue);
  EXPECT_EQ(b_->memcpy(0, {false, 0}, dev(d), 8, {}), Status::kInvalidValue);
  // Frees: only what malloc returned, once.
  EXPECT_EQ(b_->free(d + 256), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->free(d), Status::kSuccess);
  EXPECT_EQ(b_->free(d), Status::kInvalidDevicePointer);
  EXPECT_EQ(b_->memcpy(0, host(0), dev(d), 8, {}), Status::kInvalidDevicePointer) << "copy from freed memory";
  EXPECT_EQ(b_->malloc(0, 0, &local), Status::kInvalidValue);
  EXPECT_EQ(b_->malloc(0, uint64_t{1} << 52, &local), Status::kMemoryAllocation);
  // Handles we never created.
  EXPECT_EQ(b_->memcpy(S(7), host(0), host(8), 8, {}), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->memcpy(100000, host(0), host(8), 8, {}), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_destroy(0), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_destroy(S(9)), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_create(0, 0, true, 0), Status::kInvalidValue);
  EXPECT_EQ(b_->stream_create(1, 0, true, 0), Status::kInvalidValue) << "ids below kMaxDevices are legacy streams";
  EXPECT_EQ(b_->stream_create(kMaxStreams, 0, true, 0), Status::kInvalidValue);
  EXPECT_EQ(b_->event_record(0, 99), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_wait_event(0, 99), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_query(99), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_create(1u << 20, 0, 0), Status::kInvalidValue);
  // The backend still works afterwards.
  const uint64_t e = alloc(16);
  EXPECT_EQ(b_->memset(0, e, 1, 16, {}), Status::kSuccess);
  sync(0);
}

TEST_F(CudaBackendTest, HostileLaunchesAndModulesAreRejected) {
  const uint32_t m = load(1, "ORDO_TEST_FATBIN");
  const uint32_t fill = kernel(m, "fill");
  const uint64_t d = alloc(64);
  EXPECT_EQ(launch(0, 123456, FillArgs{d, 1, 0, 16}), Status::kInvalidDeviceFunction);
  EXPECT_EQ(launch(0, fill, FillArgs{d, 1, 0, 16}, {0}, {1}), Status::kInvalidConfiguration);
  EXPECT_EQ(launch(0, fill, FillArgs{d, 1, 0, 16}, {1}, {2048}), Status::kInvalidConfiguration);
  EXPECT_EQ(launch(S(9), fill, FillArgs{d, 1, 0, 16}), Status::kInvalidResourceHandle);
  // Fewer argument bytes than the kernel's parameters: the driver would read past them.
  struct Short {
    uint64_t p;
  };
  EXPECT_EQ(launch(0, fill, Short{d}), Status::kInvalidValue);
  uint32_t k = 0;
  EXPECT_EQ(b_->kernel_lookup(m, "nope", &k), Status::kInvalidDeviceFunction);
  EXPECT_EQ(b_->kernel_lookup(77, "fill", &k), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->kernel_lookup(m, std::string_view("fill\0x", 6), &k), Status::kInvalidValue);
  // Repeated lookups hand out the same id.
  EXPECT_EQ(kernel(m, "fill"), fill);

  const auto img = read_image("ORDO_TEST_FATBIN");
  EXPECT_EQ(b_->module_load(1, img), Status::kInvalidResourceHandle);  // id in use
  EXPECT_EQ(b_->module_load(0, img), Status::kInvalidValue);           // reserved for the built-ins
  EXPECT_EQ(int(b_->module_load(2, std::span(img.data(), img.size() / 2))), 200);  // truncated: cudaErrorInvalidKernelImage
  std::vector<std::byte> junk(4096);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = std::byte(i * 131 + 7);
  EXPECT_NE(b_->module_load(3, junk), Status::kSuccess);
  EXPECT_EQ(b_->module_unload(0), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->module_unload(5), Status::kInvalidResourceHandle);

  // A kernel of an unloaded module is gone; its slot may be reused, under a new generation.
  sync(0);
  EXPECT_EQ(b_->module_unload(m), Status::kSuccess);
  EXPECT_EQ(launch(0, fill, FillArgs{d, 1, 0, 16}), Status::kInvalidDeviceFunction);
  EXPECT_EQ(b_->kernel_lookup(m, "fill", &k), Status::kInvalidResourceHandle);
  load(1, "ORDO_TEST_FATBIN");
  EXPECT_NE(kernel(1, "fill"), fill);
}

// ---------------------------------------------------------------- devices

TEST(CudaDevices, OneListedDeviceIsTheSessionsOnlyDevice) {
  std::string err;
  auto b = cuda::make_cuda_backend({0}, &err);
  ASSERT_TRUE(b) << err;
  EXPECT_EQ(b->device_count(), 1u);
  DeviceInfo d{};
  EXPECT_EQ(b->device_info(0, &d), Status::kSuccess);
  EXPECT_EQ(b->device_info(1, &d), Status::kInvalidDevice);
  int32_t attrs[kDeviceAttributesPerCall] = {};
  EXPECT_EQ(b->device_attributes(0, 0, attrs), Status::kSuccess);
  EXPECT_EQ(attrs[10], 32) << "CU_DEVICE_ATTRIBUTE_WARP_SIZE";
  EXPECT_EQ(b->device_attributes(1, 0, attrs), Status::kInvalidDevice);
  uint64_t a = 0;
  EXPECT_EQ(b->malloc(1, 64, &a), Status::kInvalidDevice);
  EXPECT_EQ(b->stream_create(S(1), 1, false, 0), Status::kInvalidDevice);
  EXPECT_EQ(b->event_create(1, 1, 0), Status::kInvalidDevice);
  EXPECT_EQ(b->launch(1, LaunchParams{}, OpTag{}), Status::kInvalidResourceHandle) << "stream 1 is device 1's";
  EXPECT_FALSE(b->can_access_peer(0, 1));
  EXPECT_EQ(b->set_peer_access(0, 1, true), Status::kInvalidDevice);
}

TEST(CudaDevices, MissingRepeatedAndTooManyDevicesAreRefused) {
  std::string err;
  EXPECT_FALSE(cuda::make_cuda_backend({0, 0}, &err));
  EXPECT_NE(err.find("device 0 is listed twice"), std::string::npos) << err;
  err.clear();
  EXPECT_FALSE(cuda::make_cuda_backend({99}, &err));
  EXPECT_NE(err.find("no CUDA device 99"), std::string::npos) << err;
  EXPECT_NE(err.find("visible"), std::string::npos) << "says which devices exist: " << err;
  err.clear();
  EXPECT_FALSE(cuda::make_cuda_backend({0, -1}, &err));
  EXPECT_NE(err.find("no CUDA device -1"), std::string::npos) << err;
  err.clear();
  EXPECT_FALSE(cuda::make_cuda_backend(std::vector<int>(kMaxDevices + 1, 0), &err));
  EXPECT_NE(err.find("at most " + std::to_string(kMaxDevices)), std::string::npos) << err;
}

TEST(CudaDevices, EveryVisibleDeviceByDefaultInCudaOrder) {
  const int n = cuda::probe().count;
  if (n > int(kMaxDevices)) GTEST_SKIP() << n << " devices: more than a session may see";
  std::string err;
  auto b = make_backend("cuda", &err);
  ASSERT_TRUE(b) << err;
  ASSERT_EQ(b->device_count(), uint32_t(n));
  for (int i = 0; i < n; ++i) {
    DeviceInfo d{};
    ASSERT_EQ(b->device_info(uint32_t(i), &d), Status::kSuccess);
    cudaDeviceProp p{};
    ASSERT_EQ(cudaGetDeviceProperties(&p, i), cudaSuccess);
    EXPECT_EQ(std::memcmp(d.uuid, p.uuid.bytes, sizeof d.uuid), 0) << "device " << i;
  }
}

// Host devices 0 and 1 as the session's 0 and 1; skipped on a machine with one.
class TwoDevicesTest : public CudaBackendTest {
 protected:
  void SetUp() override {
    const int n = cuda::probe().count;
    if (n < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << n;
    std::string err;
    b_ = cuda::make_cuda_backend({0, 1}, &err);
    ASSERT_TRUE(b_) << err;
    ASSERT_EQ(b_->device_count(), 2u);
    attach_host();
  }
};

TEST_F(TwoDevicesTest, StreamsRunOnTheirDevice) {
  const uint32_t fill = kernel(load(1, "ORDO_TEST_FATBIN"), "fill");
  const uint64_t n = 1 << 16;
  const uint64_t d0 = alloc(n * 4, 0), d1 = alloc(n * 4, 1);
  EXPECT_EQ(device_of(d0), 0);
  EXPECT_EQ(device_of(d1), 1);
  // Stream 1 is device 1's legacy stream; without peer access a kernel that ran
  // on device 0 could not write d1 (the fault would reach the error sink).
  ASSERT_EQ(launch(0, fill, FillArgs{d0, 10, 0, n}), Status::kSuccess);
  ASSERT_EQ(launch(1, fill, FillArgs{d1, 11, 0, n}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(0), dev(d0), n * 4, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(1, host(n * 4), dev(d1), n * 4, {}), Status::kSuccess);
  sync(0);
  sync(1);
  for (uint64_t i = 0; i < n; i += 97) {
    ASSERT_EQ(at<uint32_t>(0)[i], 10u) << i;
    ASSERT_EQ(at<uint32_t>(n * 4)[i], 11u) << i;
  }
  // A created stream of device 1, and the built-in kernels there.
  ASSERT_EQ(b_->stream_create(S(1), 1, false, 0), Status::kSuccess);
  ASSERT_EQ(launch(S(1), fill, FillArgs{d1, 12, 0, n}), Status::kSuccess);
  ASSERT_EQ(b_->memset(S(1), d1, 0, 8, {}), Status::kSuccess);
  ASSERT_EQ(launch(S(1), kernel(0, "ordo_add_u64"), sim::AddU64Args{d1, 3}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(S(1), host(0), dev(d1), n * 4, {}), Status::kSuccess);
  sync(S(1));
  EXPECT_EQ(*at<uint64_t>(0), 3u);
  EXPECT_EQ(at<uint32_t>(0)[n - 1], 12u);
  EXPECT_EQ(b_->stream_destroy(S(1)), Status::kSuccess);
  EXPECT_EQ(b_->stream_destroy(1), Status::kInvalidResourceHandle) << "a legacy stream is not destroyed";
  EXPECT_EQ(b_->free(d1), Status::kSuccess);
  EXPECT_EQ(b_->free(d0), Status::kSuccess);
}

TEST_F(TwoDevicesTest, PeerCopiesAndCrossDeviceEventWaits) {
  const uint32_t spin = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t n = 3 << 20;
  for (uint64_t i = 0; i < n; ++i) at<uint8_t>(0)[i] = uint8_t(i * 13 + 5);
  const uint64_t a = alloc(n, 0), b = alloc(n, 1), c = alloc(n, 0);
  // Device 0 to device 1 on the source's stream, back on the destination's.
  ASSERT_EQ(b_->memcpy(0, dev(a), host(0), n, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, dev(b), dev(a), n, {}), Status::kSuccess);
  ASSERT_EQ(b_->event_create(1, 0, kEventDisableTiming), Status::kSuccess);
  ASSERT_EQ(b_->event_record(0, 1), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(1, 1), Status::kSuccess) << "device 1's stream waits for device 0's event";
  ASSERT_EQ(b_->memcpy(1, dev(c), dev(b), n, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(1, host(8 << 20), dev(c), n, {}), Status::kSuccess);
  sync(1);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(at<uint8_t>(8 << 20)[i], uint8_t(i * 13 + 5)) << i;

  // The wait holds device 1's work back until device 0's kernel is done.
  ASSERT_EQ(b_->memset(0, a, 0, 8, {}), Status::kSuccess);
  ASSERT_EQ(launch(0, spin, SpinArgs{a, 77, 100000}, {1}, {1}), Status::kSuccess);  // 100 ms
  ASSERT_EQ(b_->event_record(0, 1), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(S(2), 1, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(S(2), 1), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(S(2), dev(b), dev(a), 8, {}), Status::kSuccess);
  *at<uint64_t>(0) = 0;
  ASSERT_EQ(b_->memcpy(S(2), host(0), dev(b), 8, {}), Status::kSuccess);
  sync(S(2));
  EXPECT_EQ(*at<uint64_t>(0), 77u) << "device 1 copied before the kernel on device 0 it waited for";
  // An event is recorded only on a stream of its own device.
  EXPECT_EQ(b_->event_record(1, 1), Status::kInvalidResourceHandle);
}

TEST_F(TwoDevicesTest, EachDeviceHasItsOwnCopyOfAModulesVariables) {
  const uint32_t m = load(1, "ORDO_TEST_FATBIN");
  uint64_t a0 = 0, s0 = 0, a1 = 0, s1 = 0;
  // Device 1 first: its copy is loaded by the lookup, before any launch there.
  ASSERT_EQ(b_->module_global(m, 1, "ordo_test_counter", 8, &a1, &s1), Status::kSuccess);
  ASSERT_EQ(b_->module_global(m, 0, "ordo_test_counter", 8, &a0, &s0), Status::kSuccess);
  EXPECT_EQ(s0, 8u);
  EXPECT_EQ(s1, 8u);
  EXPECT_NE(a0, a1);
  EXPECT_EQ(device_of(a0), 0);
  EXPECT_EQ(device_of(a1), 1);
  EXPECT_EQ(b_->module_global(m, 2, "ordo_test_counter", 8, &a1, &s1), Status::kInvalidDevice);
  uint64_t again = 0;
  ASSERT_EQ(b_->module_global(m, 1, "ordo_test_counter", 8, &again, &s1), Status::kSuccess);
  EXPECT_EQ(again, a1);

  const uint32_t bump = kernel(m, "bump");
  ASSERT_EQ(launch(0, bump, BumpArgs{1}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(launch(1, bump, BumpArgs{2}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(0), dev(a0), 8, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(1, host(8), dev(a1), 8, {}), Status::kSuccess);
  sync(0);
  sync(1);
  EXPECT_EQ(*at<uint64_t>(0), 6u);
  EXPECT_EQ(*at<uint64_t>(8), 7u);
  // Copies and memsets may target a variable, as they may an allocation.
  *at<uint64_t>(16) = 100;
  ASSERT_EQ(b_->memcpy(1, dev(a1), host(16), 8, {}), Status::kSuccess);
  ASSERT_EQ(launch(1, bump, BumpArgs{1}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(1, host(24), dev(a1), 8, {}), Status::kSuccess);
  ASSERT_EQ(b_->memset(0, a0, 0, 8, {}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(0, host(32), dev(a0), 8, {}), Status::kSuccess);
  sync(0);
  sync(1);
  EXPECT_EQ(*at<uint64_t>(24), 101u);
  EXPECT_EQ(*at<uint64_t>(32), 0u);
  EXPECT_EQ(b_->memcpy(1, host(0), dev(a1), 16, {}), Status::kInvalidDevicePointer) << "past the variable";
  // Unloading drops every device's copy.
  ASSERT_EQ(b_->module_unload(m), Status::kSuccess);
  EXPECT_EQ(b_->memcpy(1, host(0), dev(a1), 8, {}), Status::kInvalidDevicePointer);
  EXPECT_EQ(launch(1, bump, BumpArgs{1}, {1}, {1}), Status::kInvalidDeviceFunction);
}

TEST_F(TwoDevicesTest, EventsAndNotificationsOfTheSecondDevice) {
  const uint32_t spin = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8, 1);
  ASSERT_EQ(b_->stream_create(S(1), 1, true, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(1, 1, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(2, 1, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_record(S(1), 1), Status::kSuccess);
  ASSERT_EQ(launch(S(1), spin, SpinArgs{d, 3, 200000}, {1}, {1}), Status::kSuccess);  // 200 ms
  ASSERT_EQ(b_->event_record(S(1), 2), Status::kSuccess);
  EXPECT_EQ(b_->event_query(2), Status::kNotReady);
  std::promise<void> notified;
  auto nf = notified.get_future();
  b_->event_notify(2, [&] { notified.set_value(); });
  std::promise<void> drained;
  auto df = drained.get_future();
  b_->stream_notify(S(1), [&] { drained.set_value(); });
  ASSERT_EQ(nf.wait_for(10s), std::future_status::ready);
  ASSERT_EQ(df.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(b_->event_query(2), Status::kSuccess);
  float ms = 0;
  ASSERT_EQ(b_->event_elapsed(1, 2, &ms), Status::kSuccess);
  EXPECT_GT(ms, 150.0f);
  // Device 1's legacy stream waits for its blocking streams, not device 0's.
  ASSERT_EQ(launch(S(1), spin, SpinArgs{d, 4, 100000}, {1}, {1}), Status::kSuccess);
  *at<uint64_t>(0) = 0;
  ASSERT_EQ(b_->memcpy(1, host(0), dev(d), 8, {}), Status::kSuccess);
  sync(1);
  EXPECT_EQ(*at<uint64_t>(0), 4u) << "device 1's legacy stream did not wait for its blocking stream";
  EXPECT_EQ(b_->event_destroy(1), Status::kSuccess);
  EXPECT_EQ(b_->event_destroy(2), Status::kSuccess);
  EXPECT_EQ(b_->stream_destroy(S(1)), Status::kSuccess);
}

TEST_F(TwoDevicesTest, PeerAccessIsCudas) {
  int native = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&native, 0, 1), cudaSuccess);
  EXPECT_EQ(b_->can_access_peer(0, 1), native != 0);
  EXPECT_FALSE(b_->can_access_peer(0, 0));
  EXPECT_FALSE(b_->can_access_peer(0, 2));
  EXPECT_EQ(b_->set_peer_access(1, 1, true), Status::kInvalidDevice);
  if (!native) {
    EXPECT_EQ(b_->set_peer_access(0, 1, true), Status::kPeerAccessUnsupported);
    GTEST_SKIP() << "devices 0 and 1 have no peer access: checked only that it is refused";
  }
  ASSERT_EQ(b_->set_peer_access(0, 1, true), Status::kSuccess);
  EXPECT_EQ(b_->set_peer_access(0, 1, true), Status::kPeerAccessAlreadyEnabled);
  // Device 0's kernel writes device 1's memory.
  const uint32_t fill = kernel(load(1, "ORDO_TEST_FATBIN"), "fill");
  const uint64_t d1 = alloc(4096, 1);
  ASSERT_EQ(launch(0, fill, FillArgs{d1, 0xABCD, 0, 1024}, {4}, {256}), Status::kSuccess);
  sync(0);
  ASSERT_EQ(b_->memcpy(1, host(0), dev(d1), 4096, {}), Status::kSuccess);
  sync(1);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(at<uint32_t>(0)[i], 0xABCDu) << i;
  EXPECT_EQ(b_->set_peer_access(0, 1, false), Status::kSuccess);
  EXPECT_EQ(b_->set_peer_access(0, 1, false), Status::kPeerAccessNotEnabled);
}

TEST_F(TwoDevicesTest, TheListedOrderIsTheSessionsOrder) {
  std::string err;
  auto swapped = cuda::make_cuda_backend({1, 0}, &err);
  ASSERT_TRUE(swapped) << err;
  for (uint32_t i = 0; i < 2; ++i) {
    DeviceInfo a{}, b{};
    ASSERT_EQ(b_->device_info(i, &a), Status::kSuccess);
    ASSERT_EQ(swapped->device_info(1 - i, &b), Status::kSuccess);
    EXPECT_EQ(std::memcmp(a.uuid, b.uuid, sizeof a.uuid), 0) << i;
    int32_t x[kDeviceAttributesPerCall], y[kDeviceAttributesPerCall];
    ASSERT_EQ(b_->device_attributes(i, 0, x), Status::kSuccess);
    ASSERT_EQ(swapped->device_attributes(1 - i, 0, y), Status::kSuccess);
    EXPECT_EQ(x[33], y[33]) << "CU_DEVICE_ATTRIBUTE_PCI_BUS_ID";
  }
  // Its device 0 is host device 1: memory from it is there.
  uint64_t a = 0;
  ASSERT_EQ(swapped->malloc(0, 64, &a), Status::kSuccess);
  EXPECT_EQ(device_of(a), 1);
  EXPECT_EQ(swapped->free(a), Status::kSuccess);
}

}  // namespace
}  // namespace ordo::test

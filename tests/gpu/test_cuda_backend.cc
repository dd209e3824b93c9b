// The cuda backend itself, on a real GPU: modules, launches, copies, memset,
// events, stream order, and the checks that keep a hostile guest inside its own
// allocations. Exits 77 (skipped) without a device.
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu.h"
#include "ordo/backend.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kHostBytes = 64ull << 20;
constexpr uint32_t kEventDisableTiming = 0x2;

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

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    b_ = make_backend("cuda", &err);
    ASSERT_TRUE(b_) << err;
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
  uint64_t alloc(uint64_t size) {
    uint64_t a = 0;
    EXPECT_EQ(b_->malloc(size, &a), Status::kSuccess);
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
  ASSERT_EQ(b_->device_info(&d), Status::kSuccess);
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
  ASSERT_EQ(b_->device_info(&info), Status::kSuccess);
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
  ASSERT_EQ(b_->stream_create(1, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(1, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_create(2, 0), Status::kSuccess);
  ASSERT_EQ(b_->event_query(1), Status::kSuccess) << "an event never recorded is complete";
  ASSERT_EQ(b_->event_record(1, 1), Status::kSuccess);
  ASSERT_EQ(launch(1, k, SpinArgs{d, 1, 300000}, {1}, {1}), Status::kSuccess);  // 300 ms
  ASSERT_EQ(b_->event_record(1, 2), Status::kSuccess);

  std::promise<void> notified;
  auto f = notified.get_future();
  const auto t0 = std::chrono::steady_clock::now();
  b_->event_notify(2, [&] { notified.set_value(); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 50ms) << "event_notify waited for the GPU";
  EXPECT_EQ(b_->event_query(2), Status::kNotReady);
  float ms = 0;
  EXPECT_EQ(b_->event_elapsed(1, 2, &ms), Status::kNotReady);
  // A re-record after the notify must not move what the notify waits for.
  ASSERT_EQ(b_->event_record(1, 2), Status::kSuccess);
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  sync(1);
  EXPECT_EQ(b_->event_query(2), Status::kSuccess);
  ASSERT_EQ(b_->event_elapsed(1, 2, &ms), Status::kSuccess);
  EXPECT_GT(ms, 250.0f);
  EXPECT_LT(ms, 5000.0f);

  // Timing disabled: no elapsed time, as in CUDA.
  ASSERT_EQ(b_->event_create(3, kEventDisableTiming), Status::kSuccess);
  ASSERT_EQ(b_->event_record(1, 3), Status::kSuccess);
  sync(1);
  EXPECT_NE(b_->event_elapsed(1, 3, &ms), Status::kSuccess);
  EXPECT_EQ(b_->event_create(4, 0x4 /* cudaEventInterprocess */), Status::kInvalidValue);
  EXPECT_EQ(b_->event_create(1, 0), Status::kInvalidResourceHandle);  // already exists
  EXPECT_EQ(b_->event_destroy(3), Status::kSuccess);
  EXPECT_EQ(b_->event_destroy(3), Status::kInvalidResourceHandle);

  // A notify on an event nobody recorded runs at once (or nearly).
  ASSERT_EQ(b_->event_create(5, 0), Status::kSuccess);
  std::promise<void> at_once;
  b_->event_notify(5, [&] { at_once.set_value(); });
  EXPECT_EQ(at_once.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_EQ(b_->stream_destroy(1), Status::kSuccess);
}

TEST_F(CudaBackendTest, StreamWaitEventOrdersStreams) {
  const uint32_t k = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8);
  ASSERT_EQ(b_->memset(0, d, 0, 8, {}), Status::kSuccess);
  sync(0);
  ASSERT_EQ(b_->stream_create(1, false, 0), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(2, false, -1), Status::kSuccess);
  ASSERT_EQ(b_->event_create(7, 0), Status::kSuccess);
  ASSERT_EQ(launch(1, k, SpinArgs{d, 42, 100000}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->event_record(1, 7), Status::kSuccess);
  ASSERT_EQ(b_->stream_wait_event(2, 7), Status::kSuccess);
  *at<uint64_t>(0) = 0;
  ASSERT_EQ(b_->memcpy(2, host(0), dev(d), 8, {}), Status::kSuccess);
  sync(2);
  EXPECT_EQ(*at<uint64_t>(0), 42u) << "stream 2 read before the kernel on stream 1 it waited for";
}

TEST_F(CudaBackendTest, LegacyStreamWaitsForBlockingStreams) {
  const uint32_t k = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8);
  ASSERT_EQ(b_->memset(0, d, 0, 8, {}), Status::kSuccess);
  ASSERT_EQ(b_->stream_create(3, true, 0), Status::kSuccess);  // blocking
  ASSERT_EQ(launch(3, k, SpinArgs{d, 5, 100000}, {1}, {1}), Status::kSuccess);
  *at<uint64_t>(0) = 0;
  ASSERT_EQ(b_->memcpy(0, host(0), dev(d), 8, {}), Status::kSuccess);  // legacy stream
  sync(0);
  EXPECT_EQ(*at<uint64_t>(0), 5u) << "the legacy stream did not wait for a blocking stream";
}

TEST_F(CudaBackendTest, HostCallbackRunsAfterEarlierWorkAndDoesNotBlock) {
  const uint32_t k = kernel(load(1, "ORDO_TEST_FATBIN"), "spin_then_write");
  const uint64_t d = alloc(8);
  ASSERT_EQ(b_->stream_create(1, false, 0), Status::kSuccess);
  ASSERT_EQ(launch(1, k, SpinArgs{d, 9, 200000}, {1}, {1}), Status::kSuccess);
  ASSERT_EQ(b_->memcpy(1, host(0), dev(d), 8, {}), Status::kSuccess);
  std::promise<uint64_t> seen;
  const auto t0 = std::chrono::steady_clock::now();
  b_->host_callback(1, [&] { seen.set_value(*at<uint64_t>(0)); });
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
  EXPECT_EQ(b_->malloc(0, &local), Status::kInvalidValue);
  EXPECT_EQ(b_->malloc(uint64_t{1} << 52, &local), Status::kMemoryAllocation);
  // Handles we never created.
  EXPECT_EQ(b_->memcpy(7, host(0), host(8), 8, {}), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->memcpy(100000, host(0), host(8), 8, {}), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_destroy(0), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_destroy(9), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_create(0, true, 0), Status::kInvalidValue);
  EXPECT_EQ(b_->stream_create(kMaxStreams, true, 0), Status::kInvalidValue);
  EXPECT_EQ(b_->event_record(0, 99), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->stream_wait_event(0, 99), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_query(99), Status::kInvalidResourceHandle);
  EXPECT_EQ(b_->event_create(1u << 20, 0), Status::kInvalidValue);
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
  EXPECT_EQ(launch(9, fill, FillArgs{d, 1, 0, 16}), Status::kInvalidResourceHandle);
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

}  // namespace
}  // namespace ordo::test

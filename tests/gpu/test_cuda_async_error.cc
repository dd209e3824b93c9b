// A kernel that faults after its launch succeeded: the error reaches the error
// sink with the tag of the work that caused it, and the completion the guest
// waits for still comes (it must not hang). Its own process: the fault breaks
// the CUDA context for good. Exits 77 (skipped) without a device.
#include <sys/mman.h>

#include <chrono>
#include <future>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "gpu.h"
#include "worker/backend.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;

TEST(CudaAsyncError, FaultIsReportedToTheIssuerAndCompletionsStillRun) {
  std::string err;
  auto b = make_backend("cuda", &err);
  ASSERT_TRUE(b) << err;
  std::mutex mu;
  std::vector<std::pair<OpTag, Status>> errors;
  b->set_error_sink([&](const OpTag& t, Status s) {
    std::lock_guard lk(mu);
    errors.emplace_back(t, s);
  });
  const auto img = read_image("ORDO_TEST_FATBIN");
  ASSERT_EQ(b->module_load(1, img), Status::kSuccess);
  uint32_t store = 0;
  ASSERT_EQ(b->kernel_lookup(1, "store", &store), Status::kSuccess);
  const uint32_t stream = kMaxDevices;  // the first id the worker may create
  ASSERT_EQ(b->stream_create(stream, 0, false, 0), Status::kSuccess);

  struct {
    uint64_t p, value;
  } args{0x10, 1};  // an address no allocation has
  LaunchParams p;
  p.kernel = store;
  p.args = reinterpret_cast<const std::byte*>(&args);
  p.args_size = sizeof args;
  const OpTag tag{1, 3, 17, 4};
  ASSERT_EQ(b->launch(stream, p, tag), Status::kSuccess) << "the fault happens later, on the device";

  std::promise<void> done;
  b->host_callback(stream, [&] { done.set_value(); });
  ASSERT_EQ(done.get_future().wait_for(20s), std::future_status::ready) << "a fence after a fault never completed";
  std::lock_guard lk(mu);
  ASSERT_FALSE(errors.empty()) << "the fault was not reported";
  EXPECT_EQ(errors[0].first.thread, 3u);
  EXPECT_EQ(errors[0].first.pos, 17u);
  EXPECT_EQ(int(errors[0].second), 700) << "expected cudaErrorIllegalAddress";
}

}  // namespace
}  // namespace ordo::test

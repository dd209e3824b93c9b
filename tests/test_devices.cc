// Several devices in one session (ordo-worker --sim-devices N): a current
// device per thread, per-device memory that kernels of another device reach
// only through peer access, per-device legacy streams, events recorded on
// their own device and waited on by any, peer copies, and CUDA's errors where
// a program can see them. The ordering of random multi-device programs is
// Generator.MultiDevice* (test_model.cc).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "guest/testing.h"
#include "harness.h"
#include "ordo/sim.h"
#include "worker/backends/null/null_backend.h"

namespace ordo::test {
namespace {

// A device with every feature there is: guests are shown none of those
// whose API ordo does not implement (WithheldAttribute), virtual memory
// management and IPC events only where the backend serves them, and every
// other attribute as the device has it.
class EveryFeature : public NullBackend {
 public:
  Status device_attributes(uint32_t, uint32_t first, int32_t* out) override {
    for (uint32_t i = 0; i < kDeviceAttributesPerCall; ++i) out[i] = int32_t(1000 + first + i);
    return Status::kSuccess;
  }
};
class EveryFeatureAndVmm final : public EveryFeature {
 public:
  bool supports_vmm() const override { return true; }
  bool supports_ipc() const override { return true; }
};

constexpr uint32_t kVmmAttribute = 102;       // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
constexpr uint32_t kIpcEventAttribute = 125;  // CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED

TEST(Devices, GuestsAreNotShownFeaturesOrdoDoesNotImplement) {
  std::set<uint32_t> withheld;
  for (const WithheldAttribute& w : withheld_attributes()) {
    ASSERT_LT(w.attr, kDeviceAttributeCount);
    ASSERT_TRUE(withheld.insert(w.attr).second) << w.attr << " listed twice";
  }
  for (uint32_t gated : {83u, 103u, 119u})  // managed memory, POSIX handles, pool IPC
    EXPECT_TRUE(withheld.count(gated)) << gated;
  // Cooperative launches, pools, clusters, VMM, IPC events: implemented.
  for (uint32_t kept : {95u, 115u, 120u, kVmmAttribute, kIpcEventAttribute})
    EXPECT_FALSE(withheld.count(kept)) << kept;
  for (bool vmm : {false, true}) {
    std::unique_ptr<Backend> b = vmm ? std::unique_ptr<Backend>(std::make_unique<EveryFeatureAndVmm>())
                                     : std::make_unique<EveryFeature>();
    InProcessWorker w({}, 16u << 20, std::move(b));
    auto c = w.attach();
    for (uint32_t first = 0; first < kDeviceAttributeCount; first += kDeviceAttributesPerCall) {
      int32_t a[kDeviceAttributesPerCall];
      ASSERT_EQ(c->device_attributes(0, first, a), Status::kSuccess);
      for (uint32_t i = 0; i < kDeviceAttributesPerCall; ++i) {
        const bool hidden =
            withheld.count(first + i) || ((first + i == kVmmAttribute || first + i == kIpcEventAttribute) && !vmm);
        EXPECT_EQ(a[i], hidden ? 0 : int32_t(1000 + first + i)) << "attribute " << first + i << ", vmm " << vmm;
      }
    }
  }
}

// Runs $ORDO_WORKER with `args`; its exit status, and stdout and stderr in *out.
int run_worker(const std::vector<std::string>& args, std::string* out) {
  std::string cmd = std::getenv("ORDO_WORKER") ? std::getenv("ORDO_WORKER") : "ordo-worker";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  out->clear();
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out->append(buf, n);
  const int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Status fill(Client& c, uint64_t dst, uint64_t count, uint32_t value, Stream s = kLegacyStream) {
  const sim::FillU32Args a{dst, count, value, 0};
  return c.launch(kernel(c, "ordo_fill_u32"), {1}, {1}, &a, sizeof a, s);
}

TEST(Devices, CountCurrentDeviceAndProperties) {
  WorkerProcess w({"--sim-devices", "4"});
  auto c = w.attach();
  ASSERT_EQ(c->device_count(), 4u);
  EXPECT_EQ(c->current_device(), 0u);
  EXPECT_EQ(c->set_device(4), Status::kInvalidDevice);
  EXPECT_EQ(c->current_device(), 0u);
  ASSERT_EQ(c->set_device(3), Status::kSuccess);
  EXPECT_EQ(c->current_device(), 3u);
  // The current device is the thread's: a new thread starts on device 0.
  uint32_t other = 99;
  std::thread([&] { other = c->current_device(); }).join();
  EXPECT_EQ(other, 0u);
  DeviceInfo a{}, b{};
  ASSERT_EQ(c->device_info(0, &a), Status::kSuccess);
  ASSERT_EQ(c->device_info(&b), Status::kSuccess);  // the current device: 3
  EXPECT_STREQ(a.name, "ordo sim device 0");
  EXPECT_STREQ(b.name, "ordo sim device 3");
  EXPECT_NE(std::memcmp(a.uuid, b.uuid, 16), 0) << "libraries tell devices apart by UUID";
  EXPECT_NE(a.pci_bus_id, b.pci_bus_id);
  DeviceInfo none{};
  EXPECT_EQ(c->device_info(4, &none), Status::kInvalidDevice);
  int32_t attrs[kDeviceAttributesPerCall];
  EXPECT_EQ(c->device_attributes(4, 0, attrs), Status::kInvalidDevice);
  ASSERT_EQ(c->device_attributes(2, 0, attrs), Status::kSuccess);
  EXPECT_EQ(attrs[1], 1024);  // MAX_THREADS_PER_BLOCK
}

TEST(Devices, StreamsEventsAndMemoryBelongToTheirDevice) {
  WorkerProcess w({"--sim-devices", "4"});
  auto c = w.attach();
  ASSERT_EQ(c->set_device(1), Status::kSuccess);
  Stream s1;
  ASSERT_EQ(c->stream_create(&s1), Status::kSuccess);
  Event e1;
  ASSERT_EQ(c->event_create(&e1), Status::kSuccess);
  uint32_t d = 99;
  ASSERT_TRUE(c->device_of(s1, &d));
  EXPECT_EQ(d, 1u);
  ASSERT_TRUE(c->device_of(kLegacyStream, &d));  // stream 0: the current device's legacy stream
  EXPECT_EQ(d, 1u);
  EXPECT_NE(guest::ring_of_stream(*c, kLegacyStream), 0u) << "device 1's legacy stream has a ring of its own";
  ASSERT_EQ(c->set_device(2), Status::kSuccess);
  ASSERT_TRUE(c->device_of(kLegacyStream, &d));
  EXPECT_EQ(d, 2u);
  Stream s2;
  ASSERT_EQ(c->stream_create(&s2), Status::kSuccess);
  // An event is recorded only on a stream of its device, at once, as CUDA answers;
  // any device's stream may wait on it.
  EXPECT_EQ(c->event_record(e1, s2), Status::kInvalidResourceHandle);
  EXPECT_EQ(c->event_record(e1, s1), Status::kSuccess);
  EXPECT_EQ(c->stream_wait_event(s2, e1), Status::kSuccess);
  EXPECT_EQ(c->stream_synchronize(s2), Status::kSuccess);
  EXPECT_EQ(c->get_last_error(), Status::kInvalidResourceHandle);  // the refused record, and nothing since
  EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  // Per-thread streams are per device too.
  const Stream p2 = c->per_thread_stream();
  ASSERT_EQ(c->set_device(1), Status::kSuccess);
  const Stream p1 = c->per_thread_stream();
  EXPECT_NE(p1.id, p2.id);
  ASSERT_TRUE(c->device_of(p1, &d));
  EXPECT_EQ(d, 1u);
  EXPECT_EQ(c->stream_destroy(s1), Status::kSuccess);
  EXPECT_EQ(c->stream_destroy(s2), Status::kSuccess);
  EXPECT_EQ(c->event_destroy(e1), Status::kSuccess);
}

TEST(Devices, PeerAccessAnswersAsCuda) {
  WorkerProcess w({"--sim-devices", "3"});
  auto c = w.attach();
  int can = -1;
  ASSERT_EQ(c->can_access_peer(&can, 0, 2), Status::kSuccess);
  EXPECT_EQ(can, 1);
  ASSERT_EQ(c->can_access_peer(&can, 1, 1), Status::kSuccess);
  EXPECT_EQ(can, 0) << "a device is not its own peer";
  EXPECT_EQ(c->can_access_peer(&can, 0, 3), Status::kInvalidDevice);
  EXPECT_EQ(c->enable_peer_access(0), Status::kInvalidDevice);  // from device 0 to itself
  EXPECT_EQ(c->enable_peer_access(3), Status::kInvalidDevice);
  EXPECT_EQ(c->disable_peer_access(1), Status::kPeerAccessNotEnabled);
  EXPECT_EQ(c->enable_peer_access(1), Status::kSuccess);
  EXPECT_EQ(c->enable_peer_access(1), Status::kPeerAccessAlreadyEnabled);
  EXPECT_EQ(c->disable_peer_access(1), Status::kSuccess);
  EXPECT_EQ(c->disable_peer_access(1), Status::kPeerAccessNotEnabled);
  c->get_last_error();
  // Peer access is the session's: a new session starts with none.
  c.reset();
  c = w.attach();
  EXPECT_EQ(c->disable_peer_access(1), Status::kPeerAccessNotEnabled);
}

// Each device's memory is its own: a kernel reaches another device's only
// after peer access from its device was enabled (a GPU faults otherwise);
// copies between devices need none.
TEST(Devices, KernelsReachAnotherDevicesMemoryOnlyWithPeerAccess) {
  WorkerProcess w({"--sim-devices", "2"});
  auto c = w.attach();
  constexpr uint64_t kN = 1024;
  uint64_t on0 = 0, on1 = 0;
  ASSERT_EQ(c->malloc(&on0, kN * 4), Status::kSuccess);
  ASSERT_EQ(c->set_device(1), Status::kSuccess);
  ASSERT_EQ(c->malloc(&on1, kN * 4), Status::kSuccess);
  // Device 1's kernel fills its own memory; a peer copy moves it to device 0's.
  ASSERT_EQ(fill(*c, on1, kN, 0xabcd0001), Status::kSuccess);
  ASSERT_EQ(c->memcpy_peer_async(on0, 0, on1, 1, kN * 4, kLegacyStream), Status::kSuccess);
  EXPECT_EQ(c->memcpy_peer_async(on0, 0, on1, 2, kN * 4, kLegacyStream), Status::kInvalidDevice);
  c->get_last_error();
  std::vector<uint32_t> out(kN);
  ASSERT_EQ(c->memcpy_d2h(out.data(), on0, kN * 4), Status::kSuccess);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(out[i], 0xabcd0001u) << i;
  // With peer access, device 1's kernel writes device 0's memory.
  ASSERT_EQ(c->enable_peer_access(0), Status::kSuccess);
  ASSERT_EQ(fill(*c, on0, kN, 7), Status::kSuccess);
  ASSERT_EQ(c->memcpy_d2h(out.data(), on0, kN * 4), Status::kSuccess);
  EXPECT_EQ(out[kN - 1], 7u);
  // Without it, the kernel faults as on a GPU: the session's context is lost.
  ASSERT_EQ(c->disable_peer_access(0), Status::kSuccess);
  ASSERT_EQ(fill(*c, on0, kN, 9), Status::kSuccess);
  EXPECT_EQ(c->device_synchronize(), Status::kIllegalAddress);
}

// A blocking stream follows its own device's legacy stream only: device 1's
// legacy stream busy for a while does not hold device 0's blocking stream.
TEST(Devices, LegacyStreamsArePerDevice) {
  WorkerProcess w({"--sim-devices", "2"});
  auto c = w.attach();
  uint64_t buf1 = 0, stamps0 = 0;
  ASSERT_EQ(c->set_device(1), Status::kSuccess);
  ASSERT_EQ(c->malloc(&buf1, 8), Status::kSuccess);
  const uint32_t slow = kernel(*c, "ordo_slow_copy");
  const sim::SlowCopyArgs sa{buf1, buf1, 0, 400000, 0};  // 400 ms on device 1's legacy stream
  ASSERT_EQ(c->launch(slow, {1}, {1}, &sa, sizeof sa, kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c->set_device(0), Status::kSuccess);
  Stream s0;
  ASSERT_EQ(c->stream_create(&s0), Status::kSuccess);  // blocking, on device 0
  ASSERT_EQ(c->malloc(&stamps0, sizeof(sim::Stamp)), Status::kSuccess);
  const sim::StampArgs st{stamps0, 0, 0};
  ASSERT_EQ(c->launch(kernel(*c, "ordo_stamp"), {1}, {1}, &st, sizeof st, s0), Status::kSuccess);
  ASSERT_EQ(c->stream_synchronize(s0), Status::kSuccess);
  ASSERT_EQ(c->set_device(1), Status::kSuccess);
  EXPECT_EQ(c->stream_query(kLegacyStream), Status::kNotReady)
      << "device 0's blocking stream waited for device 1's legacy stream";
  ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
  EXPECT_EQ(c->stream_query(kLegacyStream), Status::kSuccess);
  ASSERT_EQ(c->set_device(0), Status::kSuccess);
  EXPECT_EQ(c->stream_destroy(s0), Status::kSuccess);
}

TEST(Devices, WorkerRefusesBadDeviceCounts) {
  for (const char* n : {"0", "33", "x"}) {
    std::string out;
    EXPECT_NE(run_worker({"--device-info", "--backend", "sim", "--sim-devices", n}, &out), 0) << n;
    EXPECT_NE(out.find("--sim-devices"), std::string::npos) << out;
  }
  std::string out;
  EXPECT_EQ(run_worker({"--device-info", "--backend", "sim", "--sim-devices", "3", "--device", "2"}, &out), 0) << out;
  EXPECT_NE(out.find("name=ordo sim device 2"), std::string::npos) << out;
  EXPECT_NE(run_worker({"--device-info", "--backend", "sim", "--sim-devices", "3", "--device", "3"}, &out), 0);
}

}  // namespace
}  // namespace ordo::test

// A backend that does nothing, at once: isolates ordo's own cost (benchmarks,
// `ordo-worker --backend null`) and is the base of the fuzzer's checking
// backend. Fences and event waits run their callback inline, so ring.completed
// advances as soon as a fence is dispatched.
//
// `launch_ns` is a cost model: each launch keeps its caller busy that long, as
// a driver launch keeps the thread that calls cuLaunchKernel (a few
// microseconds of CPU time), so that dispatch-thread scaling shows without a
// GPU (bench_ordo's LaunchCost rows, `ordo-worker --null-launch-ns`).
#pragma once

#include "worker/backend.h"
#include "worker/clock.h"

namespace ordo {

class NullBackend : public Backend {
 public:
  explicit NullBackend(uint32_t devices = 1, uint64_t launch_ns = 0) : devices_(devices), launch_ns_(launch_ns) {}
  std::string_view name() const override { return "null"; }
  uint32_t device_count() const override { return devices_; }
  // It runs no kernels, so whatever pointers they are given reach nothing.
  bool register_host_memory(void*, uint64_t) override { return true; }
  Status stream_create(uint32_t, uint32_t, bool, int) override { return Status::kSuccess; }
  Status stream_destroy(uint32_t) override { return Status::kSuccess; }
  Status launch(uint32_t, const LaunchParams&, const OpTag&) override {
    if (launch_ns_) busy(launch_ns_);
    return Status::kSuccess;
  }
  Status memcpy(uint32_t, MemOperand, MemOperand, uint64_t, const OpTag&) override { return Status::kSuccess; }
  Status memset(uint32_t, uint64_t, uint8_t, uint64_t, const OpTag&) override { return Status::kSuccess; }
  Status event_create(uint32_t, uint32_t, uint32_t) override { return Status::kSuccess; }
  Status event_destroy(uint32_t) override { return Status::kSuccess; }
  Status event_record(uint32_t, uint32_t) override { return Status::kSuccess; }
  Status stream_wait_event(uint32_t, uint32_t) override { return Status::kSuccess; }
  Status event_query(uint32_t) override { return Status::kSuccess; }
  Status event_elapsed(uint32_t, uint32_t, float* ms) override {
    *ms = 0;
    return Status::kSuccess;
  }
  void event_notify(uint32_t, std::function<void()> fn) override { fn(); }
  void host_callback(uint32_t, std::function<void()> fn) override { fn(); }
  Status malloc(uint32_t, uint64_t size, uint64_t* addr) override {
    if (size == 0 || size > (1ull << 40)) return Status::kInvalidValue;
    *addr = next_;
    next_ += (size + 0xfff) & ~uint64_t{0xfff};
    return Status::kSuccess;
  }
  Status free(uint64_t) override { return Status::kSuccess; }
  Status module_load(uint32_t, std::span<const std::byte>) override { return Status::kSuccess; }
  Status module_unload(uint32_t) override { return Status::kSuccess; }
  Status kernel_lookup(uint32_t, std::string_view, uint32_t* kernel) override {
    *kernel = 0;
    return Status::kSuccess;
  }
  bool can_access_peer(uint32_t, uint32_t) override { return true; }
  Status set_peer_access(uint32_t, uint32_t, bool) override { return Status::kSuccess; }
  Status device_info(uint32_t, DeviceInfo* out) override {
    *out = DeviceInfo{};
    static constexpr char kName[] = "ordo null device";
    static_assert(sizeof(kName) <= sizeof(out->name));
    for (size_t i = 0; i < sizeof(kName); ++i) out->name[i] = kName[i];
    return Status::kSuccess;
  }

 private:
  // Spins rather than sleeps: a driver launch is CPU work, not a wait.
  static void busy(uint64_t ns) {
    for (const uint64_t end = now_ns() + ns; now_ns() < end;) {
    }
  }

  uint32_t devices_;
  uint64_t launch_ns_;
  uint64_t next_ = 0x7000'0000'0000;
};

}  // namespace ordo

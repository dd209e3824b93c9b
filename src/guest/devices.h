// Devices as the CUDA runtime has them: each thread has a current device, on
// which its streams, events and allocations are made (ARCHITECTURE.md,
// "Devices"); device properties and peer access.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "guest/session.h"
#include "guest/streams.h"
#include "guest/threads.h"
#include "ordo/client.h"
#include "ordo/device_info.h"

namespace ordo::guest {

class Devices {
 public:
  Devices(Session& session, Threads& threads, Streams& streams);

  Status set_device(uint32_t device);  // kInvalidDevice past device_count()
  uint32_t current_device() { return threads_.current().device; }
  Status can_access_peer(int* can, uint32_t device, uint32_t peer);
  Status peer_access(uint32_t peer, PeerCmd cmd);  // enable or disable, from the current device
  Status device_info(uint32_t device, DeviceInfo* out);
  Status device_attributes(uint32_t device, uint32_t first, int32_t* out);
  Status tensor_map_encode(uint32_t device, const TensorMapRequest& r, void* map);
  // The request alone: no last-error bookkeeping.
  Status fetch_device_info(uint32_t device, DeviceInfo* out);
  // The dynamic shared memory a launch on `device` may ask for (the device's
  // opt-in limit, at least 48 KiB), fetched once.
  Status shared_mem_limit(uint32_t device, uint64_t* limit);

 private:
  Session& session_;
  Threads& threads_;
  Streams& streams_;
  std::array<std::atomic<uint64_t>, kMaxDevices> smem_optin_;  // per device; 0 until needed
};

}  // namespace ordo::guest

#include "guest/devices.h"
#include "transport/op_args.h"
#include "transport/tensor_map.h"

#include <algorithm>

namespace ordo::guest {

namespace {
Entry peer_request(uint32_t device, uint32_t peer, PeerCmd cmd) {
  return make_entry<Op::PeerAccess>({.device = device, .peer = peer, .cmd = uint64_t(cmd)});
}
}  // namespace

Devices::Devices(Session& session, Threads& threads, Streams& streams)
    : session_(session), threads_(threads), streams_(streams) {
  for (auto& m : smem_optin_) m.store(0, std::memory_order_relaxed);
}

Status Devices::set_device(uint32_t device) {
  ThreadState& t = threads_.current();
  if (device >= session_.device_count()) return threads_.finish_own(t, Status::kInvalidDevice);
  if (device == t.device) return Status::kSuccess;
  if (Status s = streams_.open_legacy(t, device); !ok(s)) return threads_.finish_own(t, s);
  t.device = device;
  return threads_.finish_own(t, Status::kSuccess);
}

Status Devices::can_access_peer(int* can, uint32_t device, uint32_t peer) {
  ThreadState& t = threads_.current();
  if (!can) return threads_.finish_own(t, Status::kInvalidValue);
  if (device >= session_.device_count() || peer >= session_.device_count())
    return threads_.finish_own(t, Status::kInvalidDevice);
  if (device == peer) {  // as CUDA: a device is not its own peer
    *can = 0;
    return threads_.finish_own(t, Status::kSuccess);
  }
  uint64_t r0 = 0;
  const Status s = threads_.call(peer_request(device, peer, PeerCmd::kQuery), &r0);
  if (ok(s)) *can = r0 ? 1 : 0;
  return threads_.finish_own(t, s);
}

Status Devices::peer_access(uint32_t peer, PeerCmd cmd) {
  ThreadState& t = threads_.current();
  if (peer >= session_.device_count() || peer == t.device) return threads_.finish(t, Status::kInvalidDevice);
  return threads_.finish(t, threads_.call(peer_request(t.device, peer, cmd)));
}

Status Devices::fetch_device_info(uint32_t device, DeviceInfo* out) {
  if (device >= session_.device_count()) return Status::kInvalidDevice;
  const Entry e = make_entry<Op::DeviceInfo>({.device = device});
  DeviceInfo info{};
  const Status s = threads_.call(e, nullptr, nullptr, nullptr, &info, sizeof info);
  if (ok(s)) {
    *out = info;
    out->name[sizeof(out->name) - 1] = 0;
  }
  return s;
}

Status Devices::device_info(uint32_t device, DeviceInfo* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish(t, Status::kInvalidValue);
  return threads_.finish(t, fetch_device_info(device, out));
}

Status Devices::device_attributes(uint32_t device, uint32_t first, int32_t* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish(t, Status::kInvalidValue);
  if (device >= session_.device_count()) return threads_.finish(t, Status::kInvalidDevice);
  const Entry e = make_entry<Op::DeviceAttributes>({.device = device, .first = first});
  const Status s = threads_.call(e, nullptr, nullptr, nullptr, out, kDeviceAttributesPerCall * sizeof(int32_t));
  return threads_.finish(t, s);
}

Status Devices::tensor_map_encode(uint32_t device, const TensorMapRequest& r, void* map) {
  ThreadState& t = threads_.current();
  if (!map) return threads_.finish(t, Status::kInvalidValue);
  if (device >= session_.device_count()) return threads_.finish(t, Status::kInvalidDevice);
  const Entry e = make_entry<Op::TensorMapEncode>({.device = device});
  const std::string request(reinterpret_cast<const char*>(&r), sizeof r);
  return threads_.finish_own(t, threads_.call(e, nullptr, nullptr, &request, map, kTensorMapBytes));
}

Status Devices::shared_mem_limit(uint32_t device, uint64_t* limit) {
  *limit = smem_optin_[device].load(std::memory_order_relaxed);
  if (*limit) return Status::kSuccess;
  DeviceInfo info{};
  if (Status st = fetch_device_info(device, &info); !ok(st)) return st;
  *limit = std::max<uint64_t>(info.shared_mem_per_block_optin, 48 * 1024);
  smem_optin_[device].store(*limit, std::memory_order_relaxed);
  return Status::kSuccess;
}

}  // namespace ordo::guest

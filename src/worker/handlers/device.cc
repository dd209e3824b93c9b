// Devices: what the guest learns about them, read through the slot's payload.
#include <cstring>
#include <mutex>

#include "../worker.h"

namespace ordo {

void Worker::op_Null(const SlotCall& c) { reply(c, Status::kSuccess); }

void Worker::op_DeviceInfo(const SlotCall& c) {
  const auto a = decode<Op::DeviceInfo>(c.e.arg);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  DeviceInfo info{};
  const Status st = backend_.device_info(uint32_t(a.device), &info);
  if (ok(st)) {
    info.name[sizeof(info.name) - 1] = 0;
    std::lock_guard lock(error_mu_);  // the payload is the guest's to read after the reply
    std::memcpy(region_.slot(c.slot).payload, &info, sizeof(info));
  }
  reply(c, st);
}

void Worker::op_DeviceAttributes(const SlotCall& c) {
  const auto a = decode<Op::DeviceAttributes>(c.e.arg);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  int32_t attrs[kDeviceAttributesPerCall] = {};
  const Status st = backend_.guest_attributes(uint32_t(a.device), uint32_t(a.first), attrs);
  if (ok(st)) {
    std::lock_guard lock(error_mu_);
    std::memcpy(region_.slot(c.slot).payload, attrs, sizeof attrs);
  }
  reply(c, st);
}

}  // namespace ordo

// Tensor maps: the host driver's descriptor for the guest's request. The
// request is copied out of the payload once (the guest may rewrite it) and
// held to cuda.h's rules before the backend sees it.
#include <cstring>
#include <mutex>

#include "../worker.h"
#include "transport/tensor_map.h"

namespace ordo {

void Worker::op_TensorMapEncode(const SlotCall& c) {
  const auto a = decode<Op::TensorMapEncode>(c.e.arg);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);  // check_entry knows only kMaxDevices
  TensorMapRequest r;
  std::memcpy(&r, region_.slot(c.slot).payload, sizeof r);
  // A request against cuda.h's rules is the program's error, not a forged
  // call: CUDA's answer, nothing logged.
  std::string why;
  if (!check_tensor_map(r, &why)) return reply(c, Status::kInvalidValue);
  alignas(64) std::byte map[kTensorMapBytes] = {};
  const Status st = backend_.tensor_map_encode(uint32_t(a.device), r, map);
  if (ok(st)) {
    std::lock_guard lock(error_mu_);  // the payload is the guest's to read after the reply
    std::memcpy(region_.slot(c.slot).payload, map, sizeof map);
  }
  reply(c, st);
}

}  // namespace ordo

// The driver's private export tables (cuGetExportTable): undocumented
// interfaces cudart and NVIDIA's libraries require of libcuda.so.1. All of them
// are process-local; none needs the host. Slot meanings: docs/CUDA.md,
// "Private export tables" (credit: vosen/ZLUDA, see NOTICE).
#pragma once

#include <cstdint>

namespace ordo::driver {

// The table with `uuid` (16 bytes), or nullptr when this library has none.
const void* export_table(const uint8_t uuid[16]);

// A destroyed stream's handle from the 21318c60 table's slot 51 (by
// cuStreamGetId's id) is forgotten: slot 39 refuses it from then on.
void forget_stream_token(uint64_t stream_id);

// What a device contributes to the integrity check.
struct DeviceHashInfo {
  uint8_t uuid[16];
  int32_t pci_domain, pci_bus, pci_device;
};
static_assert(sizeof(DeviceHashInfo) == 28);
// The most devices the check hashes: a session's most (ordo::kMaxDevices).
inline constexpr int kMaxHashDevices = 32;

// The answer INTEGRITY_CHECK slot 1 gives cudart: HMAC-MD2 (RFC 1319, RFC 2104)
// under a fixed key over the caller's environment and the devices.
struct IntegrityInput {
  uint32_t driver_version, version, pid, thread;
  const void* cudart_table;
  const void* integrity_table;
  const void* check_fn;
  uint64_t unix_seconds;
};
static_assert(sizeof(IntegrityInput) == 48);
void integrity_hash(const IntegrityInput& in, const DeviceHashInfo* devices, int count, uint64_t out[2]);

// The MD2 digest of `data` (tests check it against RFC 1319's vectors).
void md2(const void* data, uint64_t size, uint8_t out[16]);

}  // namespace ordo::driver

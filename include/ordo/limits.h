// The limits and flags a guest program sees through ordo::Client, defined
// once here for both the public API (client.h) and the protocol (layout.h).
#pragma once

#include <cstdint>

namespace ordo {

// Streams are not rings: a guest session names up to kMaxStreams streams, and
// when they outnumber the rings, several share one (ARCHITECTURE.md, "Streams
// and rings"). Stream 0 is the legacy default stream, always on ring 0.
inline constexpr uint32_t kMaxStreams = 65536;
inline constexpr uint32_t kLegacyStreamId = 0;
// A session sees up to kMaxDevices devices (RegionHeader::device_count). Stream
// ids below kMaxDevices are the devices' legacy default streams: device d's is
// stream d. Device 0's is open from the start on ring 0; the guest opens
// another device's (StreamCreate with kStreamLegacy) when a thread first uses it.
inline constexpr uint32_t kMaxDevices = 32;
// Events a guest session holds at once: an event handle's low 32 bits index
// them, its high 32 bits are a generation that makes a stale handle fail.
inline constexpr uint32_t kMaxEvents = 65536;

// The largest module image (ModuleLoad) the worker copies out, and how many
// modules one guest session may hold.
inline constexpr uint64_t kMaxModuleImage = uint64_t{256} << 20;
inline constexpr uint32_t kMaxModules = 4096;

// Virtual memory management (cuMemCreate, cuMemMap): sizes, addresses and
// alignments are multiples of this, the granularity every current NVIDIA GPU
// reports for device memory (minimum and recommended alike).
inline constexpr uint64_t kVmmGranularity = uint64_t{2} << 20;
// The largest alignment a reservation may ask for (no GPU's address space
// places ranges further apart).
inline constexpr uint64_t kVmmMaxAlignment = uint64_t{1} << 40;
// A mapping's access from one device, CUmemAccess_flags' numbers: two bits a
// device in one word (VmmSetAccess arg3, and every table of mappings).
enum class VmmAccess : uint8_t { kNone = 0, kRead = 1, kReadWrite = 3 };
// Device d's access in such a word.
constexpr uint64_t vmm_access_of(uint64_t access, uint32_t d) { return access >> (2 * d) & 3; }
// `old` with each device of `devices` (bit d) given its access in `access`, the others kept.
constexpr uint64_t vmm_access_merge(uint64_t old, uint64_t devices, uint64_t access) {
  uint64_t named = 0;  // the two bits of every device named
  for (uint32_t d = 0; d < kMaxDevices; ++d)
    if (devices >> d & 1) named |= uint64_t{3} << (2 * d);
  return (old & ~named) | (access & named);
}

// Stream flags (StreamCreate arg0).
inline constexpr uint64_t kStreamNonBlocking = 1;
inline constexpr uint64_t kStreamLegacy = 2;  // the device's legacy default stream: its id is the device

// Event flags (EventCreate arg0): CUDA's numbers. An interprocess event
// (cudaEventInterprocess) can be exported to another guest process of the
// region; CUDA requires it to be made without timing.
inline constexpr uint64_t kEventBlockingSync = 1;
inline constexpr uint64_t kEventDisableTiming = 2;
inline constexpr uint64_t kEventInterprocess = 4;

// What IpcExport exports.
// kVmm: physical memory of cuMemCreate, as a POSIX descriptor exports it.
enum class IpcKind : uint64_t { kMemory = 0, kEvent = 1, kVmm = 2 };

}  // namespace ordo

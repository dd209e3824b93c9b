// The bytes of an IPC handle libcuda.so.1 hands out (a CUipcMemHandle, a
// CUipcEventHandle, or the contents of a cuMemExportToShareableHandle
// descriptor): a tag saying what it is, then the worker's token. They mean
// nothing outside the region that made them (ARCHITECTURE.md, "Sessions").
#pragma once

#include <cstdint>
#include <cstring>

#include "ordo/client.h"

namespace ordo::driver {

inline constexpr uint64_t kIpcMemTag = 0x314d435049445230ULL;    // "0RDIPCM1"
inline constexpr uint64_t kIpcEventTag = 0x3145435049445230ULL;  // "0RDIPCE1"
inline constexpr uint64_t kIpcVmmTag = 0x3156435049445230ULL;    // "0RDIPCV1"

struct IpcWire {
  uint64_t tag;
  uint64_t word;
  uint64_t secret;
  uint64_t zero[5];
};
static_assert(sizeof(IpcWire) == 64);  // CU_IPC_HANDLE_SIZE

inline IpcWire ipc_wire(uint64_t tag, const ordo::Client::IpcToken& t) { return {tag, t.word, t.secret, {}}; }

inline bool ipc_token(const void* bytes, uint64_t tag, ordo::Client::IpcToken* t) {
  IpcWire w;
  std::memcpy(&w, bytes, sizeof w);
  if (w.tag != tag) return false;
  *t = {w.word, w.secret};
  return true;
}

}  // namespace ordo::driver

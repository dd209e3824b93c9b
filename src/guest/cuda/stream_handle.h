// Stream handles as libcuda.so.1 hands them out (and cudart passes them on:
// cudaStream_t and CUstream are the same pointer type): the stream id and its generation packed
// into the pointer, so a stale handle is caught by the client, and CUDA's
// special values for the legacy and the per-thread stream.
#pragma once

#include <cstdint>

#include "ordo/client.h"

namespace ordo::driver {

inline constexpr uintptr_t kStreamTag = 0x5d;
inline constexpr uintptr_t kLegacyHandle = 0x1;     // cudaStreamLegacy, CU_STREAM_LEGACY
inline constexpr uintptr_t kPerThreadHandle = 0x2;  // cudaStreamPerThread, CU_STREAM_PER_THREAD

inline uintptr_t stream_handle(Stream s) {
  return uintptr_t(s.generation) << 32 | uintptr_t(s.id) << 8 | kStreamTag;
}

// per_thread: called through a _ptsz/_ptds entry point, where handle 0 is the
// calling thread's stream; elsewhere it is the legacy stream.
inline bool stream_of_handle(Client* c, uintptr_t h, bool per_thread, Stream* out) {
  const uintptr_t id = (h >> 8) & 0xffffff;
  if (h == 0) {
    *out = per_thread ? c->per_thread_stream() : kLegacyStream;
  } else if (h == kLegacyHandle) {
    *out = kLegacyStream;
  } else if (h == kPerThreadHandle) {
    *out = c->per_thread_stream();
  } else if ((h & 0xff) == kStreamTag && id != 0 && id < kMaxStreams) {
    *out = {uint32_t(id), uint32_t(h >> 32)};
  } else {
    return false;
  }
  return true;
}

}  // namespace ordo::driver

// What the areas of libcuda.so.1 share (docs/CUDA.md, "Layout of libcuda.so.1"):
// the prologue of every call, status codes, devices, contexts, stream and event
// handles, and the device memory the program holds. Each area keeps the rest
// of its state to itself.
#pragma once

// cuda.h declares every exported name under the name it is exported as
// (cuMemAlloc_v2, cuMemcpyHtoD_v2_ptds...) only with this set: each export is
// then defined with the signature the compiler checks.
#ifdef __cuda_cuda_h__
#error "state.h must be included before <cuda.h>"
#endif
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "address_ranges.h"
#include "ordo/client.h"
#include "ordo/layout.h"
#include "stream_handle.h"

namespace ordo::driver {

// ---------------------------------------------------------------- the client (init.cc)

// The prologue of every call that reaches the client: the error to return
// before cuInit, during exit (CUDA_ERROR_DEINITIALIZED: from the first atexit
// handler, or once the calling thread's thread_local state is destroyed) or
// without a worker, else CUDA_SUCCESS with the
// client in *out. It first moves the client's per-thread device to the current
// context's (follow_context): what the call creates or runs on stream 0 then
// lands on that device.
CUresult enter(ordo::Client** out);
// The same checks, for a call that needs no client call of its own.
CUresult enter();

bool initialized();               // cuInit has succeeded
ordo::Client* attached_client();  // the client, or null: not attached (yet), or detached at unload

CUresult to_cu(ordo::Status s);

// ---------------------------------------------------------------- devices (device.cc)

// The session's devices, set by cuInit before initialized() is true; 0 until
// then. Read on every context lookup, so shared rather than behind a call.
extern std::atomic<int> g_device_count;

inline bool valid_device(CUdevice dev) { return dev >= 0 && dev < g_device_count.load(std::memory_order_relaxed); }

inline constexpr int kAttrCount = 256;  // CU_DEVICE_ATTRIBUTE_MAX is below this in CUDA 13

struct DeviceCache {
  std::once_flag once;
  CUresult error = CUDA_SUCCESS;
  ordo::DeviceInfo info{};
  int32_t attrs[kAttrCount] = {};
};

// The cache of device `dev`, fetched once per device and process: every
// attribute is a guest-local read afterwards. Starts with enter();
// CUDA_ERROR_INVALID_DEVICE when there is no such device.
CUresult device_cache(CUdevice dev, const DeviceCache** out);

// ---------------------------------------------------------------- contexts (context.cc)

struct Context;  // one primary context per device plus any cuCtxCreate'd ones

Context* current();                  // the calling thread's current context, or null
// Whether the calling thread's thread_local state is gone (context.cc): the
// thread is ending, or the program is exiting and runs its atexit handlers.
bool thread_torn_down();
Context* context_of(CUcontext h);    // null: not a context of ours
Context* primary_ctx(CUdevice dev);  // device dev's primary context; dev must be valid
CUdevice device_of(const Context* c);
inline CUcontext handle(Context* c) { return reinterpret_cast<CUcontext>(c); }

// The device of the calling thread: its current context's, or with none, the
// one the client last had for it.
CUdevice this_device();
// This thread's device as the client has it (Client::set_device).
uint32_t client_device();
// Moves the client's device for this thread to the current context's (enter()).
CUresult follow_context(ordo::Client* c);

void init_primaries();  // once, by cuInit

// Runs `f` (client calls) with the client on `dev` for this thread, then back:
// for device-wide work of a device that is not the current one.
template <typename F>
ordo::Status on_device(ordo::Client* c, CUdevice dev, F f) {
  const uint32_t home = client_device();
  if (uint32_t(dev) == home) return f();
  if (const ordo::Status s = c->set_device(uint32_t(dev)); !ok(s)) return s;
  const ordo::Status r = f();
  const ordo::Status back = c->set_device(home);
  return ok(r) ? back : r;
}

// ---------------------------------------------------------------- streams and events

// per_thread: called through a _ptds/_ptsz entry point, where handle 0 is the
// calling thread's stream (stream_of_handle).
inline bool from_handle(ordo::Client* c, CUstream h, bool per_thread, ordo::Stream* out) {
  return stream_of_handle(c, reinterpret_cast<uintptr_t>(h), per_thread, out);
}

// Whether `s` was created CU_STREAM_NON_BLOCKING (stream.cc): only those do
// not synchronize with the legacy stream.
bool stream_non_blocking(ordo::Stream s);

inline ordo::Event to_event(CUevent e) { return {reinterpret_cast<uintptr_t>(e)}; }

// ---------------------------------------------------------------- memory (memory.cc)

// Device memory the program holds (allocations and module variables), with
// the device of each range.
AddressRanges& device_allocs();
// The reserved range (cuMemAddressReserve) holding ptr, as the program asked for it (vmm.cc).
bool vmm_reservation_of(uint64_t ptr, uint64_t* base, uint64_t* size);
// cuMemFree's work, without its check against capture (stream-ordered frees
// are checked against their stream's).
CUresult free_device_memory(CUdeviceptr ptr);
// Whether [p, p + n) is mapped pinned memory: pinned, with the session's
// region where the worker maps it, so its device address is its host address.
bool mapped_host(ordo::Client* c, uint64_t p, uint64_t n);

}  // namespace ordo::driver

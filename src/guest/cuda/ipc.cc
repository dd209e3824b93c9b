// Interprocess memory and events (cuIpc*): how PyTorch's multiprocessing,
// CuPy and NCCL's legacy P2P path share device memory and events between the
// processes of one VM. A handle holds the worker's token for the export, which
// the opener's worker finds in the region's table (ARCHITECTURE.md,
// "Sessions"): the bytes mean nothing outside this region, and a handle the
// table does not know is refused. Opened memory is device memory like
// cuMemAlloc's (device_allocs), of the device it belongs to.
#include "ipc_handle.h"
#include "state.h"

#include <cstring>
#include <map>
#include <mutex>

namespace ordo::driver {
namespace {

static_assert(sizeof(IpcWire) == CU_IPC_HANDLE_SIZE);

template <class H>
void write_handle(H* h, uint64_t tag, const ordo::Client::IpcToken& t) {
  const IpcWire w = ipc_wire(tag, t);
  std::memcpy(h->reserved, &w, sizeof w);
}

template <class H>
bool read_handle(const H& h, uint64_t tag, ordo::Client::IpcToken* t) {
  return ipc_token(h.reserved, tag, t);
}

// Opens per address, as the worker counts them: the range stays in
// device_allocs until the last close.
struct Opened {
  std::mutex mu;
  std::map<uint64_t, uint32_t> opens;
};
Opened& opened() {
  static auto* o = new Opened;  // never destroyed: used from atexit handlers
  return *o;
}

CUresult open_mem(CUdeviceptr* out, CUipcMemHandle handle, unsigned flags) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS is the only flag: the worker enables
  // peer access to another device's memory as it opens it.
  if (flags & ~unsigned(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Client::IpcToken t;
  if (!read_handle(handle, kIpcMemTag, &t)) return CUDA_ERROR_INVALID_VALUE;
  uint64_t addr = 0, size = 0;
  uint32_t device = 0;
  const Status s = c->ipc_open_mem(t, &addr, &size, &device);
  if (!ok(s)) return to_cu(s);
  {
    std::lock_guard lock(opened().mu);
    if (opened().opens[addr]++ == 0) device_allocs().add(addr, size, int(device));
  }
  *out = addr;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation
using ordo::Status;

extern "C" {

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Client::IpcToken t;
  const Status s = c->ipc_export_mem(ptr, &t);
  if (ok(s)) write_handle(handle, kIpcMemTag, t);
  return to_cu(s);
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* ptr, CUipcMemHandle handle, unsigned int flags) {
  return open_mem(ptr, handle, flags);
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* ptr, CUipcMemHandle handle, unsigned int flags) {
  return open_mem(ptr, handle, flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr ptr) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const Status s = c->ipc_close_mem(ptr);
  if (ok(s)) {
    std::lock_guard lock(opened().mu);
    if (auto it = opened().opens.find(ptr); it != opened().opens.end() && --it->second == 0) {
      opened().opens.erase(it);
      device_allocs().erase(ptr);
    }
  }
  return to_cu(s);
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent event) {
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  ordo::Client::IpcToken t;
  const Status s = c->ipc_export_event(to_event(event), &t);
  if (ok(s)) write_handle(handle, kIpcEventTag, t);
  return to_cu(s);
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* event, CUipcEventHandle handle) {
  if (!event) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  ordo::Client::IpcToken t;
  if (!read_handle(handle, kIpcEventTag, &t)) return CUDA_ERROR_INVALID_VALUE;
  ordo::Event e;
  const Status s = c->ipc_open_event(t, &e);
  if (ok(s)) *event = reinterpret_cast<CUevent>(uintptr_t(e.handle));
  return to_cu(s);
}

}  // extern "C"

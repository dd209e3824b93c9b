// ordo's libcuda.so.1: the CUDA driver API of an unmodified program (static or
// shared cudart, cuBLAS and the other NVIDIA libraries) on top of ordo::Client.
// This file: attaching the client, cuInit, status codes and error strings,
// versions and the entry points (cuGetProcAddress, cuGetExportTable). The other
// areas are laid out in docs/CUDA.md, "Layout of libcuda.so.1".
//
// Declarations come from the real cuda.h under __CUDA_API_VERSION_INTERNAL
// (state.h), so every function is defined under its exported name
// (cuMemAlloc_v2, cuMemcpyHtoD_v2_ptds...) with the signature the compiler
// checks. What is not implemented is a weak stub (generated, driver_stubs.cc)
// that names itself once and returns CUDA_ERROR_NOT_SUPPORTED; the _ptds/_ptsz
// twins and _v2-style aliases are generated from forwarders.txt.
// cuGetProcAddress resolves through the generated table (proc_table.h).
// docs/CUDA.md lists what is supported.
#include "state.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "dark_api.h"
#include "ordo/region.h"
#include "driver.h"
#include "proc_table.h"

namespace ordo::driver {
namespace {

// ---------------------------------------------------------------- the client

std::atomic<bool> g_initialized{false};
// Set by an exit handler registered at cuInit, so it runs before cudart's own
// (registered earlier), after the main thread's thread_local state is gone:
// from then on calls answer CUDA_ERROR_DEINITIALIZED, as the real driver's do
// during teardown, and touch nothing.
std::atomic<bool> g_exiting{false};
std::once_flag g_attach_once;
std::atomic<ordo::Client*> g_client{nullptr};
CUresult g_attach_error = CUDA_ERROR_NOT_INITIALIZED;

CUresult attach() {
  std::call_once(g_attach_once, [] {
    Status s = Status::kSuccess;
    auto c = ordo::Client::attach_for_cuda("libcuda.so.1 is ordo's guest driver", &s);
    if (!c) {
      g_attach_error = to_cu(s);
      return;
    }
    g_client.store(c.release(), std::memory_order_release);
  });
  return g_client.load(std::memory_order_acquire) ? CUDA_SUCCESS : g_attach_error;
}

__attribute__((destructor)) void detach() {
  // After the program's atexit handlers: no call reaches the client any more,
  // and detaching frees this session in the worker at once. Threads the
  // program left running may still touch pinned memory (NCCL's proxy threads
  // do), which a real driver leaves mapped until the process is gone: the
  // region's range stays mapped, as private memory once the session is over.
  ordo::Client* c = g_client.exchange(nullptr, std::memory_order_acq_rel);
  if (!c) return;
  c->retain_memory_until_exit();
  delete c;
  ordo::Region::privatize_retained();
}

}  // namespace

// ---------------------------------------------------------------- status

CUresult to_cu(Status s) {
  switch (s) {
    case Status::kSuccess: return CUDA_SUCCESS;
    // A launch with an empty grid or too large a block: NVIDIA's driver 580
    // answers CUDA_ERROR_INVALID_VALUE, and cudart 13 hands that on as
    // cudaErrorInvalidValue (measured natively on an H200: <<<0, 1>>> and
    // <<<1, 2048>>> both give 1), not the runtime's cudaErrorInvalidConfiguration.
    case Status::kInvalidConfiguration:
    case Status::kInvalidValue:
    case Status::kInvalidDevicePointer: return CUDA_ERROR_INVALID_VALUE;
    case Status::kMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case Status::kInitializationError: return CUDA_ERROR_NOT_INITIALIZED;
    case Status::kInvalidDevice: return CUDA_ERROR_INVALID_DEVICE;
    case Status::kInvalidContext: return CUDA_ERROR_INVALID_CONTEXT;
    case Status::kInvalidKernelImage: return CUDA_ERROR_INVALID_IMAGE;
    case Status::kDevicesUnavailable: return CUDA_ERROR_DEVICE_UNAVAILABLE;
    case Status::kInvalidDeviceFunction: return CUDA_ERROR_NOT_FOUND;
    case Status::kInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case Status::kIllegalState: return CUDA_ERROR_ILLEGAL_STATE;
    case Status::kNotReady: return CUDA_ERROR_NOT_READY;
    case Status::kIllegalAddress: return CUDA_ERROR_ILLEGAL_ADDRESS;
    case Status::kLaunchOutOfResources: return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    case Status::kMisalignedAddress: return CUDA_ERROR_MISALIGNED_ADDRESS;
    case Status::kLaunchFailure: return CUDA_ERROR_LAUNCH_FAILED;
    case Status::kLaunchTimeout: return CUDA_ERROR_LAUNCH_TIMEOUT;
    case Status::kAssert: return CUDA_ERROR_ASSERT;
    case Status::kHardwareStackError: return CUDA_ERROR_HARDWARE_STACK_ERROR;
    case Status::kIllegalInstruction: return CUDA_ERROR_ILLEGAL_INSTRUCTION;
    case Status::kInvalidAddressSpace: return CUDA_ERROR_INVALID_ADDRESS_SPACE;
    case Status::kInvalidPc: return CUDA_ERROR_INVALID_PC;
    case Status::kNoKernelImage: return CUDA_ERROR_NO_BINARY_FOR_GPU;
    case Status::kNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    case Status::kCooperativeLaunchTooLarge: return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    case Status::kInvalidClusterSize: return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    case Status::kPeerAccessUnsupported: return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    case Status::kPeerAccessAlreadyEnabled: return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    case Status::kPeerAccessNotEnabled: return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  }
  // Other codes come from a real driver through the cuda backend as cudaError_t
  // numbers, which from 100 up are the driver's CUresult numbers too.
  return int32_t(s) >= 100 ? CUresult(int32_t(s)) : CUDA_ERROR_UNKNOWN;
}

// ---------------------------------------------------------------- the prologue (state.h)

CUresult enter(ordo::Client** out) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  // Exit handlers registered after cuInit run before g_exiting is set, with
  // this thread's state (the client's per-thread slots, the context stack)
  // already destroyed: thread_torn_down() sees that.
  if (g_exiting.load(std::memory_order_relaxed) || thread_torn_down()) return CUDA_ERROR_DEINITIALIZED;
  ordo::Client* c = g_client.load(std::memory_order_acquire);
  if (!c) return g_attach_error;
  *out = c;
  return follow_context(c);
}

CUresult enter() {
  ordo::Client* c = nullptr;
  return enter(&c);
}

bool initialized() { return g_initialized.load(std::memory_order_acquire); }

ordo::Client* attached_client() { return g_client.load(std::memory_order_acquire); }

// ================================================================ for dark_api.cc

int driver_version() { return CUDA_VERSION; }

bool driver_trace() {
  static const bool on = [] {
    const char* t = std::getenv("ORDO_DRIVER_TRACE");
    return t && *t == '1';
  }();
  return on;
}

// ================================================================ for cuGetProcAddress (proc_table.h)

ProcLookup lookup_proc(std::string_view name, int version, bool per_thread, void** fn) {
  const ProcEntry* begin = kProcTable;
  const ProcEntry* end = kProcTable + kProcTableSize;
  auto first = std::lower_bound(begin, end, name, [](const ProcEntry& e, std::string_view n) { return e.name < n; });
  if (first == end || first->name != name) return ProcLookup::kSymbolNotFound;
  const ProcEntry* best = nullptr;
  bool have_per_thread = false;
  for (auto* e = first; e != end && e->name == name; ++e) have_per_thread |= e->per_thread;
  const bool want = per_thread && have_per_thread;
  for (auto* e = first; e != end && e->name == name; ++e)
    if (e->per_thread == want && e->version <= version) best = e;  // sorted by version: the newest wins
  if (!best) return ProcLookup::kVersionNotSufficient;
  *fn = driver_trace() ? best->traced : best->fn;
  return ProcLookup::kFound;
}

}  // namespace ordo::driver

// ================================================================ the driver API

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = attach(); e != CUDA_SUCCESS) return e;
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] { g_exiting.store(true); });
    const uint32_t n = g_client.load(std::memory_order_acquire)->device_count();
    g_device_count.store(int(std::min<uint32_t>(n, ordo::kMaxDevices)));
    init_primaries();
  });
  g_initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = driver_version();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~cuuint64_t(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
    return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const ProcLookup r =
      lookup_proc(symbol, version, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, pfn);
  // What a library looked for and did not get: what to implement next.
  if (driver_trace() && r != ProcLookup::kFound)
    std::fprintf(stderr, "ordo-trace: cuGetProcAddress(%s, %d): %s\n", symbol, version,
                 r == ProcLookup::kSymbolNotFound ? "no such entry point" : "only newer versions");
  if (status)
    *status = r == ProcLookup::kFound               ? CU_GET_PROC_ADDRESS_SUCCESS
              : r == ProcLookup::kSymbolNotFound    ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                                                    : CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  return r == ProcLookup::kFound ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
  if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
  *table = export_table(reinterpret_cast<const uint8_t*>(id->bytes));
  return *table ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  *str = error_name(int(error));
  return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *str = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED:
      *str = "initialization error (ordo: ORDO_REGION unset or not an ordo region; see the message on stderr)";
      break;
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      *str = "CUDA-capable device(s) is/are busy or unavailable (ordo: no ordo-worker serves ORDO_REGION)";
      break;
    case CUDA_ERROR_NOT_SUPPORTED: *str = "operation not supported (by the ordo guest library)"; break;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *str = "no kernel image is available for execution on the device"; break;
    case CUDA_ERROR_INVALID_HANDLE: *str = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: *str = "named symbol not found"; break;
    case CUDA_ERROR_NOT_READY: *str = "device not ready"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *str = "an illegal memory access was encountered"; break;
    case CUDA_ERROR_MISALIGNED_ADDRESS: *str = "misaligned address"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *str = "unspecified launch failure"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "invalid device context"; break;
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: *str = "peer access is not supported between these two devices"; break;
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: *str = "peer access is already enabled"; break;
    case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: *str = "peer access has not been enabled"; break;
    default: *str = error_name(int(error)); break;
  }
  return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuProfilerStart(void) { return CUDA_SUCCESS; }  // no profiler attaches through ordo
CUresult CUDAAPI cuProfilerStop(void) { return CUDA_SUCCESS; }

}  // extern "C"

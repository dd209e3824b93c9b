// Virtual memory management: reserved address ranges, physical memory of a
// device behind a handle, mappings and their access (PyTorch's expandable
// segments, NCCL's buffers). The worker keeps the books it checks requests
// against; these are the guest's own, for what CUDA answers without a round
// trip (cuMemGetAccess, cuMemRetainAllocationHandle, the properties of a
// handle, pointer attributes) and for the handle references CUDA counts.
// Memory is device memory like cuMemAlloc's: mappings join device_allocs().
#include "forwarded.h"
#include "graph.h"
#include "ipc_handle.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

namespace ordo::driver {
namespace {

constexpr uint64_t kGranularity = ordo::kVmmGranularity;
constexpr uint64_t kPage = 4096;

struct Handle {
  CUmemAllocationProp prop{};
  uint64_t size = 0;
  uint32_t refs = 1;  // cuMemCreate's, and one per cuMemRetainAllocationHandle
  uint32_t maps = 0;  // the worker lets its memory go once both are 0
};
struct Mapping {
  uint64_t size = 0;
  uint64_t handle = 0;
  uint64_t access = 0;  // bits 2d..2d+1: device d's CUmemAccess_flags
};
struct Reservation {
  uint64_t size = 0;      // as the program asked
  uint64_t reserved = 0;  // in whole granules, as the worker holds it
};
struct Books {
  std::mutex mu;
  std::map<uint64_t, Reservation> reservations;
  std::map<uint64_t, Handle> handles;
  std::map<uint64_t, Mapping> mappings;
};
Books& books() {
  static auto* b = new Books;  // never destroyed: used from atexit handlers
  return *b;
}

template <class Map>
auto containing(Map& m, uint64_t a, uint64_t (*size_of)(const typename Map::mapped_type&)) {
  auto it = m.upper_bound(a);
  if (it == m.begin()) return m.end();
  --it;
  return a - it->first < size_of(it->second) ? it : m.end();
}
uint64_t mapping_size(const Mapping& m) { return m.size; }
uint64_t reservation_size(const Reservation& r) { return r.size; }

// Says once per reason what is refused, and why.
CUresult not_supported_once(std::atomic<bool>& said, const char* what) {
  if (!said.exchange(true)) std::fprintf(stderr, "ordo: %s (CUDA_ERROR_NOT_SUPPORTED)\n", what);
  return CUDA_ERROR_NOT_SUPPORTED;
}

// What a CUmemAllocationProp asks for, as cuMemCreate and
// cuMemGetAllocationGranularity check it; *device: its device.
CUresult check_prop(ordo::Client* c, const CUmemAllocationProp* p, uint32_t* device) {
  if (!p || p->type != CU_MEM_ALLOCATION_TYPE_PINNED || p->win32HandleMetaData) return CUDA_ERROR_INVALID_VALUE;
  switch (p->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (p->location.id < 0 || uint32_t(p->location.id) >= c->device_count()) return CUDA_ERROR_INVALID_DEVICE;
      break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: {
      static std::atomic<bool> said;
      return not_supported_once(said,
                                "cuMemCreate of host memory (CU_MEM_LOCATION_TYPE_HOST*) is not supported: the host's "
                                "memory is not the guest's; use cuMemHostAlloc for memory kernels reach on the host");
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  // POSIX descriptors (PyTorch and NCCL always ask for them) share memory
  // between the processes of the VM (cuMemExportToShareableHandle).
  if (p->requestedHandleTypes & ~unsigned(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
    static std::atomic<bool> said;
    return not_supported_once(said,
                              "cuMemCreate with a fabric or Win32 handle type is not supported: memory of a VM's "
                              "guest is shared only between its processes, through POSIX descriptors (PyTorch "
                              "and NCCL then ask for those)");
  }
  *device = uint32_t(p->location.id);
  return CUDA_SUCCESS;
}

// Lets the worker free what no reference and no mapping holds any more. Requires b.mu.
void forget_handles(ordo::Client* c, Books& b, const std::vector<uint64_t>& handles) {
  for (uint64_t h : handles) {
    auto it = b.handles.find(h);
    if (it == b.handles.end() || it->second.refs || it->second.maps) continue;
    b.handles.erase(it);
    c->vmm_release(h);
  }
}

// Unmaps [ptr, ptr + size) at the worker, then in the books. Not under b.mu:
// the worker's unmap waits for all work first, and a host function that
// work waits for may itself call here.
CUresult unmap(ordo::Client* c, Books& b, CUdeviceptr ptr, size_t size) {
  if (Status s = c->vmm_unmap(ptr, size); !ok(s)) return to_cu(s);
  std::lock_guard lock(b.mu);
  std::vector<uint64_t> touched;
  for (auto it = b.mappings.lower_bound(ptr); it != b.mappings.end() && it->first < ptr + size;) {
    device_allocs().erase(it->first);
    auto h = b.handles.find(it->second.handle);
    if (h != b.handles.end()) --h->second.maps;
    touched.push_back(it->second.handle);
    it = b.mappings.erase(it);
  }
  forget_handles(c, b, touched);
  return CUDA_SUCCESS;
}

}  // namespace

bool vmm_reservation_of(uint64_t ptr, uint64_t* base, uint64_t* size) {
  Books& b = books();
  std::lock_guard lock(b.mu);
  auto it = containing(b.reservations, ptr, reservation_size);
  if (it == b.reservations.end()) return false;
  *base = it->first;
  *size = it->second.size;
  return true;
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation
using ordo::Status;

extern "C" {

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  uint32_t device = 0;
  if (CUresult e = check_prop(c, prop, &device); e != CUDA_SUCCESS) return e;
  *granularity = kGranularity;  // what current GPUs report, minimum and recommended alike
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
  if (!ptr || !size || flags || size % kPage || addr % kPage || (alignment & (alignment - 1)) ||
      alignment > ordo::kVmmMaxAlignment)
    return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  // Page multiples are what CUDA asks of a reservation; the worker keeps whole
  // granules, which is all that can be mapped anyway.
  const uint64_t reserved = (uint64_t(size) + kGranularity - 1) / kGranularity * kGranularity;
  if (reserved < size) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t a = 0;
  if (Status s = c->vmm_reserve(reserved, alignment, addr % kGranularity ? 0 : addr, &a); !ok(s))
    return s == Status::kMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : to_cu(s);
  Books& b = books();
  std::lock_guard lock(b.mu);
  b.reservations[a] = {size, reserved};
  *ptr = a;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  Books& b = books();
  std::unique_lock lock(b.mu);
  auto it = b.reservations.find(ptr);
  if (it == b.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t reserved = it->second.reserved;
  // Still mapped (NVIDIA asks programs to unmap first): unmapped here, run by run.
  for (auto m = b.mappings.lower_bound(ptr); m != b.mappings.end() && m->first < ptr + reserved;
       m = b.mappings.lower_bound(ptr)) {
    uint64_t end = m->first + m->second.size;
    // Not past the range: a reservation next to it keeps its mappings.
    for (auto n = std::next(m); n != b.mappings.end() && n->first == end && n->first < ptr + reserved; ++n)
      end += n->second.size;
    const uint64_t start = m->first;
    lock.unlock();
    if (CUresult e = unmap(c, b, start, end - start); e != CUDA_SUCCESS) return e;
    lock.lock();
  }
  if (Status s = c->vmm_address_free(ptr, reserved); !ok(s)) return to_cu(s);
  b.reservations.erase(ptr);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  if (!handle || !prop || flags) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  uint32_t device = 0;
  if (CUresult e = check_prop(c, prop, &device); e != CUDA_SUCCESS) return e;
  if (!size || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = 0;
  if (Status s = c->vmm_create(device, size, &h); !ok(s))
    return s == Status::kMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : to_cu(s);
  Handle entry;
  entry.prop = *prop;
  entry.prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;  // what was granted
  entry.size = size;
  Books& b = books();
  std::lock_guard lock(b.mu);
  b.handles[h] = entry;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  Books& b = books();
  std::lock_guard lock(b.mu);
  auto it = b.handles.find(handle);
  if (it == b.handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  --it->second.refs;
  forget_handles(c, b, {handle});  // still mapped: its memory lives until the last unmap
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  // CUDA maps from the start of the memory only ("offset: currently must be zero").
  if (offset || flags || !size || size % kGranularity || ptr % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  Books& b = books();
  std::lock_guard lock(b.mu);
  auto h = b.handles.find(handle);
  if (h == b.handles.end() || h->second.refs == 0 || size > h->second.size) return CUDA_ERROR_INVALID_VALUE;
  if (Status s = c->vmm_map(ptr, size, handle); !ok(s)) return to_cu(s);
  b.mappings[ptr] = {size, handle, 0};
  ++h->second.maps;
  device_allocs().add(ptr, size, h->second.prop.location.id);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (!size || size % kGranularity || ptr % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (CUresult e = capture_check_unsafe(); e != CUDA_SUCCESS) return e;
  return unmap(c, books(), ptr, size);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (!desc || !count || !size || size % kGranularity || ptr % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  uint64_t devices = 0, access = 0;
  for (size_t i = 0; i < count; ++i) {
    const CUmemAccessDesc& d = desc[i];
    if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;  // no host memory here
    if (d.location.id < 0 || uint32_t(d.location.id) >= c->device_count()) return CUDA_ERROR_INVALID_DEVICE;
    if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
    const uint32_t id = uint32_t(d.location.id);
    devices |= uint64_t{1} << id;
    access = ordo::vmm_access_merge(access, uint64_t{1} << id, uint64_t(d.flags) << (2 * id));  // a later desc wins
  }
  Books& b = books();
  std::lock_guard lock(b.mu);
  if (Status s = c->vmm_set_access(ptr, size, devices, access); !ok(s)) return to_cu(s);
  for (auto it = b.mappings.lower_bound(ptr); it != b.mappings.end() && it->first < ptr + size; ++it)
    it->second.access = ordo::vmm_access_merge(it->second.access, devices, access);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (location->id < 0 || uint32_t(location->id) >= c->device_count()) return CUDA_ERROR_INVALID_DEVICE;
  Books& b = books();
  std::lock_guard lock(b.mu);
  auto it = containing(b.mappings, ptr, mapping_size);
  if (it == b.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  *flags = ordo::vmm_access_of(it->second.access, uint32_t(location->id));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  Books& b = books();
  std::lock_guard lock(b.mu);
  auto it = containing(b.mappings, reinterpret_cast<uintptr_t>(addr), mapping_size);
  if (it == b.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  auto h = b.handles.find(it->second.handle);
  if (h == b.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  ++h->second.refs;  // the same handle, even where the program released it: the mapping kept it
  *handle = h->first;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                        CUmemGenericAllocationHandle handle) {
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  Books& b = books();
  std::lock_guard lock(b.mu);
  auto it = b.handles.find(handle);
  if (it == b.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.prop;
  return CUDA_SUCCESS;
}

// A POSIX descriptor of the VM: a memfd holding the worker's token, which the
// program passes to another process as it would the driver's (a Unix socket,
// pidfd_getfd) and which cuMemImportFromShareableHandle there reads back.
CUresult CUDAAPI cuMemExportToShareableHandle(void* out, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type, unsigned long long flags) {
  if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    static std::atomic<bool> said;
    return not_supported_once(said, "cuMemExportToShareableHandle of a fabric or Win32 handle is not supported: "
                                    "a VM's memory is shared between its processes through POSIX descriptors");
  }
  {
    Books& b = books();
    std::lock_guard lock(b.mu);
    auto it = b.handles.find(handle);
    if (it == b.handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!(it->second.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
      return CUDA_ERROR_INVALID_VALUE;  // made without asking for it
  }
  ordo::Client::IpcToken t;
  if (Status s = c->ipc_export_vmm(handle, &t); !ok(s)) return to_cu(s);
  const int fd = ::memfd_create("ordo-cuda-ipc", MFD_CLOEXEC);
  const IpcWire w = ipc_wire(kIpcVmmTag, t);
  if (fd < 0 || ::pwrite(fd, &w, sizeof w, 0) != ssize_t(sizeof w)) {
    if (fd >= 0) ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *static_cast<int*>(out) = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                CUmemAllocationHandleType type) {
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    static std::atomic<bool> said;
    return not_supported_once(said, "cuMemImportFromShareableHandle of a fabric or Win32 handle is not supported: "
                                    "a VM's memory is shared between its processes through POSIX descriptors");
  }
  const int fd = int(reinterpret_cast<intptr_t>(os_handle));
  IpcWire w{};
  ordo::Client::IpcToken t;
  if (fd < 0 || ::pread(fd, &w, sizeof w, 0) != ssize_t(sizeof w) || !ipc_token(&w, kIpcVmmTag, &t))
    return CUDA_ERROR_INVALID_VALUE;  // not a descriptor cuMemExportToShareableHandle made
  uint64_t h = 0, size = 0;
  uint32_t device = 0;
  if (Status s = c->ipc_open_vmm(t, &h, &size, &device); !ok(s)) return to_cu(s);
  Handle entry;
  entry.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  entry.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  entry.prop.location.id = int(device);
  entry.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  entry.size = size;
  Books& b = books();
  std::lock_guard lock(b.mu);
  b.handles[h] = entry;
  *handle = h;
  return CUDA_SUCCESS;
}

}  // extern "C"

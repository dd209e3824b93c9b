// The sim's virtual memory: a reserved range is host address space of its
// size, mapped PROT_NONE; physical memory is a memfd; cuMemMap maps the memfd
// into the range with MAP_FIXED, and cuMemUnmap puts scratch memory there. A range
// that spans several mappings is then contiguous host memory for copies and
// kernels, and two mappings of one handle share their bytes, as on a GPU.
// The worker's VmmTable has checked every request before it gets here.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "sim_device.h"
#include "sim_memory.h"
#include "worker/ranges.h"

namespace ordo::sim {

VmmPhysical::~VmmPhysical() {
  if (fd >= 0) ::close(fd);
}

namespace {

// The range of `ranges` that holds addr, or null.
VmmRange* range_at(const std::map<uint64_t, std::shared_ptr<VmmRange>>& ranges, uint64_t addr, uint64_t* off,
                   const std::shared_ptr<VmmRange>** owner = nullptr) {
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return nullptr;
  --it;
  if (addr - it->first >= it->second->size) return nullptr;
  *off = addr - it->first;
  if (owner) *owner = &it->second;
  return it->second.get();
}

// What an unmapped range becomes: scratch memory, not PROT_NONE. Lookups refuse
// it already; a copy or kernel that a guest let run on past its unmap (CUDA
// calls that undefined) writes into it instead of faulting the worker.
bool scratch(void* at, uint64_t size) {
  return ::mmap(at, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) !=
         MAP_FAILED;
}

}  // namespace

// Address space only (PROT_NONE, no swap reserved): PyTorch reserves 1.125x
// the device's memory for each expandable segment, several per device.
constexpr uint64_t kMaxReserveBytes = uint64_t{1} << 40;

Status Device::vmm_reserve(uint64_t size, uint64_t alignment, uint64_t /*hint*/, uint64_t* addr) {
  if (size == 0 || size > kMaxReserveBytes) return Status::kMemoryAllocation;
  auto r = std::make_shared<VmmRange>();
  void* host = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (host == MAP_FAILED) return Status::kMemoryAllocation;
  r->host = static_cast<std::byte*>(host);
  r->size = size;
  // The hint is only a hint (cuMemAddressReserve): ranges are handed out in
  // order, aligned, a granule apart so that no two ever touch.
  const uint64_t align = std::max(alignment, kVmmGranularity);
  std::unique_lock lk(mem_mu_);
  const uint64_t at = (next_vmm_addr_ + align - 1) / align * align;
  if (at < next_vmm_addr_ || at + size + kVmmGranularity < at) return Status::kMemoryAllocation;
  next_vmm_addr_ = at + size + kVmmGranularity;
  vmm_ranges_.emplace(at, std::move(r));
  *addr = at;
  return Status::kSuccess;
}

Status Device::vmm_address_free(uint64_t addr, uint64_t size) {
  std::shared_ptr<VmmRange> dead;  // unmapped once the lock is dropped, or by the last user's pin
  std::unique_lock lk(mem_mu_);
  auto it = vmm_ranges_.find(addr);
  if (it == vmm_ranges_.end() || it->second->size != size) return Status::kInvalidValue;
  dead = std::move(it->second);
  vmm_ranges_.erase(it);
  // Addresses are handed out in order: start again once none is held (the
  // session's reset frees them all), so that no session runs out for another.
  if (vmm_ranges_.empty()) next_vmm_addr_ = kVmmBase;
  return Status::kSuccess;
}

Status Device::vmm_create(uint32_t device, uint64_t size, uint64_t* handle) {
  if (device >= devices_) return Status::kInvalidDevice;
  if (size == 0 || size > kMaxAllocBytes) return Status::kMemoryAllocation;
  auto p = std::make_shared<VmmPhysical>();
  p->fd = ::memfd_create("ordo-sim-vmm", MFD_CLOEXEC);
  if (p->fd < 0 || ::ftruncate(p->fd, off_t(size)) != 0) return Status::kMemoryAllocation;
  p->size = size;
  p->device = device;
  std::unique_lock lk(mem_mu_);
  *handle = next_vmm_handle_++;
  vmm_handles_.emplace(*handle, std::move(p));
  return Status::kSuccess;
}

Status Device::vmm_release(uint64_t handle) {
  std::unique_lock lk(mem_mu_);
  return vmm_handles_.erase(handle) ? Status::kSuccess : Status::kInvalidValue;
}

Status Device::vmm_map(uint64_t addr, uint64_t size, uint64_t handle, uint32_t /*device*/) {
  std::unique_lock lk(mem_mu_);
  auto h = vmm_handles_.find(handle);
  uint64_t off = 0;
  VmmRange* r = range_at(vmm_ranges_, addr, &off);
  if (h == vmm_handles_.end() || !r || size > h->second->size || size > r->size - off) return Status::kInvalidValue;
  if (::mmap(r->host + off, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->second->fd, 0) == MAP_FAILED)
    return Status::kMemoryAllocation;
  r->views[off] = {size, h->second->device, 0};
  return Status::kSuccess;
}

Status Device::vmm_unmap(uint64_t addr, uint64_t size) {
  std::unique_lock lk(mem_mu_);
  uint64_t off = 0;
  VmmRange* r = range_at(vmm_ranges_, addr, &off);
  if (!r || size > r->size - off) return Status::kInvalidValue;
  r->views.erase(r->views.lower_bound(off), r->views.lower_bound(off + size));
  return scratch(r->host + off, size) ? Status::kSuccess : Status::kMemoryAllocation;
}

Status Device::vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access) {
  std::unique_lock lk(mem_mu_);
  uint64_t off = 0;
  VmmRange* r = range_at(vmm_ranges_, addr, &off);
  if (!r) return Status::kInvalidValue;
  for (auto it = r->views.lower_bound(off); it != r->views.end() && it->first < off + size; ++it)
    it->second.access = vmm_access_merge(it->second.access, devices, access);
  return Status::kSuccess;
}

Status Device::vmm_lookup(uint64_t addr, uint64_t bytes, uint64_t device, void** out,
                          std::shared_ptr<const void>* pin) const {
  std::shared_lock lk(mem_mu_);
  uint64_t off = 0;
  const std::shared_ptr<VmmRange>* owner = nullptr;
  VmmRange* r = range_at(vmm_ranges_, addr, &off, &owner);
  if (!r) return Status::kInvalidDevicePointer;
  if (bytes > r->size - off) return Status::kInvalidValue;
  // Mapped without a gap from off to off + bytes, each mapping reachable.
  const auto reachable = [device](const VmmRange::View& v) {
    return device == kAnyDevice ? v.access != 0 : vmm_access_of(v.access, uint32_t(device)) != 0;
  };
  if (!covered(r->views, off, bytes, [](const VmmRange::View& v) { return v.size; }, reachable))
    return Status::kInvalidDevicePointer;
  *out = r->host + off;
  if (pin) *pin = *owner;
  return Status::kSuccess;
}

}  // namespace ordo::sim

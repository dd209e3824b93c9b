// The sim's device memory: allocations (HostBlocks at synthetic device
// addresses), their translation to host memory for ops and kernels, and peer
// access between the simulated devices.
#include <memory>
#include <mutex>
#include <shared_mutex>

#include "sim_device.h"
#include "sim_memory.h"

namespace ordo::sim {

// Every access by device work to device memory goes through these (sim_memory.h).
[[gnu::noinline]] void device_copy(void* dst, const void* src, uint64_t n) { std::memmove(dst, src, n); }
[[gnu::noinline]] void device_fill(void* dst, uint8_t v, uint64_t n) { std::memset(dst, v, n); }

Status Device::malloc(uint32_t device, uint64_t size, uint64_t* device_addr) {
  if (!device_addr || size == 0 || size > kMaxAllocBytes || device >= devices_) return Status::kInvalidValue;
  auto block = std::make_shared<HostBlock>();
  if (!block->allocate(size)) return Status::kMemoryAllocation;
  return place(device, std::move(block), device_addr);
}

Status Device::place(uint32_t device, std::shared_ptr<HostBlock> block, uint64_t* device_addr) {
  const uint64_t size = block->size();
  std::unique_lock lk(mem_mu_);
  uint64_t& next = next_addr_[device];
  const uint64_t addr = next;
  // Round up and leave an unmapped gap so that adjacent allocations never touch.
  const uint64_t end = next + (size + kAllocAlign - 1) / kAllocAlign * kAllocAlign + kAllocAlign;
  if (device_of_addr(end) != device) return Status::kMemoryAllocation;  // 16 TiB handed out
  next = end;
  try {
    allocs_.emplace(addr, std::move(block));
  } catch (const std::bad_alloc&) {
    return Status::kMemoryAllocation;
  }
  *device_addr = addr;
  return Status::kSuccess;
}

Status Device::free(uint64_t device_addr) {
  if (device_addr == 0) return Status::kSuccess;  // like cudaFree(nullptr)
  std::shared_ptr<HostBlock> dead;  // released after the lock is dropped, or by the last op using it
  std::unique_lock lk(mem_mu_);
  auto it = allocs_.find(device_addr);
  if (it == allocs_.end()) return Status::kInvalidDevicePointer;
  dead = std::move(it->second);
  allocs_.erase(it);
  return Status::kSuccess;
}

// Translates [addr, addr + bytes) (bytes > 0) to host memory if it lies inside
// one live allocation: kInvalidDevicePointer if addr is in none,
// kInvalidValue if the range runs past the end of the one it starts in.
// `pin` keeps the block alive while the caller uses it (a concurrent free only
// unlinks it).
Status Device::lookup(uint64_t addr, uint64_t bytes, void** out, std::shared_ptr<const void>* pin) const {
  if (is_vmm_addr(addr)) return vmm_lookup(addr, bytes, kAnyDevice, out, pin);
  std::shared_lock lk(mem_mu_);
  auto it = allocs_.upper_bound(addr);
  if (it == allocs_.begin()) return Status::kInvalidDevicePointer;
  --it;
  const uint64_t off = addr - it->first;  // addr >= it->first
  const uint64_t size = it->second->size();
  if (off >= size) return Status::kInvalidDevicePointer;
  if (bytes > size - off) return Status::kInvalidValue;
  *out = it->second->data() + off;
  if (pin) *pin = it->second;
  return Status::kSuccess;
}

Status Device::check_operand(const MemOperand& m, uint64_t size) const {
  if (!m.device) return m.addr == 0 ? Status::kInvalidValue : Status::kSuccess;
  void* p = nullptr;
  return lookup(m.addr, size, &p);
}

// The sim is an all-to-all NVLink box: any device may reach any other once enabled.
bool Device::can_access_peer(uint32_t device, uint32_t peer) {
  return device < devices_ && peer < devices_ && device != peer;
}

Status Device::set_peer_access(uint32_t device, uint32_t peer, bool enable) {
  if (!can_access_peer(device, peer)) return Status::kPeerAccessUnsupported;
  if (enable) peers_[device].fetch_or(1u << peer, std::memory_order_release);
  else peers_[device].fetch_and(~(1u << peer), std::memory_order_release);
  return Status::kSuccess;
}

// Whether a kernel on `device` may touch memory at `addr`: its own device's,
// or an enabled peer's.
bool Device::reachable(uint32_t device, uint64_t addr) const {
  const uint32_t owner = device_of_addr(addr);
  return owner == device || (owner < kMaxDevices && (peers_[device].load(std::memory_order_acquire) >> owner & 1));
}

bool Device::register_host_memory(void* base, uint64_t size) {
  host_base_ = uint64_t(uintptr_t(base));
  host_size_ = size;
  return base && size;
}

void* Device::mapped_host(uint64_t addr, uint64_t bytes) const {
  if (!host_size_ || addr < host_base_ || addr - host_base_ >= host_size_ || bytes > host_size_ - (addr - host_base_))
    return nullptr;
  return reinterpret_cast<void*>(uintptr_t(addr));
}

void* KernelContext::translate(uint64_t device_addr, uint64_t bytes) const {
  if (bytes == 0) return nullptr;  // nothing may be touched
  if (void* p = dev_.mapped_host(device_addr, bytes)) return p;  // every device reaches mapped pinned memory
  void* p = nullptr;
  std::shared_ptr<const void> pin;
  if (is_vmm_addr(device_addr)) {
    // Mapped memory: reachable where cuMemSetAccess granted this device access, peers or not.
    if (!ok(dev_.vmm_lookup(device_addr, bytes, device_, &p, &pin)))
      throw KernelError(Status::kIllegalAddress, "kernel touched reserved memory not mapped, or not accessible from its device");
    pins_.push_back(std::move(pin));
    return p;
  }
  if (!ok(dev_.lookup(device_addr, bytes, &p, &pin))) {
    throw KernelError(Status::kIllegalAddress, "kernel touched memory outside a live allocation");
  }
  if (!dev_.reachable(device_, device_addr)) {
    // A GPU faults the same way on another device's memory without peer access.
    throw KernelError(Status::kIllegalAddress, "kernel touched another device's memory without peer access");
  }
  pins_.push_back(std::move(pin));  // alive until the kernel returns
  return p;
}

}  // namespace ordo::sim

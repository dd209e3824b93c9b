// The sim's device memory: every allocation is a HostBlock of zeroed host
// memory at a synthetic device address. Device::malloc, free and lookup (the
// address translation every op and kernel goes through) are in sim_memory.cc.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "ordo/limits.h"

namespace ordo::sim {

// Simulated device work touches device memory the way a GPU does: two streams
// the program did not order may touch the same bytes at once. Such a race is
// the guest program's bug (and the tests that switch ordering off provoke it
// on purpose), so every access by device work goes through these two
// functions (sim_memory.cc), which tests/tsan.supp names.
void device_copy(void* dst, const void* src, uint64_t n);
void device_fill(void* dst, uint8_t v, uint64_t n);

constexpr uint64_t kMaxAllocBytes = uint64_t{64} << 30;
constexpr uint64_t kAllocAlign = 256;
constexpr uint64_t kMmapThreshold = uint64_t{1} << 20;
// Synthetic device addresses are non-canonical on x86-64 and AArch64 (4- and
// 5-level paging alike), so they can never equal a real host pointer.
constexpr uint64_t kDeviceBase = 0x0d00'0000'0000'0000;
// Each device's allocations in a range of their own, so an address names its device.
constexpr unsigned kDeviceSpanShift = 44;
inline uint32_t device_of_addr(uint64_t addr) { return uint32_t((addr - kDeviceBase) >> kDeviceSpanShift); }

// Reserved ranges (cuMemAddressReserve) lie above every device's span: an
// address there names no device, its mappings do (sim_vmm.cc).
constexpr uint64_t kVmmBase = kDeviceBase + (uint64_t{kMaxDevices} << kDeviceSpanShift);
inline bool is_vmm_addr(uint64_t addr) { return addr >= kVmmBase; }
constexpr uint64_t kAnyDevice = ~uint64_t{0};

// One reserved range: host address space of its size, inaccessible except
// where physical memory (a memfd) is mapped into it, so that a range spanning
// several mappings is contiguous host memory, and two mappings of one handle
// are the same bytes.
struct VmmRange {
  struct View {
    uint64_t size = 0;
    uint32_t device = 0;  // whose memory
    uint64_t access = 0;  // bits 2d..2d+1: device d's VmmAccess
  };
  std::byte* host = nullptr;
  uint64_t size = 0;
  std::map<uint64_t, View> views;  // offset -> what is mapped there
  VmmRange() = default;
  VmmRange(const VmmRange&) = delete;
  VmmRange& operator=(const VmmRange&) = delete;
  ~VmmRange() {
    if (host) ::munmap(host, size);
  }
};

// Physical memory of one handle (cuMemCreate): a memfd, zero-filled lazily.
struct VmmPhysical {
  int fd = -1;
  uint64_t size = 0;
  uint32_t device = 0;
  VmmPhysical() = default;
  VmmPhysical(const VmmPhysical&) = delete;
  VmmPhysical& operator=(const VmmPhysical&) = delete;
  ~VmmPhysical();  // closes fd; what is mapped stays
};

// Zeroed host memory behind one device allocation, aligned like the device address.
class HostBlock {
 public:
  HostBlock() = default;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  HostBlock(HostBlock&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(o.size_), mapped_(o.mapped_), fd_(std::exchange(o.fd_, -1)) {}
  HostBlock& operator=(HostBlock&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = o.size_;
      mapped_ = o.mapped_;
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~HostBlock() { release(); }

  bool allocate(uint64_t size) {
    release();
    if (size >= kMmapThreshold) {
      // A memfd, zero-filled lazily: a large allocation costs no time, and
      // another worker process can map it once exported (share()) without a
      // copy while kernels still use it. Anonymous memory if there is none.
      const int fd = ::memfd_create("ordo-sim-memory", MFD_CLOEXEC);
      void* p = MAP_FAILED;
      if (fd >= 0 && ::ftruncate(fd, off_t((size + 4095) / 4096 * 4096)) == 0)  // whole pages, as share() makes
        p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        fd_ = fd;
      } else {
        if (fd >= 0) ::close(fd);
        p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return false;
      }
      ptr_ = static_cast<std::byte*>(p);
      mapped_ = true;
    } else {
      void* p = nullptr;
      if (::posix_memalign(&p, kAllocAlign, size) != 0 || p == nullptr) return false;
      std::memset(p, 0, size);
      ptr_ = static_cast<std::byte*>(p);
      mapped_ = false;
    }
    size_ = size;
    return true;
  }

  std::byte* data() const { return ptr_; }
  uint64_t size() const { return size_; }

  // Interprocess memory (sim_ipc.cc): another worker process maps the
  // block's memfd through /proc (fd() is the descriptor). A large block has
  // one from the start; share() moves a small one into one, and the caller
  // makes sure nothing uses the block meanwhile. adopt: a block over such a
  // memfd, opened here (takes fd).
  bool share();
  bool adopt(int fd, uint64_t size);
  int fd() const { return fd_; }

 private:
  void release() {
    if (!ptr_) return;
    if (mapped_) {
      ::munmap(ptr_, size_);
    } else {
      std::free(ptr_);
    }
    ptr_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::byte* ptr_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  int fd_ = -1;  // shared: the memfd behind the mapping
};

}  // namespace ordo::sim

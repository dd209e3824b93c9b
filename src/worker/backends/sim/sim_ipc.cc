// The sim's interprocess memory and events (cudaIpc*). Each guest process has
// a worker process of its own, so what two share must be memory both map: an
// exported block moves into a memfd (HostBlock::share), and an interprocess
// event keeps its records in a memfd page (IpcEventCell). The other worker
// opens the exporter's descriptor through /proc and checks the inode before it
// maps it, so a descriptor number reused meanwhile is refused.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include "sim_device.h"

namespace ordo::sim {
namespace {

constexpr uint64_t kPage = 4096;

// What ipc_export_* writes: the exporting process's descriptor, its file's
// identity, and for memory the block's size and device.
struct Blob {
  uint64_t pid, fd, ino, dev, size, device;
};
static_assert(sizeof(Blob) <= sizeof(IpcBlob));

IpcBlob to_blob(const Blob& b) {
  IpcBlob out{};
  std::memcpy(&out, &b, sizeof b);
  return out;
}

bool describe(int fd, uint64_t size, uint32_t device, IpcBlob* out) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return false;
  *out = to_blob({uint64_t(::getpid()), uint64_t(fd), uint64_t(st.st_ino), uint64_t(st.st_dev), size, device});
  return true;
}

// The exporter's descriptor, opened here, if it still is the file exported.
int open_exported(const IpcBlob& in, uint64_t min_size, Blob* b) {
  std::memcpy(b, &in, sizeof *b);
  if (b->pid == 0 || b->pid > uint64_t(INT32_MAX) || b->fd > uint64_t(INT32_MAX)) return -1;
  const std::string path = "/proc/" + std::to_string(b->pid) + "/fd/" + std::to_string(b->fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st{};
  if (::fstat(fd, &st) != 0 || uint64_t(st.st_ino) != b->ino || uint64_t(st.st_dev) != b->dev ||
      uint64_t(st.st_size) < min_size) {
    ::close(fd);
    return -1;
  }
  return fd;
}

uint64_t pages(uint64_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

bool HostBlock::share() {
  if (fd_ >= 0) return true;
  const int fd = ::memfd_create("ordo-sim-ipc", MFD_CLOEXEC);
  if (fd < 0) return false;
  void* p = MAP_FAILED;
  if (::ftruncate(fd, off_t(pages(size_))) == 0)
    p = ::mmap(nullptr, pages(size_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return false;
  }
  std::memcpy(p, ptr_, size_);
  const uint64_t size = size_;
  release();
  ptr_ = static_cast<std::byte*>(p);
  size_ = size;
  mapped_ = true;
  fd_ = fd;
  return true;
}

bool HostBlock::adopt(int fd, uint64_t size) {
  release();
  void* p = ::mmap(nullptr, pages(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return false;
  }
  ptr_ = static_cast<std::byte*>(p);
  size_ = size;
  mapped_ = true;
  fd_ = fd;
  return true;
}

bool IpcEventCell::orphaned(uint64_t n) const {
  const uint64_t pid = shared->recorder[n % kSlots].load(std::memory_order_acquire);
  return pid != 0 && pid <= uint64_t(INT32_MAX) && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

IpcEventCell::~IpcEventCell() {
  if (shared) ::munmap(shared, kPage);
  if (fd >= 0) ::close(fd);
}

Status Device::ipc_export_mem(uint64_t addr, IpcBlob* out, uint32_t* device) {
  // A small block moves into a memfd only while nothing uses it: every op and
  // kernel that translated an address into it holds a pin. One that holds it
  // long (a kernel spinning on it) makes the export wait, then fail with
  // kNotReady. Large blocks have their memfd from the start.
  for (int tries = 0;; ++tries) {
    {
      std::unique_lock lk(mem_mu_);
      auto it = allocs_.find(addr);
      if (it == allocs_.end()) return Status::kInvalidValue;
      HostBlock& b = *it->second;
      if (b.fd() >= 0 || it->second.use_count() == 1) {
        if (!b.share()) return Status::kMemoryAllocation;
        *device = device_of_addr(addr);
        return describe(b.fd(), b.size(), device_of_addr(addr), out) ? Status::kSuccess : Status::kMemoryAllocation;
      }
    }
    if (tries == 2000) return Status::kNotReady;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status Device::ipc_open_mem(const IpcBlob& blob, uint32_t /*device*/, uint64_t size, uint64_t* addr) {
  Blob b;
  const int fd = open_exported(blob, pages(size), &b);
  if (fd < 0) return Status::kInvalidResourceHandle;
  if (b.device >= devices_ || b.size != size || b.size == 0 || b.size > kMaxAllocBytes) {
    ::close(fd);
    return Status::kInvalidResourceHandle;
  }
  auto block = std::make_shared<HostBlock>();
  if (!block->adopt(fd, b.size)) return Status::kMemoryAllocation;
  // In the exporter's device's span: the memory is that device's, and a kernel
  // of another device reaches it through peer access, as on a GPU.
  return place(uint32_t(b.device), std::move(block), addr);
}

Status Device::ipc_export_vmm(uint64_t handle, IpcBlob* out) {
  std::shared_lock lk(mem_mu_);
  auto h = vmm_handles_.find(handle);
  if (h == vmm_handles_.end()) return Status::kInvalidValue;
  const VmmPhysical& p = *h->second;
  return describe(p.fd, p.size, p.device, out) ? Status::kSuccess : Status::kMemoryAllocation;
}

Status Device::ipc_import_vmm(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* handle) {
  Blob b;
  const int fd = open_exported(blob, size, &b);
  if (fd < 0) return Status::kInvalidResourceHandle;
  auto p = std::make_shared<VmmPhysical>();
  p->fd = fd;  // the same memory as the exporter's handle: mappings of both share bytes
  p->size = size;
  p->device = device;
  if (b.size != size || b.device != device || device >= devices_) return Status::kInvalidResourceHandle;
  std::unique_lock lk(mem_mu_);
  *handle = next_vmm_handle_++;
  vmm_handles_.emplace(*handle, std::move(p));
  return Status::kSuccess;
}

Status Device::ipc_export_event(uint32_t event, IpcBlob* out) {
  std::lock_guard lk(mu_);
  Event* e = find_event_locked(event);
  if (!e || !e->ipc) return Status::kInvalidResourceHandle;
  return describe(e->ipc->fd, kPage, 0, out) ? Status::kSuccess : Status::kInvalidResourceHandle;
}

namespace {

std::shared_ptr<IpcEventCell> map_cell(int fd) {
  auto cell = std::make_shared<IpcEventCell>();
  cell->fd = fd;
  void* p = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;  // closes fd
  cell->shared = static_cast<IpcEventCell::Shared*>(p);
  return cell;
}

}  // namespace

std::shared_ptr<IpcEventCell> new_ipc_cell() {
  const int fd = ::memfd_create("ordo-sim-ipc-event", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (::ftruncate(fd, off_t(kPage)) != 0) {
    ::close(fd);
    return nullptr;
  }
  return map_cell(fd);  // zeroed: nothing recorded
}

Status Device::ipc_open_event(uint32_t event, uint32_t device, const IpcBlob& blob) {
  if (event >= kMaxBackendEvents || device >= devices_) return Status::kInvalidValue;
  Blob b;
  const int fd = open_exported(blob, kPage, &b);
  if (fd < 0) return Status::kInvalidResourceHandle;
  auto cell = map_cell(fd);
  if (!cell) return Status::kMemoryAllocation;
  std::lock_guard lk(mu_);
  auto [it, inserted] = events_.try_emplace(event);
  if (!inserted) return Status::kInvalidResourceHandle;
  it->second.flags = uint32_t(kEventInterprocess | kEventDisableTiming);
  it->second.ipc = std::move(cell);
  return Status::kSuccess;
}

Status Device::ipc_record_locked(Stream& s, const std::shared_ptr<IpcEventCell>& cell) {
  // Numbered when dispatched: a wait dispatched after this, in any process,
  // waits for this record (the guest made both dispatches follow the calls).
  const uint64_t n = cell->shared->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
  cell->shared->recorder[n % IpcEventCell::kSlots].store(uint64_t(::getpid()), std::memory_order_release);
  push_locked(s, Op{OpTag{}, HostOp{[cell, n] {
    std::atomic<uint64_t>& slot = cell->shared->done[n % IpcEventCell::kSlots];
    for (uint64_t v = slot.load(); v < n && !slot.compare_exchange_weak(v, n);) {
    }
  }}});
  return Status::kSuccess;
}

Status Device::ipc_wait_locked(Stream& s, const std::shared_ptr<IpcEventCell>& cell) {
  const uint64_t n = cell->shared->recorded.load(std::memory_order_acquire);
  if (cell->done(n)) return Status::kSuccess;
  // The stream waits as it waits for another stream of this process, but on
  // memory another process writes: it polls, until the record completes, its
  // recorder is gone, or this session ends (ipc_abandon).
  push_locked(s, Op{OpTag{}, HostOp{[this, cell, n, epoch = ipc_epoch_.load()] {
    for (uint32_t i = 1; !cell->done(n); ++i) {
      if (ipc_stopping_.load(std::memory_order_relaxed) || ipc_epoch_.load(std::memory_order_relaxed) != epoch) return;
      if (i % 256 == 0 && cell->orphaned(n)) return;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }}});
  return Status::kSuccess;
}

void Device::ipc_notify(std::shared_ptr<IpcEventCell> cell, uint64_t n, std::function<void()> fn) {
  std::lock_guard lk(ipc_mu_);
  ipc_watches_.push_back({std::move(cell), n, std::move(fn), ipc_epoch_.load()});
  if (!ipc_thread_.joinable()) {
    ipc_thread_ = std::thread([this] {
      std::unique_lock lk(ipc_mu_);
      while (!ipc_stopping_.load()) {
        if (ipc_watches_.empty()) {
          ipc_cv_.wait(lk);
          continue;
        }
        std::vector<std::function<void()>> ready;
        const uint64_t epoch = ipc_epoch_.load();
        std::erase_if(ipc_watches_, [&](IpcWatch& w) {
          if (!w.cell->done(w.n) && w.epoch == epoch && !w.cell->orphaned(w.n)) return false;
          ready.push_back(std::move(w.fn));
          return true;
        });
        lk.unlock();
        for (auto& fn : ready) run_guarded(fn);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        lk.lock();
      }
      // Stopping: whoever waits is answered (the worker is going away).
      for (IpcWatch& w : ipc_watches_) run_guarded(w.fn);
      ipc_watches_.clear();
    });
  }
  ipc_cv_.notify_one();
}

void Device::ipc_abandon() {
  {
    std::lock_guard lk(ipc_mu_);
    ipc_epoch_.fetch_add(1);
  }
  ipc_cv_.notify_all();
}

void Device::ipc_stop() {
  {
    std::lock_guard lk(ipc_mu_);
    ipc_stopping_.store(true);
  }
  ipc_cv_.notify_all();
  if (ipc_thread_.joinable()) ipc_thread_.join();
}

}  // namespace ordo::sim

#include "ipc_table.h"

#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ordo {

// Written by one exporter at a time (owner), read by any worker: `generation`
// is odd while the cell changes, so a reader that saw the same even value
// before and after its copy has a consistent one (a seqlock). The fields are
// atomics of a word each because readers race writers by design.
struct alignas(128) IpcTable::Cell {
  static constexpr size_t kWords = 2 + sizeof(IpcBlob) / 8;
  std::atomic<uint32_t> owner;       // 0: free; else the exporting partition + 1
  std::atomic<uint32_t> generation;  // odd while being written
  std::atomic<uint64_t> secret;
  std::atomic<uint64_t> words[kWords];
};
static_assert(sizeof(IpcBlob) % 8 == 0 && std::atomic<uint64_t>::is_always_lock_free);

namespace {

constexpr size_t kTableBytes = sizeof(IpcTable::Cell) * IpcTable::kCells;

// A cell's generation before a change: even, also where a worker died halfway
// through one (left it odd), so that the cell's next tokens are good ones.
uint32_t settled(uint32_t g) { return (g + 1) & ~1u; }

void encode(const IpcExport& x, uint64_t* w) {
  w[0] = uint64_t(x.kind) | uint64_t(x.device) << 8 | uint64_t(x.partition) << 32;
  w[1] = x.size;
  std::memcpy(w + 2, &x.blob, sizeof x.blob);
}

void decode(const uint64_t* w, IpcExport* x) {
  x->kind = IpcKind(w[0] & 0xff);
  x->device = uint32_t(w[0] >> 8 & 0xffffff);
  x->partition = uint32_t(w[0] >> 32);
  x->size = w[1];
  std::memcpy(&x->blob, w + 2, sizeof x->blob);
}

uint64_t draw_secret() {
  uint64_t s = 0;
  while (s == 0)
    if (getrandom(&s, sizeof s, 0) != ssize_t(sizeof s)) s = 0;
  return s;
}

}  // namespace

std::unique_ptr<IpcTable> IpcTable::create(std::string* err, bool inherited) {
  // Inherited: the parts of a supervisor get it across exec (and a part
  // restarting itself keeps it). A lone worker's is its own.
  const int fd = ::memfd_create("ordo-ipc", inherited ? 0 : MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, off_t(kTableBytes)) != 0) {
    if (err) *err = std::string("cannot make the IPC table: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  auto t = attach(fd, err);
  if (!t) ::close(fd);
  return t;
}

std::unique_ptr<IpcTable> IpcTable::attach(int fd, std::string* err) {
  void* p = ::mmap(nullptr, kTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    if (err) *err = "cannot map the IPC table (descriptor " + std::to_string(fd) + "): " + std::strerror(errno);
    return nullptr;
  }
  return std::unique_ptr<IpcTable>(new IpcTable(fd, static_cast<Cell*>(p)));
}

IpcTable::~IpcTable() { ::munmap(cells_, kTableBytes); }  // the descriptor stays: exec passes it on

Status IpcTable::publish(const IpcExport& x, IpcToken* out) {
  for (uint32_t i = 0; i < kCells; ++i) {
    Cell& c = cells_[i];
    uint32_t free = 0;
    if (c.owner.load(std::memory_order_relaxed) != 0 ||
        !c.owner.compare_exchange_strong(free, x.partition + 1, std::memory_order_acquire))
      continue;
    const uint32_t g = settled(c.generation.load(std::memory_order_relaxed));
    c.generation.store(g + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    uint64_t w[Cell::kWords];
    encode(x, w);
    for (size_t k = 0; k < Cell::kWords; ++k) c.words[k].store(w[k], std::memory_order_relaxed);
    const uint64_t secret = draw_secret();
    c.secret.store(secret, std::memory_order_relaxed);
    c.generation.store(g + 2, std::memory_order_release);
    *out = {uint64_t(g + 2) << 32 | i, secret};
    return Status::kSuccess;
  }
  return Status::kMemoryAllocation;
}

void IpcTable::clear(Cell& c) {
  const uint32_t g = settled(c.generation.load(std::memory_order_relaxed));
  c.generation.store(g + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  c.secret.store(0, std::memory_order_relaxed);
  for (auto& w : c.words) w.store(0, std::memory_order_relaxed);
  c.generation.store(g + 2, std::memory_order_release);
  c.owner.store(0, std::memory_order_release);
}

void IpcTable::revoke(const IpcToken& t, uint32_t partition) {
  const uint32_t i = uint32_t(t.word);
  if (i >= kCells) return;
  Cell& c = cells_[i];
  if (c.owner.load(std::memory_order_acquire) != partition + 1 ||
      c.generation.load(std::memory_order_relaxed) != uint32_t(t.word >> 32))
    return;
  clear(c);
}

void IpcTable::revoke_all(uint32_t partition) {
  for (uint32_t i = 0; i < kCells; ++i)
    if (cells_[i].owner.load(std::memory_order_acquire) == partition + 1) clear(cells_[i]);
}

Status IpcTable::find(const IpcToken& t, IpcExport* out) const {
  const uint32_t i = uint32_t(t.word), want = uint32_t(t.word >> 32);
  if (i >= kCells || want % 2 != 0 || t.secret == 0) return Status::kInvalidResourceHandle;
  const Cell& c = cells_[i];
  if (c.owner.load(std::memory_order_acquire) == 0 || c.generation.load(std::memory_order_acquire) != want)
    return Status::kInvalidResourceHandle;
  uint64_t w[Cell::kWords];
  for (size_t k = 0; k < Cell::kWords; ++k) w[k] = c.words[k].load(std::memory_order_relaxed);
  const uint64_t secret = c.secret.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (c.generation.load(std::memory_order_relaxed) != want || secret != t.secret) return Status::kInvalidResourceHandle;
  decode(w, out);
  return Status::kSuccess;
}

}  // namespace ordo

#include "ordo/region.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/file_mapping.hpp>
#include <cctype>
#include <cstdlib>
#include <vector>
#include <boost/interprocess/mapped_region.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <random>

namespace ordo {

namespace bip = boost::interprocess;

// A mapping of file bytes [offset, offset + size) at `base`: boost's, or a
// plain mmap at a chosen address (rebase()). Every live one is listed, so a
// guest in the worker's own process can find the worker's.
struct Region::Mapping {
  bip::file_mapping file;
  bip::mapped_region region;
  void* fixed = nullptr;  // rebase()'s mapping, unmapped here
  char* base = nullptr;
  uint64_t size = 0, offset = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  ~Mapping() {
    if (fixed) ::munmap(fixed, size);
  }
};

Region::~Region() = default;

namespace {

std::mutex g_retained_mu;
std::vector<std::shared_ptr<Region::Mapping>>& retained() {
  static auto* kept = new std::vector<std::shared_ptr<Region::Mapping>>();  // never destroyed: see privatize
  return *kept;
}

struct MappingList {
  std::mutex mu;
  std::vector<std::weak_ptr<Region::Mapping>> live;
};
MappingList& mappings() {
  static auto* list = new MappingList();  // never destroyed: regions may outlive static destructors
  return *list;
}

bool identify(const std::string& path, Region::Mapping* m) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return false;
  m->dev = st.st_dev;
  m->ino = st.st_ino;
  return true;
}

void list_mapping(const std::shared_ptr<Region::Mapping>& m) {
  MappingList& l = mappings();
  std::lock_guard lock(l.mu);
  std::erase_if(l.live, [](const auto& w) { return w.expired(); });
  l.live.push_back(m);
}

// A live mapping of the file `like` names that holds file bytes [offset,
// offset + size) at `address`.
std::shared_ptr<Region::Mapping> find_mapping(const Region::Mapping& like, uint64_t offset, uint64_t size,
                                              uint64_t address) {
  MappingList& l = mappings();
  std::lock_guard lock(l.mu);
  for (const auto& w : l.live) {
    auto m = w.lock();
    if (m && m->dev == like.dev && m->ino == like.ino && offset >= m->offset && size <= m->size &&
        offset - m->offset <= m->size - size && uint64_t(uintptr_t(m->base)) + (offset - m->offset) == address)
      return m;
  }
  return nullptr;
}

std::unique_ptr<Region> fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return nullptr;
}

bool failed(std::string* error, std::string msg) {
  fail(error, std::move(msg));
  return false;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t random_session() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  return v ? v : 1;
}

}  // namespace

// Bytes [offset, offset + size) of the file (size 0: to its end).
std::unique_ptr<Region> Region::map_range(const std::string& path, uint64_t offset, uint64_t size,
                                          std::string* error) {
  std::unique_ptr<Region> r(new Region());
  try {
    auto m = std::make_shared<Mapping>();
    m->file = bip::file_mapping(path.c_str(), bip::read_write);
    m->region = bip::mapped_region(m->file, bip::read_write, bip::offset_t(offset), size);
    r->base_ = static_cast<char*>(m->region.get_address());
    r->size_ = m->region.get_size();
    r->offset_ = offset;
    m->base = r->base_;
    m->size = r->size_;
    m->offset = offset;
    if (identify(path, m.get())) list_mapping(m);
    r->mapping_ = std::move(m);
  } catch (const bip::interprocess_exception& e) {
    return fail(error, "cannot map region " + path + ": " + e.what() + " (need read-write access)");
  }
  r->path_ = path;
  return r;
}

void Region::retain_until_exit() {
  std::lock_guard lock(g_retained_mu);
  if (mapping_) retained().push_back(mapping_);
}

void Region::privatize_retained() {
  std::lock_guard lock(g_retained_mu);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  for (const auto& m : retained()) {
    // MAP_FIXED replaces the range in one step: no thread ever finds it unmapped.
    // The Mapping stays retained, so nothing unmaps the private memory either.
    const uintptr_t begin = reinterpret_cast<uintptr_t>(m->base) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(m->base) + m->size + page - 1) & ~(page - 1);
    ::mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  }
}

bool Region::rebase(uint64_t address, std::string* error) {
  if (address == uint64_t(uintptr_t(base_))) return true;
  auto bad = [&](const std::string& why) {
    return failed(error, "cannot map region " + path_ + " at 0x" + hex(address) + ", the worker's address: " + why);
  };
  Mapping id;
  if (!identify(path_, &id)) return bad(std::strerror(errno));
  if (auto shared = find_mapping(id, offset_, size_, address)) {  // the worker's, in this process
    mapping_ = std::move(shared);
    base_ = reinterpret_cast<char*>(uintptr_t(address));
    return true;
  }
  const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return bad(std::strerror(errno));
  void* p = ::mmap(reinterpret_cast<void*>(uintptr_t(address)), size_, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED_NOREPLACE, fd, off_t(offset_));
  const int saved = errno;
  ::close(fd);
  if (p == MAP_FAILED) return bad(saved == EEXIST ? "that range is in use in this process" : std::strerror(saved));
  if (p != reinterpret_cast<void*>(uintptr_t(address))) {  // a kernel before 4.17 takes the address as a hint
    ::munmap(p, size_);
    return bad("the kernel placed it elsewhere");
  }
  auto m = std::make_shared<Mapping>();
  m->fixed = p;
  m->base = static_cast<char*>(p);
  m->size = size_;
  m->offset = offset_;
  m->dev = id.dev;
  m->ino = id.ino;
  list_mapping(m);
  mapping_ = std::move(m);
  base_ = static_cast<char*>(p);
  return true;
}

std::unique_ptr<Region> Region::map(const std::string& path, std::string* error) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    return fail(error, "cannot open region " + path + ": " + std::strerror(errno) +
                           " (start ordo-worker --region " + path + " first, or set ORDO_REGION)");
  return map_range(path, 0, 0, error);
}

bool Region::prepare_file(const std::string& path, uint64_t size, std::string* error) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0660);
  if (fd < 0) return failed(error, "cannot create region " + path + ": " + std::strerror(errno));
  // Never shrink or truncate a region someone may have mapped (a VM, an old
  // guest): their next access would fault. Reuse it at the same size only.
  struct stat st{};
  bool sized = ::fstat(fd, &st) == 0;
  int saved = errno;
  if (sized && st.st_size == 0) {
    sized = ::ftruncate(fd, static_cast<off_t>(size)) == 0;
    saved = errno;
  } else if (sized && uint64_t(st.st_size) != size) {
    ::close(fd);
    return failed(error, "region " + path + " already exists with " + std::to_string(st.st_size) + " bytes, not " +
                             std::to_string(size) + " (pass --size " + std::to_string(st.st_size) +
                             " or remove the file when no VM uses it)");
  }
  ::close(fd);
  if (!sized)
    return failed(error, "cannot size region " + path + " to " + std::to_string(size) + " bytes: " +
                             std::strerror(saved) + " (is /dev/shm large enough?)");
  return true;
}

std::unique_ptr<Region> Region::create(const std::string& path, const Layout& layout, std::string* error,
                                       uint32_t partition, uint32_t partitions) {
  if (partitions == 0 || partitions > kMaxPartitions || partition >= partitions)
    return fail(error, "region " + path + ": part " + std::to_string(partition) + " of " + std::to_string(partitions));
  if (!prepare_file(path, layout.region_size * partitions, error)) return nullptr;
  auto r = map_range(path, layout.region_size * partition, layout.region_size, error);
  if (!r) return nullptr;
  if (r->size_ != layout.region_size) return fail(error, "region " + path + " mapped with the wrong size");
  r->layout_ = layout;
  r->partitions_ = partitions;
  // Retract the magic first, so an attached guest sees "no worker", then wipe.
  reinterpret_cast<std::atomic<uint64_t>*>(r->base_)->store(0, std::memory_order_release);
  std::memset(r->base_ + sizeof(uint64_t), 0, layout.region_size - sizeof(uint64_t));
  RegionHeader* h = new (r->base_) RegionHeader();
  h->version = kLayoutVersion;
  h->header_size = kHeaderSize;
  h->session = random_session();
  h->partition = partition;
  h->partitions = partitions;
  h->layout = layout;
  for (uint32_t i = 0; i < layout.ring_count; ++i) new (&r->ring(i)) RingControl();
  for (uint32_t i = 0; i < layout.slot_count; ++i) new (&r->slot(i)) ReplySlot();
  h->ring_open[0].store(1, std::memory_order_relaxed);  // the legacy default stream
  std::atomic_thread_fence(std::memory_order_release);
  // Magic last: a guest that sees it sees a complete header.
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
  return r;
}

bool Region::check_header(uint64_t part_size, uint32_t part, std::string* error) {
  auto bad = [&](std::string msg) {
    if (error) *error = "region " + path_ + (part ? " part " + std::to_string(part) : "") + ": " + msg;
    return false;
  };
  if (size_ < kHeaderSize) return bad("smaller than its header");
  const RegionHeader* h = header();
  const uint64_t magic = reinterpret_cast<const std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire);
  if (magic != kMagic) return bad("no ordo header (is ordo-worker running on this region?)");
  if (h->version != kLayoutVersion)
    return bad("layout version " + std::to_string(h->version) + ", this library speaks " +
               std::to_string(kLayoutVersion) + " (rebuild the guest and worker from one ordo version)");
  Layout l = h->layout;
  Layout expect{};
  if (l.region_size != part_size || h->partition != part ||
      !plan_layout(l.region_size, l.ring_count, l.ring_capacity, l.slot_count, l.staging_per_ring, &expect) ||
      std::memcmp(&expect, &l, sizeof(Layout)) != 0)
    return bad("inconsistent layout in header (region corrupt or size mismatch)");
  layout_ = l;
  return true;
}

bool Region::validate(std::string* error) {
  if (size_ < kHeaderSize) return check_header(0, 0, error);
  // Part 0's header says how the region is divided; every part checks its own.
  const uint32_t n = header()->partitions;
  if (n == 0 || n > kMaxPartitions || size_ % n != 0) {
    if (error) *error = "region " + path_ + ": inconsistent layout in header (region corrupt or size mismatch)";
    return false;
  }
  partitions_ = n;
  return check_header(size_ / n, 0, error);
}

std::unique_ptr<Region> Region::partition(uint32_t k, std::string* error) const {
  if (k >= partitions_) return fail(error, "region " + path_ + " has no part " + std::to_string(k));
  std::unique_ptr<Region> r(new Region());
  r->mapping_ = mapping_;
  r->path_ = path_;
  r->size_ = size_ / partitions_;
  r->base_ = base_ + r->size_ * k;
  r->offset_ = offset_ + r->size_ * k;
  r->partitions_ = partitions_;
  if (!r->check_header(r->size_, k, error)) return nullptr;
  return r;
}

namespace {

std::string read_line(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "";
  char buf[64] = {};
  const bool got = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string v = got ? buf : "";
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
  return v;
}

bool is_pci_address(const std::string& s) {
  // DDDD:BB:DD.F
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11})
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

constexpr const char* kPciDevices = "/sys/bus/pci/devices";

}  // namespace

std::string resolve_region(const std::string& spec, std::string* error) {
  std::string dev;
  if (spec == "ivshmem" || spec.rfind("ivshmem:", 0) == 0) {
    const long want = spec == "ivshmem" ? 0 : std::strtol(spec.c_str() + 8, nullptr, 10);
    std::vector<std::string> found;
    if (DIR* d = opendir(kPciDevices)) {
      while (dirent* e = readdir(d)) {
        const std::string p = std::string(kPciDevices) + "/" + e->d_name;
        if (e->d_name[0] != '.' && read_line(p + "/vendor") == "0x1af4" && read_line(p + "/device") == "0x1110")
          found.push_back(p);
      }
      closedir(d);
    }
    std::sort(found.begin(), found.end());
    if (want < 0 || size_t(want) >= found.size()) {
      if (error)
        *error = "no ivshmem device " + spec + " (found " + std::to_string(found.size()) +
                 "): start QEMU with -device ivshmem-plain,memdev=... or set ORDO_REGION to a path";
      return "";
    }
    dev = found[size_t(want)];
  } else if (is_pci_address(spec)) {
    dev = std::string(kPciDevices) + "/" + spec;
  } else {
    return spec;
  }
  // A BAR is not decoded until the device is enabled; no driver is needed.
  if (FILE* f = std::fopen((dev + "/enable").c_str(), "w")) {
    std::fputs("1", f);
    std::fclose(f);
  }
  const char* mode = std::getenv("ORDO_BAR_MAPPING");
  const bool uc = mode && std::string(mode) == "uc";
  if (!uc && access((dev + "/resource2_wc").c_str(), R_OK | W_OK) == 0) return dev + "/resource2_wc";
  if (access((dev + "/resource2").c_str(), R_OK | W_OK) == 0) return dev + "/resource2";
  if (error) *error = "ivshmem device " + dev + " has no accessible BAR2 (run as root, or check the device)";
  return "";
}

uint64_t parse_size(const std::string& s) {
  // stoull would skip leading spaces and accept a sign ("-1" is 2^64 - 1).
  if (s.empty() || s[0] < '0' || s[0] > '9') return 0;
  size_t idx = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &idx, 0);
  } catch (...) {
    return 0;
  }
  std::string unit = s.substr(idx);
  uint64_t mul = 1;
  if (unit == "" ) mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mul = 1ull << 10;
  else if (unit == "M" || unit == "MiB" || unit == "m") mul = 1ull << 20;
  else if (unit == "G" || unit == "GiB" || unit == "g") mul = 1ull << 30;
  else return 0;
  if (v > UINT64_MAX / mul) return 0;
  return v * mul;
}

}  // namespace ordo

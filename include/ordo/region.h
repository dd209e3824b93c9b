// Mapping the shared region: a /dev/shm file on the host, the ivshmem BAR2
// resource file in a guest. Same bytes either way (layout.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ordo/layout.h"

namespace ordo {

class Region {
 public:
  // Host side: creates (or reuses) the file at `path`, sized for `partitions`
  // parts of layout.region_size bytes, maps part `partition` alone and writes
  // it a fresh header with `layout` and a new random session id.
  static std::unique_ptr<Region> create(const std::string& path, const Layout& layout, std::string* error,
                                        uint32_t partition = 0, uint32_t partitions = 1);
  // Creates the file at `path` with `size` bytes, or checks that it has them
  // (never truncating a file a VM may have mapped).
  static bool prepare_file(const std::string& path, uint64_t size, std::string* error);
  // Maps an existing region whose layout the worker already wrote (an ivshmem BAR
  // the host created). Nothing is trusted: callers validate().
  static std::unique_ptr<Region> map(const std::string& path, std::string* error);
  // After validate() on the whole mapping: part `k` of it, validated in turn,
  // as a region of its own (sharing the mapping).
  std::unique_ptr<Region> partition(uint32_t k, std::string* error) const;
  // Maps the same bytes again at `address` (never over anything mapped there)
  // and moves this region there, so that its pointers equal the worker's
  // (RegionHeader::mapped_base). In a process that already maps these bytes
  // at `address` (a worker in the same process), shares that mapping. Call it
  // before anything holds a pointer into the region.
  bool rebase(uint64_t address, std::string* error);
  // For a process that is ending: keeps this region's mapping (every part of
  // it) from being unmapped when the region is destroyed, so that
  // privatize_retained() can later put private memory in its place.
  void retain_until_exit();
  // Replaces each retained mapping, at once and at its address, with private
  // zeroed memory. Threads a program leaves running past exit (NCCL's proxy
  // threads) then touch memory of their own instead of faulting or writing
  // into a region part another process may claim next.
  static void privatize_retained();

  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Guest side: checks magic, version and that the layout fits the mapping
  // (the whole region: its first part's header says how it is divided).
  bool validate(std::string* error);
  uint32_t partitions() const { return partitions_; }

  RegionHeader* header() const { return reinterpret_cast<RegionHeader*>(base_); }
  const Layout& layout() const { return layout_; }
  RingControl& ring(uint32_t r) const {
    return reinterpret_cast<RingControl*>(base_ + layout_.rings_off)[r];
  }
  Entry* entries(uint32_t r) const {
    return reinterpret_cast<Entry*>(base_ + layout_.entries_off) + uint64_t{r} * layout_.ring_capacity;
  }
  ReplySlot& slot(uint32_t s) const { return reinterpret_cast<ReplySlot*>(base_ + layout_.slots_off)[s]; }
  std::byte* staging(uint32_t r) const {
    return reinterpret_cast<std::byte*>(base_ + layout_.staging_off + uint64_t{r} * layout_.staging_per_ring);
  }
  std::byte* heap() const { return reinterpret_cast<std::byte*>(base_ + layout_.heap_off); }
  std::byte* base() const { return reinterpret_cast<std::byte*>(base_); }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  struct Mapping;  // how the bytes are mapped (region.cc)

 private:
  Region() = default;
  static std::unique_ptr<Region> map_range(const std::string& path, uint64_t offset, uint64_t size,
                                           std::string* error);
  bool check_header(uint64_t part_size, uint32_t part, std::string* error);
  std::shared_ptr<Mapping> mapping_;
  char* base_ = nullptr;
  uint64_t offset_ = 0;  // of base_ in the file
  uint32_t partitions_ = 1;
  uint64_t size_ = 0;
  Layout layout_{};
  std::string path_;
};

// Where a region spec points: "ivshmem" (the first ivshmem PCI device),
// "ivshmem:N" (the N-th), a PCI address ("0000:00:04.0"), or a file path. For a
// device it enables the device and returns its BAR2 resource file, the
// write-combined one where the kernel offers it (ORDO_BAR_MAPPING=uc picks the
// uncached one, to measure the difference).
std::string resolve_region(const std::string& spec, std::string* error);

// "64M", "1G", "16777216" -> bytes; 0 on a malformed string.
uint64_t parse_size(const std::string& s);

}  // namespace ordo

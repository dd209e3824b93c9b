// A session's virtual memory (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess): the ranges the guest reserved, the physical memory it
// created and what is mapped where. The worker holds every VMM request to it
// before the backend sees the request (the guest's own books are not
// trusted), copies and memsets check their device ranges against it, and the
// session's reset undoes what it lists. Pure bookkeeping: callers lock.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "ordo/limits.h"
#include "ordo/status.h"

namespace ordo {

class VmmTable {
 public:
  struct Physical {
    uint64_t backend_handle = 0;
    uint32_t device = 0;
    uint64_t size = 0;
    uint32_t maps = 0;      // mappings of it
    bool released = false;  // the guest released it: kept only while mapped
  };
  struct Mapping {
    uint64_t size = 0;
    uint64_t handle = 0;  // this table's
    uint64_t access = 0;  // bits 2d..2d+1: device d's VmmAccess
  };

  // A new reservation's [addr, addr + size) must not overlap one this
  // session holds (the backend hands out fresh ranges; this guards it).
  Status add_reservation(uint64_t addr, uint64_t size);
  // Exactly one reservation, nothing mapped in it: kInvalidValue otherwise.
  Status remove_reservation(uint64_t addr, uint64_t size);

  uint64_t add_physical(const Physical& p);  // -> this table's handle (never 0, never reused before clear())
  const Physical* physical(uint64_t handle) const;  // a live, unreleased handle; null otherwise
  // Marks it released; true if nothing maps it any more, so the backend may
  // let it go now (it is then gone from the table).
  Status release(uint64_t handle, bool* gone, uint64_t* backend_handle);

  // [addr, addr + size) inside one reservation, over nothing mapped, and no
  // larger than the handle's memory.
  Status check_map(uint64_t addr, uint64_t size, uint64_t handle) const;
  void add_mapping(uint64_t addr, uint64_t size, uint64_t handle);
  // Whole mappings that cover [addr, addr + size) exactly and without a gap.
  Status check_cover(uint64_t addr, uint64_t size) const;
  // Removes the mappings check_cover accepted; `gone` gets the backend
  // handles of released memory no longer mapped anywhere (for the backend to free).
  void remove_mappings(uint64_t addr, uint64_t size, std::vector<uint64_t>* gone);
  // Sets device d's access (bits 2d..2d+1 of `access`) for each d in
  // `devices`, on the mappings check_cover accepted.
  void set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access);

  // [addr, addr + size) lies in mappings without a gap, each accessible from
  // some device: what a copy or memset may touch.
  bool accessible(uint64_t addr, uint64_t size) const;

  const std::map<uint64_t, uint64_t>& reservations() const { return reservations_; }
  const std::map<uint64_t, Mapping>& mappings() const { return mappings_; }
  const std::map<uint64_t, Physical>& handles() const { return handles_; }
  void clear();

 private:
  std::map<uint64_t, uint64_t> reservations_;  // address -> size
  std::map<uint64_t, Mapping> mappings_;       // address -> mapping
  std::map<uint64_t, Physical> handles_;       // handle -> memory
  uint64_t next_handle_ = 1;
};

}  // namespace ordo

#include "vmm_table.h"

#include "ranges.h"

namespace ordo {
namespace {

// The entry of `m` whose range holds `addr`, or end().
template <class Map, class Size>
auto containing(Map& m, uint64_t addr, Size size_of) {
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return m.end();
  --it;
  return addr - it->first < size_of(it->second) ? it : m.end();
}

uint64_t mapping_size(const VmmTable::Mapping& m) { return m.size; }
uint64_t plain_size(uint64_t s) { return s; }

bool overflows(uint64_t addr, uint64_t size) { return size == 0 || addr + size < addr; }

}  // namespace

Status VmmTable::add_reservation(uint64_t addr, uint64_t size) {
  if (overflows(addr, size)) return Status::kInvalidValue;
  auto next = reservations_.lower_bound(addr);
  if (next != reservations_.end() && next->first < addr + size) return Status::kInvalidValue;
  if (next != reservations_.begin() && std::prev(next)->first + std::prev(next)->second > addr)
    return Status::kInvalidValue;
  reservations_.emplace(addr, size);
  return Status::kSuccess;
}

Status VmmTable::remove_reservation(uint64_t addr, uint64_t size) {
  auto it = reservations_.find(addr);
  if (it == reservations_.end() || it->second != size) return Status::kInvalidValue;
  auto m = mappings_.lower_bound(addr);
  if (m != mappings_.end() && m->first - addr < size) return Status::kInvalidValue;  // still mapped
  reservations_.erase(it);
  return Status::kSuccess;
}

uint64_t VmmTable::add_physical(const Physical& p) {
  const uint64_t h = next_handle_++;
  handles_.emplace(h, p);
  return h;
}

const VmmTable::Physical* VmmTable::physical(uint64_t handle) const {
  auto it = handles_.find(handle);
  return it == handles_.end() || it->second.released ? nullptr : &it->second;
}

Status VmmTable::release(uint64_t handle, bool* gone, uint64_t* backend_handle) {
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.released) return Status::kInvalidValue;
  *backend_handle = it->second.backend_handle;
  *gone = it->second.maps == 0;
  if (*gone) handles_.erase(it);
  else it->second.released = true;
  return Status::kSuccess;
}

Status VmmTable::check_map(uint64_t addr, uint64_t size, uint64_t handle) const {
  if (overflows(addr, size)) return Status::kInvalidValue;
  const Physical* p = physical(handle);
  if (!p) return Status::kInvalidValue;  // CUDA's answer to a handle it does not know
  if (size > p->size) return Status::kInvalidValue;
  auto r = containing(reservations_, addr, plain_size);
  if (r == reservations_.end() || size > r->second - (addr - r->first)) return Status::kInvalidValue;
  auto next = mappings_.lower_bound(addr);
  if (next != mappings_.end() && next->first < addr + size) return Status::kInvalidValue;
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > addr)
    return Status::kInvalidValue;
  return Status::kSuccess;
}

void VmmTable::add_mapping(uint64_t addr, uint64_t size, uint64_t handle) {
  mappings_.emplace(addr, Mapping{size, handle, 0});
  ++handles_.at(handle).maps;
}

Status VmmTable::check_cover(uint64_t addr, uint64_t size) const {
  if (overflows(addr, size)) return Status::kInvalidValue;
  auto it = mappings_.find(addr);
  for (uint64_t at = addr; at < addr + size; ++it) {
    if (it == mappings_.end() || it->first != at) return Status::kInvalidValue;
    at += it->second.size;
    if (at > addr + size) return Status::kInvalidValue;  // would cut a mapping
  }
  return Status::kSuccess;
}

void VmmTable::remove_mappings(uint64_t addr, uint64_t size, std::vector<uint64_t>* gone) {
  auto it = mappings_.find(addr);
  while (it != mappings_.end() && it->first < addr + size) {
    auto h = handles_.find(it->second.handle);
    if (h != handles_.end() && --h->second.maps == 0 && h->second.released) {
      gone->push_back(h->second.backend_handle);
      handles_.erase(h);
    }
    it = mappings_.erase(it);
  }
}

void VmmTable::set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access) {
  for (auto it = mappings_.find(addr); it != mappings_.end() && it->first < addr + size; ++it)
    it->second.access = vmm_access_merge(it->second.access, devices, access);
}

bool VmmTable::accessible(uint64_t addr, uint64_t size) const {
  return !overflows(addr, size) &&
         covered(mappings_, addr, size, mapping_size, [](const Mapping& m) { return m.access != 0; });
}

void VmmTable::clear() {
  reservations_.clear();
  mappings_.clear();
  handles_.clear();
  next_handle_ = 1;  // a session's handles are its own: numbered alike in each
}

}  // namespace ordo

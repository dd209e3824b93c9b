// The device allocations libcuda.so.1 handed out, to tell device from
// host pointers (cudaMemcpyDefault, cuMemcpy, cuPointerGetAttribute): the host
// GPU's addresses live in another address space and may equal guest host
// addresses, so only this table can tell. Each range keeps the device it was
// allocated on (cuPointerGetAttribute's ordinal and context, cuMemGetInfo).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

namespace ordo::driver {

class AddressRanges {
 public:
  // The range holding `a`: its base, size and device.
  bool find(uint64_t a, uint64_t* base = nullptr, uint64_t* size = nullptr, int* device = nullptr) {
    std::lock_guard lock(mu_);
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return false;
    --it;
    if (a - it->first >= it->second.size) return false;
    if (base) *base = it->first;
    if (size) *size = it->second.size;
    if (device) *device = it->second.device;
    return true;
  }
  void add(uint64_t a, uint64_t n, int device = 0) {
    std::lock_guard lock(mu_);
    ranges_[a] = {n, device};
  }
  bool erase(uint64_t a) {
    std::lock_guard lock(mu_);
    return ranges_.erase(a) != 0;
  }
  uint64_t total(int device) {
    std::lock_guard lock(mu_);
    uint64_t t = 0;
    for (auto& [a, r] : ranges_)
      if (r.device == device) t += r.size;
    return t;
  }

 private:
  struct Range {
    uint64_t size;
    int device;
  };
  std::mutex mu_;
  std::map<uint64_t, Range> ranges_;  // base -> range
};

}  // namespace ordo::driver

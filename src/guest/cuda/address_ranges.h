// The device allocations libcuda.so.1 handed out, to tell device from
// host pointers (cudaMemcpyDefault, cuMemcpy, cuPointerGetAttribute): the host
// GPU's addresses live in another address space and may equal guest host
// addresses, so only this table can tell.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

namespace ordo::driver {

class AddressRanges {
 public:
  // The range holding `a`: its base and size.
  bool find(uint64_t a, uint64_t* base = nullptr, uint64_t* size = nullptr) {
    std::lock_guard lock(mu_);
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return false;
    --it;
    if (a - it->first >= it->second) return false;
    if (base) *base = it->first;
    if (size) *size = it->second;
    return true;
  }
  void add(uint64_t a, uint64_t n) {
    std::lock_guard lock(mu_);
    ranges_[a] = n;
  }
  bool erase(uint64_t a) {
    std::lock_guard lock(mu_);
    return ranges_.erase(a) != 0;
  }
  uint64_t total() {
    std::lock_guard lock(mu_);
    uint64_t t = 0;
    for (auto& [a, n] : ranges_) t += n;
    return t;
  }

 private:
  std::mutex mu_;
  std::map<uint64_t, uint64_t> ranges_;  // base -> size
};

}  // namespace ordo::driver

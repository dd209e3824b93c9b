// Virtual memory management, generated: random programs of VMM requests
// (forged ones among them) against a worker, held to a model of CUDA's rules.
// The hand-written cases are in test_vmm.cc.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "harness.h"

namespace ordo::test {
namespace {
constexpr uint64_t kG = kVmmGranularity;
constexpr uint64_t kRW = uint64_t(VmmAccess::kReadWrite);
}  // namespace
}  // namespace ordo::test

namespace ordo::test {
namespace {

// Random VMM programs, forged requests among them, against a model of what
// CUDA's rules allow: every status must be the model's, and every marker read
// back through any mapping of a handle (aliases, remappings, released memory
// still mapped) must be the last one written through any of them.
class VmmModel {
 public:
  VmmModel(Client& c, uint64_t seed) : c_(c), rng_(seed) {}

  void step() {
    // Weighted so that ranges fill up with mappings that are granted, written and read.
    const uint64_t r = pick(20);
    if (r < 2) return reserve();
    if (r < 4) return create();
    if (r < 8) return map();
    if (r < 11) return set_access();
    if (r < 13) return unmap();
    if (r < 14) return release();
    if (r < 15) return address_free();
    if (r < 18) return write_marker();
    return read_markers();
  }
  // Gives everything back through the API, as a careful program does.
  void drain() {
    while (!maps_.empty()) {
      const uint64_t va = maps_.begin()->first;
      expect(c_.vmm_unmap(va, maps_.begin()->second.granules * kG), Status::kSuccess, "unmap at the end");
      drop_mapping(va);
    }
    for (auto& [h, p] : handles_)
      if (!p.released) expect(c_.vmm_release(h), Status::kSuccess, "release at the end");
    for (auto& [va, n] : reserved_) expect(c_.vmm_address_free(va, n * kG), Status::kSuccess, "free at the end");
  }
  int failures() const { return failures_; }
  // How often each request was answered each way: a program that never maps twice tests nothing.
  const std::map<std::string, int>& seen() const { return seen_; }

 private:
  struct Physical {
    uint64_t granules = 0;
    bool released = false;
    uint32_t maps = 0;
    std::vector<uint32_t> marker;  // per granule: the word at kMarker
  };
  struct Map {
    uint64_t granules = 0, handle = 0;
    bool access = false;
  };
  static constexpr uint64_t kMarker = 1000;

  uint64_t pick(uint64_t n) { return rng_() % n; }
  void expect(Status got, Status want, const char* what) {
    if (got == want) {
      ++seen_[std::string(what) + (ok(got) ? " ok" : " refused")];
      return;
    }
    if (++failures_ <= 10)
      ADD_FAILURE() << what << ": " << status_name(got) << ", the model expects " << status_name(want);
  }
  // A reserved granule: a reservation's start plus an offset, sometimes one past its end.
  uint64_t some_address() {
    if (reserved_.empty() || pick(10) == 0) return (pick(64) + 1) * kG;  // likely reserved by nobody
    auto it = std::next(reserved_.begin(), long(pick(reserved_.size())));
    return it->first + pick(it->second + 1) * kG;
  }
  // Mostly a run of whole mappings (va, *n granules), sometimes any range.
  uint64_t some_run(uint64_t* n) {
    if (maps_.empty() || pick(4) == 0) {
      *n = pick(4) + 1;
      return some_address();
    }
    auto it = std::next(maps_.begin(), long(pick(maps_.size())));
    const uint64_t va = it->first;
    *n = it->second.granules;
    for (auto next = std::next(it); pick(2) && next != maps_.end() && next->first == va + *n * kG; ++next)
      *n += next->second.granules;
    if (pick(8) == 0) *n += 1;  // one past the run
    return va;
  }
  // Mostly an address inside a mapping.
  uint64_t some_mapped() {
    if (maps_.empty() || pick(5) == 0) return some_address();
    auto it = std::next(maps_.begin(), long(pick(maps_.size())));
    return it->first + pick(it->second.granules) * kG;
  }
  uint64_t some_handle() {
    if (handles_.empty() || pick(8) == 0) return pick(1000) + 500;  // never given
    for (int tries = 0; tries < 3; ++tries) {  // mostly one still held
      auto it = std::next(handles_.begin(), long(pick(handles_.size())));
      if (!it->second.released || tries == 2) return it->first;
    }
    return 0;
  }
  // Whole mappings from va, without a gap, for n granules.
  bool whole(uint64_t va, uint64_t n) const {
    auto it = maps_.find(va);
    for (uint64_t at = va; at < va + n * kG; ++it) {
      if (it == maps_.end() || it->first != at) return false;
      at += it->second.granules * kG;
      if (at > va + n * kG) return false;
    }
    return true;
  }
  const Map* map_at(uint64_t a, uint64_t* base = nullptr) const {
    auto it = maps_.upper_bound(a);
    if (it == maps_.begin()) return nullptr;
    --it;
    if (a - it->first >= it->second.granules * kG) return nullptr;
    if (base) *base = it->first;
    return &it->second;
  }
  void drop_mapping(uint64_t va) {
    const uint64_t h = maps_.at(va).handle;
    maps_.erase(va);
    Physical& p = handles_.at(h);
    if (--p.maps == 0 && p.released) handles_.erase(h);
  }

  void reserve() {
    const uint64_t n = pick(8) + 1;
    uint64_t va = 0;
    expect(c_.vmm_reserve(n * kG, pick(2) ? kG : 0, 0, &va), Status::kSuccess, "reserve");
    if (va) reserved_[va] = n;
  }
  void create() {
    const uint64_t n = pick(3) + 1;
    uint64_t h = 0;
    expect(c_.vmm_create(0, n * kG, &h), Status::kSuccess, "create");
    if (h) handles_[h] = {n, false, 0, std::vector<uint32_t>(n, 0)};
  }
  // Mostly the next granule of a reservation not mapped yet (a segment growing).
  uint64_t next_free() {
    if (reserved_.empty() || pick(3) == 0) return some_address();
    auto r = std::next(reserved_.begin(), long(pick(reserved_.size())));
    uint64_t g = 0;
    while (g < r->second && map_at(r->first + g * kG)) ++g;
    return r->first + g * kG;
  }
  void map() {
    const uint64_t va = next_free(), h = some_handle();
    const uint64_t n = handles_.count(h) && pick(4) ? handles_.at(h).granules : pick(3) + 1;
    bool good = handles_.count(h) && !handles_.at(h).released && n <= handles_.at(h).granules;
    auto r = reserved_.upper_bound(va);
    good = good && r != reserved_.begin() && va + n * kG <= std::prev(r)->first + std::prev(r)->second * kG;
    for (uint64_t g = 0; good && g < n; ++g) good = !map_at(va + g * kG);
    expect(c_.vmm_map(va, n * kG, h), good ? Status::kSuccess : Status::kInvalidValue, "map");
    if (!good) return;
    maps_[va] = {n, h, false};
    ++handles_.at(h).maps;
    if (pick(3)) {  // as programs do: access at once
      expect(c_.vmm_set_access(va, n * kG, 1, kRW), Status::kSuccess, "set access");
      maps_[va].access = true;
    }
  }
  void set_access() {
    uint64_t n = 0;
    const uint64_t va = some_run(&n);
    const bool grant = pick(4) != 0;
    const bool good = whole(va, n);
    expect(c_.vmm_set_access(va, n * kG, 1, grant ? kRW : 0), good ? Status::kSuccess : Status::kInvalidValue,
           "set access");
    if (!good) return;
    for (auto it = maps_.find(va); it != maps_.end() && it->first < va + n * kG; ++it) it->second.access = grant;
  }
  void unmap() {
    uint64_t n = 0;
    const uint64_t va = some_run(&n);
    const bool good = whole(va, n);
    expect(c_.vmm_unmap(va, n * kG), good ? Status::kSuccess : Status::kInvalidValue, "unmap");
    if (!good) return;
    while (maps_.lower_bound(va) != maps_.end() && maps_.lower_bound(va)->first < va + n * kG)
      drop_mapping(maps_.lower_bound(va)->first);
  }
  void release() {
    const uint64_t h = some_handle();
    const bool good = handles_.count(h) && !handles_.at(h).released;
    expect(c_.vmm_release(h), good ? Status::kSuccess : Status::kInvalidValue, "release");
    if (!good) return;
    handles_.at(h).released = true;
    if (handles_.at(h).maps == 0) handles_.erase(h);
  }
  void address_free() {
    if (reserved_.empty()) return;
    auto it = std::next(reserved_.begin(), long(pick(reserved_.size())));
    const uint64_t va = it->first, n = it->second + (pick(6) == 0);  // sometimes not its size
    auto m = maps_.lower_bound(va);
    const bool good = n == it->second && (m == maps_.end() || m->first >= va + n * kG);
    expect(c_.vmm_address_free(va, n * kG), good ? Status::kSuccess : Status::kInvalidValue, "address free");
    if (good) reserved_.erase(it);
  }
  void write_marker() {
    const uint64_t a = some_mapped() + kMarker;
    uint64_t base = 0;
    const Map* m = map_at(a, &base);
    const uint32_t v = uint32_t(rng_());
    const bool good = m && m->access;
    expect(c_.memcpy_h2d(a, &v, 4), good ? Status::kSuccess : Status::kInvalidDevicePointer, "write");
    c_.get_last_error();
    if (good) handles_.at(m->handle).marker[(a - base) / kG] = v;
  }
  void read_markers() {
    for (auto& [va, m] : maps_) {
      for (uint64_t g = 0; g < m.granules; ++g) {
        uint32_t v = 0xdeadbeef;
        const Status want = m.access ? Status::kSuccess : Status::kInvalidDevicePointer;
        expect(c_.memcpy_d2h(&v, va + g * kG + kMarker, 4), want, "read");
        c_.get_last_error();
        if (m.access && v != handles_.at(m.handle).marker[g] && ++failures_ <= 10)
          ADD_FAILURE() << "granule " << g << " of handle " << m.handle << " reads " << v << ", written "
                        << handles_.at(m.handle).marker[g];
      }
    }
    // A copy across the seam of two mappings: allowed where both are accessible and adjacent.
    const uint64_t a = some_mapped();
    if (a < kG) return;
    const Map* left = map_at(a - 4);
    const Map* right = map_at(a);
    uint64_t v = 0;
    const bool good = left && right && left->access && right->access;
    expect(c_.memcpy_d2h(&v, a - 4, 8), good ? Status::kSuccess : Status::kInvalidDevicePointer, "seam read");
    c_.get_last_error();
  }

  Client& c_;
  std::mt19937_64 rng_;
  std::map<uint64_t, uint64_t> reserved_;  // va -> granules
  std::map<uint64_t, Physical> handles_;
  std::map<uint64_t, Map> maps_;
  int failures_ = 0;
  std::map<std::string, int> seen_;
};

TEST(ClientVmm, RandomProgramsAgreeWithAModel) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    InProcessWorker w;
    auto c = w.attach();
    VmmModel m(*c, seed);
    for (int i = 0; i < 600 && !m.failures(); ++i) m.step();
    m.drain();
    EXPECT_EQ(m.failures(), 0) << "seed " << seed;
    for (const char* what : {"map ok", "map refused", "set access ok", "set access refused", "unmap ok",
                             "unmap refused", "release ok", "release refused", "write ok", "write refused",
                             "read ok", "seam read ok", "seam read refused", "address free ok", "address free refused"})
      EXPECT_GE(m.seen().count(what) ? m.seen().at(what) : 0, 2) << what << ", seed " << seed;
    EXPECT_EQ(c->null_call(), Status::kSuccess);
  }
}

}  // namespace
}  // namespace ordo::test

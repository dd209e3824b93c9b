// The cuda backend: ordo-worker on a real GPU (cuda_backend_impl.h: the class, and where each part of it is).
// Declared whether or not the worker was built with CUDA (meson -Dcuda): without
// it, probe() says so and make_cuda_backend() returns nullptr.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/backend.h"

namespace ordo::cuda {

// Whether this build has the cuda backend at all.
bool built();

// What cudaGetDeviceCount said. `error` is the cudaError_t number (35,
// cudaErrorInsufficientDriver, on a machine without a driver).
struct Probe {
  int count = 0;
  int error = 0;
  std::string error_name;  // "cudaErrorInsufficientDriver"
  bool usable() const { return error == 0 && count > 0; }
  // "no CUDA device (cudaGetDeviceCount: cudaErrorInsufficientDriver (35))"
  std::string why_not() const;
};
Probe probe();

// The backend on host devices `devices` (ordinals, in the order the guest
// numbers them; empty: every visible device), or nullptr and *error saying why
// and what to do.
std::unique_ptr<Backend> make_cuda_backend(const std::vector<int>& devices, std::string* error);

// Whether `image` may go to cuModuleLoadData: a fatbin or 64-bit ELF cubin
// whose own size fields (fatbin header and entries, ELF program and section
// headers) stay inside `image`, or PTX text (printable ASCII and whitespace,
// optionally NUL-terminated; the backend NUL-terminates its copy). Anything
// else, the fatbin wrapper included, is refused; *why says why.
bool check_module_image(std::span<const std::byte> image, std::string* why);

// The cuda backend's kernel ids: a slot (low kSlotBits) and that slot's
// generation above it. Unloading a module releases its kernels' slots for
// reuse, so a long-running worker never runs out of ids; bumping the
// generation makes the old ids stop resolving. A stale id resolves again only
// after its slot has been reused 2^(32 - kSlotBits) times, and then it names a
// kernel of the same guest (one worker per guest), checked against that
// kernel's own parameter size: no worse than a stale CUfunction natively.
class KernelIds {
 public:
  static constexpr uint32_t kSlotBits = 20;
  static constexpr uint32_t kMaxSlots = 1u << kSlotBits;

  explicit KernelIds(uint32_t max_slots = kMaxSlots) : max_(max_slots < kMaxSlots ? max_slots : kMaxSlots) {}

  bool full() const { return free_.empty() && slots_.size() >= max_; }

  // A new live id, or false when every slot is in use.
  bool acquire(uint32_t* id) {
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else if (slots_.size() < max_) {
      slot = uint32_t(slots_.size());
      slots_.push_back({});
    } else {
      return false;
    }
    slots_[slot].live = true;
    *id = slots_[slot].gen << kSlotBits | slot;
    return true;
  }

  // The slot of a live id; false for ids never given or already released.
  bool find(uint32_t id, uint32_t* slot) const {
    const uint32_t s = id & (kMaxSlots - 1);
    if (s >= slots_.size() || !slots_[s].live || slots_[s].gen != id >> kSlotBits) return false;
    *slot = s;
    return true;
  }

  // Frees a live id's slot; anything else is ignored.
  void release(uint32_t id) {
    uint32_t s;
    if (!find(id, &s)) return;
    slots_[s].live = false;
    slots_[s].gen = (slots_[s].gen + 1) & ((1u << (32 - kSlotBits)) - 1);
    free_.push_back(s);
  }

 private:
  struct Slot {
    uint32_t gen = 0;
    bool live = false;
  };
  uint32_t max_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
};

// The fatbin of ordo's built-in kernels (the simulator's, for a GPU) that the
// backend loads as module 0; empty when not built. Benchmarks use it to run the
// same kernels natively.
std::span<const std::byte> builtin_image();

}  // namespace ordo::cuda

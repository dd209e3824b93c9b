#include "guest/pinned_heap.h"

#include <boost/interprocess/managed_external_buffer.hpp>
#include <new>

namespace ordo::guest {

namespace bip = boost::interprocess;

PinnedHeap::PinnedHeap(std::byte* base, uint64_t size) : base_(base), size_(size) {
  if (size >= 4096) buf_ = std::make_unique<bip::managed_external_buffer>(bip::create_only, base, size);
}

PinnedHeap::~PinnedHeap() = default;

void* PinnedHeap::alloc(uint64_t size) {
  std::lock_guard lock(mu_);
  return buf_ ? buf_->allocate_aligned(size, 64, std::nothrow) : nullptr;
}

void PinnedHeap::free(void* p) {
  std::lock_guard lock(mu_);
  buf_->deallocate(p);
}

}  // namespace ordo::guest

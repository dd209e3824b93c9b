#include "guest/kernels.h"
#include "transport/op_args.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace ordo::guest {

Status Kernels::lookup(uint32_t module, const std::string& name, uint32_t* kernel, bool* runnable) {
  ThreadState& t = threads_.current();
  if (!kernel || name.empty() || name.size() >= kSlotPayload) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::KernelLookup>({.module = module});
  uint64_t id = 0, cannot_run = 0;
  Status s = threads_.call(e, &id, &cannot_run, &name);
  if (ok(s)) *kernel = uint32_t(id);
  if (ok(s) && runnable) *runnable = cannot_run == 0;
  return threads_.finish_own(t, s);
}

Status Kernels::module_load(const void* image, uint64_t size, uint32_t* module) {
  ThreadState& t = threads_.current();
  if (!image || !module || size == 0) return threads_.finish_own(t, Status::kInvalidValue);
  if (size > kMaxModuleImage) return threads_.finish_own(t, Status::kInvalidKernelImage);
  // The image travels through one block of the pinned heap: all of it when it
  // is at most a share of the heap (one request), else in pieces of that
  // share, smaller while the heap has no room for one, so that no image is
  // bounded by the heap and none takes all of it from the program's other threads.
  uint64_t piece = std::min(size, std::max(heap_.size() / kImageHeapShare, kMinImagePiece));
  void* block = memory_.alloc_host(piece);
  while (!block && piece > kMinImagePiece) {
    piece = std::max(piece / 2, kMinImagePiece);
    block = memory_.alloc_host(piece);
  }
  if (!block) return threads_.finish_own(t, Status::kMemoryAllocation);
  uint64_t id = 0;
  const Status s = send_image(static_cast<const std::byte*>(image), size, block, piece, &id);
  heap_.free(block);  // the worker copied every piece out before answering
  if (ok(s)) *module = uint32_t(id);
  return threads_.finish_own(t, s);
}

Status Kernels::send_image(const std::byte* image, uint64_t size, void* block, uint64_t piece, uint64_t* id) {
  // The worker holds one image in pieces per session: this process sends one at a time.
  std::unique_lock<std::mutex> lock;
  if (piece < size) lock = std::unique_lock(pieces_mu_);
  const uint64_t off = heap_.offset(block);
  for (uint64_t at = 0;; at += piece) {
    const uint64_t n = std::min(piece, size - at);
    std::memcpy(block, image + at, n);
    // The last (or only) piece loads the module, with the count of those before it.
    if (at + n == size) return threads_.call(make_entry<Op::ModuleLoad>({.image = off, .size = n, .sent = at}), id);
    if (Status s = threads_.call(make_entry<Op::ModuleChunk>({.image = off, .size = n, .at = at})); !ok(s)) return s;
  }
}

Status Kernels::module_unload(uint32_t module) {
  ThreadState& t = threads_.current();
  // Like cudaFree: no work issued before, on any device, may still use the module's kernels.
  if (Status s = waits_.synchronize_all(t); !ok(s)) return s;
  const Entry e = make_entry<Op::ModuleUnload>({.module = module});
  return threads_.finish(t, threads_.call(e));
}

Status Kernels::module_global(uint32_t module, const std::string& name, uint64_t size_hint, uint64_t* addr,
                              uint64_t* size) {
  ThreadState& t = threads_.current();
  if (!addr || !size || name.empty() || name.size() >= kSlotPayload)
    return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::ModuleGlobal>({.module = module, .size = size_hint, .device = t.device});
  return threads_.finish_own(t, threads_.call(e, addr, size, &name));
}

Status Kernels::attributes(uint32_t kernel, uint32_t device, int32_t* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish_own(t, Status::kInvalidValue);
  // The worker checks the device against its count.
  const Entry e = make_entry<Op::KernelAttributes>({.kernel = kernel, .device = device});
  return threads_.finish_own(t, threads_.call(e, nullptr, nullptr, nullptr, out, kKernelAttributeCount * sizeof(int32_t)));
}

Status Kernels::occupancy(uint32_t kernel, uint32_t device, uint32_t threads, uint32_t smem, uint16_t shape,
                          uint64_t mode, uint32_t* out) {
  ThreadState& t = threads_.current();
  if (!out) return threads_.finish_own(t, Status::kInvalidValue);
  const Entry e = make_entry<Op::KernelOccupancy>(
      {.kernel = kernel, .device = device, .threads = threads, .smem = smem, .shape = shape, .mode = mode});
  uint64_t n = 0;
  const Status s = threads_.call(e, &n);
  if (ok(s)) *out = uint32_t(n);
  return threads_.finish_own(t, s);
}

Status Kernels::launch(uint32_t kernel, Dim3 grid, Dim3 block, const void* args, uint32_t args_size, Stream s,
                       uint32_t shared_mem, uint16_t shape) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!streams_.bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  Ring& g = *b.g;
  // CUDA's launch limits on every device since compute capability 3.0: refused
  // by the launch itself (cudaErrorInvalidConfiguration), not by a later sync.
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || threads > 1024 || block.z > 64 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return threads_.finish(t, Status::kInvalidConfiguration);
  if (args_size && !args) return threads_.finish(t, Status::kInvalidValue);
  // Every device allows 48 KiB; above that, what this device allows any kernel
  // (a kernel's own opt-in limit is the driver's to check, at dispatch).
  if (shared_mem > 48 * 1024) {
    uint64_t limit = 0;  // not finish()ed by shared_mem_limit: once, here
    if (Status st = devices_.shared_mem_limit(b.s.device, &limit); !ok(st)) return threads_.finish(t, st);
    if (shared_mem > limit) return threads_.finish(t, Status::kInvalidValue);
  }
  std::lock_guard lock(g.mu);
  uint64_t off = 0;
  if (args_size) {
    if (!staging_.alloc(t, g, args_size, &off)) return threads_.finish(t, Status::kInvalidValue);
    std::memcpy(g.staging.at(off), args, args_size);
  }
  Words arg{};
  encode(Args<Op::Launch>{.kernel = kernel,
                          .grid = grid,
                          .block = block,
                          .params = off,
                          .params_size = uint32_t(args_size),
                          .shared_mem = uint32_t(shared_mem)},
         arg);
  const uint64_t pos = producer_.push_launch(t, g, b.s, arg, shape);
  if (args_size) staging_.release_after(t, g, pos);
  return threads_.finish_async(t);
}

}  // namespace ordo::guest

#include "guest/copies.h"
#include "transport/op_args.h"

#include <algorithm>
#include <cstring>

namespace ordo::guest {

namespace {
Entry copy_entry(MemKind dst_kind, MemKind src_kind, uint64_t dst, uint64_t src, uint64_t size) {
  return make_entry<Op::Memcpy>({.dst = dst, .src = src, .size = size}, mem_flags(dst_kind, src_kind));
}
}  // namespace

Status Copies::h2d_async(uint64_t dst, const void* src, uint64_t size, Stream s) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!streams_.bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  if (size == 0) return threads_.finish(t, Status::kSuccess);
  if (!src) return threads_.finish(t, Status::kInvalidValue);
  std::lock_guard lock(b.g->mu);
  if (heap_.contains(src, size)) {
    producer_.push(t, *b.g, b.s, copy_entry(MemKind::Device, MemKind::Pinned, dst, heap_.offset(src), size));
    return threads_.finish(t, Status::kSuccess);
  }
  // Pageable memory: copied into staging now, so the caller may reuse it on
  // return (as CUDA). The worker copies chunk k while the guest fills k + 1.
  const auto* from = static_cast<const std::byte*>(src);
  uint64_t chunk = 0;
  std::byte* blocks[StagingPool::kBlocks];
  if (const unsigned nb = pool_.blocks(size, &chunk, blocks)) return h2d_pool(t, b, dst, from, size, chunk, blocks, nb);
  return h2d_window(t, b, dst, from, size);
}

Status Copies::h2d_pool(ThreadState& t, const Bound& b, uint64_t dst, const std::byte* src, uint64_t size,
                        uint64_t chunk, std::byte** blocks, unsigned nb) {
  Ring& g = *b.g;
  // Block i % nb is reused once the device copy that read it completed.
  uint64_t fences[StagingPool::kBlocks] = {};
  Status st = Status::kSuccess;
  for (uint64_t done = 0, i = 0; done < size && ok(st); ++i) {
    const unsigned k = unsigned(i % nb);
    if (fences[k] && !ok(st = session_.wait_completed(g.index, fences[k]))) break;
    const uint64_t n = std::min(chunk, size - done);
    std::memcpy(blocks[k], src + done, n);
    producer_.push(t, g, b.s, copy_entry(MemKind::Device, MemKind::Pinned, dst + done, heap_.offset(blocks[k]), n));
    fences[k] = producer_.push_fence(t, g);
    done += n;
  }
  for (unsigned k = 0; k < nb; ++k) fences[k] ? pool_.release(g.index, fences[k], blocks[k]) : heap_.free(blocks[k]);
  return ok(st) ? threads_.finish_async(t) : threads_.finish(t, st);
}

Status Copies::h2d_window(ThreadState& t, const Bound& b, uint64_t dst, const std::byte* src, uint64_t size) {
  Ring& g = *b.g;
  const uint64_t chunk = staging_.chunk(size);
  for (uint64_t done = 0; done < size;) {
    const uint64_t n = std::min(chunk, size - done);
    uint64_t off;
    if (!staging_.alloc(t, g, n, &off)) return threads_.finish(t, Status::kDevicesUnavailable);
    std::memcpy(g.staging.at(off), src + done, n);
    const uint64_t pos = producer_.push(t, g, b.s, copy_entry(MemKind::Device, MemKind::Staging, dst + done, off, n));
    staging_.release_after(t, g, pos);
    done += n;
  }
  return threads_.finish_async(t);
}

Status Copies::d2h_async(void* dst, uint64_t src, uint64_t size, Stream s) {
  ThreadState& t = threads_.current();
  Bound b;
  if (!streams_.bind(s, &b)) return threads_.finish(t, Status::kInvalidResourceHandle);
  if (size == 0) return threads_.finish(t, Status::kSuccess);
  if (!dst) return threads_.finish(t, Status::kInvalidValue);
  std::lock_guard lock(b.g->mu);
  if (heap_.contains(dst, size)) {
    producer_.push(t, *b.g, b.s, copy_entry(MemKind::Pinned, MemKind::Device, heap_.offset(dst), src, size));
    return threads_.finish(t, Status::kSuccess);
  }
  // Pageable destination: like CUDA, return only once the data is there.
  // Chunks are issued ahead, each with a fence, as far as staging allows, and
  // the guest copies chunk k out while the device fills the later ones. A
  // chunk's staging is released (its mark pushed) only once it was copied out:
  // completion alone would let the next chunk overwrite it first.
  auto* to = static_cast<std::byte*>(dst);
  uint64_t chunk = 0;
  std::byte* blocks[StagingPool::kBlocks];
  if (const unsigned nb = pool_.blocks(size, &chunk, blocks)) return d2h_pool(t, b, to, src, size, chunk, blocks, nb);
  return d2h_window(t, b, to, src, size);
}

Status Copies::d2h_pool(ThreadState& t, const Bound& b, std::byte* dst, uint64_t src, uint64_t size, uint64_t chunk,
                        std::byte** blocks, unsigned nb) {
  Ring& g = *b.g;
  // Chunk i lands in block i % nb; the guest copies it out, in order, before
  // the block takes chunk i + nb.
  struct Pending {
    uint64_t fence, at, n;
  };
  Pending q[StagingPool::kBlocks];
  Status st = Status::kSuccess;
  uint64_t issued = 0, drained = 0;
  for (uint64_t i = 0, j = 0; drained < size && ok(st);) {
    if (issued < size && i - j < nb) {
      const unsigned k = unsigned(i % nb);
      const uint64_t n = std::min(chunk, size - issued);
      producer_.push(t, g, b.s, copy_entry(MemKind::Pinned, MemKind::Device, heap_.offset(blocks[k]), src + issued, n));
      q[k] = {producer_.push_fence(t, g), issued, n};
      issued += n;
      ++i;
      continue;
    }
    const unsigned k = unsigned(j % nb);
    if (!ok(st = session_.wait_completed(g.index, q[k].fence))) break;
    std::memcpy(dst + q[k].at, blocks[k], q[k].n);
    drained += q[k].n;
    ++j;
  }
  // On a lost session the worker is gone: nothing writes the blocks any more.
  for (unsigned k = 0; k < nb; ++k) heap_.free(blocks[k]);
  return threads_.finish(t, st);
}

Status Copies::d2h_window(ThreadState& t, const Bound& b, std::byte* dst, uint64_t src, uint64_t size) {
  Ring& g = *b.g;
  struct InFlight {
    uint64_t fence, pos, end, off, at, n;
  };
  InFlight q[8];
  unsigned head = 0, count = 0;
  const uint64_t chunk = staging_.chunk(size);
  auto drain = [&]() -> Status {
    const InFlight& f = q[head % 8];
    if (Status st = session_.wait_completed(g.index, f.fence); !ok(st)) {
      for (; count; --count, ++head) g.staging.release_at(q[head % 8].pos, q[head % 8].end);
      return st;
    }
    std::memcpy(dst + f.at, g.staging.at(f.off), f.n);
    g.staging.release_at(f.pos, f.end);
    ++head;
    --count;
    return Status::kSuccess;
  };
  for (uint64_t issued = 0; issued < size || count;) {
    if (issued < size && count < 8) {
      const uint64_t n = std::min(chunk, size - issued);
      uint64_t off;
      bool got = g.staging.try_alloc(align16(n), &off);
      // Nothing of ours to copy out: wait for other entries' staging instead.
      if (!got && !count) {
        if (!staging_.alloc(t, g, n, &off)) return threads_.finish(t, Status::kDevicesUnavailable);
        got = true;
      }
      if (got) {
        const Entry e = copy_entry(MemKind::Staging, MemKind::Device, off, src + issued, n);
        const uint64_t pos = producer_.push(t, g, b.s, e);
        q[(head + count) % 8] = {producer_.push_fence(t, g), pos, g.staging.tail(), off, issued, n};
        ++count;
        issued += n;
        continue;
      }
    }
    if (Status st = drain(); !ok(st)) return threads_.finish(t, st);
  }
  return threads_.finish(t, Status::kSuccess);
}

Status Copies::d2d_async(uint64_t dst, uint64_t src, uint64_t size, Stream s) {
  return streams_.stream_op(s, copy_entry(MemKind::Device, MemKind::Device, dst, src, size));
}

Status Copies::peer_async(uint64_t dst, uint32_t dst_device, uint64_t src, uint32_t src_device, uint64_t size,
                          Stream s) {
  // With unified addressing a peer copy is a device-to-device copy: the
  // addresses say which devices; the worker checks they are this session's.
  if (dst_device >= session_.device_count() || src_device >= session_.device_count())
    return threads_.finish(threads_.current(), Status::kInvalidDevice);
  return d2d_async(dst, src, size, s);
}

Status Copies::memset_async(uint64_t dst, uint8_t value, uint64_t size, Stream s) {
  return streams_.stream_op(s, make_entry<Op::Memset>({.dst = dst, .value = value, .size = size}));
}

// cudaMemcpy is legacy-stream work (ARCHITECTURE.md rule 4): it follows the
// blocking streams through the legacy edges, not non-blocking streams.
Status Copies::h2d(uint64_t dst, const void* src, uint64_t size, Stream s) {
  // From pageable memory CUDA synchronizes before the copy starts, and the
  // async path reads the source into staging at once: wait for what the copy
  // follows first (a host function may still be writing the source).
  if (!heap_.contains(src, size))
    if (Status st = streams_.order_wait(s); !ok(st)) return st;
  if (Status st = h2d_async(dst, src, size, s); !ok(st)) return st;
  return streams_.synchronize(s);
}

Status Copies::d2h(void* dst, uint64_t src, uint64_t size) {
  if (Status s = d2h_async(dst, src, size, kLegacyStream); !ok(s)) return s;
  return streams_.synchronize(kLegacyStream);
}

}  // namespace ordo::guest

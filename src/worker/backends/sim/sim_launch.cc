// The sim's work: kernel launches, copies and memsets, checked and enqueued on
// a stream (or run at once, Device::push_or_run), and executed by the stream's
// thread (Device::execute).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string_view>

#include "sim_device.h"
#include "sim_registry.h"

namespace ordo::sim {
namespace {

// The largest copy or memset the dispatching thread runs itself (Device::run_inline):
// about 100 us of memcpy, so the worker's other rings wait no longer than that.
constexpr uint64_t kInlineBytes = uint64_t{4} << 20;

std::atomic<uint64_t> g_tick{0};

}  // namespace

Status Device::check_kernel(uint32_t kernel, Dim3 grid, Dim3 block, uint32_t shared_mem, const LaunchShape& shape,
                            Kernel* fn, std::string_view* missing) const {
  *fn = kernel_by_id(kernel);
  if (!*fn) {
    Registry& r = registry();
    std::shared_lock lk(r.mu);
    auto it = r.missing.find(kernel);
    if (it == r.missing.end()) return Status::kInvalidDeviceFunction;
    *missing = it->second;  // a map node: stable while the process lives
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0)
    return Status::kInvalidConfiguration;
  if (uint64_t{block.x} * block.y * block.z > kMaxBlockThreads) return Status::kInvalidConfiguration;
  // A cluster changes nothing a twin computes: it runs the whole grid. A
  // cooperative grid must fit the device at once, as its blocks may wait for each other.
  if (Status s = check_cluster(grid, shape.cluster); !ok(s)) return s;
  if (shape.cooperative && uint64_t{grid.x} * grid.y * grid.z > coresident_blocks(block, shared_mem))
    return Status::kCooperativeLaunchTooLarge;
  return Status::kSuccess;
}

Status Device::launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) {
  Kernel fn = nullptr;
  std::string_view missing;
  if (Status s = check_kernel(p.kernel, p.grid, p.block, p.shared_mem, p.shape, &fn, &missing); !ok(s)) return s;
  if (p.args_size != 0 && p.args == nullptr) return Status::kInvalidValue;
  Op op{tag, LaunchOp{fn, missing, p.grid, p.block, ArgBuf(p.args, p.args_size), 0}};
  std::lock_guard lk(mu_);
  Stream* s = find_stream_locked(stream);
  if (!s) return Status::kInvalidResourceHandle;
  std::get<LaunchOp>(op.body).device = s->device;
  push_locked(*s, std::move(op));
  return Status::kSuccess;
}

Status Device::memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size,
                      const OpTag& tag) {
  if (size != 0) {
    if (Status st = check_operand(dst, size); !ok(st)) return st;
    if (Status st = check_operand(src, size); !ok(st)) return st;
  }
  return push_or_run(stream, Op{tag, CopyOp{dst, src, size}}, size);
}

Status Device::memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size,
                      const OpTag& tag) {
  if (size != 0) {
    if (Status st = check_operand(MemOperand{true, dst}, size); !ok(st)) return st;
  }
  return push_or_run(stream, Op{tag, SetOp{dst, size, value}}, size);
}

// A copy or memset of `size` bytes: run on this thread when its stream is
// idle and it is short enough not to hold up the worker's other rings.
Status Device::push_or_run(uint32_t stream, Op&& op, uint64_t size) {
  std::shared_ptr<Stream> claimed;
  {
    std::lock_guard lk(mu_);
    Stream* s = find_stream_locked(stream);
    if (!s) return Status::kInvalidResourceHandle;
    if (size == 0) return Status::kSuccess;
    if (!enqueue_locked(*s, op, size <= kInlineBytes)) return Status::kSuccess;
    claimed = streams_[stream];
  }
  run_inline(*claimed, op);
  return Status::kSuccess;
}

void Device::execute(Op& op) {
  if (auto* l = std::get_if<LaunchOp>(&op.body)) {
    if (Status s = run_kernel(l->fn, l->missing, l->grid, l->block, l->args.span(), l->device, nullptr); !ok(s))
      report(op.tag, s);
  } else if (auto* g = std::get_if<ProgramOp>(&op.body)) {
    run_program(*g, op.tag);
  } else if (auto* c = std::get_if<CopyOp>(&op.body)) {
    if (Status st = run_copy(*c); !ok(st)) report(op.tag, st);
  } else if (auto* m = std::get_if<SetOp>(&op.body)) {
    if (Status st = run_set(*m); !ok(st)) report(op.tag, st);
  } else if (auto* r = std::get_if<RecordOp>(&op.body)) {
    r->cap->time = std::chrono::steady_clock::now();
  } else if (auto* w = std::get_if<WaitOp>(&op.body)) {
    w->stream->wait_for(w->seq);
  } else if (auto* h = std::get_if<HostOp>(&op.body)) {
    run_guarded(h->fn);
  }
}

Status Device::run_copy(const CopyOp& c) {
  void* dst = nullptr;
  const void* src = nullptr;
  std::shared_ptr<const void> dst_pin, src_pin;
  if (c.dst.device) {
    if (!ok(lookup(c.dst.addr, c.size, &dst, &dst_pin))) return Status::kInvalidDevicePointer;
  } else {
    dst = reinterpret_cast<void*>(static_cast<uintptr_t>(c.dst.addr));
  }
  if (c.src.device) {
    void* p = nullptr;
    if (!ok(lookup(c.src.addr, c.size, &p, &src_pin))) return Status::kInvalidDevicePointer;
    src = p;
  } else {
    src = reinterpret_cast<const void*>(static_cast<uintptr_t>(c.src.addr));
  }
  device_copy(dst, src, c.size);
  return Status::kSuccess;
}

Status Device::run_set(const SetOp& m) {
  void* dst = nullptr;
  std::shared_ptr<const void> pin;
  if (!ok(lookup(m.dst, m.size, &dst, &pin))) return Status::kInvalidDevicePointer;
  device_fill(dst, m.value, m.size);
  return Status::kSuccess;
}

Status Device::run_kernel(Kernel fn, std::string_view missing, Dim3 grid, Dim3 block, std::span<const std::byte> args,
                          uint32_t device, KernelContext::Conditions* conds) {
  if (!fn) {
    // In stream order, as a GPU reports an image it cannot run.
    std::fprintf(stderr,
                 "ordo-worker (sim): kernel %.*s has no host twin, so the sim cannot run it; the launch fails "
                 "with cudaErrorNoKernelImageForDevice (add a twin with --sim-kernels, or use --backend cuda)\n",
                 int(missing.size()), missing.data());
    return Status::kNoKernelImage;
  }
  KernelContext ctx(*this, grid, block, args, device);
  ctx.bind_conditions(conds);
  try {
    fn(ctx);
  } catch (const KernelError& e) {
    return e.status;  // kSuccess: the kernel chose to end early
  } catch (...) {
    return Status::kLaunchFailure;
  }
  return Status::kSuccess;
}

uint64_t KernelContext::tick() const { return g_tick.fetch_add(1, std::memory_order_acq_rel) + 1; }

}  // namespace ordo::sim

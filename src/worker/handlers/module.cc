// Modules and kernels: images are copied out of the pinned heap before the
// backend parses them; a kernel id names what a launch runs.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "../worker.h"

namespace ordo {

Status Worker::op_Launch(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  // After a kernel fault no device work runs (the guest's calls return the
  // fault from the region header); streams and host functions still progress,
  // so no synchronize hangs.
  if (faulted()) return Status::kSuccess;
  const auto a = decode<Op::Launch>(c.e.arg);
  LaunchParams p;
  p.kernel = a.kernel;
  p.grid = a.grid;
  p.block = a.block;
  p.args = region_.staging(c.ring) + a.params;
  p.args_size = a.params_size;
  p.shared_mem = a.shared_mem;
  LaunchShape::decode(c.e.flags, &p.shape);  // check<Op::Launch> checked it
  return backend_.launch(c.e.stream, p, c.tag);
}

bool Worker::module_loaded(uint32_t module) {
  std::lock_guard lock(modules_mu_);
  return modules_.count(module) != 0;
}

void Worker::op_KernelLookup(const SlotCall& c) {
  const std::string name = payload_name(c.slot);
  const uint32_t module = uint32_t(decode<Op::KernelLookup>(c.e.arg).module);  // check_entry: fits
  if (module != 0 && !module_loaded(module)) return reply(c, Status::kInvalidResourceHandle);
  uint32_t id = 0;
  const Status st = backend_.kernel_lookup(module, name, &id);
  reply(c, st, id, ok(st) && !backend_.kernel_runnable(id));
}

void Worker::op_KernelAttributes(const SlotCall& c) {
  const auto a = decode<Op::KernelAttributes>(c.e.arg);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  int32_t attrs[kKernelAttributeCount] = {};
  const Status st = backend_.kernel_attributes(uint32_t(a.kernel), uint32_t(a.device), attrs);  // check_entry: fits
  if (ok(st)) {
    std::lock_guard lock(error_mu_);  // the payload is the guest's to read after the reply
    std::memcpy(region_.slot(c.slot).payload, attrs, sizeof attrs);
  }
  reply(c, st);
}

void Worker::op_KernelOccupancy(const SlotCall& c) {
  const auto a = decode<Op::KernelOccupancy>(c.e.arg);  // check_entry: every field in range
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  Backend::OccupancyQuery q;
  q.threads = uint32_t(a.threads);
  q.smem = uint32_t(a.smem);
  LaunchShape::decode(uint32_t(a.shape), &q.shape);
  q.clusters = a.mode & kOccupancyClusters;
  q.non_portable = a.mode & kOccupancyNonPortable;
  uint32_t n = 0;
  const Status st = backend_.kernel_occupancy(uint32_t(a.kernel), uint32_t(a.device), q, &n);
  reply(c, st, n);
}

void Worker::op_ModuleGlobal(const SlotCall& c) {
  const std::string name = payload_name(c.slot);
  const auto a = decode<Op::ModuleGlobal>(c.e.arg);
  const uint32_t module = uint32_t(a.module);  // check_entry: fits
  if (!module_loaded(module)) return reply(c, Status::kInvalidResourceHandle);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  uint64_t addr = 0, size = 0;
  const Status st = backend_.module_global(module, uint32_t(a.device), name, a.size, &addr, &size);
  if (ok(st) && size) {
    const auto lock = write_memory();
    globals_[addr] = {size, module};
  }
  reply(c, st, addr, size);
}

namespace {

// Appends a copy of the heap's [image, image + size) to `out`; false when out
// of memory. check_entry bounded the range to the pinned heap and the image to
// kMaxModuleImage. Copied because the guest can rewrite the heap at any time
// and the backend parses the image. Grown by hand so that a pending image
// never holds more than kMaxModuleImage (a vector's doubling would hold twice).
bool append_copy(const std::byte* heap, uint64_t image, uint64_t size, std::vector<std::byte>& out) {
  try {
    const uint64_t need = out.size() + size;
    if (need > out.capacity()) out.reserve(std::min(std::max<uint64_t>(need, 2 * out.capacity()), kMaxModuleImage));
    out.insert(out.end(), heap + image, heap + image + size);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

}  // namespace

Status Worker::continue_image(const SlotCall& c, uint64_t at) {
  PendingImage& p = pending_image_;
  if (p.slot == c.slot && p.bytes.size() == at) return Status::kSuccess;
  log_bad("slot", c.slot, c.seq,
          p.slot == kNoSlot ? "a module image piece at " + std::to_string(at) + " with no image pending"
          : p.slot != c.slot
              ? "a module image piece from another slot than the pending image's (" + std::to_string(p.slot) + ")"
              : "a module image piece at " + std::to_string(at) + " after " + std::to_string(p.bytes.size()) +
                    " bytes; the pending image is dropped");
  p = {};  // the image cannot be completed: the guest starts it over
  return Status::kInvalidValue;
}

void Worker::op_ModuleChunk(const SlotCall& c) {
  const auto a = decode<Op::ModuleChunk>(c.e.arg);
  if (a.at == 0) pending_image_ = {{}, c.slot};  // a new image: an unfinished one is dropped
  else if (Status s = continue_image(c, a.at); !ok(s)) return reply(c, s);
  if (!append_copy(region_.heap(), a.image, a.size, pending_image_.bytes)) {
    pending_image_ = {};
    return reply(c, Status::kMemoryAllocation);
  }
  reply(c, Status::kSuccess);
}

void Worker::op_ModuleLoad(const SlotCall& c) {
  const auto a = decode<Op::ModuleLoad>(c.e.arg);
  std::vector<std::byte> image;
  if (a.sent) {  // the last piece of an image sent by ModuleChunk
    if (Status s = continue_image(c, a.sent); !ok(s)) return reply(c, s);
    image = std::move(pending_image_.bytes);
    pending_image_ = {};
  }
  if (!append_copy(region_.heap(), a.image, a.size, image)) return reply(c, Status::kMemoryAllocation);
  uint32_t id;
  {
    std::lock_guard lock(modules_mu_);
    if (modules_.size() + loading_.size() >= kMaxModules) return reply(c, Status::kMemoryAllocation);
    id = next_module_;
    while (id == 0 || modules_.count(id) || loading_.count(id)) ++id;  // wraps after 2^32 loads: skip live ids and 0
    next_module_ = id + 1;
    loading_.insert(id);
  }
  // The backend loads on side_ (a JIT can take seconds) and answers from there:
  // meanwhile lane 0 serves its rings and the other slots.
  side_.post([this, id, image = std::move(image), done = deferred_result(c.slot, c.seq)] {
    const Status st = backend_.module_load(id, image);
    {
      std::lock_guard lock(modules_mu_);
      loading_.erase(id);
      if (ok(st)) modules_.insert(id);
    }
    done(st, ok(st) ? id : 0);
  });
}

void Worker::op_ModuleUnload(const SlotCall& c) {
  const uint32_t module = uint32_t(decode<Op::ModuleUnload>(c.e.arg).module);  // check_entry: fits
  {
    std::lock_guard lock(modules_mu_);
    if (!modules_.erase(module)) return reply(c, Status::kInvalidResourceHandle);
  }
  {
    const auto lock = write_memory();
    std::erase_if(globals_, [module](const auto& g) { return g.second.second == module; });
  }
  reply(c, backend_.module_unload(module));
}

}  // namespace ordo

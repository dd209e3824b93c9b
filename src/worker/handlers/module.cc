// Modules and kernels: images are copied out of the pinned heap before the
// backend parses them; a kernel id names what a launch runs.
#include <new>
#include <vector>

#include "../worker.h"

namespace ordo {

Status Worker::op_Launch(const RingCall& c) {
  if (Status s = enter_stream(c); !ok(s)) return s;
  // After a kernel fault no device work runs (the guest's calls return the
  // fault from the region header); streams and host functions still progress,
  // so no synchronize hangs.
  if (faulted()) return Status::kSuccess;
  const Entry& e = c.e;
  LaunchParams p;
  p.kernel = uint32_t(e.arg[0]);
  p.grid = {uint32_t(e.arg[1]), uint32_t(e.arg[1] >> 32), uint32_t(e.arg[2])};
  p.block = {uint32_t(e.arg[2] >> 32), uint32_t(e.arg[3]), uint32_t(e.arg[3] >> 32)};
  p.args = region_.staging(c.ring) + e.arg[4];
  p.args_size = uint32_t(e.arg[5]);
  p.shared_mem = uint32_t(e.arg[5] >> 32);
  return backend_.launch(e.stream, p, c.tag);
}

void Worker::op_KernelLookup(const SlotCall& c) {
  const std::string name = payload_name(c.slot);
  const uint32_t module = uint32_t(c.e.arg[0]);  // check_entry: fits
  if (module != 0 && !modules_.count(module)) return reply(c, Status::kInvalidResourceHandle);
  uint32_t id = 0;
  const Status st = backend_.kernel_lookup(module, name, &id);
  reply(c, st, id, ok(st) && !backend_.kernel_runnable(id));
}

void Worker::op_ModuleGlobal(const SlotCall& c) {
  const std::string name = payload_name(c.slot);
  const uint32_t module = uint32_t(c.e.arg[0]);
  if (!modules_.count(module)) return reply(c, Status::kInvalidResourceHandle);
  if (c.e.arg[2] >= devices_) return reply(c, Status::kInvalidDevice);
  uint64_t addr = 0, size = 0;
  const Status st = backend_.module_global(module, uint32_t(c.e.arg[2]), name, c.e.arg[1], &addr, &size);
  if (ok(st) && size) globals_[addr] = {size, module};
  reply(c, st, addr, size);
}

void Worker::op_ModuleLoad(const SlotCall& c) {
  if (modules_.size() >= kMaxModules) return reply(c, Status::kMemoryAllocation);
  // check_entry bounded the range to the pinned heap. Copy it out: the guest
  // can rewrite the heap at any time, and the backend parses the image.
  std::vector<std::byte> image;
  try {
    image.assign(region_.heap() + c.e.arg[0], region_.heap() + c.e.arg[0] + c.e.arg[1]);
  } catch (const std::bad_alloc&) {
    return reply(c, Status::kMemoryAllocation);
  }
  uint32_t id = next_module_;
  while (id == 0 || modules_.count(id)) ++id;  // wraps after 2^32 loads: skip live ids and 0
  const Status st = backend_.module_load(id, image);
  if (!ok(st)) return reply(c, st);
  next_module_ = id + 1;
  modules_.insert(id);
  reply(c, st, id);
}

void Worker::op_ModuleUnload(const SlotCall& c) {
  const uint32_t module = uint32_t(c.e.arg[0]);
  if (!modules_.erase(module)) return reply(c, Status::kInvalidResourceHandle);
  std::erase_if(globals_, [module](const auto& g) { return g.second.second == module; });
  reply(c, backend_.module_unload(module));
}

}  // namespace ordo

// Interprocess memory and events (cudaIpcGetMemHandle, cudaIpcOpenMemHandle,
// cudaIpcCloseMemHandle, cudaIpcGetEventHandle, cudaIpcOpenEventHandle).
// Guest processes of one region have a worker each: an export goes into the
// region's IpcTable, shared by those workers only, and the guest gets a token
// for it. The workers never take a backend's bytes from a guest: what another
// process opens is what its exporter's backend wrote into the table. All run
// on lane 0; copies on other lanes read the imports under read_memory().
#include "../worker.h"

namespace ordo {

void Worker::op_IpcExport(const SlotCall& c) {
  const auto a = decode<Op::IpcExport>(c.e.arg);
  if (!opt_.ipc || !backend_.supports_ipc()) return reply(c, Status::kNotSupported);
  IpcExport x{.kind = IpcKind(a.kind), .partition = opt_.partition};
  IpcToken token;
  // Once per object: exported again, it gives the same token.
  auto once = [&](auto& exports, auto key, auto&& backend_export) -> Status {
    if (auto e = exports.find(key); e != exports.end()) {
      token = e->second;
      return Status::kSuccess;
    }
    if (Status st = backend_export(); !ok(st)) return st;
    if (Status st = opt_.ipc->publish(x, &token); !ok(st)) return st;
    exports[key] = token;
    return Status::kSuccess;
  };
  Status st;
  if (x.kind == IpcKind::kMemory) {
    // The allocation that holds the address: CUDA exports it whole.
    auto it = allocations_.upper_bound(a.handle);
    if (it == allocations_.begin() || a.handle - std::prev(it)->first >= std::prev(it)->second)
      return reply(c, Status::kInvalidValue);
    --it;
    x.size = it->second;
    st = once(ipc_exported_mem_, it->first, [&] { return backend_.ipc_export_mem(it->first, &x.blob, &x.device); });
  } else if (x.kind == IpcKind::kVmm) {
    const VmmTable::Physical* p = vmm_.physical(a.handle);
    if (!p) return reply(c, Status::kInvalidValue);
    x.device = p->device;
    x.size = p->size;
    st = once(ipc_exported_vmm_, p->backend_handle, [&] { return backend_.ipc_export_vmm(p->backend_handle, &x.blob); });
  } else {
    std::lock_guard lock(events_mu_);
    uint32_t idx;
    if (st = events_.find(a.handle, &idx); !ok(st)) return reply(c, st);
    if (!(events_.flags(idx) & kEventInterprocess)) return reply(c, Status::kInvalidResourceHandle);
    x.device = events_.device(idx);
    st = once(ipc_exported_events_, idx,
              [&] { return backend_.ipc_export_event(events_.backend_of(idx, 0), &x.blob); });
  }
  if (!ok(st)) return reply(c, st);
  reply(c, Status::kSuccess, token.word, token.secret);
}

namespace {

// What a token names, if another session exported it. CUDA refuses to open a
// handle in the process that exported it.
Status find_export(const IpcTable& table, uint32_t partition, const IpcToken& t, IpcKind kind, IpcExport* x) {
  if (Status st = table.find(t, x); !ok(st)) return st;
  if (x->kind != kind) return Status::kInvalidResourceHandle;
  if (x->partition == partition) return Status::kInvalidContext;
  return Status::kSuccess;
}

}  // namespace

void Worker::op_IpcOpenMem(const SlotCall& c) {
  const auto a = decode<Op::IpcOpenMem>(c.e.arg);
  if (!opt_.ipc || !backend_.supports_ipc()) return reply(c, Status::kNotSupported);
  if (a.device >= devices_) return reply(c, Status::kInvalidDevice);
  const IpcToken t{a.token, a.secret};
  // Another device's memory: CUDA's lazy peer access (the only flag there is)
  // lets the caller's device reach it, as cudaDeviceEnablePeerAccess would.
  auto reach = [&](uint32_t dev, uint32_t peer) {
    if (dev == peer || (peers_[dev] >> peer & 1)) return Status::kSuccess;
    if (!backend_.can_access_peer(dev, peer)) return Status::kInvalidDevice;
    if (Status st = backend_.set_peer_access(dev, peer, true); !ok(st) && st != Status::kPeerAccessAlreadyEnabled)
      return st;
    peers_[dev] |= 1u << peer;
    return Status::kSuccess;
  };
  // Opened before: the same address, counted once more (from this device too).
  for (auto& [addr, imp] : ipc_imports_) {
    if (imp.token.word != t.word || imp.token.secret != t.secret) continue;
    if (Status st = reach(uint32_t(a.device), imp.device); !ok(st)) return reply(c, st);
    ++imp.refs;
    return reply(c, Status::kSuccess, addr, SizeAndDevice{imp.size, imp.device}.word());
  }
  IpcExport x;
  if (Status st = find_export(*opt_.ipc, opt_.partition, t, IpcKind::kMemory, &x); !ok(st)) return reply(c, st);
  if (x.device >= devices_) return reply(c, Status::kInvalidDevice);
  // A last close of the same export may still be on its way to the backend,
  // which could hand back the address it is about to unmap.
  if (ipc_closing_ > 0) side_.drain();
  const uint32_t dev = uint32_t(a.device), peer = x.device;
  if (Status st = reach(dev, peer); !ok(st)) return reply(c, st);
  uint64_t addr = 0;
  if (Status st = backend_.ipc_open_mem(x.blob, dev, x.size, &addr); !ok(st)) return reply(c, st);
  {
    const auto lock = write_memory();
    ipc_imports_[addr] = {x.size, peer, 1, t};
  }
  reply(c, Status::kSuccess, addr, SizeAndDevice{x.size, peer}.word());
}

void Worker::op_IpcCloseMem(const SlotCall& c) {
  const auto a = decode<Op::IpcCloseMem>(c.e.arg);
  auto it = ipc_imports_.find(a.addr);
  if (it == ipc_imports_.end()) return reply(c, Status::kInvalidValue);
  if (--it->second.refs > 0) return reply(c, Status::kSuccess);
  {
    const auto lock = write_memory();
    ipc_imports_.erase(it);
  }
  // Off the dispatch threads, as cudaFree: the driver may wait for the device.
  ++ipc_closing_;
  side_.post([this, addr = a.addr, done = deferred_result(c.slot, c.seq)] {
    const Status st = backend_.ipc_close_mem(addr);
    --ipc_closing_;
    done(st, 0);
  });
}

void Worker::op_IpcOpenEvent(const SlotCall& c) {
  const auto a = decode<Op::IpcOpenEvent>(c.e.arg);
  if (!opt_.ipc || !backend_.supports_ipc()) return reply(c, Status::kNotSupported);
  IpcExport x;
  if (Status st = find_export(*opt_.ipc, opt_.partition, {a.token, a.secret}, IpcKind::kEvent, &x); !ok(st))
    return reply(c, st);
  if (x.device >= devices_) return reply(c, Status::kInvalidDevice);
  uint64_t handle = 0;
  Status st;
  {
    std::lock_guard lock(events_mu_);
    st = events_.create(x.device, uint32_t(kEventInterprocess | kEventDisableTiming), &handle, &x.blob);
  }
  reply(c, st, handle, x.device);
}

void Worker::op_IpcOpenVmm(const SlotCall& c) {
  const auto a = decode<Op::IpcOpenVmm>(c.e.arg);
  if (!opt_.ipc || !backend_.supports_ipc() || !backend_.supports_vmm()) return reply(c, Status::kNotSupported);
  IpcExport x;
  // A descriptor imports in the process that exported it too, as a new handle.
  if (Status st = opt_.ipc->find({a.token, a.secret}, &x); !ok(st)) return reply(c, st);
  if (x.kind != IpcKind::kVmm) return reply(c, Status::kInvalidResourceHandle);
  if (x.device >= devices_) return reply(c, Status::kInvalidDevice);
  uint64_t backend_handle = 0;
  if (Status st = backend_.ipc_import_vmm(x.blob, x.device, x.size, &backend_handle); !ok(st)) return reply(c, st);
  // Still exported after the import: what the backend took by the
  // exporter's descriptor number was that export (an exporter takes its
  // export back before it closes the descriptor, which may then be reused).
  if (IpcExport again; !ok(opt_.ipc->find({a.token, a.secret}, &again))) {
    backend_.vmm_release(backend_handle);
    return reply(c, Status::kInvalidResourceHandle);
  }
  const auto lock = write_memory();
  const uint64_t h = vmm_.add_physical({.backend_handle = backend_handle, .device = x.device, .size = x.size});
  reply(c, Status::kSuccess, h, SizeAndDevice{x.size, x.device}.word());
}

bool Worker::ipc_vmm_kept(uint64_t backend_handle) {
  if (!ipc_exported_vmm_.count(backend_handle)) return false;
  ipc_kept_vmm_.push_back(backend_handle);  // still exported: others may import it
  return true;
}

// The session ended: its exports go (processes that opened them keep what
// they opened), before anything else of it does.
void Worker::ipc_revoke_exports() {
  if (opt_.ipc) {
    for (auto& [addr, t] : ipc_exported_mem_) opt_.ipc->revoke(t, opt_.partition);
    for (auto& [idx, t] : ipc_exported_events_) opt_.ipc->revoke(t, opt_.partition);
    for (auto& [h, t] : ipc_exported_vmm_) opt_.ipc->revoke(t, opt_.partition);
  }
  ipc_exported_mem_.clear();
  ipc_exported_events_.clear();
  ipc_exported_vmm_.clear();
}

// And once its work drained, what it opened, and the exported memory it let go.
void Worker::ipc_close_imports() {
  for (auto& [addr, imp] : ipc_imports_) backend_.ipc_close_mem(addr);
  ipc_imports_.clear();
  for (uint64_t h : ipc_kept_vmm_) backend_.vmm_release(h);
  ipc_kept_vmm_.clear();
}

}  // namespace ordo

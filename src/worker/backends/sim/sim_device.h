// The sim's device: Backend on simulated devices, one object for all of them.
// Where its methods are: sim_backend.cc (construction, device info),
// sim_memory.cc (allocations, address translation, peer access), sim_vmm.cc
// (virtual memory: reserved ranges, memfd-backed mappings),
// sim_stream.cc (streams, their threads, enqueueing), sim_event.cc (events,
// notifications, host callbacks), sim_launch.cc (launches, copies, memsets:
// checked, enqueued, executed), sim_module.cc (modules, globals, kernel lookup).
//
// Threads: one host thread per stream runs that stream's ops strictly in FIFO
// order. The caller (the worker's dispatch thread) enqueues, except that it runs
// a short copy or memset itself when the stream is idle (Device::run_inline).
//
// Locking:
//   Device::mu_     stream table, event table, every stream's `enqueued` count
//                   and the legacy-stream bookkeeping; held for each enqueue so
//                   that "earlier call" is well defined.
//   Stream::mu      that stream's queue, its completion waiters and pending
//                   event notifications. Taken after Device::mu_, never the
//                   other way round; a stream thread never holds it while it
//                   runs an op or a callback. The completion count itself is an
//                   atomic; the stream thread takes Stream::mu after a
//                   completion only when someone waits or has a notification.
//   Device::mem_mu_ the allocation map (shared for translations).
//   No lock is held while an op (kernel, copy, host callback) runs.
//
// Completion: a stream counts the ops enqueued and the ops completed. A point in
// a stream is (stream, seq) and is complete when completed >= seq. Events capture
// such a point; dependencies between streams (stream_wait_event, the legacy
// default stream's implicit synchronization) are WaitOps in the waiting stream's
// queue that block its thread on the other stream's condition variable.
#pragma once

#include <sched.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ordo/layout.h"
#include "ordo/sim.h"
#include "sim_memory.h"
#include "sim_registry.h"
#include "sim_stream.h"
#include "transport/kernel_resources.h"
#include "transport/occupancy.h"
#include "worker/backend.h"

namespace ordo::sim {

// How many blocks of `block` threads using `shared_mem` bytes each the sim's
// device holds at once, as a GPU's occupancy (a cooperative launch's limit).
uint64_t coresident_blocks(Dim3 block, uint32_t shared_mem);

constexpr uint64_t kMaxBlockThreads = 1024;
// The shared memory the device keeps per block (RESERVED_SHARED_MEMORY_PER_BLOCK, backend.cc).
constexpr uint64_t kReservedSharedPerBlock = 1024;

// A new interprocess event's cell, nothing recorded (sim_ipc.cc).
std::shared_ptr<IpcEventCell> new_ipc_cell();

class Device final : public Backend {
 public:
  explicit Device(uint32_t devices);

  ~Device() override;

  std::string_view name() const override { return "sim"; }

  uint32_t device_count() const override { return devices_; }

  Status stream_create(uint32_t id, uint32_t device, bool blocking, int /*priority*/) override;

  Status stream_destroy(uint32_t id) override;

  Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) override;

  Status memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size,
                const OpTag& tag) override;

  Status memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size,
                const OpTag& tag) override;

  // Conditional nodes (sim_program.cc): handles unique in the process, and a
  // graph with conditionals run whole by its stream's thread.
  Status cond_handle_create(uint32_t device, uint64_t* handle) override;
  Status launch_program(uint32_t stream, std::shared_ptr<const std::vector<GraphStep>> steps,
                        const OpTag& tag) override;
  void abandon_programs() override { program_epoch_.fetch_add(1, std::memory_order_relaxed); }

  // A copy or memset of `size` bytes: run on this thread when its stream is
  // idle and it is short enough not to hold up the worker's other rings.
  Status push_or_run(uint32_t stream, Op&& op, uint64_t size);

  Status event_create(uint32_t event, uint32_t device, uint32_t flags) override;

  Status event_destroy(uint32_t event) override;

  Status event_record(uint32_t stream, uint32_t event) override;

  Status stream_wait_event(uint32_t stream, uint32_t event) override;

  Status event_query(uint32_t event) override;

  Status event_elapsed(uint32_t start, uint32_t end, float* ms) override;

  void event_notify(uint32_t event, std::function<void()> fn) override;

  void stream_notify(uint32_t stream, std::function<void()> fn) override;

  void host_callback(uint32_t stream, std::function<void()> fn) override;

  Status malloc(uint32_t device, uint64_t size, uint64_t* device_addr) override;
  // A block at the next address of `device`'s span.
  Status place(uint32_t device, std::shared_ptr<HostBlock> block, uint64_t* device_addr);

  // Interprocess memory and events (sim_ipc.cc): a block or an event's cell
  // moves into a memfd, which the other worker process opens as
  // /proc/PID/fd/N of the exporter, checked by inode.
  bool supports_ipc() const override { return true; }
  Status ipc_export_mem(uint64_t addr, IpcBlob* out, uint32_t* device) override;
  Status ipc_open_mem(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* addr) override;
  Status ipc_close_mem(uint64_t addr) override { return free(addr); }
  Status ipc_export_event(uint32_t event, IpcBlob* out) override;
  Status ipc_open_event(uint32_t event, uint32_t device, const IpcBlob& blob) override;
  Status ipc_export_vmm(uint64_t handle, IpcBlob* out) override;
  Status ipc_import_vmm(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* handle) override;
  void ipc_abandon() override;

  Status free(uint64_t device_addr) override;

  // The sim cannot run device code: a module's kernels are found by name among
  // the registered kernels (host twins, see `ordo-worker --sim-kernels`). Loading
  // only records the module id so that lookups in unknown modules fail as on a GPU.
  Status module_load(uint32_t module, std::span<const std::byte>) override;

  // Virtual memory (sim_vmm.cc): reserved ranges above the devices' spans,
  // physical memory as memfds mapped into the range's host address space.
  bool supports_vmm() const override { return true; }
  Status vmm_reserve(uint64_t size, uint64_t alignment, uint64_t hint, uint64_t* addr) override;
  Status vmm_address_free(uint64_t addr, uint64_t size) override;
  Status vmm_create(uint32_t device, uint64_t size, uint64_t* handle) override;
  Status vmm_release(uint64_t handle) override;
  Status vmm_map(uint64_t addr, uint64_t size, uint64_t handle, uint32_t device) override;
  Status vmm_unmap(uint64_t addr, uint64_t size) override;
  Status vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t access) override;
  // lookup() inside a reserved range: [addr, addr + bytes) mapped without a
  // gap, each mapping accessible from `device` (kAnyDevice: from some device).
  Status vmm_lookup(uint64_t addr, uint64_t bytes, uint64_t device, void** out, std::shared_ptr<const void>* pin) const;

  Status module_unload(uint32_t module) override;

  // The sim cannot read the image's initial values: a device variable starts
  // zeroed, in memory of its own, for the module's lifetime.
  Status module_global(uint32_t module, uint32_t device, std::string_view name, uint64_t size_hint, uint64_t* addr,
                       uint64_t* size) override;

  Status device_info(uint32_t device, DeviceInfo* out) override;
  Status tensor_map_encode(uint32_t device, const TensorMapRequest& r, std::byte* out) override;

  // The sim is an all-to-all NVLink box: any device may reach any other once enabled.
  bool can_access_peer(uint32_t device, uint32_t peer) override;

  Status set_peer_access(uint32_t device, uint32_t peer, bool enable) override;

  // Whether a kernel on `device` may touch memory at `addr`: its own device's,
  // or an enabled peer's.
  bool reachable(uint32_t device, uint64_t addr) const;

  // Kernels reach the shared region at the worker's own addresses, as a GPU
  // reaches mapped pinned memory under unified addressing.
  bool register_host_memory(void* base, uint64_t size) override;
  // [addr, addr + bytes) as a pointer when it lies inside that memory, else null.
  void* mapped_host(uint64_t addr, uint64_t bytes) const;

  Status kernel_lookup(uint32_t module, std::string_view name, uint32_t* kernel) override;

  // What the program's cubin states of the kernel (sim_module.cc): the sim
  // runs no device code, so its device "uses" what the compiler reported.
  Status kernel_attributes(uint32_t kernel, uint32_t device, int32_t* out) override;
  // The occupancy calculator's rules (transport/occupancy.h) over those
  // resources; a cluster fits where its blocks do, on any multiprocessors.
  Status kernel_occupancy(uint32_t kernel, uint32_t device, const OccupancyQuery& q, uint32_t* out) override;

  // The attributes DeviceInfo carries, plus what identifies an H200 to libraries
  // that pick kernels by chip (docs/CUDA.md, "The sim's device").
  Status device_attributes(uint32_t device, uint32_t first, int32_t* out) override;

  bool kernel_runnable(uint32_t kernel) override { return kernel_by_id(kernel) != nullptr; }

  // Translates [addr, addr + bytes) (bytes > 0) to host memory if it lies inside
  // one live allocation: kInvalidDevicePointer if addr is in none,
  // kInvalidValue if the range runs past the end of the one it starts in.
  // `pin` keeps the block alive while the caller uses it (a concurrent free only
  // unlinks it).
  Status lookup(uint64_t addr, uint64_t bytes, void** out, std::shared_ptr<const void>* pin = nullptr) const;

 private:
  struct Worker {
    std::shared_ptr<Stream> stream;
    std::thread thread;
  };

  Status kernel_limits(uint32_t kernel, uint32_t device, image::KernelResources* r, DeviceInfo* dev,
                       occupancy::Limits* l);
  // kernel_lookup's search of the registry, registering a module's kernel
  // that has no twin.
  Status find_kernel(uint32_t module, std::string_view name, uint32_t* kernel);

  // Requires mu_ (or construction).
  std::shared_ptr<Stream> start_stream_locked(uint32_t id, uint32_t device, bool blocking, bool legacy);

  static void stop(Stream& s);

  // Joins the threads of destroyed streams that have drained. Requires mu_.
  void reap_locked();

  Stream* find_stream_locked(uint32_t id) const {
    return id < kMaxStreams ? streams_[id].get() : nullptr;
  }

  Event* find_event_locked(uint32_t id) {
    auto it = events_.find(id);
    return it == events_.end() ? nullptr : &it->second;
  }

  Status check_operand(const MemOperand& m, uint64_t size) const;

  // Enqueues `op` on `s` after the implicit legacy-default-stream dependencies.
  // Requires mu_.
  void push_locked(Stream& s, Op&& op) { enqueue_locked(s, op, false); }

  // As push_locked; but when `may_inline` and `s` has nothing to wait for (its
  // thread asleep with every earlier op complete, no implicit dependency
  // pending), claims the stream and returns true without taking `op`: the
  // caller drops mu_ and calls run_inline. Requires mu_.
  bool enqueue_locked(Stream& s, Op& op, bool may_inline);

  // Runs an op that enqueue_locked claimed for the calling thread, as the
  // stream's thread would have: a copy into an idle stream starts at once on a
  // GPU, and handing it to a sleeping thread costs more than a small copy (tens
  // of microseconds on a busy machine). Ops enqueued meanwhile wait in the queue.
  void run_inline(Stream& s, Op& op);

  // The stream thread.
  void run(Stream& s);

  void execute(Op& op);
  // launch()'s checks of a kernel, for a launch or a graph's kernel step.
  Status check_kernel(uint32_t kernel, Dim3 grid, Dim3 block, uint32_t shared_mem, const LaunchShape& shape,
                      Kernel* fn, std::string_view* missing) const;
  void run_program(const ProgramOp& p, const OpTag& tag);
  // A ProgramOp's steps in [at, end), on the stream thread.
  Status run_steps(const std::vector<GraphStep>& steps, size_t at, size_t end, uint32_t device, uint64_t epoch,
                   KernelContext::Conditions& conds);
  // A copy's or memset's bytes, on the stream thread: kInvalidDevicePointer
  // if a device operand is no longer memory (freed while queued).
  Status run_copy(const CopyOp& c);
  Status run_set(const SetOp& m);
  Status run_kernel(Kernel fn, std::string_view missing, Dim3 grid, Dim3 block, std::span<const std::byte> args,
                    uint32_t device, KernelContext::Conditions* conds);
  std::atomic<bool> stopping_{false};  // the destructor: a WHILE node stops looping
  std::atomic<uint64_t> program_epoch_{0};  // abandon_programs: WHILE nodes launched before stop looping

  // Interprocess events: stream ops that mark a record done or wait for one
  // in another process, and notifications when one completes (a thread that
  // polls the cells while someone waits; sim_ipc.cc).
  Status ipc_record_locked(Stream& s, const std::shared_ptr<IpcEventCell>& cell);
  Status ipc_wait_locked(Stream& s, const std::shared_ptr<IpcEventCell>& cell);
  void ipc_notify(std::shared_ptr<IpcEventCell> cell, uint64_t n, std::function<void()> fn);
  void ipc_stop();
  struct IpcWatch {
    std::shared_ptr<IpcEventCell> cell;
    uint64_t n;
    std::function<void()> fn;
    uint64_t epoch;  // ipc_epoch_ when made
  };
  std::mutex ipc_mu_;
  std::condition_variable ipc_cv_;
  std::vector<IpcWatch> ipc_watches_;  // guarded by ipc_mu_
  std::thread ipc_thread_;             // started with the first watch
  std::atomic<bool> ipc_stopping_{false};
  std::atomic<uint64_t> ipc_epoch_{0};  // ipc_abandon: waits made before give up

  const uint32_t devices_;
  cpu_set_t cpus_;  // the constructing thread's CPUs: every stream thread's
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Stream>> streams_ = std::vector<std::shared_ptr<Stream>>(kMaxStreams);  // guarded by mu_; by stream id
  // Per device: live blocking streams, plus destroyed ones its legacy stream has yet to depend on.
  std::vector<std::vector<std::shared_ptr<Stream>>> blocking_;  // guarded by mu_
  std::vector<bool> destroyed_blocking_;                       // guarded by mu_
  std::array<std::atomic<uint32_t>, kMaxDevices> peers_{};     // per device: bit p = may reach device p's memory
  uint64_t host_base_ = 0, host_size_ = 0;                     // set before any work: register_host_memory
  std::unordered_map<uint32_t, Event> events_;     // guarded by mu_
  std::vector<Worker> workers_;                    // guarded by mu_

  mutable std::shared_mutex mem_mu_;
  std::map<uint64_t, std::shared_ptr<HostBlock>> allocs_;  // guarded by mem_mu_
  std::array<uint64_t, kMaxDevices> next_addr_{};  // guarded by mem_mu_; per device: its next address
  std::map<uint64_t, std::shared_ptr<VmmRange>> vmm_ranges_;        // guarded by mem_mu_; by address
  std::map<uint64_t, std::shared_ptr<VmmPhysical>> vmm_handles_;    // guarded by mem_mu_
  uint64_t next_vmm_addr_ = kVmmBase, next_vmm_handle_ = 1;          // guarded by mem_mu_

  std::mutex modules_mu_;
  std::set<uint32_t> modules_;  // guarded by modules_mu_
  using GlobalKey = std::tuple<uint32_t, uint32_t, std::string>;  // module, device, name
  std::map<GlobalKey, std::pair<uint64_t, uint64_t>> globals_;      // -> (addr, size)
  std::map<uint32_t, image::KernelResourceMap> module_resources_;   // by module, from its cubin; under modules_mu_
  std::map<uint32_t, image::KernelResources> kernel_resources_;     // by kernel id, once looked up; under modules_mu_
};

}  // namespace ordo::sim

// libFuzzer target: the worker consuming a region that a hostile guest writes.
// The input is a little program of guest actions (raw entries, tails, slot
// requests, ring bitmaps) interleaved with worker passes and sweeps, so indices
// and entries change between and during the worker's reads. The backend is a
// checker: it traps if the worker ever hands it a host pointer outside the
// region, a device range it did not allocate, or a stream, event or module it
// did not create, and it keeps no device state, so the fuzzer explores the
// worker's decoding rather than a simulator.
//
// One worker serves every input, as one session each, driven without its
// threads (poll_once, sweep): constructing a worker per input cost 20 times
// the input itself. Each input ends its session, and the checker then traps
// unless the worker gave back everything the session held. A crash that only
// shows after earlier inputs is a state the reset forgot: that is a bug too.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <memory>
#include <string>

#include "ordo/region.h"
#include "worker/backends/null/null_backend.h"
#include "worker/worker.h"
#include "transport/ring.h"

namespace {

using namespace ordo;

class CheckingBackend final : public NullBackend {
 public:
  // Two devices, so that device indices are fuzzed too.
  explicit CheckingBackend(const Region& r)
      : NullBackend(2), lo_(reinterpret_cast<uintptr_t>(r.base())), hi_(lo_ + r.size()) {}
  std::string_view name() const override { return "checking"; }
  Status launch(uint32_t, const LaunchParams& p, const OpTag& tag) override {
    std::lock_guard lock(mu_);
    // A cluster reaches a backend only if it tiles the grid (a driver would fault or hang otherwise).
    if (!ok(check_cluster(p.grid, p.shape.cluster))) __builtin_trap();
    if (tag.op == uint16_t(Op::GraphLaunch)) {
      // A graph's arguments are the worker's own copy, never the region (the
      // guest could change them mid-launch); every byte readable (ASan).
      const auto a = reinterpret_cast<uintptr_t>(p.args);
      if (p.args_size && a + p.args_size > lo_ && a < hi_) __builtin_trap();
      volatile uint8_t sum = 0;
      for (uint32_t i = 0; i < p.args_size; ++i) sum = uint8_t(sum + std::to_integer<uint8_t>(p.args[i]));
      return Status::kSuccess;
    }
    host(reinterpret_cast<uintptr_t>(p.args), p.args_size);
    return Status::kSuccess;
  }
  // A program reaches a backend parsed (its bodies nested inside their
  // conditionals, every conditional's handle declared), its memory checked.
  Status cond_handle_create(uint32_t device, uint64_t* handle) override {
    if (device >= device_count()) __builtin_trap();
    *handle = ++handles_;
    return Status::kSuccess;
  }
  Status launch_program(uint32_t, std::shared_ptr<const std::vector<GraphStep>> steps, const OpTag&) override {
    std::lock_guard lock(mu_);
    if (!steps || steps->empty() || !has_control_flow(*steps)) __builtin_trap();
    for (size_t i = 0; i < steps->size(); ++i) {
      const GraphStep& st = (*steps)[i];
      if (st.kind == StepKind::kMemset) device(st.memset.dst, st.memset.size);
      if (st.kind == StepKind::kCopy) device(st.copy.dst, st.copy.size), device(st.copy.src, st.copy.size);
      if ((st.kind == StepKind::kCond || st.kind == StepKind::kBody) && (st.end <= i || st.end > steps->size()))
        __builtin_trap();
    }
    return Status::kSuccess;
  }
  // Only requests that keep cuda.h's rules reach a backend (a driver reads
  // `rank` entries of each array).
  Status tensor_map_encode(uint32_t device, const TensorMapRequest& r, std::byte* out) override {
    std::lock_guard lock(mu_);
    std::string why;
    if (device >= device_count() || !check_tensor_map(r, &why)) __builtin_trap();
    std::memset(out, 0xa5, kTensorMapBytes);
    return Status::kSuccess;
  }
  Status memcpy(uint32_t, MemOperand dst, MemOperand src, uint64_t size, const OpTag&) override {
    std::lock_guard lock(mu_);
    operand(dst, size);
    operand(src, size);
    return Status::kSuccess;
  }
  Status memset(uint32_t, uint64_t dst, uint8_t, uint64_t size, const OpTag&) override {
    std::lock_guard lock(mu_);
    device(dst, size);
    return Status::kSuccess;
  }
  // The worker must pass only devices the backend has.
  Status stream_create(uint32_t stream, uint32_t device, bool, int) override {
    std::lock_guard lock(mu_);
    if (device >= device_count() || stream < kMaxDevices || !streams_.insert(stream).second) __builtin_trap();
    return Status::kSuccess;
  }
  Status stream_destroy(uint32_t stream) override {
    std::lock_guard lock(mu_);
    if (!streams_.erase(stream)) __builtin_trap();
    return Status::kSuccess;
  }
  Status event_create(uint32_t event, uint32_t device, uint32_t) override {
    std::lock_guard lock(mu_);
    if (device >= device_count() || event >= kMaxBackendEvents || !events_.insert(event).second) __builtin_trap();
    return Status::kSuccess;
  }
  Status event_destroy(uint32_t event) override {
    std::lock_guard lock(mu_);
    if (!events_.erase(event)) __builtin_trap();
    return Status::kSuccess;
  }
  Status event_record(uint32_t stream, uint32_t event) override {
    std::lock_guard lock(mu_);
    live_stream(stream);
    live_event(event);
    return Status::kSuccess;
  }
  Status stream_wait_event(uint32_t stream, uint32_t event) override {
    std::lock_guard lock(mu_);
    live_stream(stream);
    live_event(event);
    return Status::kSuccess;
  }
  Status event_query(uint32_t event) override {
    std::lock_guard lock(mu_);
    live_event(event);
    return Status::kSuccess;
  }
  Status event_elapsed(uint32_t a, uint32_t b, float* ms) override {
    std::lock_guard lock(mu_);
    live_event(a);
    live_event(b);
    *ms = 0;
    return Status::kSuccess;
  }
  void event_notify(uint32_t event, std::function<void()> fn) override {
    std::lock_guard lock(mu_);
    live_event(event);
    fn();
  }
  Status set_peer_access(uint32_t device, uint32_t peer, bool enable) override {
    std::lock_guard lock(mu_);
    if (device >= device_count() || peer >= device_count() || device == peer) __builtin_trap();
    // Only what is off may be enabled, only what is on disabled.
    if (peer_[device][peer] == enable) __builtin_trap();
    peer_[device][peer] = enable;
    return Status::kSuccess;
  }
  Status malloc(uint32_t device, uint64_t size, uint64_t* addr) override {
    std::lock_guard lock(mu_);
    if (device >= device_count()) __builtin_trap();
    if (Status s = bump(size, addr); !ok(s)) return s;
    allocs_[*addr] = size;
    return Status::kSuccess;
  }
  Status free(uint64_t addr) override {
    std::lock_guard lock(mu_);
    for (auto& [module, var] : globals_)
      if (var == addr) __builtin_trap();  // a module's variable is the module's to free
    if (!allocs_.erase(addr)) __builtin_trap();  // the worker must only free what it allocated
    return Status::kSuccess;
  }
  Status module_load(uint32_t id, std::span<const std::byte> image) override {
    std::lock_guard lock(mu_);
    // The worker must hand over its own copy, never the region (the guest could change it mid-load).
    if (image.size() && reinterpret_cast<uintptr_t>(image.data()) >= lo_ &&
        reinterpret_cast<uintptr_t>(image.data()) < hi_)
      __builtin_trap();
    if (image.size() > kMaxModuleImage) __builtin_trap();  // however many pieces (ModuleChunk) it came in
    if (id == 0 || !modules_.insert(id).second) __builtin_trap();
    return Status::kSuccess;
  }
  Status module_unload(uint32_t id) override {
    std::lock_guard lock(mu_);
    if (!modules_.erase(id)) __builtin_trap();
    // Its variables go with it: a copy to one from now on must not reach here.
    for (auto [it, end] = globals_.equal_range(id); it != end; ++it) allocs_.erase(it->second);
    globals_.erase(id);
    return Status::kSuccess;
  }
  Status module_global(uint32_t module, uint32_t device, std::string_view name, uint64_t, uint64_t* addr,
                       uint64_t* size) override {
    std::lock_guard lock(mu_);
    if (!modules_.count(module) || device >= device_count()) __builtin_trap();
    if (name.empty()) return Status::kInvalidValue;
    // A variable in memory of its own, so that copies to it are checked like any.
    if (Status s = bump(name.size(), addr); !ok(s)) return s;
    allocs_[*addr] = *size = name.size();
    globals_.emplace(module, *addr);
    return Status::kSuccess;
  }
  Status kernel_lookup(uint32_t module, std::string_view name, uint32_t* k) override {
    std::lock_guard lock(mu_);
    if (module && !modules_.count(module)) __builtin_trap();
    *k = uint32_t(name.size());
    return Status::kSuccess;
  }
  // Interprocess exports: only the first address of an allocation, a live
  // event, a live handle. Opens need a token of another session's export,
  // which a guest (and so the fuzzer) cannot guess: they must all be refused
  // before reaching here.
  bool supports_ipc() const override { return true; }
  Status ipc_export_mem(uint64_t addr, IpcBlob* out, uint32_t* device) override {
    std::lock_guard lock(mu_);
    if (!allocs_.count(addr)) __builtin_trap();
    *out = IpcBlob{};
    *device = 0;
    return Status::kSuccess;
  }
  Status ipc_export_event(uint32_t event, IpcBlob* out) override {
    std::lock_guard lock(mu_);
    live_event(event);
    *out = IpcBlob{};
    return Status::kSuccess;
  }
  Status ipc_export_vmm(uint64_t handle, IpcBlob* out) override {
    std::lock_guard lock(mu_);
    if (!physical_.count(handle)) __builtin_trap();
    *out = IpcBlob{};
    return Status::kSuccess;
  }
  Status ipc_open_mem(const IpcBlob&, uint32_t, uint64_t, uint64_t*) override { __builtin_trap(); }
  Status ipc_close_mem(uint64_t) override { __builtin_trap(); }
  Status ipc_open_event(uint32_t, uint32_t, const IpcBlob&) override { __builtin_trap(); }
  Status ipc_import_vmm(const IpcBlob&, uint32_t, uint64_t, uint64_t*) override { __builtin_trap(); }
  // Virtual memory: the worker's VmmTable must pass on only what keeps the
  // backend's books consistent (ranges it reserved, handles it made, whole
  // mappings, nothing mapped twice).
  bool supports_vmm() const override { return true; }
  Status vmm_reserve(uint64_t size, uint64_t, uint64_t, uint64_t* addr) override {
    std::lock_guard lock(mu_);
    if (size == 0 || size % kVmmGranularity) __builtin_trap();
    if (size > (uint64_t{1} << 40)) return Status::kMemoryAllocation;
    // Small addresses, in granules: the fuzzer's 3-byte arguments name them.
    *addr = next_vmm_;
    next_vmm_ += size + kVmmGranularity;
    reserved_[*addr] = size;
    return Status::kSuccess;
  }
  Status vmm_address_free(uint64_t addr, uint64_t size) override {
    std::lock_guard lock(mu_);
    auto it = reserved_.find(addr);
    if (it == reserved_.end() || it->second != size) __builtin_trap();
    auto m = mapped_.lower_bound(addr);
    if (m != mapped_.end() && m->first < addr + size) __builtin_trap();  // still mapped
    reserved_.erase(it);
    return Status::kSuccess;
  }
  Status vmm_create(uint32_t device, uint64_t size, uint64_t* handle) override {
    std::lock_guard lock(mu_);
    if (device >= device_count() || size == 0 || size % kVmmGranularity) __builtin_trap();
    *handle = ++next_handle_ * 1000;  // not the worker's numbering: it must translate
    physical_[*handle] = size;
    return Status::kSuccess;
  }
  Status vmm_release(uint64_t handle) override {
    std::lock_guard lock(mu_);
    if (!physical_.erase(handle)) __builtin_trap();
    for (auto& [a, m] : mapped_)
      if (m.second == handle) __builtin_trap();  // released only once unmapped everywhere
    return Status::kSuccess;
  }
  Status vmm_map(uint64_t addr, uint64_t size, uint64_t handle, uint32_t device) override {
    std::lock_guard lock(mu_);
    auto p = physical_.find(handle);
    if (p == physical_.end() || size > p->second || device >= device_count()) __builtin_trap();
    auto r = reserved_.upper_bound(addr);
    if (r == reserved_.begin() || addr - std::prev(r)->first + size > std::prev(r)->second) __builtin_trap();
    auto m = mapped_.lower_bound(addr);
    if (m != mapped_.end() && m->first < addr + size) __builtin_trap();
    if (m != mapped_.begin() && std::prev(m)->first + std::prev(m)->second.first > addr) __builtin_trap();
    mapped_[addr] = {size, handle};
    return Status::kSuccess;
  }
  Status vmm_unmap(uint64_t addr, uint64_t size) override {
    std::lock_guard lock(mu_);
    whole_mappings(addr, size);
    for (auto it = mapped_.find(addr); it != mapped_.end() && it->first < addr + size;) {
      granted_.erase(it->first);
      it = mapped_.erase(it);
    }
    return Status::kSuccess;
  }
  Status vmm_set_access(uint64_t addr, uint64_t size, uint64_t devices, uint64_t) override {
    std::lock_guard lock(mu_);
    whole_mappings(addr, size);
    if (devices >> device_count()) __builtin_trap();
    for (auto it = mapped_.find(addr); it != mapped_.end() && it->first < addr + size; ++it) granted_.insert(it->first);
    return Status::kSuccess;
  }
  // After a session ends: the worker gave back every stream, event, module,
  // allocation and peer mapping it made for the session.
  void expect_nothing_held() {
    std::lock_guard lock(mu_);
    if (!allocs_.empty() || !streams_.empty() || !events_.empty() || !modules_.empty()) __builtin_trap();
    if (!reserved_.empty() || !physical_.empty() || !mapped_.empty()) __builtin_trap();
    next_vmm_ = kVmmGranularity;
    for (auto& row : peer_)
      for (bool on : row)
        if (on) __builtin_trap();
    next_ = kDeviceBase;  // each session's addresses the same, so that inputs may name them
  }

 private:
  void host(uintptr_t p, uint64_t n) {
    if (n && (p < lo_ || p > hi_ || n > hi_ - p)) __builtin_trap();
  }
  void device(uint64_t a, uint64_t n) {
    std::lock_guard lock(mu_);
    if (auto m = mapped_.upper_bound(a); m != mapped_.begin() && a - std::prev(m)->first < std::prev(m)->second.first) {
      // Mapped memory: accessible mappings without a gap to a + n.
      for (auto it = std::prev(m); ; ++it) {
        if (it == mapped_.end() || !granted_.count(it->first)) __builtin_trap();
        const uint64_t end = it->first + it->second.first;
        if (end - a >= n) return;
        if (std::next(it) != mapped_.end() && std::next(it)->first != end) __builtin_trap();
      }
    }
    auto it = allocs_.upper_bound(a);
    if (it == allocs_.begin()) __builtin_trap();
    --it;
    if (a - it->first > it->second || n > it->second - (a - it->first)) __builtin_trap();
  }
  void operand(MemOperand m, uint64_t n) { m.device ? device(m.addr, n) : host(m.addr, n); }
  // [addr, addr + size) is whole mappings without a gap.
  void whole_mappings(uint64_t addr, uint64_t size) {
    auto it = mapped_.find(addr);
    for (uint64_t at = addr; at < addr + size; ++it) {
      if (it == mapped_.end() || it->first != at) __builtin_trap();
      at += it->second.first;
    }
  }
  // Addresses from kDeviceBase up, a page apart: the fuzzer's address-like arguments land near them.
  static constexpr uint64_t kDeviceBase = 0x7000'0000'0000;
  Status bump(uint64_t size, uint64_t* addr) {
    if (size == 0 || size > (1ull << 40)) return Status::kInvalidValue;
    *addr = next_;
    next_ += (size + 0xfff) & ~uint64_t{0xfff};
    return Status::kSuccess;
  }
  void live_stream(uint32_t s) {
    if (s >= kMaxDevices && !streams_.count(s)) __builtin_trap();
  }
  void live_event(uint32_t e) {
    if (!events_.count(e)) __builtin_trap();
  }
  uintptr_t lo_, hi_;
  // Frees and module loads run on the worker's side thread, beside the
  // dispatch threads' mallocs and operand checks.
  std::recursive_mutex mu_;
  std::map<uint64_t, uint64_t> allocs_;
  std::multimap<uint32_t, uint64_t> globals_;  // module -> its variables' addresses
  std::set<uint32_t> streams_, events_, modules_;
  std::atomic<uint64_t> handles_{0};
  bool peer_[kMaxDevices][kMaxDevices] = {};
  uint64_t next_ = kDeviceBase;
  std::map<uint64_t, uint64_t> reserved_, physical_;            // address -> size, handle -> size
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> mapped_;   // address -> (size, handle)
  std::set<uint64_t> granted_;                                  // mappings some device may touch
  uint64_t next_vmm_ = kVmmGranularity, next_handle_ = 0;
};

struct Input {
  const uint8_t* p;
  size_t n;
  uint64_t take(size_t bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < bytes && n; ++i, ++p, --n) v |= uint64_t(*p) << (8 * i);
    return v;
  }
  void fill(void* dst, size_t bytes) {
    std::memset(dst, 0, bytes);
    const size_t k = bytes < n ? bytes : n;
    std::memcpy(dst, p, k);
    p += k;
    n -= k;
  }
};

Region& region() {
  static std::unique_ptr<Region> r = [] {
    Layout l;
    plan_default_layout(1u << 20, &l);
    std::string err;
    const std::string path = "/dev/shm/ordo-fuzz-" + std::to_string(getpid());
    auto reg = Region::create(path, l, &err);
    if (!reg) {
      std::fprintf(stderr, "fuzz: %s\n", err.c_str());
      std::abort();
    }
    unlink(path.c_str());  // the mapping stays
    return reg;
  }();
  return *r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Region& r = region();
  const Layout& l = r.layout();
  static CheckingBackend backend(r);
  static const std::unique_ptr<IpcTable> ipc = IpcTable::create(nullptr);
  static Worker w(r, backend, [] {
    WorkerOptions o;
    o.quiet = true;
    o.ipc = ipc.get();
    return o;
  }());
  static uint64_t session = 0;
  RegionHeader* h = r.header();
  h->guest_session.store(++session);
  w.sweep();  // attaches: the region's rings start empty
  Input in{data, size};
  std::vector<uint64_t> tails(l.ring_count);  // each ring's next position, as a guest would keep it
  while (in.n) {
    const uint32_t ring = uint32_t(in.take(1)) % l.ring_count;
    switch (in.take(1) % 9) {
      case 0: {  // a raw entry at the ring's next position, published with its lap
        const uint64_t t = tails[ring]++;
        Entry* e = &r.entries(ring)[t & (l.ring_capacity - 1)];
        in.fill(e, sizeof(Entry));
        e->lap = entry_lap(t, l.ring_capacity);
        h->ring_open[ring / 64].fetch_or(1ull << (ring % 64));
        break;
      }
      case 1:  // overwrite an entry anywhere, published or not
        in.fill(&r.entries(ring)[in.take(2) & (l.ring_capacity - 1)], sizeof(Entry));
        break;
      case 2: {  // a slot near the ring's next position shows that position's lap
        const uint64_t p = tails[ring] + in.take(1) % 4;
        r.entries(ring)[p & (l.ring_capacity - 1)].lap = entry_lap(p, l.ring_capacity);
        break;
      }
      case 3:
        h->ring_open[in.take(1) % (kMaxRings / 64)].store(in.take(8));
        break;
      case 4: {  // a slot request
        const uint32_t slot = uint32_t(in.take(1)) % l.slot_count;
        ReplySlot& s = r.slot(slot);
        const uint64_t seq = s.request.seq.load();
        in.fill(&s.request, sizeof s.request);
        in.fill(s.edges, sizeof s.edges);
        in.fill(s.payload, size_t(in.take(1)));
        s.request.seq.store(seq + 1 + in.take(1) % 2 * in.take(8));
        // Any bits at all, or the slot's own.
        if (in.take(1) % 2) h->slot_posted[in.take(1) % (kMaxSlots / 64)].store(in.take(8));
        else post_slot(h, slot);
        break;
      }
      case 5: {  // a well-formed entry with fuzzed arguments, to get past the first checks: any op, on a ring
        const uint64_t t = tails[ring]++;
        Entry e{};
        e.op = uint16_t(in.take(1) % kOpCount);
        e.edge_count = uint8_t(in.take(1) % 3);
        for (unsigned i = 0; i < e.edge_count; ++i) e.edges[i] = {uint32_t(in.take(1) % l.ring_count), 0, in.take(1)};
        // Memcpy's MemKinds in the low bits; a launch's cluster and cooperative bits and one past them.
        const uint64_t f = in.take(1);
        e.flags = uint16_t((f & 0xf) | (f >> 4 & 3) << 4 | (f >> 6 & 1) << 12 | (f >> 7) << 13);
        e.thread = uint32_t(in.take(1) % l.slot_count);
        e.stream = uint32_t(in.take(1) % 2 ? in.take(1) % 8 : in.take(2));
        for (auto& a : e.arg) a = in.take(1) % 2 ? 0x7000'0000'0000ull + in.take(2) : in.take(3);
        publish_entry(&r.entries(ring)[t & (l.ring_capacity - 1)], e, t, l.ring_capacity);
        h->ring_open[ring / 64].fetch_or(1ull << (ring % 64));
        break;
      }
      case 6: {  // a well-formed sync request: any op, in a slot, with a name in its payload
        const uint32_t slot = uint32_t(in.take(1)) % l.slot_count;
        ReplySlot& s = r.slot(slot);
        Entry e{};
        e.op = uint16_t(in.take(1) % kOpCount);
        e.edge_count = uint8_t(in.take(1) % 2);
        if (e.edge_count) e.edges[0] = {uint32_t(in.take(1) % l.ring_count), 0, in.take(1)};
        for (auto& a : e.arg) a = in.take(1) % 2 ? 0x7000'0000'0000ull + in.take(2) : in.take(3);
        in.fill(s.payload, size_t(in.take(1) % 16));
        if (e.op == uint16_t(Op::TensorMapEncode))  // a whole request, mostly as the guest writes it
          in.fill(s.payload, size_t(in.take(2) % (sizeof(TensorMapRequest) + 1)));
        if (e.op == uint16_t(Op::GraphCreate)) {  // steps in the pinned heap, as the guest writes them
          e.arg[0] = in.take(2) * 8 % l.heap_size;
          e.arg[1] = in.take(2) % 1024;
          in.fill(r.heap() + e.arg[0], std::min(e.arg[1], l.heap_size - e.arg[0]));
        }
        write_request(s, e, s.request.seq.load() + 1);
        post_slot(h, slot);
        break;
      }
      case 7:  // the 100 ms pass: every slot read, watched slots aged
        w.sweep();
        break;
      default:
        for (uint64_t k = in.take(1) % 8 + 1; k; --k) w.poll_once();
    }
  }
  for (int k = 0; k < 4; ++k) w.poll_once();
  h->guest_session.store(0);  // the guest goes: the session's resources must all come back
  w.sweep();
  backend.expect_nothing_held();
  return 0;
}

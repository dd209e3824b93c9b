// libFuzzer target: the worker consuming a region that a hostile guest writes.
// The input is a little program of guest actions (raw entries, tails, slot
// requests, ring bitmaps) interleaved with worker passes, so indices and entries
// change between and during the worker's reads. The backend is a checker: it
// traps if the worker ever hands it a host pointer outside the region or a
// device range it did not allocate, and it keeps no device state, so the
// fuzzer explores the worker's decoding rather than a simulator.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
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
  Status launch(uint32_t, const LaunchParams& p, const OpTag&) override {
    host(reinterpret_cast<uintptr_t>(p.args), p.args_size);
    return Status::kSuccess;
  }
  Status memcpy(uint32_t, MemOperand dst, MemOperand src, uint64_t size, const OpTag&) override {
    operand(dst, size);
    operand(src, size);
    return Status::kSuccess;
  }
  Status memset(uint32_t, uint64_t dst, uint8_t, uint64_t size, const OpTag&) override {
    device(dst, size);
    return Status::kSuccess;
  }
  // The worker must pass only devices the backend has.
  Status stream_create(uint32_t stream, uint32_t device, bool, int) override {
    if (device >= device_count() || stream < kMaxDevices) __builtin_trap();
    return Status::kSuccess;
  }
  Status event_create(uint32_t, uint32_t device, uint32_t) override {
    if (device >= device_count()) __builtin_trap();
    return Status::kSuccess;
  }
  Status set_peer_access(uint32_t device, uint32_t peer, bool) override {
    if (device >= device_count() || peer >= device_count() || device == peer) __builtin_trap();
    return Status::kSuccess;
  }
  Status malloc(uint32_t device, uint64_t size, uint64_t* addr) override {
    if (device >= device_count()) __builtin_trap();
    const Status s = NullBackend::malloc(device, size, addr);
    if (ok(s)) allocs_[*addr] = size;
    return s;
  }
  Status free(uint64_t addr) override {
    if (!allocs_.erase(addr)) __builtin_trap();  // the worker must only free what it allocated
    return Status::kSuccess;
  }
  Status module_load(uint32_t, std::span<const std::byte> image) override {
    // The worker must hand over its own copy, never the region (the guest could change it mid-load).
    if (image.size() && reinterpret_cast<uintptr_t>(image.data()) >= lo_ &&
        reinterpret_cast<uintptr_t>(image.data()) < hi_)
      __builtin_trap();
    return Status::kSuccess;
  }
  Status kernel_lookup(uint32_t, std::string_view name, uint32_t* k) override {
    *k = uint32_t(name.size());
    return Status::kSuccess;
  }

 private:
  void host(uintptr_t p, uint64_t n) {
    if (n && (p < lo_ || p > hi_ || n > hi_ - p)) __builtin_trap();
  }
  void device(uint64_t a, uint64_t n) {
    auto it = allocs_.upper_bound(a);
    if (it == allocs_.begin()) __builtin_trap();
    --it;
    if (a - it->first > it->second || n > it->second - (a - it->first)) __builtin_trap();
  }
  void operand(MemOperand m, uint64_t n) { m.device ? device(m.addr, n) : host(m.addr, n); }
  uintptr_t lo_, hi_;
  std::map<uint64_t, uint64_t> allocs_;
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
  CheckingBackend backend(r);
  WorkerOptions o;
  o.quiet = true;
  Worker w(r, backend, o);
  RegionHeader* h = r.header();
  h->guest_session.store(h->guest_session.load() + 1);
  w.poll_once();  // attaches: the region's rings start empty
  Input in{data, size};
  std::vector<uint64_t> tails(l.ring_count);  // each ring's next position, as a guest would keep it
  while (in.n) {
    const uint32_t ring = uint32_t(in.take(1)) % l.ring_count;
    switch (in.take(1) % 8) {
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
      case 5: {  // a well-formed entry with fuzzed arguments, to get past the first checks
        const uint64_t t = tails[ring]++;
        Entry e{};
        e.op = uint16_t(in.take(1) % 10);
        e.edge_count = uint8_t(in.take(1) % 3);
        for (unsigned i = 0; i < e.edge_count; ++i) e.edges[i] = {uint32_t(in.take(1) % l.ring_count), 0, in.take(1)};
        e.flags = uint16_t(in.take(1) & 0xf);
        e.thread = uint32_t(in.take(1) % l.slot_count);
        for (auto& a : e.arg) a = in.take(1) % 2 ? 0x100000000000ull + in.take(2) : in.take(3);
        publish_entry(&r.entries(ring)[t & (l.ring_capacity - 1)], e, t, l.ring_capacity);
        h->ring_open[ring / 64].fetch_or(1ull << (ring % 64));
        break;
      }
      case 6: {  // a well-formed sync request
        const uint32_t slot = uint32_t(in.take(1)) % l.slot_count;
        ReplySlot& s = r.slot(slot);
        Entry e{};
        e.op = uint16_t(9 + in.take(1) % 9);
        e.arg[0] = in.take(1) % 2 ? 0x100000000000ull + in.take(2) : in.take(4);
        e.arg[1] = in.take(4);
        write_request(s, e, s.request.seq.load() + 1);
        post_slot(h, slot);
        break;
      }
      default:
        for (uint64_t k = in.take(1) % 8 + 1; k; --k) w.poll_once();
    }
  }
  for (int k = 0; k < 4; ++k) w.poll_once();
  return 0;
}

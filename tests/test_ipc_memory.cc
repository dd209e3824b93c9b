// Interprocess memory (cudaIpcGetMemHandle, OpenMemHandle, CloseMemHandle):
// two guest sessions of one region, each a worker of its own sharing one
// table (WorkerOptions::ipc, ::partition), on the sim, whose exports are
// memfds the other worker opens through /proc/PID/fd; the rules the worker
// keeps before a backend is asked; and the supervisor's worker processes. The
// CUDA programs' view of the same: tests/cuda/ipc.cu.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "guest/core.h"
#include "harness.h"
#include "ipc_support.h"
#include "ordo/sim.h"
#include "transport/op_args.h"
#include "worker/backends/null/null_backend.h"
#include "worker/backends/sim/sim_backend.h"
#include "worker/ipc_table.h"

namespace ordo::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(IpcMemory, WithoutATableEveryCallIsNotSupported) {
  InProcessWorker w;  // no WorkerOptions::ipc
  auto c = w.attach();
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 4096), Status::kSuccess);
  Client::IpcToken t;
  EXPECT_EQ(c->ipc_export_mem(d, &t), Status::kNotSupported);
  uint64_t addr = 0, size = 0;
  uint32_t dev = 0;
  EXPECT_EQ(c->ipc_open_mem({1ull << 33 | 5, 42}, &addr, &size, &dev), Status::kNotSupported);
  Event e;
  ASSERT_EQ(c->event_create(&e, kIpcEventFlags), Status::kSuccess);
  EXPECT_EQ(c->ipc_export_event(e, &t), Status::kNotSupported);
  EXPECT_EQ(c->ipc_open_event({1ull << 33 | 5, 42}, &e), Status::kNotSupported);
  EXPECT_EQ(c->null_call(), Status::kSuccess);
}

TEST(IpcMemory, TheOtherSessionReadsAndWritesTheExportersBytes) {
  Pair p;
  constexpr size_t kN = 16384;  // 64 KiB
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, kN * 4), Status::kSuccess);
  const auto in = pattern(kN, 7);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), kN * 4), Status::kSuccess);
  Client::IpcToken t, inner;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  // The whole allocation, whichever address of it was named: the same token.
  ASSERT_EQ(p.a().ipc_export_mem(x + 4 * 1000 + 3, &inner), Status::kSuccess);
  EXPECT_EQ(inner.word, t.word);
  EXPECT_EQ(inner.secret, t.secret);
  // The exporter's own memory goes on as before.
  EXPECT_EQ(read_back(p.a(), x, kN), in);

  uint64_t y = 0, size = 0;
  uint32_t dev = 99;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(size, kN * 4);
  EXPECT_EQ(dev, 0u);
  EXPECT_EQ(read_back(p.b(), y, kN), in) << "B reads A's bytes";

  // B writes (a copy and a kernel): A sees it.
  const auto mine = pattern(1024, 1u << 20);
  ASSERT_EQ(p.b().memcpy_h2d(y + 8192, mine.data(), mine.size() * 4), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x + 8192, mine.size()), mine);
  Stream s;
  ASSERT_EQ(p.b().stream_create(&s), Status::kSuccess);
  const sim::FillU32Args fill{y + 4 * 100, 50, 0xabcdu, 0};
  ASSERT_EQ(p.b().launch(kernel(p.b(), "ordo_fill_u32"), {1}, {1}, &fill, sizeof fill, s), Status::kSuccess);
  ASSERT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x + 4 * 100, 50), std::vector<uint32_t>(50, 0xabcdu));
  EXPECT_EQ(read_back(p.a(), x + 4 * 150, 1), std::vector<uint32_t>{in[150]}) << "the fill's end";
  // A device-to-device copy inside B's session, from its own memory into A's.
  uint64_t own = 0;
  ASSERT_EQ(p.b().malloc(&own, 64), Status::kSuccess);
  ASSERT_EQ(p.b().memset_async(own, 0x5a, 64, s), Status::kSuccess);
  ASSERT_EQ(p.b().memcpy_d2d_async(y, own, 64, s), Status::kSuccess);
  ASSERT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x, 16), std::vector<uint32_t>(16, 0x5a5a5a5au));
  // A range past the allocation is no more B's than A's.
  uint32_t v = 0;
  EXPECT_EQ(p.b().memcpy_d2h(&v, y + kN * 4 - 2, 4), Status::kInvalidDevicePointer);
  EXPECT_EQ(p.b().get_last_error(), Status::kInvalidDevicePointer);
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
  EXPECT_EQ(p.b().stream_destroy(s), Status::kSuccess);
}

TEST(IpcMemory, OpensAreCountedUntilAsManyClosesThenTheAddressIsRefused) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 3);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y1 = 0, y2 = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y1, &size, &dev), Status::kSuccess);
  ASSERT_EQ(p.b().ipc_open_mem(t, &y2, &size, &dev), Status::kSuccess);
  EXPECT_EQ(y1, y2) << "opened twice: the same address";
  EXPECT_EQ(size, 4096u);
  EXPECT_EQ(p.b().ipc_close_mem(y1), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y1, 1024), in) << "one close of two: still open";
  EXPECT_EQ(p.b().ipc_close_mem(y1), Status::kSuccess);
  expect_refused(p.b(), y1, "after the last close");
  expect_refused(p.b(), y1 + 2048, "inside it, after the last close");
  EXPECT_EQ(p.b().ipc_close_mem(y1), Status::kInvalidValue) << "a third close";
  EXPECT_EQ(p.b().get_last_error(), Status::kInvalidValue);
  // Opened again: A's bytes (which A changed meanwhile), once more counted from one.
  const auto later = pattern(1024, 1000);
  ASSERT_EQ(p.a().memcpy_h2d(x, later.data(), 4096), Status::kSuccess);
  uint64_t y3 = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y3, &size, &dev), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y3, 1024), later);
  EXPECT_EQ(p.b().ipc_close_mem(y3), Status::kSuccess);
  expect_refused(p.b(), y3, "reopened and closed once");
  // A's own memory is untouched by all of B's closes.
  EXPECT_EQ(read_back(p.a(), x, 1024), later);
  EXPECT_EQ(p.a().free(x), Status::kSuccess);
}

TEST(IpcMemory, TheExporterCannotOpenItsOwnExports) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(p.a().ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(p.a().ipc_export_event(e, &te), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  EXPECT_EQ(p.a().ipc_open_mem(tm, &y, &size, &dev), Status::kInvalidContext);
  Event opened;
  EXPECT_EQ(p.a().ipc_open_event(te, &opened), Status::kInvalidContext);
  // The other session can.
  EXPECT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(p.b().ipc_open_event(te, &opened), Status::kSuccess);
  // And B's opens are not A's to close.
  EXPECT_EQ(p.a().ipc_close_mem(y), Status::kInvalidValue);
  EXPECT_EQ(p.a().ipc_close_mem(x), Status::kInvalidValue) << "an allocation is not an opened export";
  EXPECT_EQ(p.b().free(y), Status::kInvalidDevicePointer) << "an opened export is not B's allocation";
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
}

TEST(IpcMemory, AFreedAllocationCannotBeOpenedButWhatWasOpenedStays) {
  Pair p(WorkerOptions{}, ClientOptions{}, 1, 3);  // C: a third session, which never opened it
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 8192), Status::kSuccess);
  const auto in = pattern(2048, 11);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 8192), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  IpcExport in_table;
  ASSERT_EQ(p.table->find(IpcToken{t.word, t.secret}, &in_table), Status::kSuccess);
  EXPECT_EQ(in_table.partition, 0u);
  EXPECT_EQ(in_table.size, 8192u);
  ASSERT_EQ(p.a().free(x), Status::kSuccess);
  EXPECT_EQ(p.table->find(IpcToken{t.word, t.secret}, &in_table), Status::kInvalidResourceHandle)
      << "the free took the export out of the region's table";
  uint64_t z = 0;
  EXPECT_EQ(p.clients[2]->ipc_open_mem(t, &z, &size, &dev), Status::kInvalidResourceHandle) << "freed: not opened again";
  EXPECT_EQ(read_back(p.b(), y, 2048), in) << "a mapping opened before stays";
  const auto mine = pattern(2048, 99);
  EXPECT_EQ(p.b().memcpy_h2d(y, mine.data(), 8192), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y, 2048), mine);
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
  EXPECT_EQ(p.b().ipc_open_mem(t, &z, &size, &dev), Status::kInvalidResourceHandle) << "closed, then freed: gone";
  // A's next allocation and export are new.
  uint64_t x2 = 0;
  ASSERT_EQ(p.a().malloc(&x2, 8192), Status::kSuccess);
  Client::IpcToken t2;
  ASSERT_EQ(p.a().ipc_export_mem(x2, &t2), Status::kSuccess);
  EXPECT_FALSE(t2.word == t.word && t2.secret == t.secret);
  ASSERT_EQ(p.b().ipc_open_mem(t2, &z, &size, &dev), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), z, 4), std::vector<uint32_t>(4, 0)) << "the sim's fresh memory";
  EXPECT_EQ(p.b().ipc_open_mem(t, &z, &size, &dev), Status::kInvalidResourceHandle);
}

TEST(IpcMemory, AnEndedSessionsExportsAndOpensAreGone) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 5);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(p.a().ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(p.a().ipc_export_event(e, &te), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  // A's process goes; its worker's next session (attach waits for the reset) exports nothing.
  IpcExport in_table;
  ASSERT_EQ(p.table->find(IpcToken{tm.word, tm.secret}, &in_table), Status::kSuccess);
  ASSERT_EQ(p.table->find(IpcToken{te.word, te.secret}, &in_table), Status::kSuccess);
  p.clients[0].reset();
  p.clients[0] = p.workers[0]->attach();
  EXPECT_EQ(p.table->find(IpcToken{tm.word, tm.secret}, &in_table), Status::kInvalidResourceHandle)
      << "the session's end took its memory export out of the region's table";
  EXPECT_EQ(p.table->find(IpcToken{te.word, te.secret}, &in_table), Status::kInvalidResourceHandle)
      << "and its event export";
  Event opened;
  EXPECT_EQ(p.b().ipc_open_event(te, &opened), Status::kInvalidResourceHandle);
  EXPECT_EQ(read_back(p.b(), y, 1024), in) << "what B opened stays";
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
  EXPECT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kInvalidResourceHandle);
  // Nor does A's new session reach them.
  EXPECT_EQ(p.a().ipc_close_mem(y), Status::kInvalidValue);
  uint32_t v = 0;
  EXPECT_EQ(p.a().memcpy_d2h(&v, x, 4), Status::kInvalidDevicePointer);
}

// B's session ends with an export open: its next session neither reaches the
// address nor inherits the count (one open, one close, refused).
TEST(IpcMemory, AnEndedSessionsOpensAreClosed) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 21);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  p.clients[1].reset();
  p.clients[1] = p.workers[1]->attach();
  uint32_t v = 0;
  EXPECT_EQ(p.b().memcpy_d2h(&v, y, 4), Status::kInvalidDevicePointer) << "the last session's open";
  EXPECT_EQ(p.b().get_last_error(), Status::kInvalidDevicePointer);
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kInvalidValue);
  uint64_t y2 = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y2, &size, &dev), Status::kSuccess) << "A's export lives on";
  EXPECT_EQ(read_back(p.b(), y2, 1024), in);
  EXPECT_EQ(p.b().ipc_close_mem(y2), Status::kSuccess);
  expect_refused(p.b(), y2, "one open, one close");
  EXPECT_EQ(read_back(p.a(), x, 1024), in) << "A's memory was never B's to free";
}

// A guest that writes its own requests: forged tokens, the wrong kind, addresses
// and devices it does not have. Each gets CUDA's error and the session goes on.
TEST(IpcMemory, ForgedRequestsGetErrorsAndTheSessionGoesOn) {
  Pair p;
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  const auto in = pattern(1024, 8);
  ASSERT_EQ(p.a().memcpy_h2d(x, in.data(), 4096), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(p.a().ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(p.a().event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(p.a().ipc_export_event(e, &te), Status::kSuccess);
  auto& bt = guest::core_of(p.b()).threads;
  auto& at = guest::core_of(p.a()).threads;
  auto open_mem = [&](uint64_t word, uint64_t secret, uint64_t device = 0) {
    uint64_t r0 = 0, r1 = 0;
    return bt.call(make_entry<Op::IpcOpenMem>({.token = word, .secret = secret, .device = device}), &r0, &r1);
  };
  auto open_event = [&](uint64_t word, uint64_t secret) {
    uint64_t r0 = 0, r1 = 0;
    return bt.call(make_entry<Op::IpcOpenEvent>({.token = word, .secret = secret}), &r0, &r1);
  };
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20; ++i) {
    const uint64_t secret = rng() | 1;
    if (secret == tm.secret || secret == te.secret) continue;
    EXPECT_EQ(open_mem(tm.word, secret), Status::kInvalidResourceHandle) << "a random secret";
    EXPECT_EQ(open_event(te.word, secret), Status::kInvalidResourceHandle) << "a random secret";
    EXPECT_EQ(open_mem(rng(), rng()), Status::kInvalidResourceHandle) << "a random token";
  }
  EXPECT_EQ(open_mem(te.word, te.secret), Status::kInvalidResourceHandle) << "an event's token as memory";
  EXPECT_EQ(open_event(tm.word, tm.secret), Status::kInvalidResourceHandle) << "memory's token as an event";
  EXPECT_EQ(open_mem(tm.word + (uint64_t{2} << 32), tm.secret), Status::kInvalidResourceHandle) << "a later generation";
  EXPECT_EQ(open_mem(tm.word + (uint64_t{1} << 32), tm.secret), Status::kInvalidResourceHandle) << "an odd generation";
  EXPECT_EQ(open_mem((tm.word >> 32 << 32) | IpcTable::kCells, tm.secret), Status::kInvalidResourceHandle)
      << "a cell past the table";
  EXPECT_EQ(open_mem(tm.word, tm.secret, 1), Status::kInvalidDevice) << "device 1 of 1";
  EXPECT_EQ(open_mem(tm.word, tm.secret, kMaxDevices), Status::kInvalidDevice);
  EXPECT_EQ(open_mem(tm.word, tm.secret, UINT64_MAX), Status::kInvalidDevice);
  uint64_t r0 = 0, r1 = 0;
  EXPECT_EQ(bt.call(make_entry<Op::IpcCloseMem>({.addr = x}), &r0, &r1), Status::kInvalidValue)
      << "A's address, never opened in B";
  EXPECT_EQ(bt.call(make_entry<Op::IpcCloseMem>({.addr = 0}), &r0, &r1), Status::kInvalidValue);
  EXPECT_EQ(bt.call(make_entry<Op::IpcCloseMem>({.addr = UINT64_MAX}), &r0, &r1), Status::kInvalidValue);
  // Exports of what the session does not hold.
  for (uint64_t addr : {uint64_t{0}, x + 4096, x - 1, UINT64_MAX}) {
    EXPECT_EQ(at.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kMemory), .handle = addr}), &r0, &r1),
              Status::kInvalidValue)
        << "an export of " << addr << ", in no allocation";
  }
  EXPECT_EQ(bt.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kMemory), .handle = x}), &r0, &r1),
            Status::kInvalidValue)
      << "A's allocation exported by B";
  EXPECT_NE(bt.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kEvent), .handle = e.handle}), &r0, &r1),
            Status::kSuccess)
      << "A's event exported by B";
  EXPECT_EQ(at.call(make_entry<Op::IpcExport>({.kind = uint64_t(IpcKind::kEvent), .handle = e.handle + 12345}), &r0,
                    &r1),
            Status::kInvalidResourceHandle)
      << "an event never made";
  for (uint64_t kind : {uint64_t{7}, uint64_t{1} << 32, UINT64_MAX})
    EXPECT_EQ(at.call(make_entry<Op::IpcExport>({.kind = kind, .handle = x}), &r0, &r1), Status::kInvalidValue)
        << "kind " << kind;
  // Both sessions serve on: the real tokens open, the bytes are A's.
  EXPECT_EQ(p.b().null_call(), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(read_back(p.b(), y, 1024), in);
  Event opened;
  EXPECT_EQ(p.b().ipc_open_event(te, &opened), Status::kSuccess);
  Client::IpcToken again;
  ASSERT_EQ(p.a().ipc_export_mem(x, &again), Status::kSuccess);
  EXPECT_EQ(again.word, tm.word);
  EXPECT_EQ(p.a().sticky_error(), Status::kSuccess);
  EXPECT_EQ(p.b().sticky_error(), Status::kSuccess);
}

// Memory of device 0 opened on device 1: the import is device 0's, and a
// kernel of device 1 reaches it (the lazy peer access CUDA's flag enables).
TEST(IpcMemory, AnotherDevicesMemoryIsReachedThroughPeerAccess) {
  Pair p(WorkerOptions{}, ClientOptions{}, 2);
  ASSERT_EQ(p.b().device_count(), 2u);
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);  // device 0
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  ASSERT_EQ(p.b().set_device(1), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 9;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(dev, 0u) << "the exporter's device";
  Stream s;
  ASSERT_EQ(p.b().stream_create(&s), Status::kSuccess);  // on device 1
  const sim::FillU32Args fill{y, 1024, 0x77u, 0};
  ASSERT_EQ(p.b().launch(kernel(p.b(), "ordo_fill_u32"), {1}, {1}, &fill, sizeof fill, s), Status::kSuccess);
  ASSERT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(p.b().sticky_error(), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x, 1024), std::vector<uint32_t>(1024, 0x77u));
  EXPECT_EQ(p.b().ipc_close_mem(y), Status::kSuccess);
}

// A backend that would export, open and create anything: what it is asked
// shows the rules the worker keeps itself (the cuda backend's driver calls
// come after them), and the words the table gives it.
class PermissiveIpc final : public NullBackend {
 public:
  bool supports_ipc() const override { return true; }
  Status event_create(uint32_t, uint32_t, uint32_t flags) override {
    std::lock_guard lock(mu);
    created_flags.push_back(flags);
    return Status::kSuccess;
  }
  Status ipc_export_mem(uint64_t addr, IpcBlob* out, uint32_t* device) override {
    std::lock_guard lock(mu);
    exported_addrs.push_back(addr);
    *out = IpcBlob{};
    out->words[0] = addr;
    *device = 0;
    return Status::kSuccess;
  }
  Status ipc_export_event(uint32_t, IpcBlob* out) override {
    std::lock_guard lock(mu);
    ++exported_events;
    *out = IpcBlob{};
    return Status::kSuccess;
  }
  Status ipc_open_mem(const IpcBlob& blob, uint32_t device, uint64_t size, uint64_t* addr) override {
    std::lock_guard lock(mu);
    opened.push_back({blob.words[0], device, size});
    *addr = 0x9000'0000'0000ull + 0x100000 * opened.size();
    return Status::kSuccess;
  }
  Status ipc_close_mem(uint64_t addr) override {
    std::lock_guard lock(mu);
    closed.push_back(addr);
    return Status::kSuccess;
  }
  Status ipc_open_event(uint32_t, uint32_t device, const IpcBlob&) override {
    std::lock_guard lock(mu);
    opened_event_devices.push_back(device);
    return Status::kSuccess;
  }
  struct Open {
    uint64_t blob0;
    uint32_t device;
    uint64_t size;
  };
  std::mutex mu;
  std::vector<uint32_t> created_flags;
  std::vector<uint64_t> exported_addrs;
  int exported_events = 0;
  std::vector<Open> opened;
  std::vector<uint64_t> closed;
  std::vector<uint32_t> opened_event_devices;
};

TEST(IpcWorker, TheWorkerKeepsCudasRulesBeforeTheBackendIsAsked) {
  auto table = new_table();
  ASSERT_TRUE(table);
  auto backend = std::make_unique<PermissiveIpc>();
  PermissiveIpc& be = *backend;
  InProcessWorker w(WorkerOptions{.ipc = table.get(), .partition = 1}, 16u << 20, std::move(backend));
  auto c = w.attach();
  // An interprocess event keeps no time; only such an event is exported.
  Event e;
  EXPECT_EQ(c->event_create(&e, uint32_t(kEventInterprocess)), Status::kInvalidValue);
  {
    std::lock_guard lock(be.mu);
    EXPECT_TRUE(be.created_flags.empty()) << "refused before the backend made it";
  }
  Event plain, ipc;
  ASSERT_EQ(c->event_create(&plain, uint32_t(kEventDisableTiming)), Status::kSuccess);
  Client::IpcToken t;
  EXPECT_EQ(c->ipc_export_event(plain, &t), Status::kInvalidResourceHandle);
  ASSERT_EQ(c->event_create(&ipc, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(c->ipc_export_event(ipc, &t), Status::kSuccess);
  ASSERT_EQ(c->ipc_export_event(ipc, &t), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.exported_events, 1) << "the plain event never reached the backend; the second export is the first's";
  }
  // Memory: the allocation's first address, whichever of its addresses was named.
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, 8192), Status::kSuccess);
  ASSERT_EQ(c->ipc_export_mem(d + 4000, &t), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.exported_addrs, std::vector<uint64_t>{d});
  }
  IpcExport x;
  ASSERT_EQ(table->find(IpcToken{t.word, t.secret}, &x), Status::kSuccess);
  EXPECT_EQ(x.partition, 1u);
  EXPECT_EQ(x.size, 8192u);
  EXPECT_EQ(x.kind, IpcKind::kMemory);
  EXPECT_EQ(x.blob.words[0], d) << "what the backend wrote";

  // Exports of another part (the test publishes them as partition 0): the
  // backend gets the table's words, never the guest's; an export of a device
  // this session lacks is refused before the backend.
  IpcExport other = stamped(0, 0);
  other.size = 65536;
  other.device = 0;
  other.blob = IpcBlob{};
  other.blob.words[0] = 0xfeed;
  IpcToken ot;
  ASSERT_EQ(table->publish(other, &ot), Status::kSuccess);
  uint64_t addr = 0, size = 0;
  uint32_t dev = 7;
  ASSERT_EQ(c->ipc_open_mem({ot.word, ot.secret}, &addr, &size, &dev), Status::kSuccess);
  EXPECT_EQ(size, 65536u);
  EXPECT_EQ(dev, 0u);
  {
    std::lock_guard lock(be.mu);
    ASSERT_EQ(be.opened.size(), 1u);
    EXPECT_EQ(be.opened[0].blob0, 0xfeedu);
    EXPECT_EQ(be.opened[0].size, 65536u);
  }
  uint32_t v = 5;
  EXPECT_EQ(c->memcpy_h2d(addr + 65532, &v, 4), Status::kSuccess) << "the import's last word";
  EXPECT_EQ(c->memcpy_h2d(addr + 65534, &v, 4), Status::kInvalidDevicePointer) << "past it";
  EXPECT_EQ(c->get_last_error(), Status::kInvalidDevicePointer);
  other.device = 3;  // this session has one device
  IpcToken far;
  ASSERT_EQ(table->publish(other, &far), Status::kSuccess);
  uint64_t refused = 0;
  EXPECT_EQ(c->ipc_open_mem({far.word, far.secret}, &refused, &size, &dev), Status::kInvalidDevice);
  other.kind = IpcKind::kEvent;
  IpcToken far_event;
  ASSERT_EQ(table->publish(other, &far_event), Status::kSuccess);
  Event opened;
  EXPECT_EQ(c->ipc_open_event({far_event.word, far_event.secret}, &opened), Status::kInvalidDevice);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.opened.size(), 1u) << "the far device's memory never reached the backend";
    EXPECT_TRUE(be.opened_event_devices.empty());
  }
  // Closes reach the backend once the count is down, at the address it gave.
  uint64_t again = 0;
  ASSERT_EQ(c->ipc_open_mem({ot.word, ot.secret}, &again, &size, &dev), Status::kSuccess);
  EXPECT_EQ(again, addr);
  ASSERT_EQ(c->ipc_close_mem(addr), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_TRUE(be.closed.empty());
  }
  ASSERT_EQ(c->ipc_close_mem(addr), Status::kSuccess);
  {
    std::lock_guard lock(be.mu);
    EXPECT_EQ(be.closed, std::vector<uint64_t>{addr});
  }
  // The session's end takes its exports out of the table, and leaves the other part's.
  c.reset();
  c = w.attach();
  EXPECT_EQ(table->find(IpcToken{t.word, t.secret}, &x), Status::kInvalidResourceHandle);
  EXPECT_EQ(table->find(ot, &x), Status::kSuccess);
}

// Memory of device 0 opened from device 0, then again from device 1: the
// second open returned the first's address (counted once more) without the
// lazy peer access a first open from device 1 enables, so a kernel of device 1
// faulted on it.
TEST(IpcMemory, ASecondOpenFromAnotherDeviceReachesTheMemoryToo) {
  Pair p(WorkerOptions{}, ClientOptions{}, 2);
  uint64_t x = 0;
  ASSERT_EQ(p.a().malloc(&x, 4096), Status::kSuccess);
  Client::IpcToken t;
  ASSERT_EQ(p.a().ipc_export_mem(x, &t), Status::kSuccess);
  uint64_t y0 = 0, y1 = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(p.b().ipc_open_mem(t, &y0, &size, &dev), Status::kSuccess);  // from device 0
  ASSERT_EQ(p.b().set_device(1), Status::kSuccess);
  ASSERT_EQ(p.b().ipc_open_mem(t, &y1, &size, &dev), Status::kSuccess);
  Stream s;
  ASSERT_EQ(p.b().stream_create(&s), Status::kSuccess);  // device 1's
  const sim::FillU32Args fill{y1, 1024, 0x99u, 0};
  ASSERT_EQ(p.b().launch(kernel(p.b(), "ordo_fill_u32"), {1}, {1}, &fill, sizeof fill, s), Status::kSuccess);
  EXPECT_EQ(p.b().stream_synchronize(s), Status::kSuccess);
  EXPECT_EQ(p.b().sticky_error(), Status::kSuccess);
  EXPECT_EQ(read_back(p.a(), x, 4), std::vector<uint32_t>(4, 0x99u));
}

// The supervisor's worker processes: one table across processes (--ipc-fd),
// the sim's exports opened through the other process's /proc/PID/fd.
TEST(IpcProcesses, TwoWorkerProcessesShareMemoryAndEvents) {
  WorkerProcess w({"--sessions", "2"}, "32M");
  auto a = w.attach();
  auto b = w.attach();
  constexpr uint32_t kWords = 1024;
  uint64_t x = 0, src = 0;
  ASSERT_EQ(a->malloc(&x, kWords * 4), Status::kSuccess);
  ASSERT_EQ(a->malloc(&src, kWords * 4), Status::kSuccess);
  const auto in = pattern(kWords, 77);
  ASSERT_EQ(a->memcpy_h2d(src, in.data(), kWords * 4), Status::kSuccess);
  Client::IpcToken tm, te;
  ASSERT_EQ(a->ipc_export_mem(x, &tm), Status::kSuccess);
  Event e;
  ASSERT_EQ(a->event_create(&e, kIpcEventFlags), Status::kSuccess);
  ASSERT_EQ(a->ipc_export_event(e, &te), Status::kSuccess);
  uint64_t y = 0, size = 0;
  uint32_t dev = 0;
  ASSERT_EQ(b->ipc_open_mem(tm, &y, &size, &dev), Status::kSuccess);
  EXPECT_EQ(size, kWords * 4);
  Event eb;
  ASSERT_EQ(b->ipc_open_event(te, &eb), Status::kSuccess);
  uint64_t own = 0;
  EXPECT_EQ(a->ipc_open_mem(tm, &own, &size, &dev), Status::kInvalidContext);
  Stream sa, sb;
  ASSERT_EQ(a->stream_create(&sa), Status::kSuccess);
  ASSERT_EQ(b->stream_create(&sb), Status::kSuccess);
  const sim::SlowCopyArgs slow{x, src, kWords * 4, 200000, 0};
  ASSERT_EQ(a->launch(kernel(*a, "ordo_slow_copy"), {1}, {1}, &slow, sizeof slow, sa), Status::kSuccess);
  ASSERT_EQ(a->event_record(e, sa), Status::kSuccess);
  EXPECT_EQ(b->event_query(eb), Status::kNotReady);
  ASSERT_EQ(b->stream_wait_event(sb, eb), Status::kSuccess);
  std::vector<uint32_t> got(kWords, 0);
  ASSERT_EQ(b->memcpy_d2h_async(got.data(), y, kWords * 4, sb), Status::kSuccess);
  EXPECT_EQ(got, in);
  EXPECT_EQ(b->event_query(eb), Status::kSuccess);
  // B writes; A reads it.
  const auto back = pattern(kWords, 5000);
  ASSERT_EQ(b->memcpy_h2d(y, back.data(), kWords * 4), Status::kSuccess);
  EXPECT_EQ(read_back(*a, x, kWords), back);
  EXPECT_EQ(b->ipc_close_mem(y), Status::kSuccess);
  expect_refused(*b, y, "closed");
  // A's process ends: its part's exports go with it.
  a.reset();
  auto a2 = w.attach();
  EXPECT_EQ(b->ipc_open_mem(tm, &y, &size, &dev), Status::kInvalidResourceHandle);
  Event again;
  EXPECT_EQ(b->ipc_open_event(te, &again), Status::kInvalidResourceHandle);
}

}  // namespace
}  // namespace ordo::test

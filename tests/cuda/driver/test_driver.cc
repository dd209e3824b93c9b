// Unit tests of the guest libcuda.so.1 (src/guest/cuda).
//
// dark_api.cc is compiled into this test (with the stand-ins below for the
// driver state it reads), so MD2 and the integrity HMAC are tested directly.
// The generated proc_table.cc is compiled in too, to check the table's order
// and contents. Everything else goes through the exported entry points of the
// built libcuda.so.1, dlopened from $LIBCUDA, as a program would reach them.
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "dark_api.h"
#include "driver.h"
#include "proc_table.h"

// ---------------------------------------------------------------- stand-ins for driver.cc

namespace ordo::driver {

// What device_hash_info reports: g_hash_devices devices (kDevice, then
// copies of it on the next PCI buses), or an error when set.
int g_hash_error = 0;
int g_hash_devices = 1;
const DeviceHashInfo kDevice = {{0x10, 0x21, 0x32, 0x43, 0x54, 0x65, 0x76, 0x87, 0x98, 0xa9, 0xba, 0xcb, 0xdc, 0xed,
                                 0xfe, 0x0f},
                                0x0000,
                                0x41,
                                0x00};
constexpr int kTestDriverVersion = 12345;

CUresult primary_context(CUdevice, CUcontext* out) {
  if (out) *out = nullptr;
  return CUDA_ERROR_NOT_INITIALIZED;
}
CUresult CUDAAPI cls_put(CUcontext, void*, void*, void (*)(CUcontext, void*, void*)) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cls_delete(CUcontext, void*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI cls_get(void** value, CUcontext, void*) {
  if (value) *value = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
DeviceHashInfo hash_device(int i) {
  DeviceHashInfo d = kDevice;
  d.uuid[15] = uint8_t(d.uuid[15] + i);
  d.pci_bus += i;
  return d;
}
int device_hash_info(DeviceHashInfo* out, int max) {
  if (g_hash_error) return -g_hash_error;
  const int n = std::min(g_hash_devices, max);
  for (int i = 0; i < n; ++i) out[i] = hash_device(i);
  return n;
}
int driver_version() { return kTestDriverVersion; }
bool driver_trace() { return false; }  // the unknown slots refuse silently

}  // namespace ordo::driver

namespace {

using ordo::driver::DeviceHashInfo;
using ordo::driver::IntegrityInput;

std::string hex(const uint8_t* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 15];
  }
  return s;
}

std::string md2_hex(std::string_view s) {
  uint8_t d[16];
  ordo::driver::md2(s.data(), s.size(), d);
  return hex(d, 16);
}

constexpr uint8_t kIntegrityUuid[16] = {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b,
                                        0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2};
constexpr uint8_t kCudartUuid[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                     0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
using IntegrityFn = CUresult (*)(uint32_t version, uint64_t secs, uint64_t out[2]);

// ---------------------------------------------------------------- MD2

TEST(Md2, Rfc1319Vectors) {
  EXPECT_EQ(md2_hex(""), "8350e5a3e24c153df2275c9f80692773");
  EXPECT_EQ(md2_hex("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
  EXPECT_EQ(md2_hex("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
  EXPECT_EQ(md2_hex("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
  EXPECT_EQ(md2_hex("abcdefghijklmnopqrstuvwxyz"), "4e8ddff3650292ab5a4108c3aa47940b");
  std::string digits;
  for (int i = 0; i < 8; ++i) digits += "1234567890";
  ASSERT_EQ(digits.size(), 80u);
  EXPECT_EQ(md2_hex(digits), "d5976f79d83d3a0dc9806c3c66f3efd8");
}

TEST(Md2, BlockBoundaries) {
  // Lengths around the 16-byte block: each message digests differently, and
  // the same message always the same.
  std::vector<std::string> seen;
  for (size_t n = 0; n <= 48; ++n) {
    const std::string m(n, 'x');
    const std::string d = md2_hex(m);
    EXPECT_EQ(d, md2_hex(m)) << n;
    for (const std::string& s : seen) EXPECT_NE(d, s) << n;
    seen.push_back(d);
  }
}

// ---------------------------------------------------------------- the integrity HMAC

constexpr uint8_t kKey[16] = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52,
                              0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};

// HMAC-MD2 (RFC 2104) built here from md2 alone: MD2's block is 16 bytes, so
// the 16-byte key is used as it is.
void hmac_md2(const IntegrityInput& in, const DeviceHashInfo* devices, int count, uint64_t out[2]) {
  std::vector<uint8_t> inner(16);
  for (int i = 0; i < 16; ++i) inner[i] = kKey[i] ^ 0x36;
  const auto* p = reinterpret_cast<const uint8_t*>(&in);
  inner.insert(inner.end(), p, p + sizeof in);
  for (int i = 0; i < count; ++i) {
    const auto* d = reinterpret_cast<const uint8_t*>(&devices[i]);
    inner.insert(inner.end(), d, d + sizeof devices[i]);
  }
  uint8_t inner_digest[16];
  ordo::driver::md2(inner.data(), inner.size(), inner_digest);
  uint8_t outer[32];
  for (int i = 0; i < 16; ++i) outer[i] = kKey[i] ^ 0x5c;
  std::memcpy(outer + 16, inner_digest, 16);
  uint8_t digest[16];
  ordo::driver::md2(outer, sizeof outer, digest);
  std::memcpy(out, digest, 16);
}

IntegrityInput sample_input() {
  IntegrityInput in{};
  in.driver_version = 13000;
  in.version = 13002;
  in.pid = 4242;
  in.thread = 0x12345678;
  in.cudart_table = reinterpret_cast<const void*>(uintptr_t(0x7f0000001000));
  in.integrity_table = reinterpret_cast<const void*>(uintptr_t(0x7f0000002000));
  in.check_fn = reinterpret_cast<const void*>(uintptr_t(0x7f0000003000));
  in.unix_seconds = 1700000000;
  return in;
}

std::vector<DeviceHashInfo> sample_devices() {
  DeviceHashInfo a{}, b{};
  for (int i = 0; i < 16; ++i) {
    a.uuid[i] = uint8_t(i * 7 + 1);
    b.uuid[i] = uint8_t(0xff - i);
  }
  a.pci_domain = 0, a.pci_bus = 0x41, a.pci_device = 0;
  b.pci_domain = 1, b.pci_bus = 0x81, b.pci_device = 3;
  return {a, b};
}

std::pair<uint64_t, uint64_t> hash(const IntegrityInput& in, const std::vector<DeviceHashInfo>& devs) {
  uint64_t out[2] = {0, 0};
  ordo::driver::integrity_hash(in, devs.data(), int(devs.size()), out);
  return {out[0], out[1]};
}

TEST(IntegrityHash, IsHmacMd2) {
  const IntegrityInput in = sample_input();
  const auto devs = sample_devices();
  for (int count = 0; count <= 2; ++count) {
    uint64_t want[2], got[2] = {0, 0};
    hmac_md2(in, devs.data(), count, want);
    ordo::driver::integrity_hash(in, devs.data(), count, got);
    EXPECT_EQ(got[0], want[0]) << count;
    EXPECT_EQ(got[1], want[1]) << count;
  }
}

TEST(IntegrityHash, EveryInputMatters) {
  const IntegrityInput base = sample_input();
  const auto devs = sample_devices();
  const auto h0 = hash(base, devs);
  EXPECT_EQ(hash(base, devs), h0);  // deterministic

  IntegrityInput in = base;
  in.pid ^= 1;
  EXPECT_NE(hash(in, devs), h0) << "pid";
  in = base;
  in.version += 1;
  EXPECT_NE(hash(in, devs), h0) << "version";
  in = base;
  in.driver_version += 10;
  EXPECT_NE(hash(in, devs), h0) << "driver_version";
  in = base;
  in.thread ^= 0x80000000u;
  EXPECT_NE(hash(in, devs), h0) << "thread";
  in = base;
  in.unix_seconds += 1;
  EXPECT_NE(hash(in, devs), h0) << "unix_seconds";
  in = base;
  in.check_fn = static_cast<const char*>(in.check_fn) + 16;
  EXPECT_NE(hash(in, devs), h0) << "check_fn";

  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < 16; ++i) {
      auto changed = devs;
      changed[d].uuid[i] ^= 0x01;
      EXPECT_NE(hash(base, changed), h0) << "device " << d << " uuid byte " << i;
    }
  auto changed = devs;
  changed[1].pci_bus += 1;
  EXPECT_NE(hash(base, changed), h0) << "pci_bus";
  EXPECT_NE(hash(base, {devs[0]}), h0) << "device count";
}

// What the check slot (export table slot 1) hashes for this process at `secs`.
IntegrityInput check_slot_input(const void* table, uint64_t secs) {
  IntegrityInput in{};
  in.driver_version = ordo::driver::kTestDriverVersion;
  in.version = 13002;
  in.pid = uint32_t(getpid());
  in.thread = uint32_t(uintptr_t(pthread_self()));
  in.cudart_table = ordo::driver::export_table(kCudartUuid);
  in.integrity_table = table;
  in.check_fn = static_cast<const void* const*>(table)[1];
  in.unix_seconds = secs;
  return in;
}

// The check as cudart calls it (slot 1 of INTEGRITY_CHECK) in this test's copy
// of dark_api.cc: constants for the first two revisions, else the HMAC of the
// caller's environment and device_hash_info's devices.
TEST(IntegrityHash, CheckSlotHashesTheEnvironment) {
  const void* t = ordo::driver::export_table(kIntegrityUuid);
  ASSERT_NE(t, nullptr);
  const auto* slots = static_cast<const void* const*>(t);
  ASSERT_EQ(uintptr_t(slots[0]), 3 * sizeof(void*));
  const auto check = reinterpret_cast<IntegrityFn>(const_cast<void*>(slots[1]));

  uint64_t out[2] = {0, 0};
  const uint64_t secs = 1712345678;
  ASSERT_EQ(check(13002, secs, out), CUDA_SUCCESS);
  const IntegrityInput in = check_slot_input(t, secs);
  uint64_t want[2];
  hmac_md2(in, &ordo::driver::kDevice, 1, want);
  EXPECT_EQ(out[0], want[0]);
  EXPECT_EQ(out[1], want[1]);

  ASSERT_EQ(check(13002, secs + 1, out), CUDA_SUCCESS);
  EXPECT_FALSE(out[0] == want[0] && out[1] == want[1]) << "the time is part of the hash";

  ordo::driver::g_hash_error = CUDA_ERROR_DEVICE_UNAVAILABLE;
  EXPECT_EQ(check(13002, secs, out), CUDA_ERROR_DEVICE_UNAVAILABLE);
  ordo::driver::g_hash_error = 0;
  EXPECT_EQ(check(13002, secs, nullptr), CUDA_ERROR_INVALID_VALUE);
}

// A session of several devices: every one of them goes into the hash, in
// ordinal order, up to a session's most (32).
TEST(IntegrityHash, CheckSlotHashesEveryDevice) {
  const void* t = ordo::driver::export_table(kIntegrityUuid);
  ASSERT_NE(t, nullptr);
  const auto* slots = static_cast<const void* const*>(t);
  const auto check = reinterpret_cast<IntegrityFn>(const_cast<void*>(slots[1]));
  const IntegrityInput in = check_slot_input(t, 1712345678);
  for (const int count : {2, 4, 32}) {
    SCOPED_TRACE(count);
    ordo::driver::g_hash_devices = count;
    std::vector<DeviceHashInfo> devs;
    for (int i = 0; i < count; ++i) devs.push_back(ordo::driver::hash_device(i));
    uint64_t out[2] = {0, 0}, want[2], fewer[2];
    ASSERT_EQ(check(13002, in.unix_seconds, out), CUDA_SUCCESS);
    hmac_md2(in, devs.data(), count, want);
    hmac_md2(in, devs.data(), count - 1, fewer);
    EXPECT_EQ(out[0], want[0]);
    EXPECT_EQ(out[1], want[1]);
    EXPECT_FALSE(out[0] == fewer[0] && out[1] == fewer[1]) << "the last device is hashed";
  }
  ordo::driver::g_hash_devices = 1;
}

// ---------------------------------------------------------------- cuFFT's table

// 6e163fbe: cuFFT checks that the table is longer than slot 7 and calls slot 7
// for each module it loads; every other slot refuses (801).
TEST(PrivateTables, CufftModuleTable) {
  constexpr uint8_t kUuid[16] = {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d,
                                 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e};
  const auto* slots = static_cast<const void* const*>(ordo::driver::export_table(kUuid));
  ASSERT_NE(slots, nullptr);
  const uintptr_t size = uintptr_t(slots[0]);
  EXPECT_EQ(size, 56 * sizeof(void*));
  EXPECT_GT(size, 0x37u) << "cuFFT's check";
  for (size_t i = 1; i < size / sizeof(void*); ++i) {
    ASSERT_NE(slots[i], nullptr) << i;
    if (i == 7) continue;
    EXPECT_EQ(reinterpret_cast<CUresult (*)()>(const_cast<void*>(slots[i]))(), CUDA_ERROR_NOT_SUPPORTED) << i;
  }
  // Before cuInit no module exists: no function, no callback.
  using Each = int (*)(CUcontext, CUmodule, void (*)(void*, CUfunction), void*);
  const auto each = reinterpret_cast<Each>(const_cast<void*>(slots[7]));
  int calls = 0;
  EXPECT_EQ(each(nullptr, reinterpret_cast<CUmodule>(0x1234), [](void* n, CUfunction) { ++*static_cast<int*>(n); },
                 &calls),
            0);
  EXPECT_EQ(calls, 0);
}

// 21318c60: slot 51 turns a stream into a handle, slot 39 a handle into the
// stream's id (cuBLAS on Hopper). Without a worker no stream exists; a handle
// the table never gave is refused, never read.
TEST(PrivateTables, StreamHandleSlotsRefuseWhatTheyDidNotGive) {
  constexpr uint8_t kUuid[16] = {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48,
                                 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2};
  const auto* slots = static_cast<const void* const*>(ordo::driver::export_table(kUuid));
  ASSERT_NE(slots, nullptr);
  EXPECT_EQ(uintptr_t(slots[0]), 96 * sizeof(void*));
  using HandleFn = CUresult (*)(CUcontext, CUstream, const void**);
  using IdFn = CUresult (*)(CUcontext, const void*, unsigned long long*);
  const auto handle = reinterpret_cast<HandleFn>(const_cast<void*>(slots[51]));
  const auto id = reinterpret_cast<IdFn>(const_cast<void*>(slots[39]));
  const void* h = nullptr;
  EXPECT_EQ(handle(nullptr, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(handle(nullptr, nullptr, &h), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(h, nullptr);
  unsigned long long v = 7;
  uint64_t forged[64] = {};
  EXPECT_EQ(id(nullptr, forged, &v), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(id(nullptr, nullptr, &v), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(id(nullptr, forged, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(v, 7u);
  // Every other unknown slot still refuses.
  for (int i : {1, 38, 40, 50, 52, 95})
    EXPECT_EQ(reinterpret_cast<CUresult (*)()>(const_cast<void*>(slots[i]))(), CUDA_ERROR_NOT_SUPPORTED) << i;
}

// ---------------------------------------------------------------- the exported library

void* lib() {
  static void* h = [] {
    const char* path = std::getenv("LIBCUDA");
    if (!path || !*path) return static_cast<void*>(nullptr);
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }();
  return h;
}

template <typename F>
F sym(const char* name) {
  void* h = lib();
  return h ? reinterpret_cast<F>(dlsym(h, name)) : nullptr;
}

void* addr(const char* name) { return sym<void*>(name); }

class Lib : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(std::getenv("LIBCUDA"), nullptr) << "LIBCUDA must name the built libcuda.so.1";
    ASSERT_NE(lib(), nullptr) << dlerror();
  }
};

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

struct Resolved {
  CUresult rc;
  CUdriverProcAddressQueryResult status;
  void* fn;
};
Resolved resolve(const char* name, int version, bool per_thread) {
  const auto get = sym<GetProcAddressFn>("cuGetProcAddress_v2");
  Resolved r{CUDA_ERROR_UNKNOWN, CU_GET_PROC_ADDRESS_SUCCESS, reinterpret_cast<void*>(uintptr_t(1))};
  if (!get) return r;
  r.status = CUdriverProcAddressQueryResult(-1);
  r.rc = get(name, &r.fn, version, per_thread ? kPerThread : cuuint64_t(CU_GET_PROC_ADDRESS_DEFAULT), &r.status);
  return r;
}

// Resolves `name` at `version` and expects the exported function `want`.
void expect_proc(const char* name, int version, bool per_thread, const char* want) {
  SCOPED_TRACE(std::string(name) + " at " + std::to_string(version) + (per_thread ? " per-thread" : ""));
  void* expected = addr(want);
  ASSERT_NE(expected, nullptr) << want << " is not exported";
  const Resolved r = resolve(name, version, per_thread);
  EXPECT_EQ(r.rc, CUDA_SUCCESS);
  EXPECT_EQ(r.status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(r.fn, expected) << "expected " << want;
}

TEST_F(Lib, ProcAddressPicksTheVersion) {
  // The candidates differ, so comparing addresses tells them apart.
  ASSERT_NE(addr("cuMemAlloc"), addr("cuMemAlloc_v2"));
  ASSERT_NE(addr("cuCtxCreate_v3"), addr("cuCtxCreate_v4"));
  ASSERT_NE(addr("cuStreamGetCaptureInfo_v3"), addr("cuStreamGetCaptureInfo_v3_ptsz"));

  expect_proc("cuMemAlloc", 3020, false, "cuMemAlloc_v2");
  expect_proc("cuMemAlloc", 13000, false, "cuMemAlloc_v2");
  expect_proc("cuMemAlloc", 2000, false, "cuMemAlloc");
  expect_proc("cuMemAlloc", 3010, false, "cuMemAlloc");
  expect_proc("cuCtxCreate", 12050, false, "cuCtxCreate_v4");
  expect_proc("cuCtxCreate", 11040, false, "cuCtxCreate_v3");
  expect_proc("cuCtxCreate", 12040, false, "cuCtxCreate_v3");
  expect_proc("cuCtxCreate", 3020, false, "cuCtxCreate_v2");
  expect_proc("cuStreamGetCaptureInfo", 12030, false, "cuStreamGetCaptureInfo_v3");
  expect_proc("cuStreamGetCaptureInfo", 12030, true, "cuStreamGetCaptureInfo_v3_ptsz");
  expect_proc("cuStreamGetCaptureInfo", 11030, true, "cuStreamGetCaptureInfo_v2_ptsz");
  expect_proc("cuStreamGetCaptureInfo", 10010, true, "cuStreamGetCaptureInfo_ptsz");
  expect_proc("cuStreamGetCaptureInfo", 10010, false, "cuStreamGetCaptureInfo");
  expect_proc("cuMemcpyHtoD", 13000, true, "cuMemcpyHtoD_v2_ptds");
  expect_proc("cuMemcpyHtoD", 13000, false, "cuMemcpyHtoD_v2");
  // Multi-device entry points, as cudart 13 asks for them.
  expect_proc("cuMemcpyPeer", 4000, false, "cuMemcpyPeer");
  expect_proc("cuMemcpyPeer", 7000, true, "cuMemcpyPeer_ptds");
  expect_proc("cuMemcpyPeerAsync", 4000, false, "cuMemcpyPeerAsync");
  expect_proc("cuMemcpyPeerAsync", 7000, true, "cuMemcpyPeerAsync_ptsz");
  expect_proc("cuStreamGetCtx", 9020, false, "cuStreamGetCtx");
  expect_proc("cuStreamGetCtx", 12050, false, "cuStreamGetCtx_v2");
  expect_proc("cuStreamGetCtx", 12050, true, "cuStreamGetCtx_v2_ptsz");
  expect_proc("cuStreamGetDevice", 12080, true, "cuStreamGetDevice_ptsz");
  expect_proc("cuCtxEnablePeerAccess", 4000, false, "cuCtxEnablePeerAccess");
  expect_proc("cuDeviceGetP2PAttribute", 8000, false, "cuDeviceGetP2PAttribute");
  // No per-thread variant: the normal one.
  expect_proc("cuMemAlloc", 13000, true, "cuMemAlloc_v2");
  expect_proc("cuCtxCreate", 13000, true, "cuCtxCreate_v4");
}

TEST_F(Lib, ProcAddressFailures) {
  Resolved r = resolve("cuMemAlloc", 1000, false);
  EXPECT_EQ(r.rc, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(int(r.rc), 500);
  EXPECT_EQ(r.status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(r.fn, nullptr);

  r = resolve("cuNoSuchThing", 13000, false);
  EXPECT_EQ(r.rc, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(r.status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(r.fn, nullptr);

  // Exported names with a suffix are not what cuGetProcAddress looks up.
  r = resolve("cuMemAlloc_v2", 13000, false);
  EXPECT_EQ(r.rc, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(r.status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

  const auto get = sym<GetProcAddressFn>("cuGetProcAddress_v2");
  ASSERT_NE(get, nullptr);
  void* fn = nullptr;
  EXPECT_EQ(get(nullptr, &fn, 13000, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get("cuMemAlloc", nullptr, 13000, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get("cuMemAlloc", &fn, 13000, 4, nullptr), CUDA_ERROR_INVALID_VALUE);
  // The status is optional; legacy-stream flag is accepted.
  EXPECT_EQ(get("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(fn, addr("cuMemAlloc_v2"));
  // The v1 entry point without a status.
  using V1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  const auto get1 = sym<V1>("cuGetProcAddress");
  ASSERT_NE(get1, nullptr);
  fn = nullptr;
  EXPECT_EQ(get1("cuCtxCreate", &fn, 11040, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, addr("cuCtxCreate_v3"));
}

// The generated table itself: sorted, unique, and every entry names an
// exported function of its own name that cuGetProcAddress returns.
TEST_F(Lib, ProcTableIsSortedAndConsistent) {
  using ordo::driver::kProcTable;
  using ordo::driver::kProcTableSize;
  ASSERT_GT(kProcTableSize, 100u);
  for (size_t i = 1; i < kProcTableSize; ++i) {
    const auto& a = kProcTable[i - 1];
    const auto& b = kProcTable[i];
    const int c = std::strcmp(a.name, b.name);
    const bool less = c < 0 || (c == 0 && (a.per_thread < b.per_thread ||
                                           (a.per_thread == b.per_thread && a.version < b.version)));
    EXPECT_TRUE(less) << "entries " << i - 1 << " and " << i << ": " << a.name << "/" << a.per_thread << "/"
                      << a.version << " then " << b.name << "/" << b.per_thread << "/" << b.version;
  }
  int failures = 0;
  for (size_t i = 0; i < kProcTableSize && failures < 10; ++i) {
    const auto& e = kProcTable[i];
    SCOPED_TRACE(std::string(e.name) + " " + std::to_string(e.version) + (e.per_thread ? " per-thread" : ""));
    const int before = ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    EXPECT_NE(e.fn, nullptr);
    Dl_info info{};
    ASSERT_NE(dladdr(e.fn, &info), 0);
    ASSERT_NE(info.dli_sname, nullptr);
    const std::string_view sname = info.dli_sname;
    EXPECT_EQ(sname.substr(0, std::strlen(e.name)), e.name) << sname;
    EXPECT_EQ(addr(info.dli_sname), e.fn) << sname;
    const bool pt_name = sname.ends_with("_ptds") || sname.ends_with("_ptsz");
    EXPECT_EQ(pt_name, e.per_thread) << sname;
    const Resolved r = resolve(e.name, e.version, e.per_thread);
    EXPECT_EQ(r.rc, CUDA_SUCCESS);
    EXPECT_EQ(r.fn, e.fn) << sname;
    if (::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() != before) ++failures;
  }
}

// ---------------------------------------------------------------- without a worker

TEST_F(Lib, InitWithoutRegionFails) {
  unsetenv("ORDO_REGION");
  using InitFn = CUresult (*)(unsigned);
  const auto init = sym<InitFn>("cuInit");
  ASSERT_NE(init, nullptr);
  EXPECT_EQ(init(1), CUDA_ERROR_INVALID_VALUE);
  testing::internal::CaptureStderr();
  const CUresult rc = init(0);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(int(rc), 3);
  EXPECT_NE(err.find("ORDO_REGION"), std::string::npos) << err;
  EXPECT_EQ(init(0), CUDA_ERROR_NOT_INITIALIZED);  // and stays so

  // Calls that need the worker answer the same.
  using DeviceGetFn = CUresult (*)(CUdevice*, int);
  const auto device_get = sym<DeviceGetFn>("cuDeviceGet");
  ASSERT_NE(device_get, nullptr);
  CUdevice dev = -1;
  EXPECT_EQ(device_get(&dev, 0), CUDA_ERROR_NOT_INITIALIZED);
}

// The multi-device entry points are implemented, not stubs: before cuInit
// they answer CUDA_ERROR_NOT_INITIALIZED (a stub answers 801 and names itself
// on stderr), after checking what needs no driver state.
TEST_F(Lib, DeviceEntryPointsBeforeInit) {
  using CanAccessFn = CUresult (*)(int*, CUdevice, CUdevice);
  using P2PFn = CUresult (*)(int*, CUdevice_P2PAttribute, CUdevice, CUdevice);
  using EnableFn = CUresult (*)(CUcontext, unsigned);
  using DisableFn = CUresult (*)(CUcontext);
  using PeerFn = CUresult (*)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
  using PeerAsyncFn = CUresult (*)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
  using GetDeviceFn = CUresult (*)(CUstream, CUdevice*);
  using GetCtxFn = CUresult (*)(CUstream, CUcontext*);
  using GetCtx2Fn = CUresult (*)(CUstream, CUcontext*, CUgreenCtx*);
  using CountFn = CUresult (*)(int*);
  const auto can = sym<CanAccessFn>("cuDeviceCanAccessPeer");
  const auto p2p = sym<P2PFn>("cuDeviceGetP2PAttribute");
  const auto enable = sym<EnableFn>("cuCtxEnablePeerAccess");
  const auto disable = sym<DisableFn>("cuCtxDisablePeerAccess");
  const auto count = sym<CountFn>("cuDeviceGetCount");
  ASSERT_TRUE(can && p2p && enable && disable && count);
  testing::internal::CaptureStderr();
  int v = -1;
  EXPECT_EQ(count(&v), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(count(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(can(&v, 0, 1), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(can(nullptr, 0, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(p2p(&v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 1), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(enable(nullptr, 0), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(enable(nullptr, 1), CUDA_ERROR_INVALID_VALUE);  // flags must be 0
  EXPECT_EQ(disable(nullptr), CUDA_ERROR_NOT_INITIALIZED);
  for (const char* name : {"cuMemcpyPeer", "cuMemcpyPeer_ptds"})
    EXPECT_EQ(sym<PeerFn>(name)(0x1000, nullptr, 0x2000, nullptr, 16), CUDA_ERROR_NOT_INITIALIZED) << name;
  for (const char* name : {"cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz"})
    EXPECT_EQ(sym<PeerAsyncFn>(name)(0x1000, nullptr, 0x2000, nullptr, 16, nullptr), CUDA_ERROR_NOT_INITIALIZED)
        << name;
  CUdevice dev = -1;
  for (const char* name : {"cuStreamGetDevice", "cuStreamGetDevice_ptsz"}) {
    EXPECT_EQ(sym<GetDeviceFn>(name)(nullptr, &dev), CUDA_ERROR_NOT_INITIALIZED) << name;
    EXPECT_EQ(sym<GetDeviceFn>(name)(nullptr, nullptr), CUDA_ERROR_INVALID_VALUE) << name;
  }
  CUcontext ctx = nullptr;
  for (const char* name : {"cuStreamGetCtx", "cuStreamGetCtx_ptsz"})
    EXPECT_EQ(sym<GetCtxFn>(name)(nullptr, &ctx), CUDA_ERROR_NOT_INITIALIZED) << name;
  CUgreenCtx green = nullptr;
  for (const char* name : {"cuStreamGetCtx_v2", "cuStreamGetCtx_v2_ptsz"}) {
    EXPECT_EQ(sym<GetCtx2Fn>(name)(nullptr, &ctx, &green), CUDA_ERROR_NOT_INITIALIZED) << name;
    EXPECT_EQ(sym<GetCtx2Fn>(name)(nullptr, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE) << name;
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "") << "a stub named itself";
}

TEST_F(Lib, IntegrityCheckTable) {
  using GetExportTableFn = CUresult (*)(const void**, const CUuuid*);
  const auto get = sym<GetExportTableFn>("cuGetExportTable");
  ASSERT_NE(get, nullptr);
  CUuuid id;
  std::memcpy(id.bytes, kIntegrityUuid, 16);
  const void* table = nullptr;
  ASSERT_EQ(get(&table, &id), CUDA_SUCCESS);
  ASSERT_NE(table, nullptr);
  const auto* slots = static_cast<const void* const*>(table);
  EXPECT_EQ(uintptr_t(slots[0]), 3 * sizeof(void*));
  const auto check = reinterpret_cast<IntegrityFn>(const_cast<void*>(slots[1]));
  ASSERT_NE(check, nullptr);

  uint64_t out[2] = {0, 0};
  ASSERT_EQ(check(13000, 1700000000, out), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 0x3341181C03CB675Cull);
  EXPECT_EQ(out[1], 0x8ED383AA1F4CD1E8ull);
  out[0] = out[1] = 0;
  ASSERT_EQ(check(13001, 1700000000, out), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 0x1841181C03CB675Cull);
  EXPECT_EQ(out[1], 0x8ED383AA1F4CD1E8ull);
  // Later revisions hash the devices, which need the worker.
  EXPECT_NE(check(13002, 1700000000, out), CUDA_SUCCESS);

  id.bytes[15] ^= 1;
  table = reinterpret_cast<const void*>(uintptr_t(1));
  EXPECT_EQ(get(&table, &id), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(table, nullptr);
  EXPECT_EQ(get(nullptr, &id), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get(&table, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Lib, VersionAndErrorNames) {
  using VersionFn = CUresult (*)(int*);
  const auto version = sym<VersionFn>("cuDriverGetVersion");
  ASSERT_NE(version, nullptr);
  int v = 0;
  ASSERT_EQ(version(&v), CUDA_SUCCESS);
  EXPECT_EQ(v, 13000);
  EXPECT_EQ(version(nullptr), CUDA_ERROR_INVALID_VALUE);

  using NameFn = CUresult (*)(CUresult, const char**);
  const auto name = sym<NameFn>("cuGetErrorName");
  ASSERT_NE(name, nullptr);
  const char* s = nullptr;
  ASSERT_EQ(name(CUDA_ERROR_INVALID_VALUE, &s), CUDA_SUCCESS);
  ASSERT_NE(s, nullptr);
  EXPECT_STREQ(s, "CUDA_ERROR_INVALID_VALUE");
  ASSERT_EQ(name(CUDA_ERROR_NOT_SUPPORTED, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "CUDA_ERROR_NOT_SUPPORTED");
  ASSERT_EQ(name(CUDA_SUCCESS, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "CUDA_SUCCESS");
  EXPECT_EQ(name(CUresult(123456), &s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_STREQ(ordo::driver::error_name(500), "CUDA_ERROR_NOT_FOUND");
  EXPECT_EQ(ordo::driver::error_name(123456), nullptr);
}

TEST_F(Lib, StubNamesItselfOnce) {
  using StubFn = int (*)();
  const auto stub = sym<StubFn>("cuMulticastCreate");
  ASSERT_NE(stub, nullptr);
  testing::internal::CaptureStderr();
  const int first = stub();
  const int second = stub();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(first, 801);
  EXPECT_EQ(second, 801);
  EXPECT_EQ(first, CUDA_ERROR_NOT_SUPPORTED);
  size_t count = 0;
  for (size_t at = err.find("cuMulticastCreate"); at != std::string::npos; at = err.find("cuMulticastCreate", at + 1)) ++count;
  EXPECT_EQ(count, 1u) << err;
}

}  // namespace

// Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess and the rest) as PyTorch's expandable segments and NCCL's
// ncclCuMemAlloc/ncclMemAlloc use it: granularity, a reservation with two
// physical allocations mapped side by side and one access grant over both,
// copies, memsets and kernels across the seam, the same memory at a second
// address, a handle released while mapped (its memory lives until the last
// unmap), a different handle mapped where another was, handles retained from
// addresses and their properties, what pointer queries say of mapped memory,
// misuse cuda.h documents, memory of another device mapped beside the first
// (when there are several), and four threads each growing and shrinking a
// segment of its own at once. cuMemExportToShareableHandle/Import between
// processes are vmm_ipc.cu's. The same program must pass natively and through
// ordo, printing the same lines (no addresses, only values and checksums).
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

#define CU_CHECK(call)                                                                         \
  do {                                                                                         \
    CUresult r_ = (call);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      const char* n_ = nullptr;                                                                \
      cuGetErrorName(r_, &n_);                                                                 \
      std::printf("FAIL %s:%d: %s -> error %d (%s)\n", __FILE__, __LINE__, #call, int(r_),     \
                  n_ ? n_ : "?");                                                              \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

constexpr size_t kTwoMiB = size_t{2} << 20;  // PyTorch's small-pool segment size

// FNV-1a over the ints: the checksums the program prints.
uint64_t checksum(const std::vector<int>& v) {
  uint64_t h = 1469598103934665603ull;
  for (int x : v) {
    h ^= uint32_t(x);
    h *= 1099511628211ull;
  }
  return h;
}

int* as_ints(CUdeviceptr p) { return reinterpret_cast<int*>(p); }

// The properties NCCL's ncclCuMemAlloc and PyTorch's ExpandableSegment::map
// give cuMemCreate: pinned device memory, exportable as a POSIX file
// descriptor, GPUDirect RDMA capable where the device says it can be.
CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  int rdma = 0;
  CU_CHECK(cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device));
  if (rdma) prop.allocFlags.gpuDirectRDMACapable = 1;
  return prop;
}

CUmemAccessDesc read_write(int device) {
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

std::vector<int> read_back(CUdeviceptr p, size_t n) {
  std::vector<int> v(n);
  CHECK(cudaMemcpy(v.data(), as_ints(p), n * sizeof(int), cudaMemcpyDeviceToHost));
  return v;
}

// Every element equals want(i); prints the first that does not.
template <typename F>
bool all_are(const std::vector<int>& v, F want) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != want(i)) {
      std::printf("  element %zu: %d, want %d\n", i, v[i], want(i));
      return false;
    }
  return true;
}

unsigned long long access_of(int device, CUdeviceptr p) {
  CUmemLocation loc = {};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = device;
  unsigned long long flags = ~0ull;
  CU_CHECK(cuMemGetAccess(&flags, &loc, p));
  return flags;
}

// Granularity, reservation, two allocations side by side, access, and data
// across the seam; aliasing, release while mapped, remapping; queries; misuse.
void one_device(size_t g) {
  CHECK(cudaSetDevice(0));
  const CUmemAllocationProp prop = device_prop(0);

  // NCCL: the reservation aligned to the granularity; 8 granules, 3 mapped.
  CUdeviceptr va = 0;
  const size_t reserved = 8 * g;
  CU_CHECK(cuMemAddressReserve(&va, reserved, g, 0, 0));
  EXPECT(va != 0 && va % g == 0);
  CUmemGenericAllocationHandle h1 = 0, h2 = 0;
  CU_CHECK(cuMemCreate(&h1, g, &prop, 0));
  CU_CHECK(cuMemCreate(&h2, 2 * g, &prop, 0));
  EXPECT(h1 != h2);
  CU_CHECK(cuMemMap(va, g, 0, h1, 0));
  CU_CHECK(cuMemMap(va + g, 2 * g, 0, h2, 0));
  // PyTorch: one grant over several mappings.
  const CUmemAccessDesc rw0 = read_write(0);
  CU_CHECK(cuMemSetAccess(va, 3 * g, &rw0, 1));
  const unsigned long long acc = access_of(0, va + g + 100);
  std::printf("access: device 0 on the second mapping %llu\n", acc);
  EXPECT(acc == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  // A memset over both mappings, read back across the seam.
  const size_t granule_ints = g / sizeof(int);
  CU_CHECK(cuMemsetD32(va, 0x11111111u, 3 * granule_ints));
  const CUdeviceptr seam = va + g;
  std::vector<int> around = read_back(seam - 4096, 2048);
  EXPECT(all_are(around, [](size_t) { return 0x11111111; }));
  std::vector<int> last = read_back(va + 3 * g - 64, 16);
  EXPECT(all_are(last, [](size_t) { return 0x11111111; }));

  // Kernels writing across the seam: 1024 ints in each allocation.
  int* window = as_ints(seam) - 1024;
  fill<<<8, 256>>>(window, 2048, 500);
  add<<<8, 256>>>(window, 2048, 7);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  around = read_back(seam - 4096, 2048);
  EXPECT(all_are(around, [](size_t i) { return 507 + int(i); }));
  std::printf("seam: kernels across two mappings, checksum %016llx\n", (unsigned long long)checksum(around));

  // A copy in across the seam, and one out of it deeper into the second allocation.
  std::vector<int> pattern(4096);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = int(i * 2654435761u);
  CHECK(cudaMemcpy(as_ints(seam) - 2048, pattern.data(), pattern.size() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(as_ints(va + 2 * g), as_ints(seam) - 2048, pattern.size() * sizeof(int),
                   cudaMemcpyDeviceToDevice));
  std::vector<int> copied = read_back(va + 2 * g, pattern.size());
  EXPECT(copied == pattern);
  std::printf("seam: copies across two mappings, checksum %016llx\n", (unsigned long long)checksum(copied));

  // What the driver says of a mapped address: the mapping's range
  // (cuMemGetAddressRange; NCCL walks segments by it), the device, device memory.
  CUdeviceptr base = 0;
  size_t size = 0;
  CU_CHECK(cuMemGetAddressRange(&base, &size, va + g + 12345));
  std::printf("address range: granule %llu, %zu granules\n", (unsigned long long)((base - va) / g), size / g);
  EXPECT(base == va + g && size == 2 * g);
  CU_CHECK(cuMemGetAddressRange(&base, &size, va + 5));
  EXPECT(base == va && size == g);
  int ordinal = -1;
  CU_CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + g));
  unsigned int type = 0;
  CU_CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 2 * g + 8));
  int mapped = 0;
  CU_CHECK(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, va + g));
  std::printf("pointer: device %d, memory type %u, mapped %d\n", ordinal, type, mapped != 0);
  EXPECT(ordinal == 0 && type == CU_MEMORYTYPE_DEVICE && mapped != 0);
  cudaPointerAttributes rt = {};
  CHECK(cudaPointerGetAttributes(&rt, as_ints(va + g)));
  EXPECT(rt.type == cudaMemoryTypeDevice && rt.device == 0);

  // A handle retained from any address inside a mapping is the one mapped there;
  // its properties are what cuMemCreate was given.
  CUmemGenericAllocationHandle got = 0;
  CU_CHECK(cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(va + 2 * g + 4096)));
  EXPECT(got == h2);
  CUmemAllocationProp p = {};
  CU_CHECK(cuMemGetAllocationPropertiesFromHandle(&p, got));
  std::printf("properties: type %d, location %d:%d, handle types %d, compression %d\n", int(p.type),
              int(p.location.type), p.location.id, int(p.requestedHandleTypes), int(p.allocFlags.compressionType));
  EXPECT(p.type == CU_MEM_ALLOCATION_TYPE_PINNED && p.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         p.location.id == 0 && p.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT(p.allocFlags.gpuDirectRDMACapable == prop.allocFlags.gpuDirectRDMACapable);
  CU_CHECK(cuMemRelease(got));  // the retain's reference; h2's own stays

  // The first allocation at a second address: the same bytes through both.
  CUdeviceptr alias = 0;
  CU_CHECK(cuMemAddressReserve(&alias, 2 * g, 0, 0, 0));
  CU_CHECK(cuMemMap(alias, g, 0, h1, 0));
  CU_CHECK(cuMemSetAccess(alias, g, &rw0, 1));
  std::vector<int> a = read_back(alias + g - 4096, 1024), b = read_back(va + g - 4096, 1024);
  EXPECT(a == b);
  EXPECT(all_are(a, [](size_t i) { return int((i + 1024) * 2654435761u); }));
  CU_CHECK(cuMemsetD32(alias, 0x2222u, 64));
  b = read_back(va, 64);
  EXPECT(all_are(b, [](size_t) { return 0x2222; }));
  std::printf("alias: the same allocation at two addresses, checksum %016llx\n",
              (unsigned long long)checksum(read_back(alias, granule_ints)));

  // Released while mapped (as vectorAddMMAP does at once): its memory stays
  // until the last mapping goes, and a retain gives the same handle back.
  CU_CHECK(cuMemRelease(h1));
  CU_CHECK(cuMemsetD32(va + 256, 0x3333u, 64));
  a = read_back(alias + 256, 64);
  EXPECT(all_are(a, [](size_t) { return 0x3333; }));
  CU_CHECK(cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(alias + 100)));
  EXPECT(got == h1);
  CU_CHECK(cuMemRelease(got));
  CU_CHECK(cuMemUnmap(alias, g));  // one mapping left
  a = read_back(va + 256, 64);
  EXPECT(all_are(a, [](size_t) { return 0x3333; }));
  EXPECT(cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(alias)) != CUDA_SUCCESS);  // not mapped
  std::printf("release: memory of a released handle lives while mapped\n");

  // Another allocation where the first was (its last mapping gone, so is it);
  // access has to be granted anew. The second allocation is untouched.
  CU_CHECK(cuMemUnmap(va, g));
  CUmemGenericAllocationHandle h3 = 0;
  CU_CHECK(cuMemCreate(&h3, g, &prop, 0));
  CU_CHECK(cuMemMap(va, g, 0, h3, 0));
  CU_CHECK(cuMemSetAccess(va, g, &rw0, 1));
  CU_CHECK(cuMemsetD32(va, 0x4444u, granule_ints));
  around = read_back(seam - 4096, 2048);
  EXPECT(all_are(around, [&](size_t i) { return i < 1024 ? 0x4444 : int((i + 1024) * 2654435761u); }));
  CU_CHECK(cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(va)));
  EXPECT(got == h3);
  CU_CHECK(cuMemRelease(got));
  std::printf("remap: a new allocation at the old address, checksum %016llx\n", (unsigned long long)checksum(around));

  // Misuse whose refusal cuda.h documents. Only cuMemCreate's code is certain
  // (CUDA_ERROR_INVALID_VALUE for a size off the granularity); the rest must fail.
  CUmemGenericAllocationHandle bad = 0;
  const CUresult unaligned = cuMemCreate(&bad, g / 2, &prop, 0);
  std::printf("misuse: cuMemCreate of half a granule -> %d\n", int(unaligned));
  EXPECT(unaligned == CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemMap(va + 4 * g, g, g, h2, 0) != CUDA_SUCCESS);  // offset must be 0
  EXPECT(cuMemMap(va, g, 0, h2, 0) != CUDA_SUCCESS);          // over a mapping
  EXPECT(cuMemUnmap(va + g, g) != CUDA_SUCCESS);              // half of one mapping
  EXPECT(cuMemUnmap(va + 5 * g, g) != CUDA_SUCCESS);          // nothing mapped there
  EXPECT(cuMemSetAccess(va, 4 * g, &rw0, 1) != CUDA_SUCCESS);  // runs past the mappings
  CUdeviceptr gone = 0;
  CU_CHECK(cuMemAddressReserve(&gone, g, 0, 0, 0));
  CU_CHECK(cuMemAddressFree(gone, g));
  EXPECT(cuMemMap(gone, g, 0, h3, 0) != CUDA_SUCCESS);  // outside any reservation
  // Nothing above changed what is mapped.
  around = read_back(seam - 4096, 2048);
  EXPECT(all_are(around, [&](size_t i) { return i < 1024 ? 0x4444 : int((i + 1024) * 2654435761u); }));

  // One unmap over both mappings (vectorAddMMAP's free), then the handles and the ranges.
  CU_CHECK(cuMemUnmap(va, 3 * g));
  CU_CHECK(cuMemRelease(h2));
  CU_CHECK(cuMemRelease(h3));
  CU_CHECK(cuMemAddressFree(va, reserved));
  CU_CHECK(cuMemAddressFree(alias, 2 * g));
}

// vectorAddMMAP across devices: a stripe of device 0's memory and one of
// device 1's side by side in one reservation, each handle released once
// mapped, both devices granted access in one call; device 0's kernels work
// across the devices' seam and read device 1's stripe without peer access
// being enabled.
void two_devices() {
  size_t g0 = 0, g1 = 0;
  const CUmemAllocationProp p0 = device_prop(0), p1 = device_prop(1);
  CU_CHECK(cuMemGetAllocationGranularity(&g0, &p0, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CU_CHECK(cuMemGetAllocationGranularity(&g1, &p1, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t g = g0 > g1 ? g0 : g1;
  CUdeviceptr va = 0;
  CU_CHECK(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h0 = 0, h1 = 0;
  CU_CHECK(cuMemCreate(&h0, g, &p0, 0));
  CU_CHECK(cuMemCreate(&h1, g, &p1, 0));
  CU_CHECK(cuMemMap(va, g, 0, h0, 0));
  CU_CHECK(cuMemRelease(h0));
  CU_CHECK(cuMemMap(va + g, g, 0, h1, 0));
  CU_CHECK(cuMemRelease(h1));
  const CUmemAccessDesc both[2] = {read_write(0), read_write(1)};
  CU_CHECK(cuMemSetAccess(va, 2 * g, both, 2));
  EXPECT(access_of(0, va + g) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT(access_of(1, va + g) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  int ordinal = -1;
  CU_CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + g + 64));
  EXPECT(ordinal == 1);
  CU_CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 64));
  EXPECT(ordinal == 0);
  CUdeviceptr base = 0;
  size_t size = 0;
  CU_CHECK(cuMemGetAddressRange(&base, &size, va + g + 4));
  EXPECT(base == va + g && size == g);

  // Device 1 fills its stripe; device 0 adds across the seam and copies device 1's part out.
  constexpr int n = 4096;
  CHECK(cudaSetDevice(1));
  fill<<<n / 256, 256>>>(as_ints(va + g), n, 9000);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaSetDevice(0));
  fill<<<n / 256, 256>>>(as_ints(va + g) - n, n, 1000);
  add<<<2 * n / 256, 256>>>(as_ints(va + g) - n, 2 * n, 3);
  int* out = nullptr;
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  slow_copy<<<1, 256>>>(as_ints(va + g), out, n, 0);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<int> host(n);
  CHECK(cudaMemcpy(host.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(all_are(host, [](size_t i) { return 9003 + int(i); }));
  std::vector<int> seam = read_back(va + g - 512 * sizeof(int), 1024);
  EXPECT(all_are(seam, [](size_t i) { return i < 512 ? 1003 + 3584 + int(i) : 9003 + int(i - 512); }));
  std::printf("devices: a kernel on device 0 across device 0's and device 1's memory, checksum %016llx\n",
              (unsigned long long)checksum(seam));
  CHECK(cudaFree(out));

  CU_CHECK(cuMemUnmap(va, 2 * g));  // both stripes, both handles freed
  CU_CHECK(cuMemAddressFree(va, 2 * g));
}

// PyTorch's ExpandableSegment, four at once: a reservation of 1 1/8 of the
// device's memory, grown by 2 MiB segments (cuMemCreate, cuMemMap, access for
// the new segment only), used by kernels over everything mapped so far,
// shrunk from the end after a stream synchronize, and torn down with one
// unmap over what is left.
constexpr int kThreads = 4;
constexpr int kSegments = 3;
std::atomic<int> ready{0};
uint64_t thread_sums[kThreads][2];

void expandable_segment(int t, size_t total_mem) {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t seg = kTwoMiB;
  const size_t max_handles = (total_mem + total_mem / 8 + seg - 1) / seg;
  CUdeviceptr ptr = 0;
  CU_CHECK(cuMemAddressReserve(&ptr, seg * max_handles, 0, 0, 0));
  const CUmemAllocationProp prop = device_prop(0);
  const CUmemAccessDesc rw0 = read_write(0);
  const int e = int(seg / sizeof(int));
  const int base = t * 10000000;

  ++ready;
  while (ready.load() < kThreads) std::this_thread::yield();

  CUmemGenericAllocationHandle h[kSegments];
  for (int k = 0; k < kSegments; ++k) {
    CU_CHECK(cuMemCreate(&h[k], seg, &prop, 0));
    CU_CHECK(cuMemMap(ptr + k * seg, seg, 0, h[k], 0));
    CU_CHECK(cuMemSetAccess(ptr + k * seg, seg, &rw0, 1));
    fill<<<e / 256, 256, 0, s>>>(as_ints(ptr + k * seg), e, base + k * e);
    add<<<(k + 1) * e / 256, 256, 0, s>>>(as_ints(ptr), (k + 1) * e, 1);
    CHECK(cudaGetLastError());
  }
  std::vector<int> v(size_t(kSegments) * e);
  CHECK(cudaMemcpyAsync(v.data(), as_ints(ptr), v.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(all_are(v, [&](size_t i) { return base + int(i) + kSegments - int(i / e); }));
  thread_sums[t][0] = checksum(v);

  // Shrink: the last segment goes, the rest keeps its data and stays usable.
  CHECK(cudaStreamSynchronize(s));
  CU_CHECK(cuMemUnmap(ptr + (kSegments - 1) * seg, seg));
  CU_CHECK(cuMemRelease(h[kSegments - 1]));
  add<<<(kSegments - 1) * e / 256, 256, 0, s>>>(as_ints(ptr), (kSegments - 1) * e, 10);
  CHECK(cudaGetLastError());
  v.resize(size_t(kSegments - 1) * e);
  CHECK(cudaMemcpyAsync(v.data(), as_ints(ptr), v.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(all_are(v, [&](size_t i) { return base + int(i) + kSegments - int(i / e) + 10; }));
  thread_sums[t][1] = checksum(v);

  CHECK(cudaStreamSynchronize(s));
  CU_CHECK(cuMemUnmap(ptr, (kSegments - 1) * seg));
  for (int k = 0; k < kSegments - 1; ++k) CU_CHECK(cuMemRelease(h[k]));
  CU_CHECK(cuMemAddressFree(ptr, seg * max_handles));
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // the primary context, current for the driver calls

  // NCCL's gate (ncclIsCuMemSupported): VMM supported on the current device.
  int vmm = 0;
  CU_CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  std::printf("virtual memory management supported: %d\n", vmm);
  EXPECT(vmm == 1);
  if (vmm != 1) {
    std::printf("FAILED (%d failures)\n", failures);
    return 1;
  }

  // NCCL asks for the minimum, ncclMemAlloc for the recommended; PyTorch
  // assumes 2 MiB without asking, so it must be a multiple.
  const CUmemAllocationProp prop = device_prop(0);
  size_t minimum = 0, recommended = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CU_CHECK(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  std::printf("granularity: minimum %zu, recommended %zu\n", minimum, recommended);
  EXPECT(minimum != 0 && recommended != 0 && recommended % minimum == 0 && kTwoMiB % minimum == 0);
  if (minimum == 0 || kTwoMiB % minimum) {
    std::printf("FAILED (%d failures)\n", failures);
    return 1;
  }

  one_device(minimum);

  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  int can = 0;
  if (count >= 2) CU_CHECK(cuDeviceCanAccessPeer(&can, 0, 1));
  if (count >= 2 && can) {
    two_devices();
  } else {
    std::printf("devices: %d, %s: not run\n", count,
                count >= 2 ? "device 0 cannot access device 1" : "no second device");
  }

  cudaDeviceProp dp = {};
  CHECK(cudaGetDeviceProperties(&dp, 0));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(expandable_segment, t, size_t(dp.totalGlobalMem));
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t)
    std::printf("expandable segment %d: grown %016llx, shrunk %016llx\n", t, (unsigned long long)thread_sums[t][0],
                (unsigned long long)thread_sums[t][1]);

  CHECK(cudaDeviceSynchronize());
  CHECK(cudaGetLastError());
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}

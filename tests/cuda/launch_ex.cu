// Launches with attributes, as Hopper libraries and Triton make them: thread
// block clusters (cudaLaunchKernelEx), cooperative launches
// (cudaLaunchCooperativeKernel and the cooperative attribute), the hints a
// launch may carry, the same shapes captured into a graph and set on a kernel
// node, and the errors CUDA gives shapes that do not fit. The kernels do not
// read their cluster: the results are the same with any shape that runs, so
// the same program must pass natively and through ordo.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

// fill through dynamic shared memory.
__global__ void fill_shared(int* p, int n, int v) {
  extern __shared__ int scratch[];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  scratch[threadIdx.x] = v + i;
  __syncthreads();
  if (i < n) p[i] = scratch[threadIdx.x];
}

namespace {

constexpr int kBlock = 256;
constexpr int kBlocks = 16;
constexpr int kN = kBlock * kBlocks;

bool filled(const int* dev, int v) {
  std::vector<int> host(kN);
  CHECK(cudaMemcpy(host.data(), dev, kN * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < kN; ++i)
    if (host[i] != v + i) return false;
  return true;
}

cudaLaunchConfig_t config(cudaStream_t s, cudaLaunchAttribute* attrs, unsigned n) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(kBlocks);
  c.blockDim = dim3(kBlock);
  c.stream = s;
  c.attrs = attrs;
  c.numAttrs = n;
  return c;
}

cudaLaunchAttribute cluster(unsigned x, unsigned y = 1, unsigned z = 1) {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = x;
  a.val.clusterDim.y = y;
  a.val.clusterDim.z = z;
  return a;
}

// Every cluster shape that divides the grid runs the whole grid; the others
// are refused by the launch itself, and the stream goes on.
void clusters(int* dev, cudaStream_t s) {
  for (unsigned x : {1u, 2u, 4u, 8u}) {
    cudaLaunchAttribute a = cluster(x);
    cudaLaunchConfig_t c = config(s, &a, 1);
    CHECK(cudaLaunchKernelEx(&c, fill, dev, kN, int(100 * x)));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(filled(dev, int(100 * x)));
  }
  for (unsigned x : {3u, 32u}) {  // does not divide 16 blocks; more than any cluster
    cudaLaunchAttribute a = cluster(x);
    cudaLaunchConfig_t c = config(s, &a, 1);
    EXPECT(cudaLaunchKernelEx(&c, fill, dev, kN, 7) == cudaErrorInvalidClusterSize);
  }
  // 16 blocks is past the portable 8 until the kernel allows more.
  cudaLaunchAttribute big = cluster(16);
  cudaLaunchConfig_t c = config(s, &big, 1);
  EXPECT(cudaLaunchKernelEx(&c, fill, dev, kN, 7) == cudaErrorInvalidClusterSize);
  CHECK(cudaFuncSetAttribute(fill, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaFuncAttributes fa = {};
  CHECK(cudaFuncGetAttributes(&fa, fill));
  EXPECT(fa.nonPortableClusterSizeAllowed == 1);
  CHECK(cudaLaunchKernelEx(&c, fill, dev, kN, 1600));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(filled(dev, 1600));
  // Hints and preferences launch as given.
  cudaLaunchAttribute hints[3] = {};
  hints[0].id = cudaLaunchAttributePriority;
  hints[0].val.priority = 0;
  hints[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  hints[1].val.programmaticStreamSerializationAllowed = 1;
  hints[2] = cluster(2, 1, 1);
  c = config(s, hints, 3);
  CHECK(cudaLaunchKernelEx(&c, fill, dev, kN, 5));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(filled(dev, 5));
}

// More than 48 KiB of dynamic shared memory, once the kernel allows it: the
// driver behind the worker must be told too.
void big_shared(int* dev, cudaStream_t s) {
  int optin = 0;
  CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const size_t smem = 64 * 1024;
  if (optin < int(smem)) {
    std::printf("device 0 allows %d bytes of shared memory per block; 64 KiB not tried\n", optin);
    return;
  }
  fill_shared<<<kBlocks, kBlock, smem, s>>>(dev, kN, 3);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(fill_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  fill_shared<<<kBlocks, kBlock, smem, s>>>(dev, kN, 3);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s));
  EXPECT(filled(dev, 3));
  // With a cluster of 2 as well, captured into a graph.
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaLaunchAttribute a = cluster(2);
  cudaLaunchConfig_t c = config(s, &a, 1);
  c.dynamicSmemBytes = smem;
  CHECK(cudaLaunchKernelEx(&c, fill_shared, dev, kN, 4));
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(filled(dev, 4));
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
}

// Occupancy with clusters, and the driver's block size search agreeing with
// the runtime's own (cudaOccupancyMaxPotentialBlockSize is a header template
// over the per-SM query).
void occupancy(cudaStream_t s) {
  cudaLaunchAttribute a = cluster(2);
  cudaLaunchConfig_t c = config(s, &a, 1);
  int clusters = 0, size = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&clusters, fill, &c));
  EXPECT(clusters >= 1);
  CHECK(cudaOccupancyMaxPotentialClusterSize(&size, fill, &c));
  EXPECT(size >= 8 && size <= 16);  // the kernel allows non-portable sizes by now
  int grid = 0, block = 0;
  CHECK(cudaOccupancyMaxPotentialBlockSize(&grid, &block, fill));
  EXPECT(grid > 0 && block > 0 && block <= 1024);
  using Search = CUresult (*)(int*, int*, CUfunction, size_t (*)(int), size_t, int);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPoint("cuOccupancyMaxPotentialBlockSize", &fn, cudaEnableDefault, &q));
  cudaFunction_t f;
  CHECK(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(fill)));
  int driver_grid = 0, driver_block = 0;
  EXPECT(reinterpret_cast<Search>(fn)(&driver_grid, &driver_block, reinterpret_cast<CUfunction>(f), nullptr, 0, 0) ==
         CUDA_SUCCESS);
  EXPECT(driver_grid == grid && driver_block == block);
  EXPECT(reinterpret_cast<Search>(fn)(&driver_grid, &driver_block, reinterpret_cast<CUfunction>(f), nullptr, 0, 96) ==
         CUDA_SUCCESS);
  EXPECT(driver_block > 0 && driver_block <= 96);
}

// A cooperative grid runs when it fits the device at once and is refused when not.
void cooperative(int* dev, cudaStream_t s) {
  int n = kN, v = 42;
  void* args[] = {&dev, &n, &v};
  CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(fill), dim3(kBlocks), dim3(kBlock), args, 0, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(filled(dev, 42));
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeCooperative;
  a.val.cooperative = 1;
  cudaLaunchConfig_t c = config(s, &a, 1);
  CHECK(cudaLaunchKernelEx(&c, fill, dev, kN, 43));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(filled(dev, 43));
  EXPECT(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(fill), dim3(1u << 20), dim3(1024), args, 0, s) ==
         cudaErrorCooperativeLaunchTooLarge);
  CHECK(cudaStreamSynchronize(s));
}

// A cluster launch on one stream, then, after an event, plain work on another
// that reads what it wrote: ordered like any launch.
void across_streams(int* dev, cudaStream_t s1, cudaStream_t s2) {
  cudaEvent_t e;
  CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (int round = 0; round < 20; ++round) {
    cudaLaunchAttribute a = cluster(4);
    cudaLaunchConfig_t c = config(s1, &a, 1);
    CHECK(cudaLaunchKernelEx(&c, fill, dev, kN, round));
    CHECK(cudaEventRecord(e, s1));
    CHECK(cudaStreamWaitEvent(s2, e, 0));
    add<<<kBlocks, kBlock, 0, s2>>>(dev, kN, 1000);
    CHECK(cudaStreamSynchronize(s2));
    EXPECT(filled(dev, round + 1000));
  }
  CHECK(cudaEventDestroy(e));
}

// Captured cluster launches keep their shape; a kernel node given one by
// attribute runs with it.
void graphs(int* dev, cudaStream_t s) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaLaunchAttribute a = cluster(2);
  cudaLaunchConfig_t c = config(s, &a, 1);
  CHECK(cudaLaunchKernelEx(&c, fill, dev, kN, 7));
  add<<<kBlocks, kBlock, 0, s>>>(dev, kN, 1);
  CHECK(cudaStreamEndCapture(s, &g));
  size_t n = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &n));
  EXPECT(n == 2);
  std::vector<cudaGraphNode_t> nodes(n);
  CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  cudaGraphNode_t first = nodes[0];
  for (cudaGraphNode_t node : nodes) {
    size_t deps = 0;
    CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &deps));
    if (deps == 0) first = node;
  }
  cudaLaunchAttributeValue got = {};
  CHECK(cudaGraphKernelNodeGetAttribute(first, cudaLaunchAttributeClusterDimension, &got));
  EXPECT(got.clusterDim.x == 2 && got.clusterDim.y == 1 && got.clusterDim.z == 1);
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(filled(dev, 8));
  }
  CHECK(cudaGraphExecDestroy(x));

  // Explicit graph: one kernel node, given a cluster of 4 by attribute.
  cudaGraph_t h;
  CHECK(cudaGraphCreate(&h, 0));
  int len = kN, v = 300;
  void* args[] = {&dev, &len, &v};
  cudaKernelNodeParams p = {};
  p.func = reinterpret_cast<void*>(fill);
  p.gridDim = dim3(kBlocks);
  p.blockDim = dim3(kBlock);
  p.kernelParams = args;
  cudaGraphNode_t k;
  CHECK(cudaGraphAddKernelNode(&k, h, nullptr, 0, &p));
  cudaLaunchAttributeValue four = {};
  four.clusterDim.x = 4;
  four.clusterDim.y = 1;
  four.clusterDim.z = 1;
  CHECK(cudaGraphKernelNodeSetAttribute(k, cudaLaunchAttributeClusterDimension, &four));
  CHECK(cudaGraphInstantiate(&x, h, 0));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(filled(dev, 300));
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(h));
  CHECK(cudaGraphDestroy(g));
}

}  // namespace

// --require: a device without clusters or cooperative launches fails the run
// instead of skipping it (the sim has both).
int main(int argc, char** argv) {
  const bool require = argc > 1 && std::strcmp(argv[1], "--require") == 0;
  int cluster_launch = 0, coop = 0;
  CHECK(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, 0));
  CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  if (!cluster_launch || !coop) {
    std::printf("%s: device 0 has no cluster (%d) or cooperative (%d) launches\n", require ? "FAIL" : "SKIP",
                cluster_launch, coop);
    return require ? 1 : 0;
  }
  int* dev = nullptr;
  CHECK(cudaMalloc(&dev, kN * sizeof(int)));
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  clusters(dev, s1);
  cooperative(dev, s1);
  big_shared(dev, s1);
  occupancy(s1);
  across_streams(dev, s1, s2);
  graphs(dev, s1);
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaFree(dev));
  std::printf("%s: %d failures\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}

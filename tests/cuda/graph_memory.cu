// CUDA graph memory: allocation and free nodes made explicitly and by
// capturing cudaMallocAsync/cudaFreeAsync (PyTorch's and JAX's stream-ordered
// allocators under CUDA graphs), CUDA's rules for them (relaunch, free,
// auto-free, no clone, no nesting, one exec at a time), memory a destroyed
// graph left, and threads capturing and destroying at once. The same program
// must pass natively and through ordo.
#include <cuda_runtime.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

namespace {

constexpr int kN = 256;
constexpr size_t kBytes = kN * sizeof(int);

bool all_equal(const int* p, int v_of_0, int step) {
  for (int i = 0; i < kN; ++i)
    if (p[i] != v_of_0 + step * i) return false;
  return true;
}

// Graph memory, explicitly: an allocation node whose address is known at
// once, kernels into it, a copy out, a free node; every launch allocates and
// frees again. Without a free node the allocation outlives the launch until
// freed, and a relaunch before that is refused (unless instantiated to free
// it itself). Such graphs cannot be cloned or instantiated twice at once.
void graph_memory_nodes() {
  std::vector<int> out(kN, -1);
  int* keep;
  CHECK(cudaMalloc(&keep, kBytes));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaMemAllocNodeParams ap = {};
  ap.poolProps.allocType = cudaMemAllocationTypePinned;
  ap.poolProps.location = {cudaMemLocationTypeDevice, 0};
  ap.bytesize = kBytes;
  cudaGraphNode_t alloc_node, fill_node, copy_node, free_node;
  CHECK(cudaGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &ap));
  int* mem = static_cast<int*>(ap.dptr);
  EXPECT(mem != nullptr);
  int n = kN, v = 70;
  void* fill_args[] = {&mem, &n, &v};
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(fill);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(kN);
  kp.kernelParams = fill_args;
  CHECK(cudaGraphAddKernelNode(&fill_node, g, &alloc_node, 1, &kp));
  CHECK(cudaGraphAddMemcpyNode1D(&copy_node, g, &fill_node, 1, keep, mem, kBytes, cudaMemcpyDeviceToDevice));
  CHECK(cudaGraphAddMemFreeNode(&free_node, g, &copy_node, 1, mem));
  cudaGraphNodeType type;
  CHECK(cudaGraphNodeGetType(alloc_node, &type));
  EXPECT(type == cudaGraphNodeTypeMemAlloc);
  CHECK(cudaGraphNodeGetType(free_node, &type));
  EXPECT(type == cudaGraphNodeTypeMemFree);
  cudaMemAllocNodeParams got = {};
  CHECK(cudaGraphMemAllocNodeGetParams(alloc_node, &got));
  EXPECT(got.dptr == mem && got.bytesize == kBytes && got.poolProps.location.id == 0);
  void* freed = nullptr;
  CHECK(cudaGraphMemFreeNodeGetParams(free_node, &freed));
  EXPECT(freed == mem);
  // What CUDA refuses: a second free node, a free node for other memory,
  // cloning the graph, losing a node.
  cudaGraphNode_t bad;
  EXPECT(cudaGraphAddMemFreeNode(&bad, g, &free_node, 1, mem) != cudaSuccess);
  EXPECT(cudaGraphAddMemFreeNode(&bad, g, &free_node, 1, keep) != cudaSuccess);
  cudaGetLastError();
  cudaGraph_t copy;
  const cudaError_t clone = cudaGraphClone(&copy, g);
  std::printf("graph memory: clone %d\n", int(clone));
  EXPECT(clone != cudaSuccess);
  cudaGetLastError();

  cudaGraphExec_t x, second;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  EXPECT(cudaGraphInstantiate(&second, g, 0) != cudaSuccess);
  cudaGetLastError();
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int round = 0; round < 3; ++round) {
    v = 70 + round;
    CHECK(cudaGraphExecKernelNodeSetParams(x, fill_node, &kp));
    CHECK(cudaGraphLaunch(x, s));  // allocated and freed within: always relaunchable
    CHECK(cudaMemcpyAsync(out.data(), keep, kBytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(all_equal(out.data(), 70 + round, 1));
  }
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));

  // No free node: the memory outlives the launch, for stream work after it.
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &ap));
  mem = static_cast<int*>(ap.dptr);
  v = 5;
  CHECK(cudaGraphAddKernelNode(&fill_node, g, &alloc_node, 1, &kp));
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaMemcpyAsync(out.data(), mem, kBytes, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(all_equal(out.data(), 5, 1));
  const cudaError_t again = cudaGraphLaunch(x, s);
  std::printf("graph memory: relaunch while allocated %d\n", int(again));
  EXPECT(again != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaFreeAsync(mem, s));
  EXPECT(cudaFreeAsync(mem, s) != cudaSuccess);  // freed already
  cudaGetLastError();
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaGraphExecDestroy(x));
  // Instantiated to free it itself, each launch frees what the last left.
  CHECK(cudaGraphInstantiate(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  // Its graph gone, the allocation the last launch left is still there until freed.
  CHECK(cudaMemcpy(out.data(), mem, kBytes, cudaMemcpyDeviceToHost));
  EXPECT(all_equal(out.data(), 5, 1));
  CHECK(cudaFree(mem));
  CHECK(cudaDeviceGraphMemTrim(0));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(keep));
}

std::atomic<bool> node_made{false};
std::atomic<bool> waited_too_long{false};
void CUDART_CB wait_for_node(void*) {
  for (int i = 0; i < 10000 && !node_made.load(); ++i) usleep(1000);
  waited_too_long = !node_made.load();
}

// What CUDA refuses of graph memory besides, and what must never wait: a
// node made while a host function waits for its maker (memory a destroyed
// graph left is reused without waiting for the device).
void graph_memory_rules() {
  cudaMemAllocNodeParams ap = {};
  ap.poolProps.allocType = cudaMemAllocationTypePinned;
  ap.poolProps.location = {cudaMemLocationTypeDevice, 0};
  ap.bytesize = kBytes;
  // Memory of a graph destroyed before any launch is not allocated: no free.
  cudaGraph_t g;
  cudaGraphNode_t alloc_node, free_node;
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &ap));
  void* gone = ap.dptr;
  CHECK(cudaGraphDestroy(g));
  EXPECT(cudaFree(gone) != cudaSuccess);
  cudaGetLastError();
  // A free node ordered before its allocation node.
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &ap));
  CHECK(cudaGraphAddMemFreeNode(&free_node, g, nullptr, 0, ap.dptr));
  CHECK(cudaGraphAddDependencies(g, &free_node, &alloc_node, nullptr, 1));
  cudaGraphExec_t x;
  EXPECT(cudaGraphInstantiate(&x, g, 0) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaGraphDestroy(g));
  // No memory nodes in a child graph (CUDA nests those only by moving them).
  cudaGraph_t parent, child, inner;
  cudaGraphNode_t child_node, bad;
  CHECK(cudaGraphCreate(&parent, 0));
  CHECK(cudaGraphCreate(&child, 0));
  CHECK(cudaGraphAddEmptyNode(&bad, child, nullptr, 0));
  CHECK(cudaGraphAddChildGraphNode(&child_node, parent, nullptr, 0, child));
  CHECK(cudaGraphChildGraphNodeGetGraph(child_node, &inner));
  EXPECT(cudaGraphAddMemAllocNode(&bad, inner, nullptr, 0, &ap) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaGraphDestroy(parent));
  CHECK(cudaGraphDestroy(child));
  // A node made while another stream's host function waits for it.
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaLaunchHostFunc(s, wait_for_node, nullptr));
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &ap));
  node_made = true;
  CHECK(cudaStreamSynchronize(s));
  EXPECT(!waited_too_long);
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaDeviceGraphMemTrim(0));
}

// Graph memory by capture, as PyTorch's and JAX's stream-ordered allocators
// make it: cudaMallocAsync and cudaFreeAsync on a capturing stream become
// allocation and free nodes.
void graph_memory_captured() {
  std::vector<int> out(kN, -1);
  int* keep;
  CHECK(cudaMalloc(&keep, kBytes));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int n = kN;
  int v = 11;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  int* mem = nullptr;
  CHECK(cudaMallocAsync(&mem, kBytes, s));
  EXPECT(mem != nullptr);
  fill<<<1, kN, 0, s>>>(mem, n, v);
  add<<<1, kN, 0, s>>>(mem, n, 1000);
  CHECK(cudaMemcpyAsync(keep, mem, kBytes, cudaMemcpyDeviceToDevice, s));
  CHECK(cudaFreeAsync(mem, s));
  cudaGraph_t g;
  CHECK(cudaStreamEndCapture(s, &g));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
  int allocs = 0, frees = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(node, &type));
    allocs += type == cudaGraphNodeTypeMemAlloc;
    frees += type == cudaGraphNodeTypeMemFree;
  }
  EXPECT(count == 5 && allocs == 1 && frees == 1);
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int round = 0; round < 3; ++round) {
    CHECK(cudaMemsetAsync(keep, 0, kBytes, s));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaMemcpyAsync(out.data(), keep, kBytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(all_equal(out.data(), 1011, 1));
  }
  unsigned long long used = 0;
  CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
  EXPECT(used >= kBytes);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaDeviceGraphMemTrim(0));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(keep));
}

// Threads capturing stream-ordered allocations at once, launching and
// destroying graphs and execs in either order (with launches in flight):
// allocations made, reused and freed under the graph lock and the graph
// memory's, which once deadlocked here.
void graph_memory_threads() {
  std::atomic<int> wrong{0};
  auto work = [&wrong](int t) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int* keep;
    CHECK(cudaMalloc(&keep, kBytes));
    std::vector<int> out(kN);
    for (int it = 0; it < 12; ++it) {
      const int v = t * 1000 + it;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      int* mem = nullptr;
      CHECK(cudaMallocAsync(&mem, kBytes + size_t(it) * 64, s));
      fill<<<1, kN, 0, s>>>(mem, kN, v);
      CHECK(cudaMemcpyAsync(keep, mem, kBytes, cudaMemcpyDeviceToDevice, s));
      CHECK(cudaFreeAsync(mem, s));
      cudaGraph_t g;
      CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t x;
      CHECK(cudaGraphInstantiate(&x, g, 0));
      if (it & 1) CHECK(cudaGraphDestroy(g));
      CHECK(cudaGraphLaunch(x, s));
      CHECK(cudaGraphLaunch(x, s));
      if (it & 2) CHECK(cudaGraphExecDestroy(x));
      CHECK(cudaMemcpyAsync(out.data(), keep, kBytes, cudaMemcpyDeviceToHost, s));
      CHECK(cudaStreamSynchronize(s));
      if (!all_equal(out.data(), v, 1)) ++wrong;
      if (!(it & 2)) CHECK(cudaGraphExecDestroy(x));
      if (!(it & 1)) CHECK(cudaGraphDestroy(g));
    }
    CHECK(cudaFree(keep));
    CHECK(cudaStreamDestroy(s));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();
  EXPECT(wrong == 0);
  CHECK(cudaDeviceGraphMemTrim(0));
}

}  // namespace

int main() {
  graph_memory_nodes();
  graph_memory_captured();
  graph_memory_rules();
  graph_memory_threads();
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}

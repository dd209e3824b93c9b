// CUDA graphs as PyTorch, JAX and the CUDA samples use them: stream capture
// (fork and join through events, the capture queries, the calls capture
// forbids), the explicit graph API (kernel, memset, memcpy, host, event,
// child-graph and empty nodes; memory nodes are graph_memory.cu's),
// instantiate, launch, updating an exec in place, user objects and kernel
// node attributes. The same program must pass
// natively and through ordo.
#include <cuda_runtime.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

namespace {

constexpr int kN = 256;
constexpr size_t kBytes = kN * sizeof(int);

size_t node_count(cudaGraph_t g) {
  size_t n = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &n));
  return n;
}

bool all_equal(const int* p, int v_of_0, int step) {
  for (int i = 0; i < kN; ++i)
    if (p[i] != v_of_0 + step * i) return false;
  return true;
}

// Capture of copies and kernels on one stream: nothing runs while capturing;
// every launch of the exec runs the whole sequence again, reading its host
// input when it runs.
void capture_one_stream() {
  int *host, *dev;
  CHECK(cudaMallocHost(&host, 2 * kBytes));
  CHECK(cudaMalloc(&dev, kBytes));
  int* in = host;
  int* out = host + kN;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < kN; ++i) in[i] = i, out[i] = -7;

  cudaStreamCaptureStatus status;
  CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusActive);
  unsigned long long id = 0;
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id));
  EXPECT(status == cudaStreamCaptureStatusActive && id != 0);
  CHECK(cudaMemcpyAsync(dev, in, kBytes, cudaMemcpyHostToDevice, s));
  add<<<1, kN, 0, s>>>(dev, kN, 1000);
  CHECK(cudaGetLastError());
  CHECK(cudaMemsetAsync(dev + kN / 2, 0, kBytes / 2, s));
  CHECK(cudaMemcpyAsync(out, dev, kBytes, cudaMemcpyDeviceToHost, s));
  cudaGraph_t g;
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);
  EXPECT(node_count(g) == 4);
  CHECK(cudaStreamSynchronize(s));
  EXPECT(out[0] == -7);  // captured, not run

  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kN; ++i) in[i] = round * 10 + i;
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    bool ok = true;
    for (int i = 0; i < kN; ++i) ok &= out[i] == (i < kN / 2 ? round * 10 + i + 1000 : 0);
    EXPECT(ok);
  }
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(dev));
  CHECK(cudaFreeHost(host));
}

// A capture that forks to another stream and joins back through events; the
// forked branch runs between the fork and the join.
void capture_fork_join() {
  int* dev;
  CHECK(cudaMalloc(&dev, 2 * kBytes));
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreate(&s1));
  CHECK(cudaStreamCreate(&s2));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
  fill<<<1, kN, 0, s1>>>(dev, kN, 5);
  CHECK(cudaEventRecord(fork, s1));
  CHECK(cudaStreamWaitEvent(s2, fork, 0));
  cudaStreamCaptureStatus status;
  CHECK(cudaStreamIsCapturing(s2, &status));
  EXPECT(status == cudaStreamCaptureStatusActive);  // s2 joined the capture
  fill<<<1, kN, 0, s2>>>(dev + kN, kN, 100);
  add<<<1, kN, 0, s1>>>(dev, kN, 1);
  add<<<1, kN, 0, s2>>>(dev + kN, kN, 2);
  CHECK(cudaEventRecord(join, s2));
  CHECK(cudaStreamWaitEvent(s1, join, 0));
  cudaGraph_t g;
  CHECK(cudaStreamEndCapture(s1, &g));
  EXPECT(node_count(g) == 4);
  size_t edges = 0;
  CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  EXPECT(edges == 3);  // fill1 -> add1, fill1 -> fill2 -> add2
  CHECK(cudaStreamIsCapturing(s2, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);

  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiateWithFlags(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  CHECK(cudaGraphLaunch(x, s1));
  std::vector<int> host(2 * kN);
  CHECK(cudaMemcpyAsync(host.data(), dev, 2 * kBytes, cudaMemcpyDeviceToHost, s1));
  CHECK(cudaStreamSynchronize(s1));
  EXPECT(all_equal(host.data(), 6, 1));
  EXPECT(all_equal(host.data() + kN, 102, 1));

  // A fork that never joins back: the end of the capture fails and gives no graph.
  CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  CHECK(cudaEventRecord(fork, s1));
  CHECK(cudaStreamWaitEvent(s2, fork, 0));
  fill<<<1, kN, 0, s2>>>(dev, kN, 0);
  cudaGraph_t bad = reinterpret_cast<cudaGraph_t>(1);
  EXPECT(cudaStreamEndCapture(s1, &bad) == cudaErrorStreamCaptureUnjoined);
  EXPECT(bad == nullptr);
  cudaGetLastError();
  CHECK(cudaStreamIsCapturing(s2, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);

  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(fork));
  CHECK(cudaEventDestroy(join));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaFree(dev));
}

// What capture forbids fails and invalidates the capture; the end of the
// capture then reports it.
void capture_forbidden() {
  int* dev;
  CHECK(cudaMalloc(&dev, kBytes));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;

  // The legacy stream cannot be captured.
  EXPECT(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();

  // Waiting for a capturing stream.
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  fill<<<1, kN, 0, s>>>(dev, kN, 1);
  EXPECT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status;
  CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusInvalidated);
  EXPECT(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  EXPECT(g == nullptr);
  cudaGetLastError();

  // cudaMalloc during a global-mode capture of this thread; allowed once the
  // thread's mode is relaxed.
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  EXPECT(mode == cudaStreamCaptureModeGlobal);
  int* more = nullptr;
  EXPECT(cudaMalloc(&more, 64) == cudaSuccess);
  CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  fill<<<1, kN, 0, s>>>(dev, kN, 1);
  CHECK(cudaStreamEndCapture(s, &g));  // still valid
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(more));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  EXPECT(cudaMalloc(&more, 64) == cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();
  EXPECT(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();

  // Legacy-stream work while a blocking stream captures would depend on the capture.
  cudaStream_t blocking;
  CHECK(cudaStreamCreate(&blocking));
  CHECK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
  EXPECT(cudaMemsetAsync(dev, 0, kBytes, cudaStreamLegacy) == cudaErrorStreamCaptureImplicit);
  cudaGetLastError();
  EXPECT(cudaStreamEndCapture(blocking, &g) == cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  // Capturing a stream twice; ending a capture that never began.
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess);
  cudaGetLastError();
  if (cudaStreamEndCapture(s, &g) == cudaSuccess) CHECK(cudaGraphDestroy(g));
  cudaGetLastError();
  EXPECT(cudaStreamEndCapture(s, &g) != cudaSuccess);
  cudaGetLastError();

  CHECK(cudaStreamDestroy(blocking));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(dev));
}

// A capture that another thread's work joins: thread B waits on the fork
// event, launches on its own stream (which joins the capture) and records the
// join; the origin's thread ends the capture. B's kernel is in the graph and
// runs between the fork and the join at every launch.
void capture_across_threads() {
  int* dev;
  CHECK(cudaMalloc(&dev, kBytes));
  cudaStream_t origin, other;
  CHECK(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  CHECK(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal));
  fill<<<1, kN, 0, origin>>>(dev, kN, 1);
  CHECK(cudaEventRecord(fork, origin));
  std::thread b([&] {
    CHECK(cudaStreamWaitEvent(other, fork, 0));
    add<<<1, kN, 0, other>>>(dev, kN, 100);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(join, other));
  });
  b.join();
  CHECK(cudaStreamWaitEvent(origin, join, 0));
  add<<<1, kN, 0, origin>>>(dev, kN, 10000);
  cudaGraph_t g;
  CHECK(cudaStreamEndCapture(origin, &g));
  EXPECT(node_count(g) == 3);
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  std::vector<int> out(kN);
  for (int round = 0; round < 2; ++round) {
    CHECK(cudaGraphLaunch(x, other));
    CHECK(cudaMemcpyAsync(out.data(), dev, kBytes, cudaMemcpyDeviceToHost, other));
    CHECK(cudaStreamSynchronize(other));
    EXPECT(all_equal(out.data(), 10101, 1));
  }
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(fork));
  CHECK(cudaEventDestroy(join));
  CHECK(cudaStreamDestroy(origin));
  CHECK(cudaStreamDestroy(other));
  CHECK(cudaFree(dev));
}

std::atomic<int> host_calls{0};
void CUDART_CB count_call(void* arg) { host_calls += *static_cast<int*>(arg); }

// The explicit API: memset -> fill -> child graph (add) -> host node, and a
// memcpy node to the host, with an event record node; updates of the exec.
void explicit_graph() {
  int* dev;
  CHECK(cudaMalloc(&dev, kBytes));
  std::vector<int> out(kN);
  cudaGraph_t g, child;
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphCreate(&child, 0));

  cudaMemsetParams ms = {};
  ms.dst = dev;
  ms.value = 0x7f;
  ms.elementSize = 4;
  ms.width = kN;
  ms.height = 1;
  cudaGraphNode_t set_node, fill_node, child_node, host_node, copy_node, add_node, empty_node, record_node;
  CHECK(cudaGraphAddMemsetNode(&set_node, g, nullptr, 0, &ms));

  int n = kN, v = 40;
  void* fill_args[] = {&dev, &n, &v};
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(fill);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(kN);
  kp.kernelParams = fill_args;
  CHECK(cudaGraphAddKernelNode(&fill_node, g, &set_node, 1, &kp));

  int a = 3;
  void* add_args[] = {&dev, &n, &a};
  cudaKernelNodeParams ap = kp;
  ap.func = reinterpret_cast<void*>(add);
  ap.kernelParams = add_args;
  CHECK(cudaGraphAddKernelNode(&add_node, child, nullptr, 0, &ap));
  CHECK(cudaGraphAddEmptyNode(&empty_node, child, &add_node, 1));
  CHECK(cudaGraphAddChildGraphNode(&child_node, g, &fill_node, 1, child));

  int weight = 1;
  cudaHostNodeParams hp = {count_call, &weight};
  CHECK(cudaGraphAddHostNode(&host_node, g, &child_node, 1, &hp));
  CHECK(cudaGraphAddMemcpyNode1D(&copy_node, g, &child_node, 1, out.data(), dev, kBytes, cudaMemcpyDeviceToHost));
  cudaEvent_t done;
  CHECK(cudaEventCreate(&done));
  cudaGraphNode_t both[] = {host_node, copy_node};
  CHECK(cudaGraphAddEventRecordNode(&record_node, g, both, 2, done));
  EXPECT(node_count(g) == 6);
  size_t roots = 0;
  CHECK(cudaGraphGetRootNodes(g, nullptr, &roots));
  EXPECT(roots == 1);
  cudaGraphNodeType type;
  CHECK(cudaGraphNodeGetType(child_node, &type));
  EXPECT(type == cudaGraphNodeTypeGraph);

  cudaKernelNodeParams got = {};
  CHECK(cudaGraphKernelNodeGetParams(fill_node, &got));
  EXPECT(got.blockDim.x == unsigned(kN) && got.kernelParams && *static_cast<int*>(got.kernelParams[2]) == 40);

  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaEventSynchronize(done));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(all_equal(out.data(), 43, 1));
  EXPECT(host_calls == 1);

  // The exec's own copy of a node's parameters.
  v = 500;
  CHECK(cudaGraphExecKernelNodeSetParams(x, fill_node, &kp));
  weight = 10;
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(all_equal(out.data(), 503, 1));
  EXPECT(host_calls == 11);

  // A disabled kernel node does not run: the memset's pattern stays.
  CHECK(cudaGraphNodeSetEnabled(x, fill_node, 0));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(out[0] == 0x7f + 3);
  CHECK(cudaGraphNodeSetEnabled(x, fill_node, 1));

  // Whole-graph update from a graph of the same shape with other parameters.
  cudaGraph_t copy;
  CHECK(cudaGraphClone(&copy, g));
  cudaGraphNode_t fill_in_copy;
  CHECK(cudaGraphNodeFindInClone(&fill_in_copy, fill_node, copy));
  v = 7000;
  CHECK(cudaGraphKernelNodeSetParams(fill_in_copy, &kp));
  cudaGraphExecUpdateResultInfo info;
  CHECK(cudaGraphExecUpdate(x, copy, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess);
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(all_equal(out.data(), 7003, 1));
  // Not the same shape: refused, the exec unchanged.
  cudaGraphNode_t extra;
  CHECK(cudaGraphAddEmptyNode(&extra, copy, nullptr, 0));
  EXPECT(cudaGraphExecUpdate(x, copy, &info) == cudaErrorGraphExecUpdateFailure);
  EXPECT(info.result != cudaGraphExecUpdateSuccess);
  cudaGetLastError();
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(all_equal(out.data(), 7003, 1));

  // A cycle cannot be instantiated (if the edge that makes it is taken at all).
  cudaGraphExec_t never;
  cudaGraphNode_t rec_in_copy, set_in_copy;
  CHECK(cudaGraphNodeFindInClone(&rec_in_copy, record_node, copy));
  CHECK(cudaGraphNodeFindInClone(&set_in_copy, set_node, copy));
  if (cudaGraphAddDependencies(copy, &rec_in_copy, &set_in_copy, nullptr, 1) == cudaSuccess)
    EXPECT(cudaGraphInstantiate(&never, copy, 0) != cudaSuccess);
  cudaGetLastError();

  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(copy));
  CHECK(cudaGraphDestroy(child));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(done));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(dev));
}

// Launches of one exec on three streams (the default stream one of them) run
// one after the other, as CUDA orders them: each launch's add sees the last's.
// The exec outlives its graph; a node of another graph names nothing in it.
void exec_launches_in_order() {
  int* dev;
  CHECK(cudaMalloc(&dev, kBytes));
  CHECK(cudaMemset(dev, 0, kBytes));
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  add<<<1, kN, 0, s1>>>(dev, kN, 1);
  CHECK(cudaStreamEndCapture(s1, &g));
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphDestroy(g));
  for (int i = 0; i < 21; ++i) CHECK(cudaGraphLaunch(x, i % 3 == 0 ? cudaStream_t(0) : i % 3 == 1 ? s1 : s2));
  CHECK(cudaDeviceSynchronize());
  std::vector<int> out(kN);
  CHECK(cudaMemcpy(out.data(), dev, kBytes, cudaMemcpyDeviceToHost));
  EXPECT(all_equal(out.data(), 21, 0));
  cudaGraph_t other;
  CHECK(cudaGraphCreate(&other, 0));
  int n = kN, v = 1;
  void* args[] = {&dev, &n, &v};
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(add);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(kN);
  kp.kernelParams = args;
  cudaGraphNode_t stranger;
  CHECK(cudaGraphAddKernelNode(&stranger, other, nullptr, 0, &kp));
  EXPECT(cudaGraphExecKernelNodeSetParams(x, stranger, &kp) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaGraphDestroy(other));
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaFree(dev));
}

std::atomic<int> destroyed{0};
void CUDART_CB destroy_object(void* p) { destroyed += *static_cast<int*>(p); }

// A user object the graph holds goes once the graph and every exec made from
// it are gone (the exec's after its launches ran); a kernel node's attributes
// are kept; the graph can be printed for debugging.
void user_objects_and_attributes() {
  int* dev;
  CHECK(cudaMalloc(&dev, kBytes));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  fill<<<1, kN, 0, s>>>(dev, kN, 9);
  CHECK(cudaStreamEndCapture(s, &g));
  static int weight = 1;
  cudaUserObject_t obj;
  CHECK(cudaUserObjectCreate(&obj, &weight, destroy_object, 1, cudaUserObjectNoDestructorSync));
  CHECK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));

  cudaGraphNode_t node;
  size_t one = 1;
  CHECK(cudaGraphGetNodes(g, &node, &one));
  cudaKernelNodeAttrValue v = {};
  v.priority = 1;
  CHECK(cudaGraphKernelNodeSetAttribute(node, cudaKernelNodeAttributePriority, &v));
  cudaKernelNodeAttrValue got = {};
  CHECK(cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributePriority, &got));
  EXPECT(got.priority == 1);
  char path[] = "/tmp/ordo-graph-dot-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT(fd >= 0);
  if (fd >= 0) {
    close(fd);
    CHECK(cudaGraphDebugDotPrint(g, path, 0));
    char head[16] = {};
    FILE* f = std::fopen(path, "r");
    EXPECT(f && std::fread(head, 1, 7, f) == 7 && std::strncmp(head, "digraph", 7) == 0);
    if (f) std::fclose(f);
    unlink(path);
  }

  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(destroyed == 0);  // the exec still holds it
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < 1000 && destroyed == 0; ++i) usleep(1000);  // CUDA destroys it asynchronously
  EXPECT(destroyed == 1);
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(dev));
}

}  // namespace

int main() {
  capture_one_stream();
  capture_fork_join();
  capture_across_threads();
  capture_forbidden();
  explicit_graph();
  exec_launches_in_order();
  user_objects_and_attributes();
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}

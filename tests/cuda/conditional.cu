// Conditional graph nodes as XLA's command buffers and PyTorch's captured
// torch.cond use them: IF (with and without ELSE), WHILE and SWITCH nodes
// whose value a kernel of the same launch sets (cudaGraphSetConditional),
// nested, made with the explicit API and by capture into a body
// (cudaStreamBeginCaptureToGraph), default values, updates, and what CUDA
// refuses. The same program must pass natively and through ordo.
//
//   conditional            the functional cases
//   conditional N [US]     the seed scenario over N rounds with thread A's
//                          work a conditional graph (a WHILE inside an IF
//                          running a slow copy twice); prints its violations
//                          and exits 1 if there was any
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

// Sets `h` to *p (twins.cc: _Z9set_valueyPKi).
__global__ void set_value(cudaGraphConditionalHandle h, const int* p) { cudaGraphSetConditional(h, unsigned(*p)); }

// Counts *counter down and keeps `h` set while it is positive (twins.cc: _Z9countdownyPi).
__global__ void countdown(cudaGraphConditionalHandle h, int* counter) {
  const int left = --*counter;
  cudaGraphSetConditional(h, left > 0 ? 1 : 0);
}

namespace {

constexpr int kN = 64;
constexpr size_t kBytes = kN * sizeof(int);

cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t* deps, size_t n, void* fn, void** args,
                            unsigned threads = 1) {
  cudaGraphNodeParams p = {};
  p.type = cudaGraphNodeTypeKernel;
  p.kernel.func = fn;
  p.kernel.gridDim = dim3(1);
  p.kernel.blockDim = dim3(threads);
  p.kernel.kernelParams = args;
  cudaGraphNode_t node;
  CHECK(cudaGraphAddNode(&node, g, deps, nullptr, n, &p));
  return node;
}

// A conditional node of `type` with `size` bodies; their graphs in *bodies.
cudaGraphNode_t cond_node(cudaGraph_t g, const cudaGraphNode_t* deps, size_t n, cudaGraphConditionalHandle h,
                          cudaGraphConditionalNodeType type, unsigned size, std::vector<cudaGraph_t>* bodies) {
  cudaGraphNodeParams p = {};
  p.type = cudaGraphNodeTypeConditional;
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = size;
  cudaGraphNode_t node;
  CHECK(cudaGraphAddNode(&node, g, deps, nullptr, n, &p));
  bodies->assign(p.conditional.phGraph_out, p.conditional.phGraph_out + size);
  return node;
}

int read0(const int* dev) {
  int v = 0;
  CHECK(cudaMemcpy(&v, dev, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

void set0(int* dev, int v) { CHECK(cudaMemcpy(dev, &v, sizeof v, cudaMemcpyHostToDevice)); }

// IF, then IF/ELSE: a kernel sets the value from device memory, so each launch
// takes the branch the memory says at the time it runs.
void if_else() {
  int *flag, *data;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&data, kBytes));
  CHECK(cudaMemset(data, 0, kBytes));
  for (unsigned size : {1u, 2u}) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g));
    void* set_args[] = {&h, &flag};
    cudaGraphNode_t setter = kernel_node(g, nullptr, 0, reinterpret_cast<void*>(set_value), set_args);
    std::vector<cudaGraph_t> bodies;
    cond_node(g, &setter, 1, h, cudaGraphCondTypeIf, size, &bodies);
    EXPECT(bodies.size() == size);
    int n = kN, then_v = 1, else_v = 100;
    void* then_args[] = {&data, &n, &then_v};
    void* else_args[] = {&data, &n, &else_v};
    kernel_node(bodies[0], nullptr, 0, reinterpret_cast<void*>(add), then_args, kN);
    if (size == 2) kernel_node(bodies[1], nullptr, 0, reinterpret_cast<void*>(add), else_args, kN);
    cudaGraphNodeType type;
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    EXPECT(count == 2);
    std::vector<cudaGraphNode_t> nodes(count);
    CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
    CHECK(cudaGraphNodeGetType(nodes[1], &type));
    EXPECT(type == cudaGraphNodeTypeConditional);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaMemset(data, 0, kBytes));
    const int flags[] = {1, 0, 1, 1, 0};
    int expect = 0;
    for (int f : flags) {
      set0(flag, f);
      CHECK(cudaGraphLaunch(x, 0));
      expect += f ? then_v : size == 2 ? else_v : 0;
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<int> out(kN);
    CHECK(cudaMemcpy(out.data(), data, kBytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < kN; ++i) EXPECT(out[i] == expect);
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
  }
  CHECK(cudaFree(flag));
  CHECK(cudaFree(data));
}

// WHILE with a default value: the body runs until its own kernel clears the
// value; a value of 0 at the start runs it never.
void while_loop() {
  int *counter, *data;
  CHECK(cudaMalloc(&counter, sizeof(int)));
  CHECK(cudaMalloc(&data, kBytes));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
  std::vector<cudaGraph_t> body;
  cond_node(g, nullptr, 0, h, cudaGraphCondTypeWhile, 1, &body);
  int n = kN, one = 1;
  void* add_args[] = {&data, &n, &one};
  cudaGraphNode_t a = kernel_node(body[0], nullptr, 0, reinterpret_cast<void*>(add), add_args, kN);
  void* down_args[] = {&h, &counter};
  kernel_node(body[0], &a, 1, reinterpret_cast<void*>(countdown), down_args);
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int rounds : {5, 1, 3}) {
    CHECK(cudaMemset(data, 0, kBytes));
    set0(counter, rounds);
    CHECK(cudaGraphLaunch(x, 0));
    CHECK(cudaDeviceSynchronize());
    EXPECT(read0(data) == rounds);
    EXPECT(read0(counter) == 0);
  }
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));

  // Default 0: the body never runs.
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, cudaGraphCondAssignDefault));
  cond_node(g, nullptr, 0, h, cudaGraphCondTypeWhile, 1, &body);
  kernel_node(body[0], nullptr, 0, reinterpret_cast<void*>(add), add_args, kN);
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaMemset(data, 0, kBytes));
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaDeviceSynchronize());
  EXPECT(read0(data) == 0);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(counter));
  CHECK(cudaFree(data));
}

// SWITCH: body n for value n; a value past the last body runs none.
void switch_node() {
  int *value, *data;
  CHECK(cudaMalloc(&value, sizeof(int)));
  CHECK(cudaMalloc(&data, kBytes));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CHECK(cudaGraphConditionalHandleCreate(&h, g));
  void* set_args[] = {&h, &value};
  cudaGraphNode_t setter = kernel_node(g, nullptr, 0, reinterpret_cast<void*>(set_value), set_args);
  std::vector<cudaGraph_t> bodies;
  cond_node(g, &setter, 1, h, cudaGraphCondTypeSwitch, 3, &bodies);
  int n = kN, vs[3] = {1, 10, 100};
  void* args[3][3] = {{&data, &n, &vs[0]}, {&data, &n, &vs[1]}, {&data, &n, &vs[2]}};
  for (int i = 0; i < 3; ++i) kernel_node(bodies[i], nullptr, 0, reinterpret_cast<void*>(add), args[i], kN);
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaMemset(data, 0, kBytes));
  for (int v : {2, 0, 7, 1, 2, 3}) {
    set0(value, v);
    CHECK(cudaGraphLaunch(x, 0));
  }
  CHECK(cudaDeviceSynchronize());
  EXPECT(read0(data) == 100 + 1 + 10 + 100);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(value));
  CHECK(cudaFree(data));
}

// An IF whose body holds a WHILE (its handle made on the body) and a memset
// and a copy; a handle of the outer graph used inside the body.
void nested() {
  int *flag, *counter, *data, *copy;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&counter, sizeof(int)));
  CHECK(cudaMalloc(&data, kBytes));
  CHECK(cudaMalloc(&copy, kBytes));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle outer;
  CHECK(cudaGraphConditionalHandleCreate(&outer, g));
  void* set_args[] = {&outer, &flag};
  cudaGraphNode_t setter = kernel_node(g, nullptr, 0, reinterpret_cast<void*>(set_value), set_args);
  std::vector<cudaGraph_t> then;
  cond_node(g, &setter, 1, outer, cudaGraphCondTypeIf, 1, &then);
  // In the body: zero the data, count to 4 in a WHILE, copy it out.
  cudaMemsetParams m = {};
  m.dst = data;
  m.value = 0;
  m.elementSize = 4;
  m.width = kN;
  m.height = 1;
  cudaGraphNode_t zero;
  CHECK(cudaGraphAddMemsetNode(&zero, then[0], nullptr, 0, &m));
  int four = 4, n = kN, one = 1;
  void* init_args[] = {&counter, &one, &four};  // fill(counter, 1, 4): counter[0] = 4
  cudaGraphNode_t init = kernel_node(then[0], &zero, 1, reinterpret_cast<void*>(fill), init_args);
  cudaGraphConditionalHandle inner;
  CHECK(cudaGraphConditionalHandleCreate(&inner, then[0], 1, cudaGraphCondAssignDefault));
  std::vector<cudaGraph_t> loop;
  cudaGraphNode_t w = cond_node(then[0], &init, 1, inner, cudaGraphCondTypeWhile, 1, &loop);
  void* add_args[] = {&data, &n, &one};
  cudaGraphNode_t a = kernel_node(loop[0], nullptr, 0, reinterpret_cast<void*>(add), add_args, kN);
  void* down_args[] = {&inner, &counter};
  kernel_node(loop[0], &a, 1, reinterpret_cast<void*>(countdown), down_args);
  cudaGraphNode_t cp;
  CHECK(cudaGraphAddMemcpyNode1D(&cp, then[0], &w, 1, copy, data, kBytes, cudaMemcpyDeviceToDevice));
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaMemset(copy, 0, kBytes));
  set0(flag, 0);
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaDeviceSynchronize());
  EXPECT(read0(copy) == 0);
  set0(flag, 1);
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaDeviceSynchronize());
  std::vector<int> out(kN);
  CHECK(cudaMemcpy(out.data(), copy, kBytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < kN; ++i) EXPECT(out[i] == 4);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  for (int* p : {flag, counter, data, copy}) CHECK(cudaFree(p));
}

// PyTorch's way: while stream s captures, a conditional node is added to
// the capture's graph and its body captured from another stream
// (cudaStreamBeginCaptureToGraph); the capture then goes on after it.
void captured_body() {
  int *flag, *data;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&data, kBytes));
  cudaStream_t s, body_stream;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&body_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  fill<<<1, kN, 0, s>>>(data, kN, 0);
  cudaStreamCaptureStatus status;
  cudaGraph_t g;
  const cudaGraphNode_t* deps;
  size_t ndeps;
  CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &g, &deps, nullptr, &ndeps));
  EXPECT(status == cudaStreamCaptureStatusActive && ndeps == 1);
  cudaGraphConditionalHandle h;
  CHECK(cudaGraphConditionalHandleCreate(&h, g));
  set_value<<<1, 1, 0, s>>>(h, flag);
  CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &g, &deps, nullptr, &ndeps));
  std::vector<cudaGraph_t> body;
  cudaGraphNode_t node = cond_node(g, deps, ndeps, h, cudaGraphCondTypeIf, 1, &body);
  CHECK(cudaStreamUpdateCaptureDependencies(s, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
  CHECK(cudaStreamBeginCaptureToGraph(body_stream, body[0], nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal));
  add<<<1, kN, 0, body_stream>>>(data, kN, 1000);
  cudaGraph_t ended;
  CHECK(cudaStreamEndCapture(body_stream, &ended));
  EXPECT(ended == body[0]);
  add<<<1, kN, 0, s>>>(data, kN, 1);
  cudaGraph_t captured;
  CHECK(cudaStreamEndCapture(s, &captured));
  EXPECT(captured == g);
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, captured, 0));
  for (int f : {1, 0}) {
    set0(flag, f);
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    std::vector<int> out(kN);
    CHECK(cudaMemcpy(out.data(), data, kBytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < kN; ++i) EXPECT(out[i] == i + 1 + (f ? 1000 : 0));
  }
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(captured));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(body_stream));
  CHECK(cudaFree(flag));
  CHECK(cudaFree(data));
}

// An exec updated from a graph of the same shape takes the new kernels'
// arguments, bodies included; another shape is refused.
void update() {
  int *flag, *data;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&data, kBytes));
  auto make = [&](int v, bool extra, cudaGraph_t* out) {
    CHECK(cudaGraphCreate(out, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, *out, 1, cudaGraphCondAssignDefault));
    std::vector<cudaGraph_t> body;
    cond_node(*out, nullptr, 0, h, cudaGraphCondTypeIf, 1, &body);
    static int n = kN;
    static int vs[2];
    vs[extra] = v;
    void* args[] = {&data, &n, &vs[extra]};
    cudaGraphNode_t k = kernel_node(body[0], nullptr, 0, reinterpret_cast<void*>(add), args, kN);
    if (extra) kernel_node(body[0], &k, 1, reinterpret_cast<void*>(add), args, kN);
  };
  cudaGraph_t g1, g2, g3;
  make(1, false, &g1);
  make(50, false, &g2);
  make(7, true, &g3);
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g1, 0));
  CHECK(cudaMemset(data, 0, kBytes));
  CHECK(cudaGraphLaunch(x, 0));
  cudaGraphExecUpdateResultInfo info;
  CHECK(cudaGraphExecUpdate(x, g2, &info));
  CHECK(cudaGraphLaunch(x, 0));
  EXPECT(cudaGraphExecUpdate(x, g3, &info) == cudaErrorGraphExecUpdateFailure);
  cudaGetLastError();
  CHECK(cudaDeviceSynchronize());
  EXPECT(read0(data) == 51);
  CHECK(cudaGraphExecDestroy(x));
  for (cudaGraph_t g : {g1, g2, g3}) CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(flag));
  CHECK(cudaFree(data));
}

// A body's nodes edited through the parent's exec, as XLA updates its
// command buffers: a kernel's arguments, a node disabled; edges that point
// from a node to one made before it; an empty ELSE; and a cycle in a body,
// which instantiation refuses.
void body_edits() {
  int* data;
  CHECK(cudaMalloc(&data, kBytes));
  CHECK(cudaMemset(data, 0, kBytes));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
  std::vector<cudaGraph_t> bodies;
  cond_node(g, nullptr, 0, h, cudaGraphCondTypeIf, 2, &bodies);  // bodies[1], the ELSE, stays empty
  int n = kN, ten = 10, one = 1, five = 5;
  void* b_args[] = {&data, &n, &ten};
  void* a_args[] = {&data, &n, &one};
  cudaGraphNode_t b = kernel_node(bodies[0], nullptr, 0, reinterpret_cast<void*>(add), b_args, kN);
  cudaGraphNode_t a = kernel_node(bodies[0], nullptr, 0, reinterpret_cast<void*>(add), a_args, kN);
  CHECK(cudaGraphAddDependencies(bodies[0], &a, &b, nullptr, 1));  // a, made after b, runs first
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaDeviceSynchronize());
  EXPECT(read0(data) == 11);
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(add);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(kN);
  void* five_args[] = {&data, &n, &five};
  kp.kernelParams = five_args;
  CHECK(cudaGraphExecKernelNodeSetParams(x, a, &kp));
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaDeviceSynchronize());
  EXPECT(read0(data) == 26);
  CHECK(cudaGraphNodeSetEnabled(x, b, 0));
  unsigned enabled = 1;
  CHECK(cudaGraphNodeGetEnabled(x, b, &enabled));
  EXPECT(enabled == 0);
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaDeviceSynchronize());
  EXPECT(read0(data) == 31);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));

  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
  cond_node(g, nullptr, 0, h, cudaGraphCondTypeIf, 1, &bodies);
  b = kernel_node(bodies[0], nullptr, 0, reinterpret_cast<void*>(add), b_args, kN);
  a = kernel_node(bodies[0], &b, 1, reinterpret_cast<void*>(add), a_args, kN);
  CHECK(cudaGraphAddDependencies(bodies[0], &a, &b, nullptr, 1));  // b -> a -> b
  EXPECT(cudaGraphInstantiate(&x, g, 0) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(data));
}

// A kernel in a body launched in clusters (Hopper's cuBLAS kernels are, in
// XLA's loops too): the node's cluster attribute goes with it. Devices
// without cluster launches skip it.
void cluster_in_body() {
  int cluster = 0;
  CHECK(cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, 0));
  if (!cluster) {
    std::printf("cluster_in_body: SKIP (no cluster launches on device 0)\n");
    return;
  }
  int* data;
  CHECK(cudaMalloc(&data, kBytes));
  CHECK(cudaMemset(data, 0, kBytes));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
  std::vector<cudaGraph_t> body;
  cond_node(g, nullptr, 0, h, cudaGraphCondTypeIf, 1, &body);
  int n = kN, seven = 7;
  void* args[] = {&data, &n, &seven};
  cudaGraphNodeParams p = {};
  p.type = cudaGraphNodeTypeKernel;
  p.kernel.func = reinterpret_cast<void*>(add);
  p.kernel.gridDim = dim3(2);
  p.kernel.blockDim = dim3(kN / 2);
  p.kernel.kernelParams = args;
  cudaGraphNode_t k;
  CHECK(cudaGraphAddNode(&k, body[0], nullptr, nullptr, 0, &p));
  cudaLaunchAttributeValue v = {};
  v.clusterDim.x = 2;
  v.clusterDim.y = 1;
  v.clusterDim.z = 1;
  CHECK(cudaGraphKernelNodeSetAttribute(k, cudaLaunchAttributeClusterDimension, &v));
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaDeviceSynchronize());
  std::vector<int> out(kN);
  CHECK(cudaMemcpy(out.data(), data, kBytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < kN; ++i) EXPECT(out[i] == 7);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(data));
}

void CUDART_CB nothing(void*) {}

// What CUDA refuses: bodies of the wrong size, a handle of another graph,
// cloning, nesting as a child, two execs at once, a host node in a body.
void refused() {
  cudaGraph_t g, other;
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphCreate(&other, 0));
  cudaGraphConditionalHandle h, foreign;
  CHECK(cudaGraphConditionalHandleCreate(&h, g));
  CHECK(cudaGraphConditionalHandleCreate(&foreign, other));
  EXPECT(cudaGraphConditionalHandleCreate(&h, g, 0, 0x10) == cudaErrorInvalidValue);
  cudaGetLastError();
  cudaGraphNodeParams p = {};
  p.type = cudaGraphNodeTypeConditional;
  p.conditional.handle = h;
  cudaGraphNode_t node;
  struct {
    cudaGraphConditionalNodeType type;
    unsigned size;
  } bad[] = {{cudaGraphCondTypeIf, 0}, {cudaGraphCondTypeIf, 3}, {cudaGraphCondTypeWhile, 2},
             {cudaGraphCondTypeSwitch, 0}};
  for (auto b : bad) {
    p.conditional.type = b.type;
    p.conditional.size = b.size;
    EXPECT(cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &p) == cudaErrorInvalidValue);
    cudaGetLastError();
  }
  p.conditional.type = cudaGraphCondTypeIf;
  p.conditional.size = 1;
  p.conditional.handle = foreign;
  EXPECT(cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &p) == cudaErrorInvalidValue);
  cudaGetLastError();
  p.conditional.handle = h;
  CHECK(cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &p));
  cudaGraph_t body = p.conditional.phGraph_out[0];
  cudaGraph_t clone;
  EXPECT(cudaGraphClone(&clone, g) != cudaSuccess);
  cudaGetLastError();
  cudaGraphNode_t child;
  EXPECT(cudaGraphAddChildGraphNode(&child, other, nullptr, 0, g) != cudaSuccess);
  cudaGetLastError();
  cudaGraphExec_t x, y;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  EXPECT(cudaGraphInstantiate(&y, g, 0) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphInstantiate(&x, g, 0));  // the first exec gone, a second may be made
  CHECK(cudaGraphExecDestroy(x));
  cudaHostNodeParams hp = {nothing, nullptr};
  cudaGraphNode_t host;
  CHECK(cudaGraphAddHostNode(&host, body, nullptr, 0, &hp));
  EXPECT(cudaGraphInstantiate(&x, g, 0) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaGraphDestroy(other));
}

// The seed scenario: thread A launches a conditional graph whose IF runs a
// WHILE of two slow copies of `in` into `out`; thread B, told by A, records
// an event on A's stream, makes s2 wait for it and overwrites `in`.
int seed_scenario(int iterations, unsigned sleep_us) {
  const int n = 4096;
  int *in, *out, *flag, *counter;
  CHECK(cudaMalloc(&in, n * sizeof(int)));
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&counter, sizeof(int)));
  set0(flag, 1);
  cudaStream_t s, s2;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle hi, hw;
  CHECK(cudaGraphConditionalHandleCreate(&hi, g));
  CHECK(cudaGraphConditionalHandleCreate(&hw, g, 1, cudaGraphCondAssignDefault));
  void* set_args[] = {&hi, &flag};
  cudaGraphNode_t setter = kernel_node(g, nullptr, 0, reinterpret_cast<void*>(set_value), set_args);
  std::vector<cudaGraph_t> then, loop;
  cond_node(g, &setter, 1, hi, cudaGraphCondTypeIf, 1, &then);
  int one = 1, two = 2;
  void* init_args[] = {&counter, &one, &two};  // counter[0] = 2
  cudaGraphNode_t init = kernel_node(then[0], nullptr, 0, reinterpret_cast<void*>(fill), init_args);
  cond_node(then[0], &init, 1, hw, cudaGraphCondTypeWhile, 1, &loop);
  int count = n;
  void* copy_args[] = {&in, &out, &count, &sleep_us};
  cudaGraphNode_t copy = kernel_node(loop[0], nullptr, 0, reinterpret_cast<void*>(slow_copy), copy_args, 256);
  void* down_args[] = {&hw, &counter};
  kernel_node(loop[0], &copy, 1, reinterpret_cast<void*>(countdown), down_args);
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(cudaGraphDestroy(g));
  // The WHILE counted its counter down to 0 too.
  const int violations = seed_rounds(
      iterations, n, in, out, s, s2, ev, [&] { CHECK(cudaGraphLaunch(exec, s)); }, [&] { return read0(counter) == 0; });
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaEventDestroy(ev));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(s2));
  for (int* p : {in, out, flag, counter}) CHECK(cudaFree(p));
  std::printf("seed scenario (conditional graph launches): %d violations in %d iterations\n", violations, iterations);
  return violations ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return seed_scenario(std::atoi(argv[1]), argc > 2 ? unsigned(std::atoi(argv[2])) : 3000);
  if_else();
  while_loop();
  switch_node();
  nested();
  captured_body();
  update();
  body_edits();
  cluster_in_body();
  refused();
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}

// NVIDIA's libraries through libcuda.so.1, built the default way: each case
// sets a library up (handles, plans, descriptors) and issues its first
// library kernel, then synchronizes.
//
//   libraries CASE [--expect-no-twin]
//
// On a GPU every case must succeed. On the sim, which has no host twins of the
// libraries' kernels, every call before the launch must succeed and the
// kernel must be refused with cudaErrorNoKernelImageForDevice (209): with
// --expect-no-twin a case checks that and exits 0. run.sh's `library` mode
// also fails a case that touched anything ordo does not implement, and one
// whose worker named no kernel it could not run.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cufft.h>
#include <curand.h>
#include <cusolverDn.h>
#include <cusparse.h>
#include <nccl.h>
#include <nvrtc.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.cuh"

namespace {

#define LIB_CHECK(call, ok_value, name_fn)                                                         \
  do {                                                                                            \
    auto s_ = (call);                                                                             \
    if (s_ != (ok_value)) {                                                                       \
      std::printf("FAIL %s:%d: %s -> status %d (%s)\n", __FILE__, __LINE__, #call, int(s_), name_fn(s_)); \
      return 2;                                                                                   \
    }                                                                                             \
  } while (0)

const char* blas_name(cublasStatus_t s) { return cublasGetStatusString(s); }
const char* dnn_name(cudnnStatus_t s) { return cudnnGetErrorString(s); }
const char* fft_name(cufftResult) { return "cufftResult"; }
const char* rand_name(curandStatus_t) { return "curandStatus"; }
const char* sparse_name(cusparseStatus_t s) { return cusparseGetErrorString(s); }
const char* solver_name(cusolverStatus_t) { return "cusolverStatus"; }
const char* nccl_name(ncclResult_t s) { return ncclGetErrorString(s); }
const char* rtc_name(nvrtcResult s) { return nvrtcGetErrorString(s); }
const char* cu_name(CUresult r) {
  const char* n = nullptr;
  cuGetErrorName(r, &n);
  return n ? n : "?";
}

#define BLAS(call) LIB_CHECK(call, CUBLAS_STATUS_SUCCESS, blas_name)
#define DNN(call) LIB_CHECK(call, CUDNN_STATUS_SUCCESS, dnn_name)
#define FFT(call) LIB_CHECK(call, CUFFT_SUCCESS, fft_name)
#define RAND(call) LIB_CHECK(call, CURAND_STATUS_SUCCESS, rand_name)
#define SPARSE(call) LIB_CHECK(call, CUSPARSE_STATUS_SUCCESS, sparse_name)
#define SOLVER(call) LIB_CHECK(call, CUSOLVER_STATUS_SUCCESS, solver_name)
#define NCCL(call) LIB_CHECK(call, ncclSuccess, nccl_name)
#define RTC(call) LIB_CHECK(call, NVRTC_SUCCESS, rtc_name)
#define CU(call) LIB_CHECK(call, CUDA_SUCCESS, cu_name)

bool expect_no_twin = false;

// The call that issues a library's first kernel. On the sim the refused
// kernel may surface inside it, as the library's own failure status: an
// asynchronous error reaches the issuing thread's next call, which may be
// the library's next launch or its own synchronize. run.sh checks that the
// worker saw and named the kernel.
#define LAUNCHING(what, call, ok_value, name_fn)                                                       \
  do {                                                                                                \
    auto r_ = (call);                                                                                 \
    if (r_ != (ok_value) && expect_no_twin) {                                                         \
      std::printf("%s: every call up to its first kernel succeeded; the kernel was refused (%s: %d, %s)\n", \
                  what, #call, int(r_), name_fn(r_));                                                 \
      return 0;                                                                                       \
    }                                                                                                 \
    LIB_CHECK(r_, ok_value, name_fn);                                                                 \
  } while (0)

// The end of every case: the library's kernel ran (GPU) or was refused (sim).
int finish(const char* what, cudaStream_t s) {
  const cudaError_t e = cudaStreamSynchronize(s);
  if (expect_no_twin) {
    // A kernel the sim cannot run fails its launch with 209 when the guest
    // already knows (the library sees that, as from a GPU without the
    // kernel's image), else in stream order: the synchronize's 209. Either
    // way the worker names the kernel (run.sh checks).
    if (e != cudaErrorNoKernelImageForDevice && e != cudaSuccess) {
      std::printf("FAIL %s: the synchronize gave %d (%s), expected 209 (a library kernel without a twin)\n", what,
                  int(e), cudaGetErrorName(e));
      return 1;
    }
    std::printf("%s: every call up to its first kernel succeeded; the kernel was refused (209, at %s)\n", what,
                e == cudaSuccess ? "its launch" : "the synchronize");
    return 0;
  }
  if (e != cudaSuccess) {
    std::printf("FAIL %s: %d (%s)\n", what, int(e), cudaGetErrorName(e));
    return 1;
  }
  std::printf("%s: ran\n", what);
  return 0;
}

float* device_floats(size_t n, float v) {
  std::vector<float> h(n, v);
  float* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

// What cuBLAS asks of the driver's 21318c60 table before a GEMM on Hopper
// (docs/CUDA.md, "Private export tables"): slot 51 gives a handle for a
// stream, slot 39 that handle's id, which must tell streams apart (cuBLAS keeps
// per-stream state by it). Checked through ordo only (the sim never takes
// cuBLAS down that path): the same calls on NVIDIA's driver are its own.
int stream_handle_slots(cudaStream_t s) {
  constexpr CUuuid kTable = {{0x21, 0x31, char(0x8c), 0x60, char(0x97), 0x14, 0x32, 0x48, char(0x8c), char(0xa6), 0x41,
                              char(0xff), 0x73, 0x24, char(0xc8), char(0xf2)}};
  const void* table = nullptr;
  CU(cuGetExportTable(&table, &kTable));
  const auto* slots = static_cast<void* const*>(table);
  using HandleFn = CUresult (*)(CUcontext, CUstream, void**);
  using IdFn = CUresult (*)(CUcontext, void*, unsigned long long*);
  const auto handle = reinterpret_cast<HandleFn>(slots[51]);
  const auto id_of = reinterpret_cast<IdFn>(slots[39]);
  CUcontext ctx = nullptr;
  CU(cuCtxGetCurrent(&ctx));
  cudaStream_t other;
  CHECK(cudaStreamCreate(&other));
  const CUstream streams[] = {s, other, nullptr, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, s};
  unsigned long long ids[6];
  void* handles[6];
  for (int i = 0; i < 6; ++i) {
    CU(handle(ctx, streams[i], &handles[i]));
    CU(id_of(ctx, handles[i], &ids[i]));
  }
  // s twice, and stream 0 is the legacy stream: one stream, one handle, one id.
  const bool same[6][6] = {{1, 0, 0, 0, 0, 1}, {0, 1, 0, 0, 0, 0}, {0, 0, 1, 1, 0, 0},
                           {0, 0, 1, 1, 0, 0}, {0, 0, 0, 0, 1, 0}, {1, 0, 0, 0, 0, 1}};
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j)
      if ((ids[i] == ids[j]) != same[i][j] || (handles[i] == handles[j]) != same[i][j]) {
        std::printf("FAIL stream handles %d and %d: ids %llx %llx\n", i, j, ids[i], ids[j]);
        return 1;
      }
  unsigned long long public_id = 0;
  CU(cuStreamGetId(other, &public_id));
  if (public_id != ids[1]) {
    std::printf("FAIL slot 39 gave %llx, cuStreamGetId %llx\n", ids[1], public_id);
    return 1;
  }
  // A destroyed stream's handle names nothing.
  CHECK(cudaStreamDestroy(other));
  unsigned long long dead_id = 0;
  if (const CUresult r = id_of(ctx, handles[1], &dead_id); r != CUDA_ERROR_INVALID_HANDLE) {
    std::printf("FAIL a destroyed stream's handle gave %d, not 400\n", int(r));
    return 1;
  }
  return 0;
}

int cublas(cudaStream_t s) {
  if (expect_no_twin)
    if (int r = stream_handle_slots(s)) return r;
  cublasHandle_t h;
  BLAS(cublasCreate(&h));
  BLAS(cublasSetStream(h, s));
  const int n = 64;
  float *a = device_floats(n * n, 1.f), *b = device_floats(n * n, 2.f), *c = device_floats(n * n, 0.f);
  const float one = 1.f, zero = 0.f;
  LAUNCHING("cublas", cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n),
            CUBLAS_STATUS_SUCCESS, blas_name);
  return finish("cublas", s);
}

int cublaslt(cudaStream_t s) {
  cublasLtHandle_t h;
  BLAS(cublasLtCreate(&h));
  const int n = 64;
  cublasLtMatmulDesc_t op;
  BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t la;
  BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, n, n));
  cublasLtMatmulPreference_t pref;
  BLAS(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = 1 << 20;
  BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  BLAS(cublasLtMatmulAlgoGetHeuristic(h, op, la, la, la, la, pref, 1, &heur, &found));
  if (found == 0) {
    std::printf("FAIL cublaslt: no algorithm\n");
    return 1;
  }
  void* work = nullptr;
  CHECK(cudaMalloc(&work, ws));
  float *a = device_floats(n * n, 1.f), *b = device_floats(n * n, 2.f), *c = device_floats(n * n, 0.f);
  const float one = 1.f, zero = 0.f;
  LAUNCHING("cublaslt", cublasLtMatmul(h, op, &one, a, la, b, la, &zero, c, la, c, la, &heur.algo, work, ws, s),
            CUBLAS_STATUS_SUCCESS, blas_name);
  return finish("cublaslt", s);
}

int cudnn(cudaStream_t s) {
  cudnnHandle_t h;
  DNN(cudnnCreate(&h));
  DNN(cudnnSetStream(h, s));
  cudnnTensorDescriptor_t t;
  DNN(cudnnCreateTensorDescriptor(&t));
  DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 4, 8, 8));
  cudnnActivationDescriptor_t act;
  DNN(cudnnCreateActivationDescriptor(&act));
  DNN(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  float *x = device_floats(256, -1.f), *y = device_floats(256, 5.f);
  const float one = 1.f, zero = 0.f;
  LAUNCHING("cudnn", cudnnActivationForward(h, act, &one, t, x, &zero, t, y), CUDNN_STATUS_SUCCESS, dnn_name);
  return finish("cudnn", s);
}

int cufft(cudaStream_t s) {
  cufftHandle plan;
  FFT(cufftPlan1d(&plan, 1024, CUFFT_C2C, 1));
  FFT(cufftSetStream(plan, s));
  cufftComplex* d = nullptr;
  CHECK(cudaMalloc(&d, 1024 * sizeof(cufftComplex)));
  CHECK(cudaMemset(d, 0, 1024 * sizeof(cufftComplex)));
  LAUNCHING("cufft", cufftExecC2C(plan, d, d, CUFFT_FORWARD), CUFFT_SUCCESS, fft_name);
  return finish("cufft", s);
}

int curand(cudaStream_t s) {
  curandGenerator_t g;
  RAND(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_DEFAULT));
  RAND(curandSetStream(g, s));
  RAND(curandSetPseudoRandomGeneratorSeed(g, 1234));
  float* d = nullptr;
  CHECK(cudaMalloc(&d, 4096 * sizeof(float)));
  // The first generate seeds the generator with a kernel and waits for it.
  LAUNCHING("curand", curandGenerateUniform(g, d, 4096), CURAND_STATUS_SUCCESS, rand_name);
  return finish("curand", s);
}

int cusparse(cudaStream_t s) {
  cusparseHandle_t h;
  SPARSE(cusparseCreate(&h));
  SPARSE(cusparseSetStream(h, s));
  const int n = 16;  // the identity, in CSR
  std::vector<int> rows(n + 1), cols(n);
  for (int i = 0; i <= n; ++i) rows[i] = i;
  for (int i = 0; i < n; ++i) cols[i] = i;
  int *dr = nullptr, *dc = nullptr;
  CHECK(cudaMalloc(&dr, rows.size() * sizeof(int)));
  CHECK(cudaMalloc(&dc, cols.size() * sizeof(int)));
  CHECK(cudaMemcpy(dr, rows.data(), rows.size() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dc, cols.data(), cols.size() * sizeof(int), cudaMemcpyHostToDevice));
  float *vals = device_floats(n, 1.f), *x = device_floats(n, 3.f), *y = device_floats(n, 0.f);
  cusparseSpMatDescr_t a;
  SPARSE(cusparseCreateCsr(&a, n, n, n, dr, dc, vals, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                           CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
  cusparseDnVecDescr_t vx, vy;
  SPARSE(cusparseCreateDnVec(&vx, n, x, CUDA_R_32F));
  SPARSE(cusparseCreateDnVec(&vy, n, y, CUDA_R_32F));
  const float one = 1.f, zero = 0.f;
  size_t size = 0;
  SPARSE(cusparseSpMV_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, a, vx, &zero, vy, CUDA_R_32F,
                                 CUSPARSE_SPMV_ALG_DEFAULT, &size));
  void* buf = nullptr;
  CHECK(cudaMalloc(&buf, size ? size : 1));
  LAUNCHING("cusparse",
            cusparseSpMV(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, a, vx, &zero, vy, CUDA_R_32F,
                         CUSPARSE_SPMV_ALG_DEFAULT, buf),
            CUSPARSE_STATUS_SUCCESS, sparse_name);
  return finish("cusparse", s);
}

int cusolver(cudaStream_t s) {
  cusolverDnHandle_t h;
  SOLVER(cusolverDnCreate(&h));
  SOLVER(cusolverDnSetStream(h, s));
  const int n = 16;
  std::vector<float> a(n * n, 0.f);
  for (int i = 0; i < n; ++i) a[i * n + i] = 2.f;
  float* da = device_floats(n * n, 0.f);
  CHECK(cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
  int lwork = 0;
  SOLVER(cusolverDnSgetrf_bufferSize(h, n, n, da, n, &lwork));
  float* work = device_floats(lwork > 0 ? lwork : 1, 0.f);
  int *piv = nullptr, *info = nullptr;
  CHECK(cudaMalloc(&piv, n * sizeof(int)));
  CHECK(cudaMalloc(&info, sizeof(int)));
  LAUNCHING("cusolver", cusolverDnSgetrf(h, n, n, da, n, work, piv, info), CUSOLVER_STATUS_SUCCESS, solver_name);
  return finish("cusolver", s);
}

// One communicator per device of this process, an all-reduce over them.
int nccl(cudaStream_t) {
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  std::vector<ncclComm_t> comms(devices);
  NCCL(ncclCommInitAll(comms.data(), devices, nullptr));
  std::vector<cudaStream_t> streams(devices);
  std::vector<float*> bufs(devices);
  for (int d = 0; d < devices; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
    bufs[d] = device_floats(1024, float(d + 1));
  }
  NCCL(ncclGroupStart());
  const std::string what = "nccl over " + std::to_string(devices) + " device" + (devices > 1 ? "s" : "");
  for (int d = 0; d < devices; ++d)
    NCCL(ncclAllReduce(bufs[d], bufs[d], 1024, ncclFloat, ncclSum, comms[d], streams[d]));
  LAUNCHING(what.c_str(), ncclGroupEnd(), ncclSuccess, nccl_name);
  if (devices == 1) {
    // One rank's in-place all-reduce launches no kernel: it must just run.
    CHECK(cudaStreamSynchronize(streams[0]));
    std::vector<float> out(1024);
    CHECK(cudaMemcpy(out.data(), bufs[0], out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (float v : out)
      if (v != 1.f) {
        std::printf("FAIL %s: the all-reduce gave %g, expected 1\n", what.c_str(), v);
        return 1;
      }
    std::printf("%s: ran (one rank's all-reduce needs no kernel) and the buffer is right\n", what.c_str());
    return 0;
  }
  for (int d = 0; d < devices; ++d) {
    CHECK(cudaSetDevice(d));
    if (int r = finish(what.c_str(), streams[d]); r != 0) return r;
  }
  return 0;
}

// NCCL's ranks as torchrun starts them: a process each, one device each
// (rank r on device r), the unique id handed from rank 0 to the others (a
// pipe here), its bootstrap over sockets, then an all-reduce. Between
// processes its P2P transport maps the peers' buffers from cuMem memory
// exported as POSIX descriptors (NCCL_P2P_LEVEL=SYS: the guest's sysfs shows
// no PCI path), which its proxy passes over a Unix socket. Forks before any
// CUDA call, so main() calls it first.
int nccl_ranks() {
  constexpr int kRanks = 2;
  int id_pipe[2];
  if (pipe(id_pipe) != 0) return 2;
  const pid_t child = fork();
  if (child < 0) return 2;
  const int rank = child == 0 ? 1 : 0;
  ncclUniqueId id;
  if (rank == 0) {
    NCCL(ncclGetUniqueId(&id));
    if (write(id_pipe[1], &id, sizeof id) != ssize_t(sizeof id)) return 2;
  } else if (read(id_pipe[0], &id, sizeof id) != ssize_t(sizeof id)) {
    std::printf("FAIL nccl rank 1: no unique id from rank 0\n");
    _exit(2);
  }
  int rc = [&]() -> int {
    CHECK(cudaSetDevice(rank));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ncclComm_t comm;
    NCCL(ncclCommInitRank(&comm, kRanks, id, rank));
    float* buf = device_floats(1024, float(rank + 1));
    const std::string what = "nccl rank " + std::to_string(rank) + " of " + std::to_string(kRanks) + " processes";
    LAUNCHING(what.c_str(), ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, s), ncclSuccess, nccl_name);
    return finish(what.c_str(), s);
  }();
  if (rank == 1) {
    std::fflush(stdout);
    _exit(rc);  // the parent reports for both
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("FAIL nccl rank 1 exited with status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return rc ? rc : 1;
  }
  return rc;
}

const char* kSaxpy = R"(
extern "C" __global__ void rtc_saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

// A kernel compiled at run time (NVRTC, for this device), loaded and launched
// through the driver API.
int nvrtc(cudaStream_t s) {
  nvrtcProgram prog;
  RTC(nvrtcCreateProgram(&prog, kSaxpy, "saxpy.cu", 0, nullptr, nullptr));
  int major = 0, minor = 0;
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor);
  const char* opts[] = {arch.c_str()};
  if (nvrtcCompileProgram(prog, 1, opts) != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    std::printf("FAIL nvrtc: compile failed: %s\n", log.c_str());
    return 2;
  }
  size_t size = 0;
  RTC(nvrtcGetCUBINSize(prog, &size));
  std::vector<char> cubin(size);
  RTC(nvrtcGetCUBIN(prog, cubin.data()));
  CHECK(cudaFree(nullptr));  // the primary context, current
  CUmodule mod;
  CU(cuModuleLoadData(&mod, cubin.data()));
  CUfunction fn;
  CU(cuModuleGetFunction(&fn, mod, "rtc_saxpy"));
  const int n = 256;
  float *x = device_floats(n, 1.f), *y = device_floats(n, 2.f);
  float a = 3.f;
  int count = n;
  void* args[] = {&a, &x, &y, &count};
  LAUNCHING("nvrtc", cuLaunchKernel(fn, 1, 1, 1, n, 1, 1, 0, s, args, nullptr), CUDA_SUCCESS, cu_name);
  if (int r = finish("nvrtc", s); r != 0 || expect_no_twin) return r;
  std::vector<float> out(n);
  CHECK(cudaMemcpy(out.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (out[i] != 5.f) {
      std::printf("FAIL nvrtc: y[%d] = %g, expected 5\n", i, out[i]);
      return 1;
    }
  return 0;
}

struct Case {
  const char* name;
  int (*run)(cudaStream_t);
};
const Case kCases[] = {{"cublas", cublas},     {"cublaslt", cublaslt}, {"cudnn", cudnn},
                       {"cufft", cufft},       {"curand", curand},     {"cusparse", cusparse},
                       {"cusolver", cusolver}, {"nccl", nccl},         {"nvrtc", nvrtc}};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: libraries CASE [--expect-no-twin]; cases: nccl_ranks");
    for (const Case& c : kCases) std::printf(" %s", c.name);
    std::printf("\n");
    return 2;
  }
  expect_no_twin = argc > 2 && std::strcmp(argv[2], "--expect-no-twin") == 0;
  if (std::strcmp(argv[1], "nccl_ranks") == 0) return nccl_ranks();
  for (const Case& c : kCases)
    if (std::strcmp(argv[1], c.name) == 0) {
      cudaStream_t s;
      CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      return c.run(s);
    }
  std::printf("unknown case %s\n", argv[1]);
  return 2;
}

// Native CUDA against the same work remoted through ordo, on this machine's GPU.
//
//   Launch/{Native,Remote}      launches of an empty kernel, 1, 4 and 16 threads
//                               (each its own non-blocking stream): enqueue rate
//   Launch/RemoteOneDispatch    the same through a second worker with one
//                               dispatch thread (--dispatch-threads 1): the
//                               baseline of the default's several, in one run
//   LaunchSync/{Native,Remote}  one empty launch then cudaStreamSynchronize: latency
//   SyncIdle/{Native,Remote}    cudaStreamSynchronize on an idle stream
//   Copy/{Native,Remote}/{H2D,D2H}/{Pageable,Pinned}/bytes
//                               a copy then a stream sync; pinned is
//                               cudaMallocHost natively and the region's heap
//                               (Client::malloc_host) remoted
//
// The remoted side is an ordo::Client attached to an `ordo-worker --backend
// cuda` process started here ($ORDO_WORKER, or the worker next to this build).
// The empty kernel is ordo's built-in ordo_noop on both sides: natively through
// cudaLibraryLoadData, remoted through the worker's module 0.
// Without a CUDA device the program prints why and exits 77 (skipped).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ordo/client.h"
#include "ordo/doorbell.h"
#include "worker/backends/cuda/cuda_backend.h"

namespace {

constexpr uint64_t kMaxCopy = 256ull << 20;
constexpr const char* kRegionSize = "1G";  // 256 MiB pinned in the heap, plus staging

// Native state.
const void* g_noop = nullptr;  // a cudaKernel_t, as cudaLaunchKernel takes it
void* g_dev = nullptr;
void* g_pinned = nullptr;
void* g_pageable = nullptr;

// Remoted state.
std::unique_ptr<ordo::Client> g_client;
std::unique_ptr<ordo::Client> g_client1;  // the worker with one dispatch thread
uint32_t g_remote_noop = 0;
uint32_t g_remote1_noop = 0;
uint64_t g_remote_dev = 0;
void* g_remote_pinned = nullptr;

void die(const char* what, cudaError_t e) {
  std::fprintf(stderr, "bench_cuda: %s: %s (%d)\n", what, cudaGetErrorName(e), int(e));
  std::exit(1);
}
#define CK(call)                                 \
  do {                                           \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) die(#call, e_); \
  } while (0)

void remote_check(ordo::Status s, const char* what) {
  if (!ordo::ok(s)) {
    std::fprintf(stderr, "bench_cuda: %s: %s (%d)\n", what, std::string(ordo::status_name(s)).c_str(), int(s));
    std::exit(1);
  }
}

// ---------------------------------------------------------------- the worker process

class Worker {
 public:
  // `tag` names the region; `extra`: more ordo-worker arguments.
  bool start(std::string* err, const char* tag = "", const char* size = kRegionSize,
             std::vector<std::string> extra = {}) {
    const char* env = std::getenv("ORDO_WORKER");
    std::string exe = env ? env : "";
    if (exe.empty()) {
      std::error_code ec;
      auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
      exe = (self.parent_path().parent_path() / "src/worker/ordo-worker").string();
    }
    region_ = "/dev/shm/ordo-bench-cuda-" + std::to_string(getpid()) + tag;
    log_ = region_ + ".log";
    const std::string ready = region_ + ".ready";
    unlink(ready.c_str());
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) dup2(fd, 2);
      std::vector<std::string> args = {exe, "--region", region_, "--size", size, "--backend", "cuda", "--ready-file", ready};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(exe.c_str(), argv.data());
      _exit(127);
    }
    for (int i = 0; i < 3000; ++i) {  // pinning a 1 GiB region takes a moment
      if (access(ready.c_str(), F_OK) == 0) {
        unlink(ready.c_str());
        return true;
      }
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        *err = exe + " exited at start; its log: " + log_;
        return false;
      }
      usleep(10000);
    }
    *err = exe + " did not become ready in 30 s; its log: " + log_;
    return false;
  }
  ~Worker() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st;
      waitpid(pid_, &st, 0);
      unlink(log_.c_str());
    }
    unlink(region_.c_str());
    unlink(ordo::doorbell_path(region_).c_str());
  }
  const std::string& region() const { return region_; }

 private:
  pid_t pid_ = -1;
  std::string region_, log_;
};

// ---------------------------------------------------------------- launches

void Launch_Native(benchmark::State& state) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto _ : state) CK(cudaLaunchKernel(g_noop, dim3(1), dim3(1), nullptr, 0, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
  state.SetItemsProcessed(state.iterations());
}

template <bool one_dispatch>
void Launch_Remote(benchmark::State& state) {
  ordo::Client& c = one_dispatch ? *g_client1 : *g_client;
  const uint32_t k = one_dispatch ? g_remote1_noop : g_remote_noop;
  ordo::Stream s;
  remote_check(c.stream_create(&s, ordo::kStreamNonBlocking), "stream_create");
  for (auto _ : state) remote_check(c.launch(k, {1}, {1}, nullptr, 0, s), "launch");
  remote_check(c.stream_synchronize(s), "stream_synchronize");
  remote_check(c.stream_destroy(s), "stream_destroy");
  state.SetItemsProcessed(state.iterations());
}

void LaunchSync_Native(benchmark::State& state) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto _ : state) {
    CK(cudaLaunchKernel(g_noop, dim3(1), dim3(1), nullptr, 0, s));
    CK(cudaStreamSynchronize(s));
  }
  CK(cudaStreamDestroy(s));
}

void LaunchSync_Remote(benchmark::State& state) {
  ordo::Stream s;
  remote_check(g_client->stream_create(&s, ordo::kStreamNonBlocking), "stream_create");
  for (auto _ : state) {
    remote_check(g_client->launch(g_remote_noop, {1}, {1}, nullptr, 0, s), "launch");
    remote_check(g_client->stream_synchronize(s), "stream_synchronize");
  }
  remote_check(g_client->stream_destroy(s), "stream_destroy");
}

void SyncIdle_Native(benchmark::State& state) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamSynchronize(s));
  for (auto _ : state) CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
}

void SyncIdle_Remote(benchmark::State& state) {
  ordo::Stream s;
  remote_check(g_client->stream_create(&s, ordo::kStreamNonBlocking), "stream_create");
  remote_check(g_client->stream_synchronize(s), "stream_synchronize");
  for (auto _ : state) remote_check(g_client->stream_synchronize(s), "stream_synchronize");
  remote_check(g_client->stream_destroy(s), "stream_destroy");
}

// ---------------------------------------------------------------- copies

enum Dir { kH2D, kD2H };
enum Mem { kPageable, kPinned };

template <Dir D, Mem M>
void Copy_Native(benchmark::State& state) {
  const uint64_t n = uint64_t(state.range(0));
  void* host = M == kPinned ? g_pinned : g_pageable;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto _ : state) {
    if (D == kH2D)
      CK(cudaMemcpyAsync(g_dev, host, n, cudaMemcpyHostToDevice, s));
    else
      CK(cudaMemcpyAsync(host, g_dev, n, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
  }
  CK(cudaStreamDestroy(s));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
}

template <Dir D, Mem M>
void Copy_Remote(benchmark::State& state) {
  const uint64_t n = uint64_t(state.range(0));
  void* host = M == kPinned ? g_remote_pinned : g_pageable;
  ordo::Stream s;
  remote_check(g_client->stream_create(&s, ordo::kStreamNonBlocking), "stream_create");
  for (auto _ : state) {
    if (D == kH2D)
      remote_check(g_client->memcpy_h2d_async(g_remote_dev, host, n, s), "memcpy_h2d_async");
    else
      remote_check(g_client->memcpy_d2h_async(host, g_remote_dev, n, s), "memcpy_d2h_async");
    remote_check(g_client->stream_synchronize(s), "stream_synchronize");
  }
  remote_check(g_client->stream_destroy(s), "stream_destroy");
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
}

void register_all() {
  for (int threads : {1, 4, 16}) {
    benchmark::RegisterBenchmark("Launch/Native", Launch_Native)->Threads(threads)->UseRealTime()->MinTime(0.5);
    benchmark::RegisterBenchmark("Launch/Remote", Launch_Remote<false>)->Threads(threads)->UseRealTime()->MinTime(0.5);
    benchmark::RegisterBenchmark("Launch/RemoteOneDispatch", Launch_Remote<true>)
        ->Threads(threads)->UseRealTime()->MinTime(0.5);
  }
  benchmark::RegisterBenchmark("LaunchSync/Native", LaunchSync_Native)->UseRealTime()->MinTime(0.3);
  benchmark::RegisterBenchmark("LaunchSync/Remote", LaunchSync_Remote)->UseRealTime()->MinTime(0.3);
  benchmark::RegisterBenchmark("SyncIdle/Native", SyncIdle_Native)->UseRealTime()->MinTime(0.3);
  benchmark::RegisterBenchmark("SyncIdle/Remote", SyncIdle_Remote)->UseRealTime()->MinTime(0.3);
  auto sizes = [](benchmark::internal::Benchmark* b) {
    b->RangeMultiplier(16)->Range(4 << 10, int64_t(kMaxCopy))->UseRealTime()->MinTime(0.1);
  };
  sizes(benchmark::RegisterBenchmark("Copy/Native/H2D/Pageable", Copy_Native<kH2D, kPageable>));
  sizes(benchmark::RegisterBenchmark("Copy/Remote/H2D/Pageable", Copy_Remote<kH2D, kPageable>));
  sizes(benchmark::RegisterBenchmark("Copy/Native/H2D/Pinned", Copy_Native<kH2D, kPinned>));
  sizes(benchmark::RegisterBenchmark("Copy/Remote/H2D/Pinned", Copy_Remote<kH2D, kPinned>));
  sizes(benchmark::RegisterBenchmark("Copy/Native/D2H/Pageable", Copy_Native<kD2H, kPageable>));
  sizes(benchmark::RegisterBenchmark("Copy/Remote/D2H/Pageable", Copy_Remote<kD2H, kPageable>));
  sizes(benchmark::RegisterBenchmark("Copy/Native/D2H/Pinned", Copy_Native<kD2H, kPinned>));
  sizes(benchmark::RegisterBenchmark("Copy/Remote/D2H/Pinned", Copy_Remote<kD2H, kPinned>));
}

}  // namespace

int main(int argc, char** argv) {
  const ordo::cuda::Probe p = ordo::cuda::probe();
  if (!p.usable()) {
    if (p.error != 0)
      std::printf("no CUDA device (cudaGetDeviceCount returned %d): skipping\n", p.error);
    else
      std::printf("no CUDA device (cudaGetDeviceCount found none): skipping\n");
    return 77;
  }
  benchmark::Initialize(&argc, argv);

  // Native side.
  cudaLibrary_t lib;
  cudaKernel_t noop;
  const auto img = ordo::cuda::builtin_image();
  CK(cudaLibraryLoadData(&lib, img.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  CK(cudaLibraryGetKernel(&noop, lib, "ordo_noop"));
  g_noop = reinterpret_cast<const void*>(noop);
  CK(cudaMalloc(&g_dev, kMaxCopy));
  CK(cudaMallocHost(&g_pinned, kMaxCopy));
  g_pageable = std::aligned_alloc(4096, kMaxCopy);
  std::memset(g_pageable, 1, kMaxCopy);  // fault it in before timing
  std::memset(g_pinned, 1, kMaxCopy);

  // Remoted side: the default worker, and one with a single dispatch thread.
  Worker worker, worker1;
  std::string err;
  auto connect = [&](Worker& w, std::unique_ptr<ordo::Client>* client, uint32_t* noop) {
    *client = ordo::Client::attach(w.region(), &err);
    if (!*client) return false;
    remote_check((*client)->kernel_lookup("ordo_noop", noop), "kernel_lookup ordo_noop");
    return true;
  };
  if (!worker.start(&err) || !connect(worker, &g_client, &g_remote_noop) ||
      !worker1.start(&err, "-one", "64M", {"--dispatch-threads", "1"}) || !connect(worker1, &g_client1, &g_remote1_noop)) {
    std::fprintf(stderr, "bench_cuda: %s\n", err.c_str());
    return 1;
  }
  remote_check(g_client->malloc(&g_remote_dev, kMaxCopy), "malloc");
  remote_check(g_client->malloc_host(&g_remote_pinned, kMaxCopy), "malloc_host");
  std::memset(g_remote_pinned, 1, kMaxCopy);

  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  g_client->free_host(g_remote_pinned);
  g_client->free(g_remote_dev);
  g_client.reset();
  g_client1.reset();
  cudaFreeHost(g_pinned);
  cudaFree(g_dev);
  std::free(g_pageable);
  cudaLibraryUnload(lib);
  return 0;
}

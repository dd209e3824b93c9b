// Host-side stream work and the legacy default stream (issue 10, class 6):
// a host function (cudaLaunchHostFunc, cudaStreamAddCallback) or a host-to-host
// cudaMemcpyAsync on the legacy stream runs after earlier work on blocking
// streams, and one on a blocking stream runs after earlier legacy-stream work.
// Each case: a slow kernel copies `in` to `out` and a device-to-host copy puts
// `out` into pinned memory, on one stream; the host-side work on the other
// stream then reads the pinned memory. It must see the copied data. Then a host
// function on each stream kind waits for what its caller does after
// cudaLaunchHostFunc returned. Then the other direction (issue 28): a host
// function that writes pinned memory, and later work on another stream kind
// (legacy after a blocking stream's function or cudaStreamPerThread's, a
// blocking stream or cudaStreamPerThread after the legacy stream's), or a
// synchronizing call that covers the function, must see what it wrote. Built
// also with --default-stream per-thread. Prints the number of violations;
// exits 1 if there was any.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "kernels.h"

namespace {
constexpr int kN = 1024;
struct Seen {
  const int* pinned;
  int first;
};
void CUDART_CB host_fn(void* p) {
  auto* s = static_cast<Seen*>(p);
  s->first = s->pinned[0];
}
void CUDART_CB callback(cudaStream_t, cudaError_t, void* p) { host_fn(p); }

// Writes 7 into the pinned buffer, late: work that does not wait for it reads zeros.
constexpr int kP = 1024;
void CUDART_CB late_writer(void* p) {
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto* pinned = static_cast<int*>(p);
  for (int i = 0; i < kP; ++i) pinned[i] = 7;
}
void CUDART_CB late_callback(cudaStream_t, cudaError_t, void* p) { late_writer(p); }

// Waits for the caller's next step (issue 10, class 8): cudaLaunchHostFunc
// must have returned before the function runs.
struct Handshake {
  std::atomic<bool> go{false}, ran{false}, timed_out{false};
};
void CUDART_CB wait_for_caller(void* p) {
  auto* h = static_cast<Handshake*>(p);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!h->go.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  h->timed_out = !h->go.load();
  h->ran = true;
}
}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 8;
  int *in, *out, *pinned, *copy;
  CHECK(cudaMalloc(&in, kN * sizeof(int)));
  CHECK(cudaMalloc(&out, kN * sizeof(int)));
  CHECK(cudaMallocHost(&pinned, kN * sizeof(int)));
  CHECK(cudaMallocHost(&copy, kN * sizeof(int)));
  cudaStream_t blocking;
  CHECK(cudaStreamCreate(&blocking));
  const char* kinds[] = {"cudaLaunchHostFunc", "cudaStreamAddCallback", "host-to-host cudaMemcpyAsync"};
  int violations = 0;
  for (int it = 0; it < iterations; ++it)
    for (int legacy_first = 0; legacy_first < 2; ++legacy_first)
      for (int kind = 0; kind < 3; ++kind) {
        std::vector<int> data(kN);
        for (int i = 0; i < kN; ++i) data[i] = 1000 + it * 10 + kind + i;
        CHECK(cudaMemcpy(in, data.data(), kN * sizeof(int), cudaMemcpyHostToDevice));
        std::memset(pinned, 0, kN * sizeof(int));
        std::memset(copy, 0, kN * sizeof(int));
        CHECK(cudaDeviceSynchronize());
        cudaStream_t first = legacy_first ? cudaStreamLegacy : blocking;
        cudaStream_t second = legacy_first ? blocking : cudaStreamLegacy;
        slow_copy<<<1, 256, 0, first>>>(in, out, kN, 3000);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(pinned, out, kN * sizeof(int), cudaMemcpyDeviceToHost, first));
        Seen seen{pinned, -1};
        if (kind == 0) CHECK(cudaLaunchHostFunc(second, host_fn, &seen));
        if (kind == 1) CHECK(cudaStreamAddCallback(second, callback, &seen, 0));
        if (kind == 2) CHECK(cudaMemcpyAsync(copy, pinned, kN * sizeof(int), cudaMemcpyHostToHost, second));
        CHECK(cudaDeviceSynchronize());
        const int got = kind == 2 ? copy[0] : seen.first;
        if (got != data[0]) {
          ++violations;
          std::printf("violation: %s on the %s stream ran before the %s stream's earlier work (saw %d, want %d)\n",
                      kinds[kind], legacy_first ? "blocking" : "legacy", legacy_first ? "legacy" : "blocking", got,
                      data[0]);
        }
      }
  for (cudaStream_t s : {cudaStreamLegacy, blocking, cudaStreamPerThread}) {
    Handshake h;
    CHECK(cudaLaunchHostFunc(s, wait_for_caller, &h));
    const bool early = h.ran.load();
    h.go = true;
    CHECK(cudaStreamSynchronize(s));
    if (early || h.timed_out || !h.ran) {
      ++violations;
      std::printf("violation: a host function %s\n", early ? "ran before cudaLaunchHostFunc returned"
                                                        : h.timed_out ? "waited for its caller in vain"
                                                                      : "had not run after cudaStreamSynchronize");
    }
  }
  // Work after a host function on another stream kind, and synchronizing calls that cover it.
  int* dev;
  int* back;
  CHECK(cudaMalloc(&dev, kP * sizeof(int)));
  CHECK(cudaMallocHost(&back, kP * sizeof(int)));
  struct Case {
    const char* fn_on;
    cudaStream_t fn_stream;
    const char* then;
    cudaStream_t copy_stream;  // the copy's stream; nullptr: a synchronizing call, then a check on the host
    int sync;  // 0 copy, 1 cudaStreamSynchronize(legacy), 2 cudaDeviceSynchronize, 3 cudaMemcpy, 4 from pageable
  };
  const Case cases[] = {
      {"a blocking stream", blocking, "a copy on the legacy stream", cudaStreamLegacy, 0},
      {"cudaStreamPerThread", cudaStreamPerThread, "a copy on the legacy stream", cudaStreamLegacy, 0},
      {"the legacy stream", cudaStreamLegacy, "a copy on a blocking stream", blocking, 0},
      {"the legacy stream", cudaStreamLegacy, "a copy on cudaStreamPerThread", cudaStreamPerThread, 0},
      {"a blocking stream", blocking, "cudaStreamSynchronize(cudaStreamLegacy)", nullptr, 1},
      {"cudaStreamPerThread", cudaStreamPerThread, "cudaStreamSynchronize(cudaStreamLegacy)", nullptr, 1},
      {"a blocking stream", blocking, "cudaDeviceSynchronize", nullptr, 2},
#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
      // Legacy-stream work; with per-thread default streams cudaMemcpy is the
      // thread's stream's, which does not follow other blocking streams.
      {"a blocking stream", blocking, "a synchronous cudaMemcpy", nullptr, 3},
      {"a blocking stream", blocking, "a synchronous cudaMemcpy from pageable memory", nullptr, 4},
#endif
      {"the legacy stream", cudaStreamLegacy, "a synchronous cudaMemcpy from pageable memory", nullptr, 4},
      {"cudaStreamPerThread", cudaStreamPerThread, "a synchronous cudaMemcpy", nullptr, 3},
  };
  std::vector<int> pageable(kP);
  int cross = 0;
  for (int it = 0; it < iterations; ++it)
    for (const Case& k : cases) {
      for (int callback_api = 0; callback_api < 2; ++callback_api, ++cross) {
        std::memset(pinned, 0, kP * sizeof(int));
        std::memset(back, 0, kP * sizeof(int));
        std::fill(pageable.begin(), pageable.end(), 0);
        int* written = k.sync == 4 ? pageable.data() : pinned;
        CHECK(cudaMemset(dev, 0, kP * sizeof(int)));
        CHECK(cudaDeviceSynchronize());
        if (callback_api) CHECK(cudaStreamAddCallback(k.fn_stream, late_callback, written, 0));
        else CHECK(cudaLaunchHostFunc(k.fn_stream, late_writer, written));
        int got = 0;
        if (k.sync == 0) {
          CHECK(cudaMemcpyAsync(dev, pinned, kP * sizeof(int), cudaMemcpyHostToDevice, k.copy_stream));
          CHECK(cudaMemcpyAsync(back, dev, kP * sizeof(int), cudaMemcpyDeviceToHost, k.copy_stream));
          CHECK(cudaStreamSynchronize(k.copy_stream));
          got = back[kP - 1];
        } else if (k.sync >= 3) {
          CHECK(cudaMemcpy(dev, written, kP * sizeof(int), cudaMemcpyHostToDevice));
          CHECK(cudaMemcpy(back, dev, kP * sizeof(int), cudaMemcpyDeviceToHost));
          got = back[kP - 1];
        } else {
          CHECK(k.sync == 1 ? cudaStreamSynchronize(cudaStreamLegacy) : cudaDeviceSynchronize());
          got = pinned[kP - 1];
        }
        CHECK(cudaDeviceSynchronize());
        if (got != 7) {
          ++violations;
          std::printf("violation: %s after %s on %s did not wait for it (saw %d, want 7)\n", k.then,
                      callback_api ? "cudaStreamAddCallback" : "cudaLaunchHostFunc", k.fn_on, got);
        }
      }
    }
  std::printf("host-side stream work: %d violations in %d cases\n", violations, iterations * 6 + 3 + cross);
  return violations ? 1 : 0;
}

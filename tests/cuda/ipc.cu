// CUDA legacy IPC between two processes: memory handles (cudaIpcGetMemHandle,
// cudaIpcOpenMemHandle, cudaIpcCloseMemHandle) and interprocess events
// (cudaIpcGetEventHandle, cudaIpcOpenEventHandle). The parent (exporter) forks
// one child (importer) before any CUDA call, as CUDA requires; they talk over
// two pipes. Functional part: three buffers filled by the exporter, read,
// reopened (a reference), written by the importer's kernels and read back by
// the exporter; misuse that must fail. Ordering part: each round the exporter
// launches a slow kernel writing B and records an interprocess event; the
// importer waits for that event (stream wait, event synchronize or query
// polling) and reads B, which must hold the round's values, else a violation.
// The importer's device is 1 where there are several devices that can reach
// device 0 (cudaIpcMemLazyEnablePeerAccess); the ordering part is on device 0.
//
//   ipc [rounds] [delay]   rounds (default 20); the slow kernel's sleep in us (default 3000)
//
// Prints "violations: N" (the importer) and exits 1 if N > 0; 2 for a failed
// call or a dead peer, 3 for failed checks. Output has no addresses or codes:
// the native run and the run through ordo must print the same lines.
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

namespace {

constexpr int kBuffers = 3;
constexpr size_t kBytes[kBuffers] = {4096, size_t{3} << 20, (size_t{64} << 20) + 256};
constexpr int kN = 1024;  // ints of the ordering part's buffer B
constexpr int kImported = -1, kReady = -2;  // acks; rounds are 1..R, 0 ends them

int base_of(int k) { return (k + 1) << 24; }  // the exporter's pattern: base + index
int added(int k) { return 1000 * (k + 1); }   // what the importer's kernel adds

struct OrderingHandles {
  cudaIpcEventHandle_t event;
  cudaIpcMemHandle_t b;
};
static_assert(sizeof(cudaIpcMemHandle_t) == 64 && sizeof(cudaIpcEventHandle_t) == 64);

int rfd = -1, wfd = -1;
pid_t child = 0;  // in the exporter
const char* peer = "";

void print_status(int st) {
  std::printf("  the importer %s %d\n", WIFEXITED(st) ? "exited with" : "was killed by signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

void send_raw(const void* p, size_t n, int line) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(wfd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      std::printf("FAIL %s:%d: writing to the %s: %s\n", __FILE__, line, peer, std::strerror(errno));
      std::exit(2);
    }
    c += w;
    n -= size_t(w);
  }
}

// A peer that died closed its end: EOF is a failure, never a wait.
void recv_raw(void* p, size_t n, int line) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(rfd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      std::printf("FAIL %s:%d: the %s closed its pipe (%s)\n", __FILE__, line, peer,
                  r == 0 ? "it failed or died" : std::strerror(errno));
      int st = 0;
      if (child > 0 && waitpid(child, &st, 0) == child) print_status(st);
      std::exit(2);
    }
    c += r;
    n -= size_t(r);
  }
}

#define SEND(x) send_raw(&(x), sizeof(x), __LINE__)
#define RECV(x) recv_raw(&(x), sizeof(x), __LINE__)

void expect_msg(int want, int line) {
  int got = 0;
  recv_raw(&got, sizeof got, line);
  if (got != want) {
    std::printf("FAIL %s:%d: the %s sent %d, want %d\n", __FILE__, line, peer, got, want);
    std::exit(2);
  }
}
#define EXPECT_MSG(want) expect_msg(want, __LINE__)

void launch_fill(int* p, size_t n, int v) {
  fill<<<unsigned((n + 255) / 256), 256>>>(p, int(n), v);
  CHECK(cudaGetLastError());
}

// Every element i is base + i: the whole of a small buffer, three windows of
// the 64 MiB one (its ends, the 256 bytes past 64 MiB included, and its middle).
bool matches(const int* p, size_t bytes, int base) {
  const size_t n = bytes / sizeof(int), w = 65536;
  std::vector<std::pair<size_t, size_t>> ranges = {{0, n}};
  if (bytes > (size_t{16} << 20)) ranges = {{0, w}, {n / 2 - w / 2, w}, {n - w, w}};
  std::vector<int> h;
  for (auto [first, count] : ranges) {
    h.resize(count);
    CHECK(cudaMemcpy(h.data(), p + first, count * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i)
      if (h[i] != base + int(first + i)) {
        std::printf("  element %zu of %zu bytes: %d, want %d\n", first + i, bytes, h[i], base + int(first + i));
        return false;
      }
  }
  return true;
}

void clear_error() { (void)cudaGetLastError(); }  // a refused call leaves its error behind

int exporter(int rounds, unsigned delay) {
  CHECK(cudaSetDevice(0));
  int* buf[kBuffers];
  cudaIpcMemHandle_t h[kBuffers];
  for (int k = 0; k < kBuffers; ++k) {
    CHECK(cudaMalloc(&buf[k], kBytes[k]));
    launch_fill(buf[k], kBytes[k] / sizeof(int), base_of(k));
  }
  CHECK(cudaDeviceSynchronize());
  for (int k = 0; k < kBuffers; ++k) CHECK(cudaIpcGetMemHandle(&h[k], buf[k]));
  // A handle is for other processes only.
  void* self = nullptr;
  EXPECT(cudaIpcOpenMemHandle(&self, h[0], cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
  clear_error();
  std::printf("exporter: %d buffers filled (%zu, %zu, %zu bytes), handles sent\n", kBuffers, kBytes[0], kBytes[1],
              kBytes[2]);
  SEND(h);

  EXPECT_MSG(kImported);
  for (int k = 0; k < kBuffers; ++k) EXPECT(matches(buf[k], kBytes[k], base_of(k) + added(k)));
  std::printf("exporter: the importer's writes are in its buffers\n");

  // Ordering: src is the exporter's own; B is shared. The importer's ack of a
  // round comes after its read of B, so the next round's kernel cannot race it.
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  int *b, *src;
  CHECK(cudaMalloc(&b, kN * sizeof(int)));
  CHECK(cudaMalloc(&src, kN * sizeof(int)));
  CHECK(cudaMemset(b, 0, kN * sizeof(int)));
  CHECK(cudaDeviceSynchronize());
  OrderingHandles oh;
  CHECK(cudaIpcGetEventHandle(&oh.event, ev));
  CHECK(cudaIpcGetMemHandle(&oh.b, b));
  std::printf("exporter: ordering, %d rounds, kernel sleep %u us\n", rounds, delay);
  SEND(oh);
  EXPECT_MSG(kReady);
  for (int r = 1; r <= rounds; ++r) {
    fill<<<kN / 256, 256, 0, s>>>(src, kN, r * kN);
    slow_copy<<<1, 256, 0, s>>>(src, b, kN, delay);  // sleeps first: B changes only at its end
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(ev, s));
    SEND(r);
    EXPECT_MSG(r);
  }
  const int done = 0;
  SEND(done);
  int violations = 0;
  RECV(violations);  // sent once the importer closed every handle: now the memory may go
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaEventDestroy(ev));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(b));
  CHECK(cudaFree(src));
  for (int k = 0; k < kBuffers; ++k) CHECK(cudaFree(buf[k]));
  CHECK(cudaGetLastError());

  int st = 0;
  if (waitpid(child, &st, 0) != child) {
    std::printf("FAIL %s:%d: waitpid: %s\n", __FILE__, __LINE__, std::strerror(errno));
    return 2;
  }
  const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (code != 0 && code != 1) {
    std::printf("FAIL %s:%d: the importer failed\n", __FILE__, __LINE__);
    print_status(st);
    return code == 3 ? 3 : 2;
  }
  EXPECT((code == 1) == (violations > 0));
  // Exit 1 only for violations alone: the harness's unordered mode tells them apart.
  if (failures) {
    std::printf("FAILED (%d failures)\n", failures);
    return 3;
  }
  std::printf("%s\n", violations ? "FAILED (violations)" : "OK");
  return violations ? 1 : 0;
}

int importer() {
  int count = 0, can = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count > 1) CHECK(cudaDeviceCanAccessPeer(&can, 1, 0));
  const int dev = can ? 1 : 0;
  CHECK(cudaSetDevice(dev));
  cudaIpcMemHandle_t h[kBuffers];
  RECV(h);
  int* p[kBuffers];
  for (int k = 0; k < kBuffers; ++k) {
    CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p[k]), h[k], cudaIpcMemLazyEnablePeerAccess));
    EXPECT(matches(p[k], kBytes[k], base_of(k)));
  }
  // The device is where the memory resides (the exporter's, 0), wherever it is opened.
  cudaPointerAttributes a = {};
  CHECK(cudaPointerGetAttributes(&a, p[1] + 100));
  EXPECT(a.type == cudaMemoryTypeDevice && a.device == 0 && a.devicePointer == p[1] + 100);
  std::printf("importer: %d buffers opened on device %d, the exporter's data in them\n", kBuffers, dev);

  // A second open of a handle is a reference to the same mapping: one close leaves it mapped.
  for (int k = 0; k < kBuffers; ++k) {
    void* again = nullptr;
    CHECK(cudaIpcOpenMemHandle(&again, h[k], cudaIpcMemLazyEnablePeerAccess));
    EXPECT(again == p[k]);
    CHECK(cudaIpcCloseMemHandle(again));
    EXPECT(matches(p[k], kBytes[k], base_of(k)));
  }
  std::printf("importer: a second open gives the same pointer; closing it once leaves the memory\n");
  for (int k = 0; k < kBuffers; ++k) {
    const size_t n = kBytes[k] / sizeof(int);
    add<<<unsigned((n + 255) / 256), 256>>>(p[k], int(n), added(k));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  // Misuse: only cudaEventCreateWithFlags's code is documented; the rest must fail.
  int* own = nullptr;
  CHECK(cudaMalloc(&own, 4096));
  EXPECT(cudaIpcCloseMemHandle(own) != cudaSuccess);
  clear_error();
  CHECK(cudaFree(own));
  cudaIpcMemHandle_t junk;
  std::memset(&junk, 0xAB, sizeof junk);
  void* q = nullptr;
  EXPECT(cudaIpcOpenMemHandle(&q, junk, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
  clear_error();
  cudaEvent_t e = nullptr;
  const cudaError_t timed = cudaEventCreateWithFlags(&e, cudaEventInterprocess);
  EXPECT(timed == cudaErrorInvalidValue);
  clear_error();
  if (timed == cudaSuccess) CHECK(cudaEventDestroy(e));
  CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaIpcEventHandle_t eh;
  EXPECT(cudaIpcGetEventHandle(&eh, e) != cudaSuccess);
  clear_error();
  CHECK(cudaEventDestroy(e));
  std::printf("importer: kernels wrote its buffers; misuse refused\n");
  SEND(kImported);

  OrderingHandles oh;
  RECV(oh);
  CHECK(cudaSetDevice(0));
  cudaEvent_t ev;
  CHECK(cudaIpcOpenEventHandle(&ev, oh.event));
  int* b = nullptr;
  CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&b), oh.b, cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t s2;
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  int* host = nullptr;
  CHECK(cudaMallocHost(&host, kN * sizeof(int)));
  SEND(kReady);
  int violations = 0;
  for (;;) {
    int r = 0;
    RECV(r);
    if (r == 0) break;
    if (r % 3 == 0) {  // the host waits for the event
      CHECK(cudaEventSynchronize(ev));
      CHECK(cudaMemcpy(host, b, kN * sizeof(int), cudaMemcpyDeviceToHost));
    } else {
      if (r % 3 == 1) {  // the stream waits for the event
        CHECK(cudaStreamWaitEvent(s2, ev, 0));
      } else {  // the host polls the event
        cudaError_t st;
        while ((st = cudaEventQuery(ev)) == cudaErrorNotReady) usleep(50);
        CHECK(st);
      }
      CHECK(cudaMemcpyAsync(host, b, kN * sizeof(int), cudaMemcpyDeviceToHost, s2));
      CHECK(cudaStreamSynchronize(s2));
    }
    int bad = 0;
    for (int i = 0; i < kN; ++i) bad += host[i] != r * kN + i;
    if (bad) {
      ++violations;
      std::printf("importer: round %d: %d elements read before the exporter's kernel wrote them\n", r, bad);
    }
    SEND(r);
  }
  CHECK(cudaFreeHost(host));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaEventDestroy(ev));
  CHECK(cudaIpcCloseMemHandle(b));
  EXPECT(cudaIpcCloseMemHandle(b) != cudaSuccess);  // closed already
  clear_error();
  CHECK(cudaSetDevice(dev));
  for (int k = 0; k < kBuffers; ++k) CHECK(cudaIpcCloseMemHandle(p[k]));
  for (int k = 0; k < kBuffers; ++k) {
    EXPECT(cudaIpcCloseMemHandle(p[k]) != cudaSuccess);
    clear_error();
  }
  CHECK(cudaGetLastError());
  std::printf("importer: every handle closed, a second close refused\n");
  std::printf("violations: %d\n", violations);
  SEND(violations);
  return failures ? 3 : violations ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 20;
  // A few ms on the sim (its twin sleeps this long) and natively: the
  // importer's wait is issued while the kernel still runs.
  const unsigned delay = argc > 2 ? unsigned(std::atoi(argv[2])) : 3000;
  // Line by line, so that the two processes' lines land in protocol order.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);  // a dead peer is an EPIPE to report, not a silent death
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) {
    std::printf("FAIL %s:%d: pipe: %s\n", __FILE__, __LINE__, std::strerror(errno));
    return 2;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();  // before any CUDA call: a forked CUDA context is unusable
  if (pid < 0) {
    std::printf("FAIL %s:%d: fork: %s\n", __FILE__, __LINE__, std::strerror(errno));
    return 2;
  }
  if (pid == 0) {
    // Dies with the exporter even when blocked in a CUDA call that waits on it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) return 2;
    close(to_child[1]);
    close(to_parent[0]);
    rfd = to_child[0];
    wfd = to_parent[1];
    peer = "exporter";
    return importer();
  }
  child = pid;
  close(to_child[0]);
  close(to_parent[1]);
  rfd = to_parent[0];
  wfd = to_child[1];
  peer = "importer";
  return exporter(rounds, delay);
}

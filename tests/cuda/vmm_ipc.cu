// Virtual memory shared between two processes as NCCL's proxy and PyTorch's
// expandable segments share it: cuMemCreate asking for POSIX descriptors,
// cuMemExportToShareableHandle, the descriptor sent over a Unix socket with
// SCM_RIGHTS, cuMemImportFromShareableHandle in the other process. The parent
// (exporter) forks the child (importer) before any CUDA call. The exporter
// fills two granules of device 0, refuses misuse (an unknown flag, a handle
// made without POSIX descriptors), imports its own descriptor (the same
// memory at a second address), and sends the descriptor. The importer refuses
// descriptors no export made (/dev/null, a pipe), imports the one it got twice
// (on device 1 where there are several devices and 1 reaches 0, else 0), reads
// the exporter's data, writes through one import and reads through the other;
// the exporter reads those writes through its own mapping. Each releases
// everything; the exporter only after the importer's last message.
//
// Exits 2 for a failed call or a dead peer, 3 for failed checks. Output has
// no addresses or codes: the native run and the run through ordo must print
// the same lines.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "expect.cuh"
#include "fill.cuh"

const char* cu_name(CUresult r) {
  const char* n = nullptr;
  cuGetErrorName(r, &n);
  return n ? n : "?";
}

#define CU_CHECK(call)                                                                                  \
  do {                                                                                                  \
    CUresult r_ = (call);                                                                               \
    if (r_ != CUDA_SUCCESS) {                                                                           \
      std::printf("FAIL %s:%d: %s -> error %d (%s)\n", __FILE__, __LINE__, #call, int(r_), cu_name(r_)); \
      std::exit(2);                                                                                     \
    }                                                                                                   \
  } while (0)

// A call whose result r_ must satisfy cond; counted as a failure otherwise.
#define CU_EXPECT(call, cond)                                                                                     \
  do {                                                                                                            \
    CUresult r_ = (call);                                                                                         \
    if (!(cond)) {                                                                                                \
      std::printf("FAIL %s:%d: %s -> error %d (%s), want %s\n", __FILE__, __LINE__, #call, int(r_), cu_name(r_), \
                  #cond);                                                                                         \
      ++failures;                                                                                                 \
    }                                                                                                             \
  } while (0)

namespace {

constexpr CUmemAllocationHandleType kFdType = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
constexpr int kBase1 = 1 << 24, kBase2 = 2 << 24, kAdded = 7000;
enum : int { kFd = 1, kImported, kChecked, kReleased };  // the messages, in protocol order
struct Msg {
  int kind;
  uint64_t size;
};

int sock = -1;
pid_t child = 0;  // in the exporter
const char* peer = "";

void* as_os_handle(int fd) { return reinterpret_cast<void*>(uintptr_t(fd)); }

// Kind and size, and where fd >= 0 the descriptor as SCM_RIGHTS.
void send_msg(int kind, uint64_t size, int fd, int line) {
  Msg m = {kind, size};
  iovec iov = {&m, sizeof m};
  msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  ssize_t w;
  do w = sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w != ssize_t(sizeof m)) {
    std::printf("FAIL %s:%d: sending to the %s: %s\n", __FILE__, line, peer, w < 0 ? std::strerror(errno) : "short");
    std::exit(2);
  }
}

void print_status(int st) {
  std::printf("  the importer %s %d\n", WIFEXITED(st) ? "exited with" : "was killed by signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

// The message of kind `want`; its descriptor into *fd where fd is given (it must
// carry one). A peer that died closed its end: EOF is a failure, never a wait.
Msg recv_msg(int want, int* fd, int line) {
  Msg m = {};
  iovec iov = {&m, sizeof m};
  msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t r;
  do r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  if (r <= 0) {
    std::printf("FAIL %s:%d: the %s closed its socket (%s)\n", __FILE__, line, peer,
                r == 0 ? "it failed or died" : std::strerror(errno));
    int st = 0;
    if (child > 0 && waitpid(child, &st, 0) == child) print_status(st);
    std::exit(2);
  }
  int got = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&got, CMSG_DATA(c), sizeof got);
  if (r != ssize_t(sizeof m) || m.kind != want || (mh.msg_flags & MSG_CTRUNC) || (fd != nullptr) != (got >= 0)) {
    std::printf("FAIL %s:%d: the %s sent message %d (%zd bytes, descriptor %s), want %d%s\n", __FILE__, line, peer,
                m.kind, r, got >= 0 ? "yes" : "no", want, fd ? " with a descriptor" : "");
    std::exit(2);
  }
  if (fd) *fd = got;
  return m;
}

#define SEND(kind, size, fd) send_msg(kind, size, fd, __LINE__)
#define RECV(kind, fd) recv_msg(kind, fd, __LINE__)

CUmemAllocationProp device_prop(int device, bool shareable) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = shareable ? kFdType : CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// The whole of h at a fresh reservation, readable and writable from device.
CUdeviceptr map_rw(CUmemGenericAllocationHandle h, size_t size, int device) {
  CUdeviceptr va = 0;
  CU_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
  CU_CHECK(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK(cuMemSetAccess(va, size, &d, 1));
  return va;
}

void unmap_free(CUdeviceptr va, size_t size) {
  CU_CHECK(cuMemUnmap(va, size));
  CU_CHECK(cuMemAddressFree(va, size));
}

int* as_ints(CUdeviceptr p) { return reinterpret_cast<int*>(p); }

// Element i of the n ints at p is base + i.
bool matches(CUdeviceptr p, size_t n, int base) {
  std::vector<int> h(n);
  CU_CHECK(cuMemcpyDtoH(h.data(), p, n * sizeof(int)));
  for (size_t i = 0; i < n; ++i)
    if (h[i] != base + int(i)) {
      std::printf("  element %zu: %d, want %d\n", i, h[i], base + int(i));
      return false;
    }
  return true;
}

void run_fill(CUdeviceptr p, size_t n, int v) {
  fill<<<unsigned((n + 255) / 256), 256>>>(as_ints(p), int(n), v);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
}

int exporter() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // the primary context, current for the driver calls
  const CUmemAllocationProp prop = device_prop(0, true);
  size_t g = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = 2 * g, n = size / sizeof(int);
  CUmemGenericAllocationHandle h = 0;
  CU_CHECK(cuMemCreate(&h, size, &prop, 0));
  const CUdeviceptr va = map_rw(h, size, 0);
  run_fill(va, n, kBase1);
  EXPECT(matches(va, n, kBase1));
  std::printf("exporter: two granules of device 0 mapped and filled\n");

  // Misuse: an unknown flag (cuda.h: flags must be 0), a handle made without
  // asking for descriptors.
  int fd = -1;
  CU_EXPECT(cuMemExportToShareableHandle(&fd, h, kFdType, 1), r_ == CUDA_ERROR_INVALID_VALUE);
  const CUmemAllocationProp plain = device_prop(0, false);
  CUmemGenericAllocationHandle hp = 0;
  CU_CHECK(cuMemCreate(&hp, g, &plain, 0));
  CU_EXPECT(cuMemExportToShareableHandle(&fd, hp, kFdType, 0), r_ != CUDA_SUCCESS);
  CU_CHECK(cuMemRelease(hp));
  std::printf("exporter: export with flags 1 and of a handle without descriptors refused\n");

  fd = -1;
  CU_CHECK(cuMemExportToShareableHandle(&fd, h, kFdType, 0));
  EXPECT(fd >= 0 && fcntl(fd, F_GETFD) != -1);  // a descriptor of this process

  // Imported in its own process: another handle for the same memory. Writes
  // through it are seen through the first; its release leaves the memory.
  CUmemGenericAllocationHandle hs = 0;
  CU_CHECK(cuMemImportFromShareableHandle(&hs, as_os_handle(fd), kFdType));
  const CUdeviceptr vs = map_rw(hs, size, 0);
  EXPECT(matches(vs, n, kBase1));
  run_fill(vs, n, kBase2);
  EXPECT(matches(va, n, kBase2));
  unmap_free(vs, size);
  CU_CHECK(cuMemRelease(hs));
  EXPECT(matches(va, n, kBase2));
  std::printf("exporter: its own descriptor imported: the same memory at a second address\n");

  SEND(kFd, size, fd);
  close(fd);  // the importer has its own now
  RECV(kImported, nullptr);
  EXPECT(matches(va, n, kBase2 + kAdded));
  std::printf("exporter: the importer's writes are in its own mapping\n");
  SEND(kChecked, 0, -1);
  RECV(kReleased, nullptr);  // the importer let go of everything: now the memory may go
  EXPECT(matches(va, n, kBase2 + kAdded));
  unmap_free(va, size);
  CU_CHECK(cuMemRelease(h));
  CHECK(cudaGetLastError());
  std::printf("exporter: everything released after the importer\n");

  int st = 0;
  if (waitpid(child, &st, 0) != child) {
    std::printf("FAIL %s:%d: waitpid: %s\n", __FILE__, __LINE__, std::strerror(errno));
    return 2;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::printf("FAIL %s:%d: the importer failed\n", __FILE__, __LINE__);
    print_status(st);
    return WIFEXITED(st) && WEXITSTATUS(st) == 3 ? 3 : 2;
  }
  if (failures) {
    std::printf("FAILED (%d failures)\n", failures);
    return 3;
  }
  std::printf("OK\n");
  return 0;
}

int importer() {
  int count = 0, can = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count > 1) CHECK(cudaDeviceCanAccessPeer(&can, 1, 0));
  const int dev = can ? 1 : 0;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaFree(nullptr));

  // Descriptors that no export made.
  CUmemGenericAllocationHandle bad = 0;
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  EXPECT(null_fd >= 0);
  CU_EXPECT(cuMemImportFromShareableHandle(&bad, as_os_handle(null_fd), kFdType), r_ != CUDA_SUCCESS);
  close(null_fd);
  int pipe_fds[2];
  EXPECT(pipe2(pipe_fds, O_CLOEXEC) == 0);
  CU_EXPECT(cuMemImportFromShareableHandle(&bad, as_os_handle(pipe_fds[0]), kFdType), r_ != CUDA_SUCCESS);
  close(pipe_fds[0]);
  close(pipe_fds[1]);

  int fd = -1;
  const size_t size = RECV(kFd, &fd).size, n = size / sizeof(int);
  std::printf("importer: descriptors of /dev/null and a pipe refused\n");
  CUmemGenericAllocationHandle h2 = 0, h3 = 0;
  CU_CHECK(cuMemImportFromShareableHandle(&h2, as_os_handle(fd), kFdType));
  CU_CHECK(cuMemImportFromShareableHandle(&h3, as_os_handle(fd), kFdType));
  close(fd);  // the handles hold the memory
  CUmemAllocationProp p = {};
  CU_CHECK(cuMemGetAllocationPropertiesFromHandle(&p, h2));
  std::printf("importer: imported handle's location: type %d, id %d\n", int(p.location.type), p.location.id);
  EXPECT(p.location.type == CU_MEM_LOCATION_TYPE_DEVICE && p.location.id == 0);

  const CUdeviceptr v2 = map_rw(h2, size, dev), v3 = map_rw(h3, size, dev);
  EXPECT(matches(v2, n, kBase2));
  EXPECT(matches(v3, n, kBase2));
  std::printf("importer: the descriptor imported twice on device %d, the exporter's data in both\n", dev);
  add<<<unsigned((n + 255) / 256), 256>>>(as_ints(v2), int(n), kAdded);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  EXPECT(matches(v3, n, kBase2 + kAdded));
  std::printf("importer: a kernel's writes through one import are seen through the other\n");
  SEND(kImported, 0, -1);

  RECV(kChecked, nullptr);
  unmap_free(v2, size);
  unmap_free(v3, size);
  CU_CHECK(cuMemRelease(h2));
  CU_CHECK(cuMemRelease(h3));
  CHECK(cudaGetLastError());
  std::printf("importer: everything released\n");
  SEND(kReleased, 0, -1);
  return failures ? 3 : 0;
}

}  // namespace

int main() {
  // Line by line, so that the two processes' lines land in protocol order.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    std::printf("FAIL %s:%d: socketpair: %s\n", __FILE__, __LINE__, std::strerror(errno));
    return 2;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();  // before any CUDA call: a forked CUDA context is unusable
  if (pid < 0) {
    std::printf("FAIL %s:%d: fork: %s\n", __FILE__, __LINE__, std::strerror(errno));
    return 2;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the exporter even inside a CUDA call
    if (getppid() != parent) return 2;
    close(sv[0]);
    sock = sv[1];
    peer = "exporter";
    return importer();
  }
  child = pid;
  close(sv[1]);
  sock = sv[0];
  peer = "importer";
  return exporter();
}

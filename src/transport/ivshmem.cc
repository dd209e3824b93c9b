#include "ivshmem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace ordo {

std::string ivshmem_bar0_path(const std::string& region_path) {
  for (const char* bar2 : {"/resource2_wc", "/resource2"}) {
    const size_t n = std::strlen(bar2);
    if (region_path.size() > n && region_path.compare(region_path.size() - n, n, bar2) == 0)
      return region_path.substr(0, region_path.size() - n) + "/resource0";
  }
  return {};
}

std::unique_ptr<IvshmemBell> IvshmemBell::open(const std::string& bar0_path, std::string* error) {
  const int fd = ::open(bar0_path.c_str(), O_RDWR | O_SYNC | O_CLOEXEC);
  if (fd < 0) {
    if (error) *error = "cannot open ivshmem registers " + bar0_path + ": " + std::strerror(errno);
    return nullptr;
  }
  // BAR0 is 256 bytes; sysfs maps whole pages, so the registers sit at the
  // BAR's offset within its page (the first line of the sibling "resource" file).
  uint64_t start = 0;
  const std::string dev = bar0_path.substr(0, bar0_path.rfind('/'));
  if (FILE* f = std::fopen((dev + "/resource").c_str(), "r")) {
    if (std::fscanf(f, "%" SCNx64, &start) != 1) start = 0;
    std::fclose(f);
  }
  const long page = sysconf(_SC_PAGESIZE);
  void* p = ::mmap(nullptr, size_t(page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    if (error) *error = "cannot map ivshmem registers " + bar0_path + ": " + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<IvshmemBell> b(new IvshmemBell());
  b->map_ = p;
  b->regs_ = reinterpret_cast<volatile uint32_t*>(static_cast<char*>(p) + (start & uint64_t(page - 1)));
  return b;
}

IvshmemBell::~IvshmemBell() {
  if (map_) ::munmap(map_, size_t(sysconf(_SC_PAGESIZE)));
}

void IvshmemBell::ring(uint32_t peer, uint32_t vector) const {
  regs_[kIvshmemDoorbell / 4] = (peer & 0xffff) << 16 | (vector & 0xffff);
}

namespace {

// One server message: a little-endian int64, maybe with one fd (SCM_RIGHTS).
// Returns 1 on a message, 0 when none is waiting (nonblocking), -1 on EOF/error.
int recv_message(int sock, bool block, int64_t* value, int* fd) {
  *fd = -1;
  int64_t v = 0;
  iovec iov{&v, sizeof v};
  // Room for a few fds: a misbehaving server's extras are received, then closed.
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (block ? 0 : MSG_DONTWAIT));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  if (n < 0) return -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
      if (*fd < 0 && n == sizeof v) *fd = got;
      else ::close(got);
    }
  }
  if (n != sizeof v) return -1;
  *value = int64_t(le64toh(uint64_t(v)));
  return 1;
}

}  // namespace

std::unique_ptr<IvshmemPeer> IvshmemPeer::join(const std::string& socket_path, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = "ivshmem-server " + socket_path + ": " + why;
    return nullptr;
  };
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) return fail("socket path too long");
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  std::unique_ptr<IvshmemPeer> p(new IvshmemPeer());
  p->sock_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (p->sock_ < 0 || ::connect(p->sock_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return fail(std::string("cannot connect: ") + std::strerror(errno) + " (is the server running?)");
  // A server that stalls mid-setup must not hang the worker's start.
  timeval tv{5, 0};
  ::setsockopt(p->sock_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int64_t v;
  int fd;
  if (recv_message(p->sock_, true, &v, &fd) != 1) return fail("closed before the protocol version");
  if (fd >= 0) ::close(fd);
  if (v != kIvshmemProtocolVersion) return fail("protocol version " + std::to_string(v) + ", expected 0");
  if (recv_message(p->sock_, true, &v, &fd) != 1) return fail("closed before our peer id");
  if (fd >= 0) ::close(fd);
  if (v < 0 || v >= int64_t{kIvshmemMaxPeers}) return fail("bad peer id " + std::to_string(v));
  p->id_ = uint32_t(v);
  if (recv_message(p->sock_, true, &v, &fd) != 1 || v != -1 || fd < 0) {
    if (fd >= 0) ::close(fd);
    return fail("expected the shared memory fd after the peer id");
  }
  p->shm_fd_ = fd;
  // Other peers' vectors come first (we close them: the worker never rings a
  // guest), then ours, one per vector. Guests ring vector 0; any further vectors
  // of ours arrive later and drain() closes them.
  while (p->own_.empty()) {
    if (recv_message(p->sock_, true, &v, &fd) != 1) return fail("closed before sending our eventfds");
    if (v == int64_t{p->id_} && fd >= 0) p->own_.push_back(fd);
    else if (fd >= 0) ::close(fd);
  }
  return p;
}

bool IvshmemPeer::drain() {
  int64_t v;
  int fd;
  for (;;) {
    const int r = recv_message(sock_, false, &v, &fd);
    if (r == 0) return true;
    if (r < 0) return false;
    if (fd >= 0) ::close(fd);
  }
}

IvshmemPeer::~IvshmemPeer() {
  for (int fd : own_) ::close(fd);
  if (shm_fd_ >= 0) ::close(shm_fd_);
  if (sock_ >= 0) ::close(sock_);
}

}  // namespace ordo

// ordo-ivshmem-server: the ivshmem-server protocol (QEMU docs/specs/ivshmem-spec.rst)
// for hosts whose QEMU package does not ship contrib/ivshmem-server (Debian's
// does not). QEMU's own server works with ordo-worker just as well.
//
// Each client (a QEMU with -device ivshmem-doorbell, or ordo-worker) gets: the
// protocol version, its peer id, the shared memory fd, every other peer's
// eventfds, then its own. Peers learn of each other's arrival (id + fd) and
// departure (id alone).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ordo/region.h"
#include "transport/ivshmem.h"

namespace {

struct Peer {
  int sock = -1;
  uint32_t id = 0;
  std::vector<int> vectors;  // eventfds, one per vector
};

volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

bool send_message(int sock, int64_t value, int fd) {
  int64_t v = int64_t(htole64(uint64_t(value)));
  iovec iov{&v, sizeof v};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL) == sizeof v;
}

void close_peer(Peer& p) {
  for (int fd : p.vectors) ::close(fd);
  ::close(p.sock);
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: ordo-ivshmem-server --socket PATH --region PATH [--size N] [--vectors N] [--verbose]\n"
               "  --socket PATH   the Unix socket QEMU (-chardev socket,path=PATH) and ordo-worker connect to\n"
               "  --region PATH   the shared memory file (e.g. /dev/shm/ordo-vm1), created when missing\n"
               "  --size N        its size, a power of two (default 64M; K/M/G suffixes)\n"
               "  --vectors N     interrupt vectors per peer (default 1; QEMU's vectors= must match)\n");
}

struct Options {
  std::string socket_path, region_path;
  uint64_t size = 64ull << 20;
  unsigned vectors = 1;
  bool verbose = false;
};

// False: exit with *rc.
bool parse(int argc, char** argv, Options* o, int* rc) {
  *rc = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ordo-ivshmem-server: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--socket") o->socket_path = value();
    else if (a == "--region") o->region_path = value();
    else if (a == "--size") o->size = ordo::parse_size(value());
    else if (a == "--vectors") o->vectors = unsigned(std::strtoul(value().c_str(), nullptr, 0));
    else if (a == "--verbose") o->verbose = true;
    else if (a == "--help" || a == "-h") {
      usage(stdout);
      *rc = 0;
      return false;
    } else {
      std::fprintf(stderr, "ordo-ivshmem-server: unknown option %s\n", a.c_str());
      usage(stderr);
      return false;
    }
  }
  if (o->socket_path.empty() || o->region_path.empty() || o->vectors < 1 || o->vectors > 64 || o->size == 0 ||
      (o->size & (o->size - 1)) != 0) {
    std::fprintf(stderr, "ordo-ivshmem-server: need --socket, --region, a power-of-two --size and 1..64 --vectors\n");
    usage(stderr);
    return false;
  }
  return true;
}

// The listening socket, or -1 (said why). *rc: the exit status then.
int listen_on(const std::string& path, int* rc) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    std::fprintf(stderr, "ordo-ivshmem-server: socket path %s is too long\n", path.c_str());
    *rc = 2;
    return -1;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ::unlink(path.c_str());
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 16) != 0) {
    std::fprintf(stderr, "ordo-ivshmem-server: cannot listen on %s: %s\n", path.c_str(), std::strerror(errno));
    *rc = 1;
    return -1;
  }
  return listener;
}

struct Server {
  const Options& o;
  int shm;
  std::vector<Peer> peers;
  uint32_t next_id = 0;

  // Any message from a peer, or its hangup, means it is gone (the protocol has
  // no client-to-server messages).
  void drop(size_t k) {
    Peer gone = peers[k];
    peers.erase(peers.begin() + long(k));
    close_peer(gone);
    for (const Peer& p : peers) send_message(p.sock, gone.id, -1);
    if (o.verbose) std::fprintf(stderr, "ordo-ivshmem-server: peer %u left\n", gone.id);
  }

  // A new peer gets its id, the memory, every other peer's vectors and its own;
  // the others get its vectors.
  void admit(int sock) {
    Peer p;
    p.sock = sock;
    bool ok = peers.size() < ordo::kIvshmemMaxPeers;
    for (; ok; ++next_id) {  // an id no live peer holds
      bool used = false;
      for (const Peer& q : peers) used |= q.id == (next_id & 0xffff);
      if (!used) break;
    }
    p.id = next_id++ & 0xffff;
    for (unsigned v = 0; ok && v < o.vectors; ++v) {
      const int fd = ::eventfd(0, EFD_CLOEXEC);
      ok = fd >= 0;
      if (ok) p.vectors.push_back(fd);
    }
    ok = ok && send_message(p.sock, ordo::kIvshmemProtocolVersion, -1) && send_message(p.sock, p.id, -1) &&
         send_message(p.sock, -1, shm);
    for (const Peer& q : peers) {
      for (size_t v = 0; ok && v < q.vectors.size(); ++v) ok = send_message(p.sock, q.id, q.vectors[v]);
    }
    for (size_t v = 0; ok && v < p.vectors.size(); ++v) ok = send_message(p.sock, p.id, p.vectors[v]);
    if (!ok) {
      std::fprintf(stderr, "ordo-ivshmem-server: setting up a new peer failed: %s\n", std::strerror(errno));
      close_peer(p);
      return;
    }
    for (const Peer& q : peers) {
      for (int fd : p.vectors) send_message(q.sock, p.id, fd);
    }
    if (o.verbose) std::fprintf(stderr, "ordo-ivshmem-server: peer %u joined\n", p.id);
    peers.push_back(std::move(p));
  }

  void serve(int listener) {
    while (!g_stop) {
      std::vector<pollfd> fds{{listener, POLLIN, 0}};
      for (const Peer& p : peers) fds.push_back({p.sock, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR: look at g_stop
      for (size_t i = fds.size(); i-- > 1;)
        if (fds[i].revents) drop(i - 1);
      if (!(fds[0].revents & POLLIN)) continue;
      if (const int sock = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC); sock >= 0) admit(sock);
    }
    for (Peer& p : peers) close_peer(p);
  }
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int rc;
  if (!parse(argc, argv, &o, &rc)) return rc;
  const int shm = ::open(o.region_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  struct stat st{};
  if (shm < 0 || ::fstat(shm, &st) != 0 || (uint64_t(st.st_size) != o.size && ::ftruncate(shm, off_t(o.size)) != 0)) {
    std::fprintf(stderr, "ordo-ivshmem-server: cannot open or size %s: %s\n", o.region_path.c_str(), std::strerror(errno));
    return 1;
  }
  const int listener = listen_on(o.socket_path, &rc);
  if (listener < 0) return rc;
  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fprintf(stderr, "ordo-ivshmem-server: serving %s (%llu MiB, %u vectors) on %s\n", o.region_path.c_str(),
               (unsigned long long)(o.size >> 20), o.vectors, o.socket_path.c_str());
  Server{o, shm, {}}.serve(listener);
  ::close(listener);
  ::unlink(o.socket_path.c_str());
  return 0;
}

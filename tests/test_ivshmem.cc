// The ivshmem-doorbell plumbing on the host: ordo-ivshmem-server speaks the
// protocol QEMU expects, IvshmemPeer joins it, and a ring on the worker's
// eventfd (what QEMU does for a guest's BAR0 Doorbell write) wakes the worker's
// DoorbellWaiter. The VM test covers the guest's half.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ordo/doorbell.h"
#include "transport/ivshmem.h"
#include "worker/doorbell_waiter.h"

using namespace ordo;
using namespace std::chrono_literals;

namespace {

std::string unique_name(const char* what) {
  return "/tmp/ordo-test-ivshmem-" + std::to_string(getpid()) + "-" + what;
}

// What QEMU does: connect and read every message, keeping the fds.
struct RawClient {
  int sock = -1;
  struct Message {
    int64_t value;
    int fd;
  };
  std::vector<Message> got;

  explicit RawClient(const std::string& path) {
    sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    if (::connect(sock, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) sock = -1;
    timeval tv{0, 200000};
    ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawClient() {
    for (auto& m : got)
      if (m.fd >= 0) ::close(m.fd);
    if (sock >= 0) ::close(sock);
  }
  // Reads until nothing arrives for 200 ms.
  void read_all() {
    for (;;) {
      int64_t v;
      iovec iov{&v, sizeof v};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      if (::recvmsg(sock, &msg, 0) != sizeof v) return;
      int fd = -1;
      if (cmsghdr* c = CMSG_FIRSTHDR(&msg); c && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
      got.push_back({v, fd});
    }
  }
};

class Server {
 public:
  Server(const std::string& socket, const std::string& region) : socket_(socket) {
    const char* exe = std::getenv("ORDO_IVSHMEM_SERVER");
    if (!exe) throw std::runtime_error("ORDO_IVSHMEM_SERVER is not set: run the tests through meson test");
    pid_ = fork();
    if (pid_ == 0) {
      execl(exe, exe, "--socket", socket.c_str(), "--region", region.c_str(), "--size", "1M", "--vectors", "2",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 200 && ::access(socket.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(10ms);
  }
  ~Server() {
    ::kill(pid_, SIGTERM);
    int st;
    ::waitpid(pid_, &st, 0);
  }

 private:
  std::string socket_;
  pid_t pid_ = -1;
};

}  // namespace

TEST(Ivshmem, ServerSpeaksTheQemuProtocolAndPeersSeeEachOther) {
  const std::string sock = unique_name("sock"), region = unique_name("region");
  ::unlink(region.c_str());
  {
    Server server(sock, region);
    std::string err;
    auto worker = IvshmemPeer::join(sock, &err);
    ASSERT_TRUE(worker) << err;
    struct stat a{}, b{};
    ASSERT_EQ(::fstat(worker->shm_fd(), &a), 0);
    ASSERT_EQ(::stat(region.c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << "the server must share the --region file";
    EXPECT_EQ(b.st_size, 1 << 20);

    RawClient qemu(sock);
    ASSERT_GE(qemu.sock, 0);
    qemu.read_all();
    // version 0, own id, -1 + shm fd, the worker's 2 vectors, then our own 2.
    ASSERT_EQ(qemu.got.size(), 7u);
    EXPECT_EQ(qemu.got[0].value, 0);
    const int64_t me = qemu.got[1].value;
    EXPECT_NE(me, int64_t{worker->id()});
    EXPECT_EQ(qemu.got[2].value, -1);
    EXPECT_GE(qemu.got[2].fd, 0);
    EXPECT_EQ(qemu.got[3].value, int64_t{worker->id()});
    EXPECT_EQ(qemu.got[4].value, int64_t{worker->id()});
    EXPECT_EQ(qemu.got[5].value, me);
    EXPECT_EQ(qemu.got[6].value, me);

    // QEMU's Doorbell write for (worker id, vector 0) is a write to this fd.
    auto waiter = DoorbellWaiter::listen(unique_name("bell"), &err);
    ASSERT_TRUE(waiter) << err;
    waiter->add_eventfd(worker->vector0());
    EXPECT_FALSE(waiter->wait(20ms)) << "nobody rang yet";
    const uint64_t one = 1;
    ASSERT_EQ(::write(qemu.got[3].fd, &one, sizeof one), ssize_t(sizeof one));
    EXPECT_TRUE(waiter->wait(2s));
    // The read consumed the count: the next wait sleeps again.
    EXPECT_FALSE(waiter->wait(20ms));
    // A ring on vector 1 is not for the worker (guests ring vector 0).
    ASSERT_EQ(::write(qemu.got[4].fd, &one, sizeof one), ssize_t(sizeof one));
    EXPECT_FALSE(waiter->wait(20ms));
    // Rings arriving while the worker is busy still wake the next wait at once.
    ASSERT_EQ(::write(qemu.got[3].fd, &one, sizeof one), ssize_t(sizeof one));
    ASSERT_EQ(::write(qemu.got[3].fd, &one, sizeof one), ssize_t(sizeof one));
    EXPECT_TRUE(waiter->wait(2s));
    EXPECT_FALSE(waiter->wait(20ms));
    // The host socket still works alongside.
    DoorbellRinger(unique_name("bell")).ring();
    EXPECT_TRUE(waiter->wait(2s));

    // Peers learn of departures (an id without an fd); the worker drains them.
    RawClient observer(sock);
    observer.read_all();
    const size_t before = observer.got.size();
    ::close(qemu.sock);
    qemu.sock = -1;
    observer.read_all();
    ASSERT_EQ(observer.got.size(), before + 1);
    EXPECT_EQ(observer.got.back().value, me);
    EXPECT_EQ(observer.got.back().fd, -1);
    EXPECT_TRUE(worker->drain());
  }
  ::unlink(region.c_str());
}

TEST(Ivshmem, JoinRejectsAServerOfAnotherProtocol) {
  const std::string sock = unique_name("fake");
  const int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, sock.c_str(), sizeof a.sun_path - 1);
  ::unlink(sock.c_str());
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(l, 1), 0);
  std::thread fake([l] {
    const int c = ::accept(l, nullptr, nullptr);
    const int64_t version = 7;
    [[maybe_unused]] ssize_t n = ::write(c, &version, sizeof version);
    std::this_thread::sleep_for(100ms);
    ::close(c);
  });
  std::string err;
  EXPECT_FALSE(IvshmemPeer::join(sock, &err));
  EXPECT_NE(err.find("protocol version 7"), std::string::npos) << err;
  fake.join();
  ::close(l);
  ::unlink(sock.c_str());
  EXPECT_FALSE(IvshmemPeer::join(sock, &err));
  EXPECT_NE(err.find("is the server running"), std::string::npos) << err;
}

TEST(Ivshmem, Bar0PathOnlyForPciResources) {
  EXPECT_EQ(ivshmem_bar0_path("/sys/bus/pci/devices/0000:00:04.0/resource2_wc"),
            "/sys/bus/pci/devices/0000:00:04.0/resource0");
  EXPECT_EQ(ivshmem_bar0_path("/sys/bus/pci/devices/0000:00:04.0/resource2"),
            "/sys/bus/pci/devices/0000:00:04.0/resource0");
  EXPECT_EQ(ivshmem_bar0_path("/dev/shm/ordo"), "");
  EXPECT_EQ(ivshmem_bar0_path("resource2"), "");
}

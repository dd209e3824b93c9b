// The worker's side of the doorbell: the only io_uring user, so guests link
// without liburing.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ordo/doorbell.h"

namespace ordo {

std::unique_ptr<DoorbellWaiter> DoorbellWaiter::listen(const std::string& path, std::string* error) {
  sockaddr_un addr;
  if (!doorbell_address(path, &addr)) {
    if (error) *error = "doorbell path " + path + " is too long for a Unix socket";
    return nullptr;
  }
  std::unique_ptr<DoorbellWaiter> w(new DoorbellWaiter());
  w->path_ = path;
  w->fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ::unlink(path.c_str());  // a previous worker's socket
  if (w->fd_ < 0 || ::bind(w->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (error) *error = "cannot bind doorbell socket " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  int rc = io_uring_queue_init(4, &w->ring_, 0);
  if (rc < 0) {
    if (error) *error = std::string("io_uring_queue_init failed: ") + std::strerror(-rc) +
                        " (kernel without io_uring, or io_uring disabled by sysctl)";
    return nullptr;
  }
  w->ring_ready_ = true;
  return w;
}

DoorbellWaiter::~DoorbellWaiter() {
  if (ring_ready_) io_uring_queue_exit(&ring_);
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

bool DoorbellWaiter::wait(std::chrono::microseconds timeout) {
  if (!armed_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) return false;
    io_uring_prep_recv(sqe, fd_, buf_, sizeof(buf_), 0);
    if (io_uring_submit(&ring_) < 0) return false;
    armed_ = true;
  }
  __kernel_timespec ts{};
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  io_uring_cqe* cqe = nullptr;
  if (io_uring_wait_cqe_timeout(&ring_, &cqe, &ts) != 0 || !cqe) return false;
  io_uring_cqe_seen(&ring_, cqe);
  armed_ = false;
  // Several guests may have rung at once: one wake-up is enough for all.
  while (::recv(fd_, buf_, sizeof(buf_), MSG_DONTWAIT) > 0) {
  }
  return true;
}

}  // namespace ordo

// The worker's side of the doorbell: the only io_uring user, so guests link
// without liburing.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "doorbell_waiter.h"

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
  int rc = io_uring_queue_init(8, &w->ring_, 0);
  if (rc < 0) {
    if (error) *error = std::string("io_uring_queue_init failed: ") + std::strerror(-rc) +
                        " (kernel without io_uring, or io_uring disabled by sysctl)";
    return nullptr;
  }
  w->ring_ready_ = true;
  w->sources_.reserve(4);  // recv buffers are armed in place: no reallocation
  w->sources_.push_back(Source{w->fd_, true, false, {}});
  return w;
}

DoorbellWaiter::~DoorbellWaiter() {
  if (ring_ready_) io_uring_queue_exit(&ring_);
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void DoorbellWaiter::add_eventfd(int eventfd) {
  if (sources_.size() < sources_.capacity()) sources_.push_back(Source{eventfd, false, false, {}});
}

bool DoorbellWaiter::arm(size_t i) {
  Source& s = sources_[i];
  if (s.armed) return true;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) return false;
  if (s.socket) io_uring_prep_recv(sqe, s.fd, s.buf, sizeof(s.buf), 0);
  else io_uring_prep_poll_add(sqe, s.fd, POLLIN);
  io_uring_sqe_set_data64(sqe, i);
  s.armed = true;
  return true;
}

bool DoorbellWaiter::wait(std::chrono::microseconds timeout) {
  for (size_t i = 0; i < sources_.size(); ++i) arm(i);
  if (io_uring_submit(&ring_) < 0) return false;
  __kernel_timespec ts{};
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  io_uring_cqe* cqe = nullptr;
  if (io_uring_wait_cqe_timeout(&ring_, &cqe, &ts) != 0 || !cqe) return false;
  bool rang = false;
  do {
    const uint64_t i = io_uring_cqe_get_data64(cqe);
    if (i < sources_.size()) {
      Source& src = sources_[i];
      src.armed = false;
      rang = true;
      // Polled, not read, so that one read here takes every ring counted so far:
      // rings that arrive while the worker is busy wake it once, not once each.
      if (!src.socket && cqe->res > 0 && (cqe->res & POLLIN)) [[maybe_unused]] ssize_t n = ::read(src.fd, src.buf, 8);
    }
    io_uring_cqe_seen(&ring_, cqe);
  } while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe);
  // Several guests may have rung at once: one wake-up is enough for all.
  if (!sources_[0].armed) {
    while (::recv(fd_, sources_[0].buf, sizeof(sources_[0].buf), MSG_DONTWAIT) > 0) {
    }
  }
  return rang;
}

}  // namespace ordo

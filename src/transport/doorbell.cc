#include "ordo/doorbell.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ordo {

std::string doorbell_path(const std::string& region_path) { return region_path + ".doorbell"; }

std::unique_ptr<DoorbellWaiter> DoorbellWaiter::open_fifo(const std::string& path, std::string* error) {
  if (::mkfifo(path.c_str(), 0660) != 0 && errno != EEXIST) {
    if (error) *error = "cannot create doorbell FIFO " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<DoorbellWaiter> w(new DoorbellWaiter());
  w->path_ = path;
  // O_RDWR: the FIFO always has a writer (us), so reads block instead of hitting EOF.
  w->fd_ = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (w->fd_ < 0) {
    if (error) *error = "cannot open doorbell FIFO " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  int rc = io_uring_queue_init(4, &w->ring_, 0);
  if (rc < 0) {
    ::close(w->fd_);
    w->fd_ = -1;
    if (error) *error = std::string("io_uring_queue_init failed: ") + std::strerror(-rc) +
                        " (kernel without io_uring, or io_uring disabled by sysctl)";
    return nullptr;
  }
  return w;
}

DoorbellWaiter::~DoorbellWaiter() {
  if (fd_ >= 0) {
    io_uring_queue_exit(&ring_);
    ::close(fd_);
  }
}

bool DoorbellWaiter::wait(std::chrono::microseconds timeout) {
  if (!armed_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) return false;
    io_uring_prep_read(sqe, fd_, buf_, sizeof(buf_), 0);
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
  while (::read(fd_, buf_, sizeof(buf_)) > 0) {
  }
  return true;
}

DoorbellRinger::DoorbellRinger(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
}

DoorbellRinger::~DoorbellRinger() {
  if (fd_ >= 0) ::close(fd_);
}

void DoorbellRinger::ring() const {
  if (fd_ < 0) return;
  char b = 1;
  // EAGAIN means the FIFO is full of rings the worker has not drained: it is awake.
  [[maybe_unused]] ssize_t n = ::write(fd_, &b, 1);
}

}  // namespace ordo

// The worker's side of the doorbell (ordo/doorbell.h): it sleeps on the
// doorbell socket and its ivshmem-server eventfds through io_uring.
#pragma once

#include <liburing.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ordo/doorbell.h"

namespace ordo {

class DoorbellWaiter {
 public:
  // Binds a datagram socket at `path` (replacing a stale one).
  static std::unique_ptr<DoorbellWaiter> listen(const std::string& path, std::string* error);
  ~DoorbellWaiter();
  DoorbellWaiter(const DoorbellWaiter&) = delete;
  DoorbellWaiter& operator=(const DoorbellWaiter&) = delete;

  // Also wakes on `eventfd` (an ivshmem-server vector of ours); the caller owns it.
  void add_eventfd(int eventfd);
  // Sleeps until a doorbell rings or `timeout` passes; true when one rang.
  bool wait(std::chrono::microseconds timeout);
  const std::string& path() const { return path_; }

 private:
  struct Source {
    int fd;
    bool socket;  // a datagram socket (received, then drained) or an eventfd (polled, then read once)
    bool armed = false;
    alignas(8) char buf[64] = {};
  };
  DoorbellWaiter() = default;
  bool arm(size_t i);
  io_uring ring_{};
  int fd_ = -1;
  bool ring_ready_ = false;
  std::vector<Source> sources_;
  std::string path_;
};

}  // namespace ordo

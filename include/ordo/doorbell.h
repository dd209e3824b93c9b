// Waking an idle worker. The worker sleeps on a readable fd through io_uring: a
// FIFO next to the region for guests on this host, an ivshmem-server eventfd for
// VMs. Rings are advisory: one can be lost (nobody listening, a VM without the
// doorbell device), so the worker never sleeps longer than its timeout.
#pragma once

#include <liburing.h>

#include <chrono>
#include <memory>
#include <string>

namespace ordo {

std::string doorbell_path(const std::string& region_path);

class DoorbellWaiter {
 public:
  // Creates the FIFO if needed and opens it so that it never reports end-of-file.
  static std::unique_ptr<DoorbellWaiter> open_fifo(const std::string& path, std::string* error);
  ~DoorbellWaiter();
  DoorbellWaiter(const DoorbellWaiter&) = delete;
  DoorbellWaiter& operator=(const DoorbellWaiter&) = delete;

  // Sleeps until the doorbell rings or `timeout` passes; true when it rang.
  bool wait(std::chrono::microseconds timeout);
  const std::string& path() const { return path_; }

 private:
  DoorbellWaiter() = default;
  io_uring ring_{};
  int fd_ = -1;
  bool armed_ = false;
  char buf_[64];
  std::string path_;
};

class DoorbellRinger {
 public:
  DoorbellRinger() = default;
  explicit DoorbellRinger(const std::string& path);  // silently inert when the FIFO is absent
  ~DoorbellRinger();
  DoorbellRinger(const DoorbellRinger&) = delete;
  DoorbellRinger& operator=(const DoorbellRinger&) = delete;
  void ring() const;
  bool connected() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace ordo

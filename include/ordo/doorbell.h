// Waking an idle worker. The worker sleeps on a readable fd through io_uring
// (DoorbellWaiter, src/worker/doorbell_waiter.h): a Unix datagram socket next
// to the region for guests on this host (a send to a dead worker fails with
// ECONNREFUSED instead of raising SIGPIPE, as a FIFO would), an ivshmem-server
// eventfd for VMs. Rings are advisory: one can be lost (nobody listening, a VM
// without the doorbell device), so the worker never sleeps longer than its
// timeout. This header is the ringing side and the doorbell's address, which
// both sides use.
#pragma once

#include <sys/un.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ordo {

// The worker of part `partition` of the region listens here.
std::string doorbell_path(const std::string& region_path, uint32_t partition = 0);
// The socket address of a doorbell path; false when the path is too long.
bool doorbell_address(const std::string& path, sockaddr_un* addr);

class DoorbellRinger {
 public:
  DoorbellRinger() = default;
  explicit DoorbellRinger(const std::string& path);  // rings go nowhere while nobody listens
  ~DoorbellRinger();
  DoorbellRinger(const DoorbellRinger&) = delete;
  DoorbellRinger& operator=(const DoorbellRinger&) = delete;
  void ring() const;

 private:
  int fd_ = -1;
  std::string path_;
};

class IvshmemBell;
struct RegionHeader;

// Guest side: wakes the worker serving a region, through BAR0's Doorbell
// register when the guest is in an ivshmem-doorbell VM and the worker joined its
// ivshmem-server, else through the socket next to the region (host guests).
class WorkerBell {
 public:
  WorkerBell(const std::string& region_path, const RegionHeader* header);
  ~WorkerBell();
  WorkerBell(const WorkerBell&) = delete;
  WorkerBell& operator=(const WorkerBell&) = delete;
  void ring() const;

 private:
  const RegionHeader* header_;
  DoorbellRinger socket_;
  std::unique_ptr<IvshmemBell> vm_;
};

}  // namespace ordo

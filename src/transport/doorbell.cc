#include "ordo/doorbell.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "ivshmem.h"
#include "ordo/layout.h"

namespace ordo {

bool doorbell_address(const std::string& path, sockaddr_un* a) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (path.size() >= sizeof(a->sun_path)) return false;
  std::memcpy(a->sun_path, path.data(), path.size());
  return true;
}

std::string doorbell_path(const std::string& region_path, uint32_t partition) {
  return region_path + ".doorbell" + (partition ? "." + std::to_string(partition) : "");
}

DoorbellRinger::DoorbellRinger(const std::string& path) : path_(path) {
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

DoorbellRinger::~DoorbellRinger() {
  if (fd_ >= 0) ::close(fd_);
}

void DoorbellRinger::ring() const {
  sockaddr_un addr;
  if (fd_ < 0 || !doorbell_address(path_, &addr)) return;
  char b = 1;
  // ECONNREFUSED (no worker) or EAGAIN (it has unread rings, so it is awake): fine.
  [[maybe_unused]] ssize_t n =
      ::sendto(fd_, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
}

WorkerBell::WorkerBell(const std::string& region_path, const RegionHeader* header)
    : header_(header), socket_(doorbell_path(region_path, header->partition)) {
  // In a VM without the doorbell device (ivshmem-plain) BAR0 still maps and the
  // worker publishes no peer: the guest then rings nobody and the worker polls.
  if (const std::string bar0 = ivshmem_bar0_path(region_path); !bar0.empty()) vm_ = IvshmemBell::open(bar0, nullptr);
}

WorkerBell::~WorkerBell() = default;

void WorkerBell::ring() const {
  if (vm_) {
    if (const uint32_t peer = header_->ivshmem_peer.load(std::memory_order_relaxed); peer != 0) {
      vm_->ring(peer - 1, 0);
      return;
    }
  }
  socket_.ring();
}

}  // namespace ordo

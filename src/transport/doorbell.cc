#include "ordo/doorbell.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace ordo {

bool doorbell_address(const std::string& path, sockaddr_un* a) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (path.size() >= sizeof(a->sun_path)) return false;
  std::memcpy(a->sun_path, path.data(), path.size());
  return true;
}

std::string doorbell_path(const std::string& region_path) { return region_path + ".doorbell"; }

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

}  // namespace ordo

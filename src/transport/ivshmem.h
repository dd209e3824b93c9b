// ivshmem-doorbell: how a guest in a VM wakes the host worker.
//
// QEMU's ivshmem-doorbell device gets its memory and its interrupts from an
// ivshmem-server over a Unix socket. Every client of that server (each QEMU,
// and ordo-worker) is a peer with an id and one eventfd per vector; a guest
// write of (peer << 16 | vector) to BAR0's Doorbell register makes QEMU signal
// that peer's eventfd. The worker joins the server as a peer, publishes its id
// in the region header (RegionHeader::ivshmem_peer) and sleeps on its eventfds
// through io_uring. Protocol: QEMU docs/specs/ivshmem-spec.rst.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ordo {

// BAR0 registers (32 bit).
inline constexpr uint32_t kIvshmemIntrMask = 0;
inline constexpr uint32_t kIvshmemIntrStatus = 4;
inline constexpr uint32_t kIvshmemIvPosition = 8;
inline constexpr uint32_t kIvshmemDoorbell = 12;
inline constexpr int64_t kIvshmemProtocolVersion = 0;
inline constexpr uint32_t kIvshmemMaxPeers = 65536;  // the Doorbell register has 16 bits for a peer id

// The BAR0 register file of a BAR2 resource path ("/sys/bus/pci/devices/X/resource2_wc"
// -> ".../resource0"); empty when `region_path` is not an ivshmem PCI resource.
std::string ivshmem_bar0_path(const std::string& region_path);

// Guest side: writes the Doorbell register of the VM's ivshmem device.
class IvshmemBell {
 public:
  static std::unique_ptr<IvshmemBell> open(const std::string& bar0_path, std::string* error);
  ~IvshmemBell();
  IvshmemBell(const IvshmemBell&) = delete;
  IvshmemBell& operator=(const IvshmemBell&) = delete;
  // QEMU drops the write when the peer is gone or has no such vector: advisory.
  void ring(uint32_t peer, uint32_t vector) const;

 private:
  IvshmemBell() = default;
  void* map_ = nullptr;
  volatile uint32_t* regs_ = nullptr;
};

// Host side: a client of an ivshmem-server (QEMU's contrib/ivshmem-server or
// ordo-ivshmem-server).
class IvshmemPeer {
 public:
  // Connects and reads the setup messages up to this peer's own eventfds.
  static std::unique_ptr<IvshmemPeer> join(const std::string& socket_path, std::string* error);
  ~IvshmemPeer();
  IvshmemPeer(const IvshmemPeer&) = delete;
  IvshmemPeer& operator=(const IvshmemPeer&) = delete;

  uint32_t id() const { return id_; }
  int shm_fd() const { return shm_fd_; }
  int socket() const { return sock_; }
  int vector0() const { return own_.front(); }  // the eventfd guests ring us on
  // Reads the server's later peer join/leave notices (closing their fds: the
  // worker never rings a guest). False once the server has gone away.
  bool drain();

 private:
  IvshmemPeer() = default;
  int sock_ = -1;
  int shm_fd_ = -1;
  uint32_t id_ = 0;
  std::vector<int> own_;
};

}  // namespace ordo

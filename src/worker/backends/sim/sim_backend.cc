// The CPU simulator backend: make_sim_backend, the device's construction and
// what it reports about itself. The device (class Device) is declared in
// sim_device.h, which says where the rest of it is.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "sim_backend.h"
#include "sim_device.h"

namespace ordo::sim {
namespace {

// What the sim reports as its device: a plausible modern GPU, so that programs
// that size their launches from the properties behave.
DeviceInfo sim_device_info(uint32_t device) {
  DeviceInfo d{};
  std::snprintf(d.name, sizeof d.name, "ordo sim device %u", device);
  d.total_global_mem = uint64_t{16} << 30;
  d.shared_mem_per_block = 48 << 10;
  d.shared_mem_per_block_optin = 227 << 10;
  d.shared_mem_per_multiprocessor = 228 << 10;
  d.total_const_mem = 64 << 10;
  d.texture_alignment = 512;
  d.mem_pitch = INT32_MAX;
  d.major = 9;
  d.minor = 0;
  d.multi_processor_count = 4;
  d.warp_size = 32;
  d.max_threads_per_block = int32_t(kMaxBlockThreads);
  d.max_threads_dim[0] = d.max_threads_dim[1] = 1024;
  d.max_threads_dim[2] = 64;
  d.max_grid_size[0] = INT32_MAX;
  d.max_grid_size[1] = d.max_grid_size[2] = 65535;
  d.regs_per_block = d.regs_per_multiprocessor = 65536;
  d.clock_rate_khz = 1'000'000;
  d.memory_clock_rate_khz = 1'000'000;
  d.memory_bus_width = 256;
  d.l2_cache_size = 4 << 20;
  d.max_threads_per_multiprocessor = 2048;
  d.max_blocks_per_multiprocessor = 32;
  d.compute_mode = 0;  // default
  d.concurrent_kernels = 1;
  d.async_engine_count = 2;
  d.unified_addressing = 1;
  d.can_map_host_memory = 1;
  d.stream_priorities_supported = 1;
  d.cooperative_launch = 1;
  d.global_l1_cache_supported = d.local_l1_cache_supported = 1;
  static constexpr uint8_t kUuid[16] = {'o', 'r', 'd', 'o', '-', 's', 'i', 'm', '-', 'd', 'e', 'v', 'i', 'c', 'e', '0'};
  std::memcpy(d.uuid, kUuid, sizeof kUuid);
  d.uuid[15] = uint8_t(kUuid[15] + device);  // libraries tell devices apart by UUID and bus id
  d.pci_bus_id = int32_t(0x1b + device);
  return d;
}

}  // namespace

Device::Device(uint32_t devices) : devices_(devices), blocking_(devices), destroyed_blocking_(devices) {
  if (sched_getaffinity(0, sizeof cpus_, &cpus_) != 0) CPU_ZERO(&cpus_);
  for (uint32_t d = 0; d < devices_; ++d) {
    streams_[d] = start_stream_locked(d, d, false, true);
    next_addr_[d] = kDeviceBase + (uint64_t{d} << kDeviceSpanShift);
  }
}

Device::~Device() {
  stopping_.store(true, std::memory_order_relaxed);  // a WHILE node that never ends must not hold the drain
  ipc_stop();  // streams waiting for another process's records give up
  // Drain every stream and join its thread. Loop in case a host callback
  // created a stream meanwhile.
  for (;;) {
    std::vector<Worker> workers;
    {
      std::lock_guard lk(mu_);
      workers.swap(workers_);
    }
    if (workers.empty()) break;
    for (auto& w : workers) stop(*w.stream);
    for (auto& w : workers) w.thread.join();
  }
}

uint64_t coresident_blocks(Dim3 block, uint32_t shared_mem) {
  const DeviceInfo d = sim_device_info(0);  // the sim's devices are alike
  const uint64_t threads = (uint64_t{block.x} * block.y * block.z + 31) / 32 * 32;
  uint64_t per_sm = std::min<uint64_t>(uint64_t(d.max_threads_per_multiprocessor) / threads,
                                       uint64_t(d.max_blocks_per_multiprocessor));
  if (shared_mem) per_sm = std::min<uint64_t>(per_sm, d.shared_mem_per_multiprocessor / shared_mem);
  return per_sm * uint64_t(d.multi_processor_count);
}

// The sim's tensor maps: no kernel of its reads one (twins get no TMA), so
// its format is its own: magic, the address (where ReplaceAddress changes
// it), a hash of the rest of the request and its shape. Equal requests give
// equal maps, as the driver's do.
namespace {
constexpr uint64_t kSimTensorMapMagic = 0x50414d54'6f64726full;  // "ordoTMAP"
struct SimTensorMap {
  uint64_t magic, address, hash;
  uint32_t data_type, rank;
  uint64_t dim[kMaxTensorRank], strides[kMaxTensorRank - 1];
};
static_assert(sizeof(SimTensorMap) <= kTensorMapBytes);
}  // namespace

Status Device::tensor_map_encode(uint32_t device, const TensorMapRequest& r, std::byte* out) {
  if (device >= devices_) return Status::kInvalidDevice;
  SimTensorMap m{};
  if (TensorMapKind(r.kind) == TensorMapKind::kReplaceAddress) {
    std::memcpy(&m, r.map, sizeof m);
    if (m.magic != kSimTensorMapMagic) return Status::kInvalidValue;  // not a map the sim made
    m.address = r.global_address;
  } else {
    TensorMapRequest rest = r;
    rest.global_address = 0;
    std::memset(rest.map, 0, sizeof rest.map);
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (size_t i = 0; i < sizeof rest; ++i) h = (h ^ uint8_t(reinterpret_cast<const char*>(&rest)[i])) * 0x100000001b3ull;
    m = {kSimTensorMapMagic, r.global_address, h, r.data_type, r.rank, {}, {}};
    std::memcpy(m.dim, r.global_dim, sizeof m.dim);
    std::memcpy(m.strides, r.global_strides, sizeof m.strides);
  }
  std::memset(out, 0, kTensorMapBytes);
  std::memcpy(out, &m, sizeof m);
  return Status::kSuccess;
}

Status Device::device_info(uint32_t device, DeviceInfo* out) {
  if (!out || device >= devices_) return Status::kInvalidValue;
  *out = sim_device_info(device);
  return Status::kSuccess;
}

// The attributes DeviceInfo carries, plus what identifies an H200 to libraries
// that pick kernels by chip (docs/CUDA.md, "The sim's device").
Status Device::device_attributes(uint32_t device, uint32_t first, int32_t* out) {
  if (Status s = Backend::device_attributes(device, first, out); !ok(s)) return s;
  auto set = [&](uint32_t attr, int32_t v) {
    if (attr >= first && attr < first + kDeviceAttributesPerCall) out[attr - first] = v;
  };
  set(139, int32_t(0x233510DE));  // GPU_PCI_DEVICE_ID: H200 SXM (0x2335), NVIDIA (0x10DE)
  set(120, 1);                    // CLUSTER_LAUNCH, as every compute capability 9 device
  return Status::kSuccess;
}

std::unique_ptr<Backend> make_sim_backend(uint32_t devices) {
  if (devices == 0 || devices > kMaxDevices) return nullptr;
  register_builtin_kernels();
  return std::make_unique<Device>(devices);
}

}  // namespace ordo::sim

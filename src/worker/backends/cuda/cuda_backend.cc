// The cuda backend: creating and destroying it (make_cuda_backend, after
// probe() found a usable device), and what the worker asks before making one.
// The class is in cuda_backend_impl.h, which says where the rest of it is.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_backend.h"
#include "cuda_backend_impl.h"

namespace {
#include "cuda_builtins_fatbin.h"  // static const unsigned char ordo_cuda_builtins[] (bin2c)
}

namespace ordo::cuda {

// `ordinals`: host devices by guest device index, checked by make_cuda_backend.
std::unique_ptr<Backend> CudaBackend::create(const std::vector<int>& ordinals, std::string* error) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(ordinals));
  if (!b->init(error)) return nullptr;
  return b;
}

CudaBackend::CudaBackend(const std::vector<int>& ordinals) : devices_(ordinals.size()) {
  for (size_t i = 0; i < ordinals.size(); ++i) devices_[i].ordinal = ordinals[i];
}

CudaBackend::~CudaBackend() {
  // Pending callbacks point at this object; let every queued piece of work end.
  // A device whose context init() never got has nothing queued.
  for (uint32_t d = 0; d < device_count(); ++d) {
    if (!devices_[d].ctx) continue;
    bind(d);
    cudaDeviceSynchronize();
  }
  for (uint32_t d = 0; d < device_count(); ++d) {
    if (!devices_[d].completions) continue;
    bind(d);  // it destroys its device's events here
    devices_[d].completions.reset();  // answers what it still watches, then stops
  }
  std::lock_guard lk(mu_);
  drop_programs();
  for (uint32_t i = kMaxDevices; i < kMaxStreams; ++i) {
    if (!streams_[i].handle) continue;
    bind(streams_[i].device);
    cudaStreamDestroy(streams_[i].handle);
  }
  for (uint32_t d = 0; d < device_count(); ++d) {
    for (auto& n : devices_[d].notify) {
      bind(d);
      cudaStreamDestroy(n->stream);
    }
  }
  for (auto& [id, ev] : events_) {
    bind(ev.device);
    cudaEventDestroy(ev.handle);
  }
  for (auto& [id, mod] : modules_) unload_everywhere(mod);
  for (auto& [addr, a] : allocs_) {
    bind(a.device);
    cudaFree(reinterpret_cast<void*>(addr));
  }
  for (auto& r : host_ranges_)
    if (r.pinned) cudaHostUnregister(reinterpret_cast<void*>(r.base));
}

// ---------------------------------------------------------------- public API

bool built() { return true; }

std::string Probe::why_not() const {
  if (error != 0)
    return "no CUDA device (cudaGetDeviceCount: " + error_name + " (" + std::to_string(error) + "))";
  if (count <= 0) return "no CUDA device (cudaGetDeviceCount found none)";
  return "";
}

Probe probe() {
  Probe p;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  p.error = int(e);
  p.error_name = cudaGetErrorName(e);
  p.count = e == cudaSuccess ? n : 0;
  if (e != cudaSuccess) cudaGetLastError();
  return p;
}

std::unique_ptr<Backend> make_cuda_backend(const std::vector<int>& devices, std::string* error) {
  const Probe p = probe();
  if (!p.usable()) {
    if (error) *error = p.why_not() + "; use --backend sim";
    return nullptr;
  }
  auto refuse = [&](const std::string& why) {
    if (error) *error = "cuda backend: " + why;
    return nullptr;
  };
  const std::string visible = p.count == 1 ? "1 CUDA device is visible, ordinal 0"
                                           : std::to_string(p.count) + " CUDA devices are visible, ordinals 0 to " +
                                                 std::to_string(p.count - 1);
  std::vector<int> ordinals = devices;
  if (ordinals.empty()) {
    if (p.count > int(kMaxDevices))
      return refuse(visible + ", and a session sees at most " + std::to_string(kMaxDevices) +
                    ": list the ones to use (--devices) or narrow CUDA_VISIBLE_DEVICES");
    for (int i = 0; i < p.count; ++i) ordinals.push_back(i);
  }
  if (ordinals.size() > kMaxDevices)
    return refuse(std::to_string(ordinals.size()) + " devices listed, and a session sees at most " +
                  std::to_string(kMaxDevices) + ": list fewer (--devices)");
  for (size_t i = 0; i < ordinals.size(); ++i) {
    const int o = ordinals[i];
    if (o < 0 || o >= p.count)
      return refuse("there is no CUDA device " + std::to_string(o) + " (" + visible +
                    "): list devices that exist (--devices)");
    if (std::find(ordinals.begin(), ordinals.begin() + i, o) != ordinals.begin() + i)
      return refuse("CUDA device " + std::to_string(o) + " is listed twice: list each device once (--devices)");
  }
  std::string why;
  auto b = CudaBackend::create(ordinals, &why);
  if (!b && error) *error = "cuda backend: " + why;
  return b;
}

std::span<const std::byte> builtin_image() {
  return std::as_bytes(std::span(ordo_cuda_builtins));
}


}  // namespace ordo::cuda

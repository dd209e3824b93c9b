// The cuda backend's events, and notifications when one completes.
#include <cuda_runtime_api.h>

#include <functional>
#include <mutex>
#include <utility>

#include "cuda_backend_impl.h"

namespace ordo::cuda {
namespace {

constexpr uint32_t kEventFlags = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
static_assert(cudaEventInterprocess == kEventInterprocess && cudaEventDisableTiming == kEventDisableTiming);

}  // namespace

Status CudaBackend::event_create(uint32_t event, uint32_t device, uint32_t flags) {
  if (event >= kMaxBackendEvents || (flags & ~kEventFlags)) return Status::kInvalidValue;
  if (device >= device_count()) return Status::kInvalidDevice;
  std::lock_guard lk(mu_);
  if (events_.count(event)) return Status::kInvalidResourceHandle;
  bind(device);
  cudaEvent_t ev = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&ev, flags); e != cudaSuccess) return to_status(e);
  events_.emplace(event, EventEntry{ev, device});
  return Status::kSuccess;
}

Status CudaBackend::event_destroy(uint32_t event) {
  std::lock_guard lk(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return Status::kInvalidResourceHandle;
  const EventEntry ev = it->second;
  events_.erase(it);
  bind(ev.device);
  return to_status(cudaEventDestroy(ev.handle));  // streams already waiting on it keep their wait
}

Status CudaBackend::event_record(uint32_t stream, uint32_t event) {
  std::lock_guard lk(mu_);
  const StreamEntry* st = find_stream(stream);
  const EventEntry* ev = find_event(event);
  // CUDA records an event only on a stream of the event's device.
  if (!st || !ev || ev->device != st->device) return Status::kInvalidResourceHandle;
  bind(st->device);
  return to_status(cudaEventRecord(ev->handle, st->handle));
}

Status CudaBackend::stream_wait_event(uint32_t stream, uint32_t event) {
  std::lock_guard lk(mu_);
  const StreamEntry* st = find_stream(stream);
  const EventEntry* ev = find_event(event);
  if (!st || !ev) return Status::kInvalidResourceHandle;
  bind(st->device);
  return to_status(cudaStreamWaitEvent(st->handle, ev->handle, 0));  // the event may be another device's
}

Status CudaBackend::event_query(uint32_t event) {
  std::lock_guard lk(mu_);
  const EventEntry* ev = find_event(event);
  if (!ev) return Status::kInvalidResourceHandle;
  bind(ev->device);
  return to_status(cudaEventQuery(ev->handle));  // cudaErrorNotReady is 600, Status::kNotReady
}

Status CudaBackend::event_elapsed(uint32_t start, uint32_t end, float* ms) {
  if (!ms) return Status::kInvalidValue;
  std::lock_guard lk(mu_);
  const EventEntry* a = find_event(start);
  const EventEntry* b = find_event(end);
  if (!a || !b) return Status::kInvalidResourceHandle;
  bind(a->device);
  return to_status(cudaEventElapsedTime(ms, a->handle, b->handle));  // CUDA refuses two devices' events
}

void CudaBackend::event_notify(uint32_t event, std::function<void()> fn) {
  std::unique_lock lk(mu_);
  const EventEntry* ev = find_event(event);
  if (!ev) {
    lk.unlock();
    return run_guarded(fn);  // nothing to wait for
  }
  // A private stream of the event's device waits for the event's current
  // capture (a later re-record does not move it), then answers from a
  // callback. Each pending wait gets an idle stream of its own where possible,
  // so a quick event is not answered behind a slow one.
  const uint32_t d = ev->device;
  bind(d);
  NotifyStream* n = pick_notify_stream(d);
  if (!n) {
    lk.unlock();
    return run_guarded(fn);
  }
  if (cudaError_t e = cudaStreamWaitEvent(n->stream, ev->handle, 0); e != cudaSuccess) {
    lk.unlock();
    log("cudaStreamWaitEvent for an event wait failed (%s)", cudaGetErrorName(e));
    return run_guarded(fn);
  }
  enqueue_completion(d, n->stream, std::move(fn), nullptr, &n->pending, lk);
}

}  // namespace ordo::cuda

// The cuda backend's streams, and running host functions after stream work:
// host callbacks (CUDA's callback thread), completion notifications (the
// device's Completions poller, cuda_completions.h) on private notify streams.
#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "cuda_backend_impl.h"

namespace ordo::cuda {
namespace {

constexpr uint32_t kMaxNotifyStreams = 64;  // one per guest thread that can wait at once (slot_count)

}  // namespace

Status CudaBackend::stream_create(uint32_t stream, uint32_t device, bool blocking, int priority) {
  // Ids below kMaxDevices name the devices' legacy streams, which exist from the start.
  if (stream < kMaxDevices || stream >= kMaxStreams) return Status::kInvalidValue;
  if (device >= device_count()) return Status::kInvalidDevice;
  std::lock_guard lk(mu_);
  if (streams_[stream].handle) return Status::kInvalidResourceHandle;
  bind(device);
  cudaStream_t s = nullptr;
  // The driver clamps the priority into the device's range, as cudaStreamCreateWithPriority does for a program.
  cudaError_t e = cudaStreamCreateWithPriority(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking, priority);
  if (e != cudaSuccess) return to_status(e);
  streams_[stream] = {s, device, OpTag{}};
  return Status::kSuccess;
}

Status CudaBackend::stream_destroy(uint32_t stream) {
  if (stream < kMaxDevices || stream >= kMaxStreams) return Status::kInvalidResourceHandle;
  std::lock_guard lk(mu_);
  StreamEntry& st = streams_[stream];
  if (!st.handle) return Status::kInvalidResourceHandle;
  bind(st.device);
  return to_status(cudaStreamDestroy(std::exchange(st.handle, nullptr)));  // queued work and callbacks still run
}

// Runs fn once the work now on `stream` is done. A device error that reaches
// it is reported to whoever issued the stream's last work: usually the thread
// now synchronizing on it.
void CudaBackend::after_stream(uint32_t stream, std::function<void()> fn, bool as_work) {
  std::unique_lock lk(mu_);
  const StreamEntry* st = find_stream(stream);
  if (!st) {
    lk.unlock();
    return run_guarded(fn);  // unknown stream: nothing to wait for
  }
  bind(st->device);
  const OpTag tag = st->last_tag;
  if (as_work)
    enqueue_callback(st->handle, std::move(fn), &tag, nullptr, lk);
  else
    enqueue_completion(st->device, st->handle, std::move(fn), &tag, nullptr, lk);
}

// Requires mu_ and `device` current: an idle private stream of the device, or its least busy one.
CudaBackend::NotifyStream* CudaBackend::pick_notify_stream(uint32_t device) {
  auto& pool = devices_[device].notify;
  NotifyStream* best = nullptr;
  for (auto& n : pool) {
    if (n->pending.load(std::memory_order_acquire) == 0) return n.get();
    if (!best || n->pending.load() < best->pending.load()) best = n.get();
  }
  if (pool.size() < kMaxNotifyStreams) {
    auto n = std::make_unique<NotifyStream>();
    if (cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) == cudaSuccess) {
      pool.push_back(std::move(n));
      return pool.back().get();
    }
    cudaGetLastError();
  }
  return best;
}

// Queues fn after everything now on `s`. Releases `lk`. If CUDA refuses the
// callback (a broken context), fn runs at once so nobody waits forever.
void CudaBackend::enqueue_callback(cudaStream_t s, std::function<void()> fn, const OpTag* tag,
                                   std::atomic<uint32_t>* pending, std::unique_lock<std::mutex>& lk) {
  auto cb = std::make_unique<Callback>(Callback{this, std::move(fn), tag ? *tag : OpTag{}, tag != nullptr, pending});
  if (pending) pending->fetch_add(1, std::memory_order_acq_rel);
  cudaError_t e = cudaStreamAddCallback(s, &CudaBackend::on_callback, cb.get(), 0);
  if (e == cudaSuccess) {
    cb.release();  // on_callback owns it now
    return;
  }
  lk.unlock();
  cb->finish(e);
}

// Runs fn once everything now on `s`, a stream of `device`, is done
// (that device's Completions). Releases `lk`. A device error is reported to
// `tag`'s thread; if CUDA refuses to record the event (a broken context), fn
// runs at once so nobody waits forever.
void CudaBackend::enqueue_completion(uint32_t device, cudaStream_t s, std::function<void()> fn, const OpTag* tag,
                                     std::atomic<uint32_t>* pending, std::unique_lock<std::mutex>& lk) {
  if (pending) pending->fetch_add(1, std::memory_order_acq_rel);
  Completions::Done done = [cb = Callback{this, std::move(fn), tag ? *tag : OpTag{}, tag != nullptr, pending}](
                               cudaError_t e) mutable { cb.finish(e); };
  const cudaError_t e = devices_[device].completions->watch(s, done);
  lk.unlock();
  if (e != cudaSuccess) done(e);
}

// On CUDA's callback thread: must not call CUDA.
void CUDART_CB CudaBackend::on_callback(cudaStream_t, cudaError_t status, void* p) {
  std::unique_ptr<Callback> cb(static_cast<Callback*>(p));
  cb->finish(status);
}

void CudaBackend::run_guarded(std::function<void()>& fn) {
  try {
    if (fn) fn();
  } catch (...) {
    // A throwing completion must not take CUDA's callback thread down.
  }
}

}  // namespace ordo::cuda

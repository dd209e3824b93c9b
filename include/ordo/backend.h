// What the worker drives: a CUDA-like device with streams, events and memory.
// The worker calls a backend from its one dispatch thread, in an order that
// already respects the guest's ordering (edges). A backend only has to keep CUDA's
// own semantics for the calls it is given: stream FIFO, events, the legacy default
// stream (id 0) synchronizing with blocking streams, and never block the caller
// on device work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ordo/status.h"

namespace ordo {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

// Identifies the guest call behind a backend operation, for async error reports.
struct OpTag {
  uint32_t ring = 0;
  uint32_t thread = 0;  // reply slot of the issuing guest thread
  uint64_t pos = 0;     // ring position
  uint16_t op = 0;      // ordo::Op
};

struct LaunchParams {
  uint32_t kernel = 0;
  Dim3 grid, block;
  uint32_t shared_mem = 0;
  const std::byte* args = nullptr;  // valid only during the launch() call
  uint32_t args_size = 0;
};

// A validated memory operand: a device address, or a host pointer into the region.
struct MemOperand {
  bool device = false;
  uint64_t addr = 0;  // device address, or reinterpret_cast<uintptr_t>(host pointer)
};

class Backend {
 public:
  // Called (from any backend thread) when async work fails after dispatch.
  using ErrorSink = std::function<void(const OpTag&, Status)>;

  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  void set_error_sink(ErrorSink sink) { error_sink_ = std::move(sink); }

  // Stream 0, the legacy default stream, exists from construction.
  virtual Status stream_create(uint32_t stream, bool blocking, int priority) = 0;
  virtual Status stream_destroy(uint32_t stream) = 0;  // pending work still runs

  virtual Status launch(uint32_t stream, const LaunchParams& p, const OpTag& tag) = 0;
  virtual Status memcpy(uint32_t stream, MemOperand dst, MemOperand src, uint64_t size,
                        const OpTag& tag) = 0;
  virtual Status memset(uint32_t stream, uint64_t dst, uint8_t value, uint64_t size,
                        const OpTag& tag) = 0;

  virtual Status event_create(uint32_t event, uint32_t flags) = 0;
  virtual Status event_destroy(uint32_t event) = 0;
  virtual Status event_record(uint32_t stream, uint32_t event) = 0;
  virtual Status stream_wait_event(uint32_t stream, uint32_t event) = 0;
  virtual Status event_query(uint32_t event) = 0;  // kSuccess or kNotReady
  virtual Status event_elapsed(uint32_t start, uint32_t end, float* ms) = 0;
  // Runs fn once the work the event last captured has completed (at once if none).
  virtual void event_notify(uint32_t event, std::function<void()> fn) = 0;
  // Runs fn once all work enqueued so far on `stream` has completed. Like
  // cudaLaunchHostFunc: later work on the stream waits for fn to return.
  virtual void host_callback(uint32_t stream, std::function<void()> fn) = 0;

  virtual Status malloc(uint64_t size, uint64_t* device_addr) = 0;
  virtual Status free(uint64_t device_addr) = 0;  // caller made sure no work uses it
  virtual Status kernel_lookup(std::string_view name, uint32_t* kernel) = 0;

 protected:
  void report(const OpTag& tag, Status s) {
    if (error_sink_) error_sink_(tag, s);
  }

 private:
  ErrorSink error_sink_;
};

// "sim" (always available) or "cuda" (when built with CUDA and a device is present).
std::unique_ptr<Backend> make_backend(std::string_view name, std::string* error);

}  // namespace ordo

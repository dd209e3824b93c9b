// Host functions (cudaLaunchHostFunc) waiting for their stream
// (ARCHITECTURE.md, "Host functions"). The handshake words live in the pinned
// heap (HostFuncWords); one runner thread polls them, since the worker cannot
// wake a thread across the VM boundary.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "guest/memory.h"
#include "guest/ring_producer.h"
#include "guest/session.h"
#include "guest/streams.h"
#include "guest/threads.h"

namespace ordo::guest {

class HostFunctions {
 public:
  static constexpr uint32_t kSlots = 1024;  // host functions outstanding at once; more wait for one to finish

  HostFunctions(Session& session, Threads& threads, Streams& streams, RingProducer& producer, Memory& memory)
      : session_(session), threads_(threads), streams_(streams), producer_(producer), memory_(memory) {}
  ~HostFunctions();  // stop()
  // Ends the runner; functions not run by then never run.
  void stop();

  // Returns at once; `fn` runs on the runner once the stream's earlier work
  // completed, and the stream's later work waits until it returned.
  Status host_func(Stream s, std::function<void()> fn);

 private:
  // A caller told its host_func failed (a sticky fault, an earlier async error)
  // must be able to free what the function uses, as with CUDA, whose callback
  // then never runs: the function waits for its caller's verdict.
  enum Verdict : int { kUndecided, kRun, kSkip };
  struct Pending {
    uint32_t slot;
    uint64_t ticket;
    std::function<void()> fn;
    std::shared_ptr<std::atomic<int>> verdict;
  };
  // The words and the runner, on the first host function; caller holds mu_.
  Status start_locked();
  void run();
  // The pending function whose stream got there and whose caller decided, or end().
  std::deque<Pending>::iterator ready_locked();

  Session& session_;
  Threads& threads_;
  Streams& streams_;
  RingProducer& producer_;
  Memory& memory_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // the runner: new pending functions, or stop
  std::condition_variable slot_cv_;  // callers: a free slot
  HostFuncWords* words_ = nullptr;   // kSlots of them, or null until the first host function
  std::vector<uint64_t> tickets_;
  std::vector<uint32_t> free_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::thread runner_;
};

}  // namespace ordo::guest

// Test plumbing: a worker in another process (as in production) or in a thread
// (for sanitizers and white-box checks), each on its own /dev/shm region.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ordo/client.h"
#include "ordo/region.h"
#include "status_print.h"
#include "worker/backend.h"
#include "worker/worker.h"

namespace ordo::test {

std::string unique_region(const char* tag);
// ORDO_DISPATCH_THREADS (the `lanes` suite): the dispatch threads every
// worker the tests start uses, unless a test chooses its own; 0 when unset.
uint32_t dispatch_threads();

class WorkerProcess {
 public:
  // Starts $ORDO_WORKER (the built ordo-worker) on a fresh region; waits until it serves.
  // `region`: reuse this path (a restarted worker); empty: a fresh one.
  explicit WorkerProcess(std::vector<std::string> args = {}, const char* size = "16M", std::string region = "");
  ~WorkerProcess();
  const std::string& region() const { return region_; }
  std::unique_ptr<Client> attach(ClientOptions o = {});
  pid_t pid() const { return pid_; }
  // Stops the worker and returns its stderr.
  std::string stop();
  // Its stderr so far.
  std::string log() const;
  // Asks the running worker for its counters (SIGUSR1) and returns the JSON line.
  std::string stats_now();

 private:
  std::string region_, log_;
  pid_t pid_ = -1;
  bool owns_region_ = true;
 public:
  // Leaves the region file in place when destroyed (another worker takes it over).
  void keep_region() { owns_region_ = false; }
};

class InProcessWorker {
 public:
  // `backend`: the sim (or ORDO_TEST_BACKEND) when null.
  explicit InProcessWorker(WorkerOptions o = {}, uint64_t size = 16u << 20, std::unique_ptr<Backend> backend = nullptr);
  ~InProcessWorker();
  const std::string& region_path() const { return path_; }
  Region& region() { return *region_; }
  Worker& worker() { return *worker_; }
  std::unique_ptr<Client> attach(ClientOptions o = {});

 private:
  std::string path_;
  std::unique_ptr<Region> region_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<DoorbellWaiter> bell_;
  std::thread thread_;
};

// Looks a kernel up and fails the test on error.
uint32_t kernel(Client& c, const char* name);

}  // namespace ordo::test

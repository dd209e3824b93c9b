#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>

namespace ordo::test {

uint32_t dispatch_threads() {
  const char* v = std::getenv("ORDO_DISPATCH_THREADS");
  return v && *v ? uint32_t(std::strtoul(v, nullptr, 10)) : 0;
}

std::string unique_region(const char* tag) {
  static std::atomic<int> n{0};
  return "/dev/shm/ordo-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) + "-" + tag;
}

WorkerProcess::WorkerProcess(std::vector<std::string> args, const char* size, std::string region) {
  region_ = region.empty() ? unique_region("proc") : region;
  log_ = region_ + "." + std::to_string(getpid()) + "." + std::to_string(reinterpret_cast<uintptr_t>(this)) + ".log";
  const std::string ready = region_ + ".ready";
  const char* exe = std::getenv("ORDO_WORKER");
  if (!exe) throw std::runtime_error("ORDO_WORKER is not set: run the tests through meson test");
  std::vector<std::string> argv = {exe, "--region", region_, "--size", size, "--ready-file", ready, "--stats"};
  if (const uint32_t n = dispatch_threads()) {
    argv.push_back("--dispatch-threads");
    argv.push_back(std::to_string(n));
  }
  argv.insert(argv.end(), args.begin(), args.end());  // a test's own --dispatch-threads comes last and wins
  pid_ = fork();
  if (pid_ == 0) {
    // A test process that dies (a sanitizer halting on an error) takes its
    // worker along: an orphan would hold the test's output pipe open until
    // meson's timeout.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(exe, cargv.data());
    _exit(127);
  }
  // Ready in well under a second when the machine is idle; the limit only turns
  // a hang into a failure, and a loaded 2-core machine (a sanitizer build, a
  // stacked worker pair starting while another runs) has taken over 5 s.
  for (int i = 0; i < 6000; ++i) {
    if (access(ready.c_str(), F_OK) == 0) {
      unlink(ready.c_str());
      return;
    }
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("ordo-worker exited at start; see " + log_);
    }
    usleep(5000);
  }
  throw std::runtime_error("ordo-worker did not become ready in 30 s; see " + log_);
}

std::string WorkerProcess::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int st;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  return log();
}

std::string WorkerProcess::log() const {
  std::ifstream f(log_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string WorkerProcess::stats_now() {
  auto count = [](const std::string& s) {
    size_t n = 0;
    for (size_t p = s.find("{\"entries\""); p != std::string::npos; p = s.find("{\"entries\"", p + 1)) ++n;
    return n;
  };
  const size_t before = count(log());
  kill(pid_, SIGUSR1);
  for (int i = 0; i < 400; ++i) {
    usleep(5000);
    const std::string text = log();
    if (count(text) > before) {
      const size_t p = text.rfind("{\"entries\"");
      return text.substr(p, text.find('\n', p) - p);
    }
  }
  return "";
}

WorkerProcess::~WorkerProcess() {
  stop();
  if (owns_region_) {
    unlink(region_.c_str());
    for (uint32_t k = 0; k < kMaxPartitions; ++k) unlink(doorbell_path(region_, k).c_str());
  }
  unlink((region_ + ".ready").c_str());  // a worker that restarted (a lost GPU context) wrote it again
  unlink(log_.c_str());
}

std::unique_ptr<Client> WorkerProcess::attach(ClientOptions o) {
  std::string err;
  auto c = Client::attach(region_, &err, o);
  if (!c) throw std::runtime_error("attach failed: " + err);
  return c;
}

InProcessWorker::InProcessWorker(WorkerOptions o, uint64_t size, std::unique_ptr<Backend> backend)
    : backend_(std::move(backend)) {
  path_ = unique_region("thread");
  Layout l;
  if (!plan_default_layout(size, &l)) throw std::runtime_error("bad size");
  std::string err;
  region_ = Region::create(path_, l, &err);
  if (!region_) throw std::runtime_error(err);
  // ORDO_TEST_BACKEND=cuda: the stacked suite (tests/stacked) runs these tests
  // on the cuda backend over ordo's libcuda.so.1.
  const char* name = std::getenv("ORDO_TEST_BACKEND");
  if (!backend_) backend_ = make_backend(name && *name ? name : "sim", &err);
  if (!backend_) throw std::runtime_error(err);
  bell_ = DoorbellWaiter::listen(doorbell_path(path_), &err);
  o.quiet = true;
  if (const uint32_t n = dispatch_threads(); n && o.dispatch_threads == 1) o.dispatch_threads = n;
  worker_ = std::make_unique<Worker>(*region_, *backend_, o);
  thread_ = std::thread([this] { worker_->run(bell_.get()); });
}

InProcessWorker::~InProcessWorker() {
  worker_->stop();
  DoorbellRinger(doorbell_path(path_)).ring();  // a sleeping worker sees stop() only when woken
  thread_.join();
  worker_.reset();
  backend_.reset();
  unlink(path_.c_str());
  unlink(doorbell_path(path_).c_str());
}

std::unique_ptr<Client> InProcessWorker::attach(ClientOptions o) {
  std::string err;
  auto c = Client::attach(path_, &err, o);
  if (!c) throw std::runtime_error("attach failed: " + err);
  return c;
}

uint32_t kernel(Client& c, const char* name) {
  uint32_t k = 0;
  Status s = c.kernel_lookup(name, &k);
  EXPECT_EQ(s, Status::kSuccess) << "kernel_lookup(" << name << ")";
  return k;
}

}  // namespace ordo::test

#include "supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "ordo/region.h"

namespace ordo {
namespace {

std::atomic<int> g_signal{0};  // the last SIGTERM/SIGINT/SIGUSR1 not yet passed on
void on_signal(int sig) { g_signal.store(sig); }

struct Part {
  pid_t pid = 0;
  std::chrono::steady_clock::time_point started;
  bool ready = false;
};

std::string part_file(const std::string& f, uint32_t k) { return f + "." + std::to_string(k); }

pid_t spawn(char** argv, uint32_t k, const SupervisorOptions& o) {
  std::vector<std::string> args;
  for (char** a = argv; *a; ++a) args.emplace_back(*a);
  // Later options win: the part's own ready file, and its own trace file.
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--trace") args[i + 1] = part_file(args[i + 1], k);
  args.insert(args.end(), {"--partition", std::to_string(k), "--backend", o.backend});
  if (o.ipc_fd >= 0) args.insert(args.end(), {"--ipc-fd", std::to_string(o.ipc_fd)});
  if (!o.ready_file.empty()) args.insert(args.end(), {"--ready-file", part_file(o.ready_file, k)});
  const pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGTERM);  // a supervisor killed outright takes its parts along
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv("/proc/self/exe", cargs.data());
  std::fprintf(stderr, "ordo-worker: cannot start the worker of session part %u: %s\n", k, std::strerror(errno));
  _exit(1);
}

}  // namespace

int supervise(char** argv, const SupervisorOptions& o) {
  std::string err;
  // Sized once here: parts starting together would otherwise race to size it.
  if (!Region::prepare_file(o.region, o.size, &err)) {
    std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
    return 1;
  }
  if (!o.ready_file.empty()) unlink(o.ready_file.c_str());
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
  std::vector<Part> parts(o.sessions);
  for (uint32_t k = 0; k < o.sessions; ++k) {
    if (!o.ready_file.empty()) unlink(part_file(o.ready_file, k).c_str());
    parts[k] = {spawn(argv, k, o), std::chrono::steady_clock::now()};
  }
  bool stopping = false, all_ready = false;
  int status = 0;
  uint32_t running = o.sessions;
  while (running > 0) {
    if (const int sig = g_signal.exchange(0)) {
      stopping |= sig != SIGUSR1;
      for (const Part& p : parts)
        if (p.pid > 0) kill(p.pid, sig);
    }
    if (!all_ready && !o.ready_file.empty()) {
      all_ready = true;
      for (uint32_t k = 0; k < o.sessions; ++k)
        all_ready &= parts[k].ready = parts[k].ready || access(part_file(o.ready_file, k).c_str(), F_OK) == 0;
      if (all_ready) {
        for (uint32_t k = 0; k < o.sessions; ++k) unlink(part_file(o.ready_file, k).c_str());
        if (FILE* f = std::fopen(o.ready_file.c_str(), "w")) std::fclose(f);
      }
    }
    int ws = 0;
    const pid_t pid = waitpid(-1, &ws, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    for (uint32_t k = 0; k < o.sessions; ++k) {
      Part& p = parts[k];
      if (p.pid != pid) continue;
      p.pid = 0;
      --running;
      const int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
      if (stopping) {
        if (code != 0 && status == 0) status = code;
        break;
      }
      // A part that fails as it starts (a bad option, no device) would fail
      // again: stop them all with its status. One that served and then died
      // is restarted; its guest process sees the worker change and reattaches.
      if (std::chrono::steady_clock::now() - p.started < std::chrono::seconds(2)) {
        std::fprintf(stderr, "ordo-worker: the worker of session part %u exited with status %d as it started; "
                             "stopping the others\n", k, code);
        status = code ? code : 1;
        stopping = true;
        g_signal.store(SIGTERM);
        break;
      }
      std::fprintf(stderr, "ordo-worker: the worker of session part %u exited with status %d; restarting it\n", k,
                   code);
      p = {spawn(argv, k, o), std::chrono::steady_clock::now()};
      ++running;
      break;
    }
  }
  // Parts that never all became ready (a failed start) leave theirs.
  if (!o.ready_file.empty())
    for (uint32_t k = 0; k < o.sessions; ++k) unlink(part_file(o.ready_file, k).c_str());
  return status;
}

}  // namespace ordo

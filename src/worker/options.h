// ordo-worker's command line: what it names, checked before anything starts.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend.h"
#include "ordo/layout.h"
#include "worker.h"

namespace ordo {

struct CommandLine {
  std::string region_path, backend_name = "auto", ready_file, trace_path, ivshmem_socket;
  std::vector<std::string> plugins;  // --sim-kernels
  uint64_t size = 64ull << 20;
  uint32_t sessions = 0;  // 0 until parsed: the default for the size
  int partition = -1;     // >= 0: serve this part alone (a supervisor's child)
  int ipc_fd = -1;        // >= 0: the supervisor's IPC table (ipc_table.h), inherited
  bool stats = false, doorbell = true, max_sleep_set = false, device_info = false;
  uint32_t info_device = 0;
  BackendOptions bopt;
  WorkerOptions opt{.dispatch_threads = 0};  // 0 until parsed: the worker's choice
  Layout layout;  // of one part
};

// Parses and checks argv. False: the process exits with *exit_code (0 after --help).
bool parse_command_line(int argc, char** argv, CommandLine* out, int* exit_code);

}  // namespace ordo

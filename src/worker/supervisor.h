// ordo-worker --sessions N: one worker process per part of the region, so that
// each guest process is served as a CUDA process is natively: its own device
// context (a kernel fault ends that session alone), its own handles, and the
// host's scheduler between them (docs/ARCHITECTURE.md, "Sessions").
#pragma once

#include <string>

namespace ordo {

struct SupervisorOptions {
  std::string region;      // the region file, sized here before any part starts
  uint64_t size = 0;       // all parts together
  uint32_t sessions = 1;   // parts, one worker process each
  std::string backend;     // resolved: sim, null or cuda (each part starts it with its first guest)
  std::string ready_file;  // written once every part is serving
  int ipc_fd = -1;         // the region's IPC table, which every part inherits
};

// Runs `argv` again once per part with --partition K (and per-part ready and
// trace files), restarts a part's process that dies after it started serving,
// passes SIGTERM, SIGINT and SIGUSR1 on, and returns the exit status once all
// parts have stopped.
int supervise(char** argv, const SupervisorOptions& o);

}  // namespace ordo

// ordo-worker: serves one guest region on this host. With several sessions the
// process supervises a worker process per part of the region (supervisor.cc);
// otherwise, or as one of those, it serves a part itself (serve.cc).
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "backend.h"
#include "options.h"
#include "serve.h"
#include "ipc_table.h"
#include "supervisor.h"

int main(int argc, char** argv) {
  // Each cuMemCreate on the sim is a memfd (so is each allocation of 1 MiB
  // or more, which other processes may open), and PyTorch's expandable segments
  // make one per 2 MiB: the soft limit of open files (often 1024) would end a
  // 16 GiB device's memory at 2 GiB. The hard limit is what the system allows.
  if (rlimit r; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  ordo::CommandLine c;
  if (int rc; !ordo::parse_command_line(argc, argv, &c, &rc)) return rc;
  if (c.sessions > 1 && c.partition < 0 && !c.device_info) {
    // Decided once, here, before the region exists: a backend that cannot start
    // fails the worker now, not each part when its first guest comes.
    std::string err;
    const std::string backend = ordo::resolve_backend(c.backend_name, &err);
    if (backend.empty()) {
      std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
      return 2;
    }
    // One table of exports for all parts: guest processes share memory and
    // events through it (cudaIpc*). Without it they cannot, and say so.
    const auto ipc = ordo::IpcTable::create(&err, /*inherited=*/true);
    if (!ipc) std::fprintf(stderr, "ordo-worker: %s; guest processes cannot share memory or events\n", err.c_str());
    return ordo::supervise(argv, {.region = c.region_path, .size = c.size, .sessions = c.sessions,
                                  .backend = backend, .ready_file = c.ready_file, .ipc_fd = ipc ? ipc->fd() : -1});
  }
  return ordo::serve(c, argv);
}

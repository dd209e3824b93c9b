// ordo-worker: serves one guest region on this host. With several sessions the
// process supervises a worker process per part of the region (supervisor.cc);
// otherwise, or as one of those, it serves a part itself (serve.cc).
#include <cstdio>
#include <string>

#include "backend.h"
#include "options.h"
#include "serve.h"
#include "supervisor.h"

int main(int argc, char** argv) {
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
    return ordo::supervise(argv, {.region = c.region_path, .size = c.size, .sessions = c.sessions,
                                  .backend = backend, .ready_file = c.ready_file});
  }
  return ordo::serve(c, argv);
}

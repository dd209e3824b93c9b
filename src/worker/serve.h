// Serving one part of a region in this process: the region, its doorbell, an
// ivshmem-server peer, the backend (started with the part's first guest when
// lazy), the Worker, signals, and the restart after a kernel fault.
#pragma once

#include "options.h"

namespace ordo {

// Returns the process's exit status; execs a fresh image after a kernel fault.
int serve(CommandLine& c, char** argv);

}  // namespace ordo

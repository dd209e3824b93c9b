#include "options.h"

#include <algorithm>
#include <cstdlib>

#include "ordo/region.h"

namespace ordo {
namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: ordo-worker --region PATH [--size N] [--sessions N] [--backend auto|sim|cuda|null] [--stats]\n"
               "                   [--trace FILE] [--no-doorbell]\n"
               "                   [--ivshmem-server SOCKET] [--max-sleep MS] [--guest-timeout MS] [--unordered]\n"
               "                   [--devices LIST | --sim-devices N] [--chaos SEED] [--sim-kernels SO] [--quiet]\n"
               "                   [--dispatch-threads N] [--null-launch-ns NS]\n"
               "       ordo-worker --device-info [--device K] [--backend B] [--devices LIST | --sim-devices N]\n"
               "  --region PATH   the shared region: a /dev/shm file (created, or reset, here)\n"
               "  --size N        region size, a power of two (default 64M; K/M/G suffixes)\n"
               "  --sessions N    guest processes served at once, a power of two: the region is divided into N\n"
               "                  equal parts, each served by a worker process of its own (default: one per\n"
               "                  32 MiB, 1 to 16)\n"
               "  --backend B     auto (default: cuda if a CUDA device is present, else sim), sim (CPU simulator),\n"
               "                  cuda (the GPU) or null (runs nothing: transport cost)\n"
               "  --devices LIST  cuda: the host devices guests see, as ordinals in the order guests number them\n"
               "                  (e.g. 0,2: the guest's device 1 is host device 2; default: every device)\n"
               "  --sim-devices N sim and null: the number of simulated devices (default 1, at most 32)\n"
               "  --stats         print counters at exit (and on SIGUSR1) as a table and a JSON line\n"
               "  --trace FILE    write a Chrome/Perfetto trace of every dispatch at exit (ui.perfetto.dev);\n"
               "                  with several sessions, FILE.K for part K\n"
               "  --ready-file F  write F once the region is ready (for scripts)\n"
               "  --ivshmem-server SOCKET  join this ivshmem-server as a peer, so guests of ivshmem-doorbell VMs\n"
               "                  can wake the idle worker (the server's memory must be --region)\n"
               "  --max-sleep MS  longest idle sleep between polls (default 20; 1000 with --ivshmem-server)\n"
               "  --guest-timeout MS  free a guest's resources when its heartbeat stops this long (default 5000)\n"
               "  --dispatch-threads N  threads that dispatch a session's rings, 1 to 64 (default: one per 2 CPUs\n"
               "                  this process may use, at most 8); each ring keeps one of them\n"
               "  --null-launch-ns NS  null: make each launch keep its dispatch thread busy NS nanoseconds, the\n"
               "                  CPU time a driver launch costs (for benchmarks without a GPU)\n"
               "  --unordered     ignore ordering edges, like the old prototype: tests only\n"
               "  --chaos SEED    hold dispatchable entries for random times: tests only\n"
               "  --sim-kernels SO  load host twins of device kernels into the sim backend (may repeat; see sim.h)\n"
               "  --device-info   print device K (--device, default 0) as guests see it (name, memory, every\n"
               "                  CUdevice_attribute) as key=value lines and exit\n");
}

bool parse_count(const char* what, const std::string& v, uint64_t lo, uint64_t hi, uint64_t* out) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end || n < lo || n > hi) {
    std::fprintf(stderr, "ordo-worker: %s %s: a number from %llu to %llu\n", what, v.c_str(), (unsigned long long)lo,
                 (unsigned long long)hi);
    return false;
  }
  *out = n;
  return true;
}

bool parse_devices(const std::string& v, BackendOptions* b) {
  b->cuda_devices.clear();
  for (size_t p = 0; p <= v.size();) {
    const size_t q = std::min(v.find(',', p), v.size());
    char* end = nullptr;
    const std::string item = v.substr(p, q - p);
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || n < 0) {
      std::fprintf(stderr, "ordo-worker: --devices %s: a comma-separated list of device ordinals (e.g. 0,2)\n",
                   v.c_str());
      return false;
    }
    b->cuda_devices.push_back(int(n));
    p = q + 1;
  }
  return true;
}

// How many parts, and the layout of each.
bool check_sessions(CommandLine& c) {
  if (c.sessions == 0) c.sessions = uint32_t(std::clamp<uint64_t>(c.size / (32ull << 20), 1, 16));
  if ((c.sessions & (c.sessions - 1)) != 0 || c.sessions > kMaxPartitions || c.size / c.sessions < (1ull << 20) ||
      c.partition >= int(c.sessions)) {
    std::fprintf(stderr, "ordo-worker: --sessions %u: a power of two up to %u, with at least 1 MiB of the region each\n",
                 c.sessions, kMaxPartitions);
    return false;
  }
  if (!plan_default_layout(c.size / c.sessions, &c.layout)) {
    std::fprintf(stderr, "ordo-worker: --size %llu is not a power of two of at least 1 MiB (ivshmem needs a power of two)\n",
                 (unsigned long long)c.size);
    return false;
  }
  return true;
}

}  // namespace

bool parse_command_line(int argc, char** argv, CommandLine* out, int* exit_code) {
  CommandLine& c = *out;
  *exit_code = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ordo-worker: %s needs a value\n", a.c_str());
        std::exit(2);  // before anything started
      }
      return argv[++i];
    };
    if (a == "--region") c.region_path = value();
    else if (a == "--size") c.size = parse_size(value());
    else if (a == "--sessions") c.sessions = uint32_t(std::strtoul(value().c_str(), nullptr, 0));
    else if (a == "--partition") c.partition = int(std::strtol(value().c_str(), nullptr, 0));
    else if (a == "--ipc-fd") c.ipc_fd = int(std::strtol(value().c_str(), nullptr, 0));  // the supervisor's, to its parts
    else if (a == "--backend") c.backend_name = value();
    else if (a == "--stats") c.stats = true;
    else if (a == "--no-doorbell") c.doorbell = false;
    else if (a == "--ready-file") c.ready_file = value();
    else if (a == "--unordered") c.opt.ordered = false;
    else if (a == "--chaos") c.opt.chaos_seed = std::strtoull(value().c_str(), nullptr, 0);
    else if (a == "--quiet") c.opt.quiet = true;
    else if (a == "--sim-kernels") c.plugins.push_back(value());
    else if (a == "--trace") c.trace_path = value();
    else if (a == "--ivshmem-server") c.ivshmem_socket = value();
    else if (a == "--max-sleep") {
      c.opt.max_sleep = std::chrono::milliseconds(std::strtoull(value().c_str(), nullptr, 0));
      c.max_sleep_set = true;
    }
    else if (a == "--guest-timeout") c.opt.guest_timeout = std::chrono::milliseconds(std::strtoull(value().c_str(), nullptr, 0));
    else if (a == "--device-info") c.device_info = true;
    else if (a == "--device") c.info_device = uint32_t(std::strtoul(value().c_str(), nullptr, 0));
    else if (a == "--sim-devices") {
      uint64_t n;
      if (!parse_count("--sim-devices", value(), 1, kMaxDevices, &n)) return false;
      c.bopt.sim_devices = uint32_t(n);
    }
    else if (a == "--dispatch-threads") {
      uint64_t n;
      if (!parse_count("--dispatch-threads", value(), 1, kMaxDispatchThreads, &n)) return false;
      c.opt.dispatch_threads = uint32_t(n);
    }
    else if (a == "--null-launch-ns") {
      if (!parse_count("--null-launch-ns", value(), 0, 1'000'000'000, &c.bopt.null_launch_ns)) return false;
    }
    else if (a == "--devices") {
      if (!parse_devices(value(), &c.bopt)) return false;
    }
    else if (a == "--help" || a == "-h") {
      usage(stdout);
      *exit_code = 0;
      return false;
    }
    else {
      std::fprintf(stderr, "ordo-worker: unknown option %s\n", a.c_str());
      usage(stderr);
      return false;
    }
  }
  if (c.region_path.empty() && !c.device_info) {
    usage(stderr);
    return false;
  }
  c.opt.trace = !c.trace_path.empty();
  if (c.opt.dispatch_threads == 0) c.opt.dispatch_threads = default_dispatch_threads();
  return check_sessions(c);
}

}  // namespace ordo

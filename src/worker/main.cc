// ordo-worker: serves one guest region on this host.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "doorbell_waiter.h"
#include "ordo/region.h"
#include "supervisor.h"
#include "transport/ivshmem.h"
#include "worker.h"
#include "worker/backends/sim/sim_backend.h"

namespace {

std::atomic<ordo::Worker*> g_worker{nullptr};
std::atomic<bool> g_dump{false};
std::atomic<bool> g_stopping{false};
std::atomic<bool> g_stop_requested{false};

void on_stop(int) {
  g_stop_requested.store(true);
  if (auto* w = g_worker.load()) w->stop();
}
void on_usr1(int) { g_dump.store(true); }

const sigset_t& stop_signals() {
  static const sigset_t set = [] {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    return s;
  }();
  return set;
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: ordo-worker --region PATH [--size N] [--sessions N] [--backend auto|sim|cuda|null] [--stats]\n"
               "                   [--trace FILE] [--no-doorbell]\n"
               "                   [--ivshmem-server SOCKET] [--max-sleep MS] [--guest-timeout MS] [--unordered]\n"
               "                   [--devices LIST | --sim-devices N] [--chaos SEED] [--sim-kernels SO] [--quiet]\n"
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
               "  --unordered     ignore ordering edges, like the old prototype: tests only\n"
               "  --chaos SEED    hold dispatchable entries for random times: tests only\n"
               "  --sim-kernels SO  load host twins of device kernels into the sim backend (may repeat; see sim.h)\n"
               "  --device-info   print device K (--device, default 0) as guests see it (name, memory, every\n"
               "                  CUdevice_attribute) as key=value lines and exit\n");
}

// What a guest's cudaGetDeviceProperties/cuDeviceGetAttribute will see, so an
// operator (and tests/cuda's props case) can compare without a guest.
int print_device_info(ordo::Backend& backend, uint32_t device) {
  ordo::DeviceInfo d{};
  if (device >= backend.device_count()) {
    std::fprintf(stderr, "ordo-worker: --device %u: the %s backend has %u device(s)\n", device,
                 std::string(backend.name()).c_str(), backend.device_count());
    return 1;
  }
  if (ordo::Status s = backend.device_info(device, &d); !ordo::ok(s)) {
    std::fprintf(stderr, "ordo-worker: the %s backend reports no device %u (status %d)\n",
                 std::string(backend.name()).c_str(), device, int(s));
    return 1;
  }
  d.name[sizeof d.name - 1] = 0;
  std::printf("backend=%s\nname=%s\ntotal_mem=%llu\n", std::string(backend.name()).c_str(), d.name,
              (unsigned long long)d.total_global_mem);
  for (uint32_t first = 0; first < ordo::kDeviceAttributeCount; first += ordo::kDeviceAttributesPerCall) {
    int32_t a[ordo::kDeviceAttributesPerCall];
    if (!ordo::ok(backend.device_attributes(device, first, a))) continue;
    for (uint32_t i = 0; i < ordo::kDeviceAttributesPerCall; ++i)
      if (first + i > 0) std::printf("attr.%u=%d\n", first + i, a[i]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string region_path, backend_name = "auto", ready_file, trace_path;
  std::vector<std::string> plugins;
  uint64_t size = 64ull << 20;
  uint32_t sessions = 0;  // 0: the default for the size
  int partition = -1;     // >= 0: serve this part alone (a supervisor's child)
  std::string ivshmem_socket;
  bool stats = false, doorbell = true, max_sleep_set = false, device_info = false;
  uint32_t info_device = 0;
  ordo::BackendOptions bopt;
  ordo::WorkerOptions opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ordo-worker: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--region") region_path = value();
    else if (a == "--size") size = ordo::parse_size(value());
    else if (a == "--sessions") sessions = uint32_t(std::strtoul(value().c_str(), nullptr, 0));
    else if (a == "--partition") partition = int(std::strtol(value().c_str(), nullptr, 0));
    else if (a == "--backend") backend_name = value();
    else if (a == "--stats") stats = true;
    else if (a == "--no-doorbell") doorbell = false;
    else if (a == "--ready-file") ready_file = value();
    else if (a == "--unordered") opt.ordered = false;
    else if (a == "--chaos") opt.chaos_seed = std::strtoull(value().c_str(), nullptr, 0);
    else if (a == "--quiet") opt.quiet = true;
    else if (a == "--sim-kernels") plugins.push_back(value());
    else if (a == "--trace") trace_path = value();
    else if (a == "--ivshmem-server") ivshmem_socket = value();
    else if (a == "--max-sleep") {
      opt.max_sleep = std::chrono::milliseconds(std::strtoull(value().c_str(), nullptr, 0));
      max_sleep_set = true;
    }
    else if (a == "--guest-timeout") opt.guest_timeout = std::chrono::milliseconds(std::strtoull(value().c_str(), nullptr, 0));
    else if (a == "--device-info") device_info = true;
    else if (a == "--device") info_device = uint32_t(std::strtoul(value().c_str(), nullptr, 0));
    else if (a == "--sim-devices") {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long n = std::strtoul(v.c_str(), &end, 10);
      if (v.empty() || *end || n == 0 || n > ordo::kMaxDevices) {
        std::fprintf(stderr, "ordo-worker: --sim-devices %s: a number from 1 to %u\n", v.c_str(), ordo::kMaxDevices);
        return 2;
      }
      bopt.sim_devices = uint32_t(n);
    }
    else if (a == "--devices") {
      const std::string v = value();
      bopt.cuda_devices.clear();
      for (size_t p = 0; p <= v.size();) {
        const size_t q = std::min(v.find(',', p), v.size());
        char* end = nullptr;
        const std::string item = v.substr(p, q - p);
        const long n = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || n < 0) {
          std::fprintf(stderr, "ordo-worker: --devices %s: a comma-separated list of device ordinals (e.g. 0,2)\n",
                       v.c_str());
          return 2;
        }
        bopt.cuda_devices.push_back(int(n));
        p = q + 1;
      }
    }
    else if (a == "--help" || a == "-h") { usage(stdout); return 0; }
    else {
      std::fprintf(stderr, "ordo-worker: unknown option %s\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (region_path.empty() && !device_info) {
    usage(stderr);
    return 2;
  }
  opt.trace = !trace_path.empty();
  if (sessions == 0) sessions = uint32_t(std::clamp<uint64_t>(size / (32ull << 20), 1, 16));
  if ((sessions & (sessions - 1)) != 0 || sessions > ordo::kMaxPartitions || size / sessions < (1ull << 20) ||
      partition >= int(sessions)) {
    std::fprintf(stderr, "ordo-worker: --sessions %u: a power of two up to %u, with at least 1 MiB of the region each\n",
                 sessions, ordo::kMaxPartitions);
    return 2;
  }
  ordo::Layout layout;
  if (!ordo::plan_default_layout(size / sessions, &layout)) {
    std::fprintf(stderr, "ordo-worker: --size %llu is not a power of two of at least 1 MiB (ivshmem needs a power of two)\n",
                 (unsigned long long)size);
    return 2;
  }
  std::string err;
  if (sessions > 1 && partition < 0 && !device_info) {
    // Decided once, here, before the region exists: a backend that cannot start
    // fails the worker now, not each part when its first guest comes.
    const std::string backend = ordo::resolve_backend(backend_name, &err);
    if (backend.empty()) {
      std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
      return 2;
    }
    return ordo::supervise(argv, {.region = region_path, .size = size, .sessions = sessions, .backend = backend,
                                  .ready_file = ready_file});
  }
  const uint32_t part = partition < 0 ? 0 : uint32_t(partition);
  for (const std::string& p : plugins) {
    if (!ordo::sim::load_kernel_plugin(p, &err)) {
      std::fprintf(stderr, "ordo-worker: --sim-kernels %s: %s\n", p.c_str(), err.c_str());
      return 1;
    }
  }
  // A part's backend (on a GPU: a CUDA context, hundreds of MiB of device
  // memory) starts with the part's first guest, so idle parts cost nothing.
  const bool lazy = partition >= 0 && !device_info;
  std::unique_ptr<ordo::Backend> backend;
  if (!lazy) {
    backend = ordo::make_backend(backend_name, bopt, &err);
    if (!backend) {
      std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
      return 2;
    }
    if (device_info) return print_device_info(*backend, info_device);
  }
  auto region = ordo::Region::create(region_path, layout, &err, part, sessions);
  if (!region) {
    std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
    return 1;
  }
  std::unique_ptr<ordo::DoorbellWaiter> bell;
  if (doorbell) {
    bell = ordo::DoorbellWaiter::listen(ordo::doorbell_path(region_path, part), &err);
    if (!bell) std::fprintf(stderr, "ordo-worker: %s; idle sleeps will poll instead\n", err.c_str());
  }
  std::unique_ptr<ordo::IvshmemPeer> peer;
  std::thread peer_reader;
  if (!ivshmem_socket.empty()) {
    peer = ordo::IvshmemPeer::join(ivshmem_socket, &err);
    if (!peer) {
      std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
      return 1;
    }
    // A server sharing other memory than ours would send the guest's rings here
    // while its rings live elsewhere: refuse, loudly.
    struct stat a{}, b{};
    if (::fstat(peer->shm_fd(), &a) != 0 || ::stat(region_path.c_str(), &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
      std::fprintf(stderr, "ordo-worker: ivshmem-server %s shares a different memory file than --region %s "
                           "(start the server with the same region file)\n", ivshmem_socket.c_str(), region_path.c_str());
      return 1;
    }
    if (!bell) {
      std::fprintf(stderr, "ordo-worker: --ivshmem-server needs the io_uring doorbell (drop --no-doorbell)\n");
      return 1;
    }
    bell->add_eventfd(peer->vector0());
    region->header()->ivshmem_peer.store(peer->id() + 1, std::memory_order_release);
    // Guests ring on their own: an idle worker may sleep long (a lost ring still
    // costs at most this).
    if (!max_sleep_set) opt.max_sleep = std::chrono::milliseconds(1000);
    peer_reader = std::thread([&peer, &ivshmem_socket] {
      // Later join/leave notices carry fds: read them so they don't pile up.
      while (peer->drain()) {
        pollfd p{peer->socket(), POLLIN, 0};
        ::poll(&p, 1, -1);
      }
      if (!g_stopping.load())
        std::fprintf(stderr, "ordo-worker: ivshmem-server %s went away; VMs already connected can still ring, "
                             "new ones cannot\n", ivshmem_socket.c_str());
    });
  }
  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, nullptr);
  // Blocked by the image that restarted into this one (see below).
  sigprocmask(SIG_UNBLOCK, &stop_signals(), nullptr);
  auto announce = [&] {
    if (opt.quiet) return;
    std::fprintf(stderr, "ordo-worker: serving %s%s (%llu MiB, %u rings x %u entries, backend %s%s%s%s)\n",
                 region_path.c_str(),
                 sessions > 1 ? (" session part " + std::to_string(part) + " of " + std::to_string(sessions)).c_str() : "",
                 (unsigned long long)(layout.region_size >> 20), layout.ring_count, layout.ring_capacity,
                 backend ? std::string(backend->name()).c_str() : backend_name.c_str(),
                 opt.ordered ? "" : ", UNORDERED", opt.chaos_seed ? ", chaos" : "",
                 peer ? (", ivshmem peer " + std::to_string(peer->id())).c_str() : "");
  };
  auto write_ready = [&] {
    if (ready_file.empty()) return;
    if (FILE* f = std::fopen(ready_file.c_str(), "w")) std::fclose(f);
  };
  if (lazy) {
    ordo::RegionHeader* h = region->header();
    h->worker_state.store(uint32_t(ordo::WorkerState::kIdle), std::memory_order_release);
    announce();
    write_ready();
    // A guest claiming the part rings while it waits to be attached.
    while (!g_stop_requested.load() && h->guest_session.load(std::memory_order_acquire) == 0) {
      if (bell) bell->wait(std::chrono::milliseconds(100));
      else usleep(10000);
    }
    if (g_stop_requested.load()) {
      h->worker_state.store(uint32_t(ordo::WorkerState::kStopped), std::memory_order_release);
      return 0;
    }
    backend = ordo::make_backend(backend_name, bopt, &err);
    if (!backend) {
      std::fprintf(stderr, "ordo-worker: session part %u: %s\n", part, err.c_str());
      h->worker_state.store(uint32_t(ordo::WorkerState::kStopped), std::memory_order_release);
      return 2;
    }
  }
  ordo::Worker worker(*region, *backend, opt);
  g_worker.store(&worker);
  if (g_stop_requested.load()) worker.stop();
  if (!lazy) {
    announce();
    write_ready();
  }
  std::thread reporter;
  std::atomic<bool> done{false};
  if (stats) {
    reporter = std::thread([&] {
      while (!done.load()) {
        if (g_dump.exchange(false)) {
          auto s = worker.stats();
          std::fprintf(stderr, "%s%s\n", s.table().c_str(), s.json().c_str());
        }
        usleep(50000);
      }
    });
  }
  worker.run(bell.get());
  done.store(true);
  if (peer) {
    g_stopping.store(true);
    ::shutdown(peer->socket(), SHUT_RDWR);  // wakes the reader's poll
    peer_reader.join();
  }
  if (reporter.joinable()) reporter.join();
  g_worker.store(nullptr);
  if (stats) {
    auto s = worker.stats();
    std::fprintf(stderr, "%s%s\n", s.table().c_str(), s.json().c_str());
  }
  // A stop that arrives from here on stays pending across the exec below,
  // for the new image to take once its handlers are in place.
  sigprocmask(SIG_BLOCK, &stop_signals(), nullptr);
  if (worker.restart_requested() && !g_stop_requested.load()) {
    // CUDA ends a kernel fault's context only with the process. The region
    // stays as it is until the new process resets it, and a guest that asked
    // to attach meanwhile asks again (Client::attach).
    std::fprintf(stderr, "ordo-worker: the session's kernel fault (%s) left the %s backend's device context "
                         "unusable; restarting to serve the next session with a fresh one\n",
                 std::string(ordo::status_name(ordo::Status(region->header()->sticky_error.load()))).c_str(),
                 std::string(backend->name()).c_str());
    std::fflush(stderr);
    ::execv("/proc/self/exe", argv);
    std::fprintf(stderr, "ordo-worker: restart failed: %s; exiting\n", std::strerror(errno));
    return 1;
  }
  if (!trace_path.empty()) {
    if (!worker.write_trace(trace_path, &err)) {
      std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
      return 1;
    }
    if (!opt.quiet) std::fprintf(stderr, "ordo-worker: trace written to %s (open it in ui.perfetto.dev)\n", trace_path.c_str());
  }
  return 0;
}

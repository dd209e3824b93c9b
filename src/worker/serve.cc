#include "serve.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "backend.h"
#include "doorbell_waiter.h"
#include "ordo/region.h"
#include "transport/ivshmem.h"
#include "worker.h"
#include "worker/backends/sim/sim_backend.h"

namespace ordo {
namespace {

std::atomic<Worker*> g_worker{nullptr};
std::atomic<bool> g_dump{false};
std::atomic<bool> g_stopping{false};
std::atomic<bool> g_stop_requested{false};

std::atomic<bool> g_restarting{false};

// SIGTERM, SIGINT and SIGUSR1.
const sigset_t& handled_signals() {
  static const sigset_t set = [] {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGUSR1);
    return s;
  }();
  return set;
}

// What a guest's cudaGetDeviceProperties/cuDeviceGetAttribute will see, so an
// operator (and tests/cuda's props case) can compare without a guest.
int print_device_info(Backend& backend, uint32_t device) {
  DeviceInfo d{};
  if (device >= backend.device_count()) {
    std::fprintf(stderr, "ordo-worker: --device %u: the %s backend has %u device(s)\n", device,
                 std::string(backend.name()).c_str(), backend.device_count());
    return 1;
  }
  if (Status s = backend.device_info(device, &d); !ok(s)) {
    std::fprintf(stderr, "ordo-worker: the %s backend reports no device %u (status %d)\n",
                 std::string(backend.name()).c_str(), device, int(s));
    return 1;
  }
  d.name[sizeof d.name - 1] = 0;
  std::printf("backend=%s\nname=%s\ntotal_mem=%llu\n", std::string(backend.name()).c_str(), d.name,
              (unsigned long long)d.total_global_mem);
  for (uint32_t first = 0; first < kDeviceAttributeCount; first += kDeviceAttributesPerCall) {
    int32_t a[kDeviceAttributesPerCall];
    if (!ok(backend.guest_attributes(device, first, a))) continue;
    for (uint32_t i = 0; i < kDeviceAttributesPerCall; ++i)
      if (first + i > 0) std::printf("attr.%u=%d\n", first + i, a[i]);
  }
  // What the device has that guests are not shown (a native run sees it).
  for (const WithheldAttribute& w : withheld_attributes()) {
    int32_t a[kDeviceAttributesPerCall];
    const uint32_t first = w.attr / kDeviceAttributesPerCall * kDeviceAttributesPerCall;
    if (ok(backend.device_attributes(device, first, a)) && a[w.attr - first])
      std::printf("withheld.%u=%d  # %s\n", w.attr, a[w.attr - first], w.api);
  }
  return 0;
}

// The signals are blocked in every thread (this runs before any is made, and
// they inherit the mask) and taken by one thread of their own with sigwait,
// so that a stop is acted on whatever the other threads are doing: a handler
// runs on whichever thread the kernel picks, and a sanitizer that defers
// handlers to the thread's next intercepted call deferred a stop sent to the
// dispatch loop, which makes none, for ever. A stop that comes once a restart
// is under way (finish()) is sent again, to stay pending across the exec for
// the new image, which blocks the signals the same way and so takes it.
void take_signals() {
  pthread_sigmask(SIG_BLOCK, &handled_signals(), nullptr);
  std::thread([] {
    for (;;) {
      int sig = 0;
      if (sigwait(&handled_signals(), &sig) != 0) continue;
      if (sig == SIGUSR1) {
        g_dump.store(true);
        continue;
      }
      if (g_restarting.load()) {
        kill(getpid(), sig);
        return;
      }
      g_stop_requested.store(true);
      if (auto* w = g_worker.load()) w->stop();
    }
  }).detach();
}

// One part's serving state, from the region's creation to the process's exit.
struct Part {
  CommandLine& c;
  char** argv;
  uint32_t index;
  bool lazy;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Region> region;
  std::unique_ptr<DoorbellWaiter> bell;
  std::unique_ptr<IvshmemPeer> peer;
  std::thread peer_reader;
  std::string err;

  Part(CommandLine& cl, char** av)
      : c(cl), argv(av), index(cl.partition < 0 ? 0 : uint32_t(cl.partition)), lazy(cl.partition >= 0 && !cl.device_info) {}
  ~Part() { stop_peer_reader(); }  // also on the early returns

  void stop_peer_reader() {
    if (!peer_reader.joinable()) return;
    g_stopping.store(true);
    ::shutdown(peer->socket(), SHUT_RDWR);  // wakes the reader's poll
    peer_reader.join();
  }

  bool join_ivshmem_server() {
    peer = IvshmemPeer::join(c.ivshmem_socket, &err);
    if (!peer) {
      std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
      return false;
    }
    // A server sharing other memory than ours would send the guest's rings here
    // while its rings live elsewhere: refuse, loudly.
    struct stat a{}, b{};
    if (::fstat(peer->shm_fd(), &a) != 0 || ::stat(c.region_path.c_str(), &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
      std::fprintf(stderr, "ordo-worker: ivshmem-server %s shares a different memory file than --region %s "
                           "(start the server with the same region file)\n", c.ivshmem_socket.c_str(), c.region_path.c_str());
      return false;
    }
    if (!bell) {
      std::fprintf(stderr, "ordo-worker: --ivshmem-server needs the io_uring doorbell (drop --no-doorbell)\n");
      return false;
    }
    bell->add_eventfd(peer->vector0());
    region->header()->ivshmem_peer.store(peer->id() + 1, std::memory_order_release);
    // Guests ring on their own: an idle worker may sleep long (a lost ring still
    // costs at most this).
    if (!c.max_sleep_set) c.opt.max_sleep = std::chrono::milliseconds(1000);
    peer_reader = std::thread([this] {
      // Later join/leave notices carry fds: read them so they don't pile up.
      while (peer->drain()) {
        pollfd p{peer->socket(), POLLIN, 0};
        ::poll(&p, 1, -1);
      }
      if (!g_stopping.load())
        std::fprintf(stderr, "ordo-worker: ivshmem-server %s went away; VMs already connected can still ring, "
                             "new ones cannot\n", c.ivshmem_socket.c_str());
    });
    return true;
  }

  void announce() const {
    if (!c.opt.quiet) {
      std::fprintf(stderr, "ordo-worker: serving %s%s (%llu MiB, %u rings x %u entries, backend %s%s%s%s)\n",
                   c.region_path.c_str(),
                   c.sessions > 1 ? (" session part " + std::to_string(index) + " of " + std::to_string(c.sessions)).c_str() : "",
                   (unsigned long long)(c.layout.region_size >> 20), c.layout.ring_count, c.layout.ring_capacity,
                   backend ? std::string(backend->name()).c_str() : c.backend_name.c_str(),
                   c.opt.ordered ? "" : ", UNORDERED", c.opt.chaos_seed ? ", chaos" : "",
                   peer ? (", ivshmem peer " + std::to_string(peer->id())).c_str() : "");
    }
    if (c.ready_file.empty()) return;
    if (FILE* f = std::fopen(c.ready_file.c_str(), "w")) std::fclose(f);
  }

  // Lazy: the backend (on a GPU, a CUDA context and hundreds of MiB of device
  // memory) starts with the part's first guest. -1: go on serving.
  int wait_for_first_guest() {
    RegionHeader* h = region->header();
    h->worker_state.store(uint32_t(WorkerState::kIdle), std::memory_order_release);
    announce();
    // A guest claiming the part rings while it waits to be attached.
    while (!g_stop_requested.load() && h->guest_session.load(std::memory_order_acquire) == 0) {
      if (bell) bell->wait(std::chrono::milliseconds(100));
      else usleep(10000);
    }
    if (g_stop_requested.load()) {
      h->worker_state.store(uint32_t(WorkerState::kStopped), std::memory_order_release);
      return 0;
    }
    backend = make_backend(c.backend_name, c.bopt, &err);
    if (!backend) {
      std::fprintf(stderr, "ordo-worker: session part %u: %s\n", index, err.c_str());
      h->worker_state.store(uint32_t(WorkerState::kStopped), std::memory_order_release);
      return 2;
    }
    return -1;
  }

  void run(Worker& worker) {
    std::thread reporter;
    std::atomic<bool> done{false};
    if (c.stats) {
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
    stop_peer_reader();
    if (reporter.joinable()) reporter.join();
    g_worker.store(nullptr);
    if (c.stats) {
      auto s = worker.stats();
      std::fprintf(stderr, "%s%s\n", s.table().c_str(), s.json().c_str());
    }
  }

  int finish(Worker& worker) {
    // A stop that arrives from here on stays pending across the exec below,
    // for the new image to take (take_signals).
    g_restarting.store(true);
    if (worker.restart_requested() && !g_stop_requested.load()) {
      // CUDA ends a kernel fault's context only with the process. The region
      // stays as it is until the new process resets it, and a guest that asked
      // to attach meanwhile asks again (Client::attach).
      std::fprintf(stderr, "ordo-worker: the session's kernel fault (%s) left the %s backend's device context "
                           "unusable; restarting to serve the next session with a fresh one\n",
                   std::string(status_name(Status(region->header()->sticky_error.load()))).c_str(),
                   std::string(backend->name()).c_str());
      std::fflush(stderr);
      ::execv("/proc/self/exe", argv);
      std::fprintf(stderr, "ordo-worker: restart failed: %s; exiting\n", std::strerror(errno));
      return 1;
    }
    if (!c.trace_path.empty()) {
      if (!worker.write_trace(c.trace_path, &err)) {
        std::fprintf(stderr, "ordo-worker: %s\n", err.c_str());
        return 1;
      }
      if (!c.opt.quiet)
        std::fprintf(stderr, "ordo-worker: trace written to %s (open it in ui.perfetto.dev)\n", c.trace_path.c_str());
    }
    return 0;
  }
};

}  // namespace

int serve(CommandLine& c, char** argv) {
  take_signals();
  Part p(c, argv);
  for (const std::string& plugin : c.plugins) {
    if (!sim::load_kernel_plugin(plugin, &p.err)) {
      std::fprintf(stderr, "ordo-worker: --sim-kernels %s: %s\n", plugin.c_str(), p.err.c_str());
      return 1;
    }
  }
  if (!p.lazy) {
    p.backend = make_backend(c.backend_name, c.bopt, &p.err);
    if (!p.backend) {
      std::fprintf(stderr, "ordo-worker: %s\n", p.err.c_str());
      return 2;
    }
    if (c.device_info) return print_device_info(*p.backend, c.info_device);
  }
  p.region = Region::create(c.region_path, c.layout, &p.err, p.index, c.sessions);
  if (!p.region) {
    std::fprintf(stderr, "ordo-worker: %s\n", p.err.c_str());
    return 1;
  }
  if (c.doorbell) {
    p.bell = DoorbellWaiter::listen(doorbell_path(c.region_path, p.index), &p.err);
    if (!p.bell) std::fprintf(stderr, "ordo-worker: %s; idle sleeps will poll instead\n", p.err.c_str());
  }
  if (!c.ivshmem_socket.empty() && !p.join_ivshmem_server()) return 1;
  // A lone worker's own table: one guest process has nobody to share with,
  // but its exports still succeed as CUDA's do. What this part's previous
  // process exported goes at once, not when its next guest comes.
  std::unique_ptr<IpcTable> ipc = c.ipc_fd >= 0 ? IpcTable::attach(c.ipc_fd, &p.err) : IpcTable::create(&p.err);
  if (!ipc) std::fprintf(stderr, "ordo-worker: %s; cudaIpc* calls will answer not supported\n", p.err.c_str());
  if (ipc) ipc->revoke_all(p.index);
  c.opt.ipc = ipc.get();
  c.opt.partition = p.index;
  if (p.lazy) {
    if (int rc = p.wait_for_first_guest(); rc >= 0) return rc;
  }
  Worker worker(*p.region, *p.backend, c.opt);
  g_worker.store(&worker);
  if (g_stop_requested.load()) worker.stop();
  if (!p.lazy) p.announce();
  p.run(worker);
  return p.finish(worker);
}

}  // namespace ordo

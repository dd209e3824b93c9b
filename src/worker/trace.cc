#include "trace.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "ordo/ops.h"

namespace ordo {
namespace {

uint64_t key(uint32_t ring, uint64_t pos) { return uint64_t(ring) << 48 ^ pos; }

}  // namespace

bool Tracer::write(const std::string& path, std::string* error) const {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    if (error) *error = "cannot write trace " + path;
    return false;
  }
  const double ns = double(std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - ns0_).count());
  const double ns_per_tick = ns / double(std::max<uint64_t>(1, stamp() - tsc0_));
  const uint64_t t0 = events_.empty() ? 0 : events_.front().staged_ns;
  auto us = [t0, ns_per_tick](uint64_t tick) { return double(tick - t0) * ns_per_tick / 1000.0; };
  auto dur_us = [ns_per_tick](uint64_t ticks) { return double(ticks) * ns_per_tick / 1000.0; };
  // Where each ring entry was dispatched, to draw the edges that pointed at it.
  std::unordered_map<uint64_t, size_t> at;
  at.reserve(events_.size());
  for (size_t i = 0; i < events_.size(); ++i)
    if (events_[i].track < kMaxRings) at[key(events_[i].track, events_[i].pos)] = i;

  std::fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"dropped_events\":%zu},\"traceEvents\":[\n", dropped_);
  std::vector<bool> named(kMaxRings * 2, false);
  bool first = true;
  auto sep = [&] {
    if (!first) std::fputs(",\n", f);
    first = false;
  };
  uint64_t flow = 0;
  for (const Event& e : events_) {
    if (e.track < named.size() && !named[e.track]) {
      named[e.track] = true;
      sep();
      if (e.track < kMaxRings)
        std::fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":\"ring %u%s\"}}",
                     e.track, e.track, e.track == kLegacyRing ? " (legacy default stream)" : "");
      else
        std::fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":\"sync calls, slot %u\"}}",
                     e.track, e.track - kMaxRings);
    }
    const char* name = valid_op(e.op) ? kOps[e.op].name.data() : "invalid";
    const int name_len = valid_op(e.op) ? int(kOps[e.op].name.size()) : 7;
    sep();
    std::fprintf(f,
                 "{\"name\":\"%.*s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,"
                 "\"args\":{\"pos\":%" PRIu64 ",\"guest_thread\":%u,\"edge_wait_us\":%.3f,\"edges\":%u}}",
                 name_len, name, e.track < kMaxRings ? "ring" : "sync", e.track, us(e.staged_ns),
                 dur_us(e.done_ns - e.staged_ns) + 0.001, e.pos, e.thread, dur_us(e.done_ns - e.staged_ns),
                 e.edge_count);
    for (unsigned i = 0; i < e.edge_count; ++i) {
      // An edge (ring, pos) points at entry pos-1 of that ring.
      if (e.edges[i].pos == 0) continue;
      auto it = at.find(key(e.edges[i].ring, e.edges[i].pos - 1));
      if (it == at.end()) continue;
      const Event& src = events_[it->second];
      ++flow;
      sep();
      std::fprintf(f, "{\"name\":\"edge\",\"cat\":\"edge\",\"ph\":\"s\",\"id\":%" PRIu64 ",\"pid\":1,\"tid\":%u,\"ts\":%.3f}",
                   flow, src.track, us(src.done_ns));
      sep();
      std::fprintf(f,
                   "{\"name\":\"edge\",\"cat\":\"edge\",\"ph\":\"f\",\"bp\":\"e\",\"id\":%" PRIu64
                   ",\"pid\":1,\"tid\":%u,\"ts\":%.3f}",
                   flow, e.track, us(e.done_ns));
    }
  }
  std::fputs("\n]}\n", f);
  const bool good = std::fclose(f) == 0;
  if (!good && error) *error = "error writing trace " + path;
  return good;
}

}  // namespace ordo

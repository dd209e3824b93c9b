// 8 guest threads x 8 streams x 10^6 calls against a worker process: every call
// is accounted for (exact sums on the device, the worker's own entry count) and
// every byte copied arrives.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <thread>
#include <vector>

#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

TEST(Stress, EightThreadsEightStreamsMillionCalls) {
  constexpr int kThreads = 8;
  constexpr uint64_t kCalls = 1'000'000;
  constexpr uint64_t kPerThread = kCalls / kThreads;
  constexpr uint64_t kCopyEvery = 16;  // every 16th call is a copy instead of a launch
  constexpr uint64_t kChunk = 256;     // bytes per copy
  WorkerProcess w({}, "64M");
  {
    auto c = w.attach();
    const uint32_t add = kernel(*c, "ordo_add_u64");
    uint64_t counters = 0, data = 0;
    const uint64_t copies = kPerThread / kCopyEvery;
    ASSERT_EQ(c->malloc(&counters, kThreads * 8), Status::kSuccess);
    ASSERT_EQ(c->malloc(&data, kThreads * copies * kChunk), Status::kSuccess);
    ASSERT_EQ(c->memset_async(counters, 0, kThreads * 8, kLegacyStream), Status::kSuccess);
    ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        Stream s;
        ASSERT_EQ(c->stream_create(&s, t % 2 ? kStreamNonBlocking : 0), Status::kSuccess);
        std::vector<uint8_t> chunk(kChunk);
        uint64_t copy = 0;
        for (uint64_t i = 1; i <= kPerThread; ++i) {
          if (i % kCopyEvery == 0) {
            for (uint64_t b = 0; b < kChunk; ++b) chunk[b] = uint8_t(t * 31 + copy * 7 + b);
            const uint64_t dst = data + (uint64_t(t) * copies + copy) * kChunk;
            ASSERT_EQ(c->memcpy_h2d_async(dst, chunk.data(), kChunk, s), Status::kSuccess);
            ++copy;
          } else {
            sim::AddU64Args a{counters + 8 * uint64_t(t), i};
            ASSERT_EQ(c->launch(add, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
          }
        }
        ASSERT_EQ(c->stream_synchronize(s), Status::kSuccess);
        ASSERT_EQ(c->stream_destroy(s), Status::kSuccess);
      });
    for (auto& t : ts) t.join();

    std::vector<uint64_t> got(kThreads);
    ASSERT_EQ(c->memcpy_d2h(got.data(), counters, kThreads * 8), Status::kSuccess);
    uint64_t expect = 0;
    for (uint64_t i = 1; i <= kPerThread; ++i)
      if (i % kCopyEvery) expect += i;
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], expect) << "thread " << t << " lost or repeated a launch";
    std::vector<uint8_t> all(kThreads * copies * kChunk);
    ASSERT_EQ(c->memcpy_d2h(all.data(), data, all.size()), Status::kSuccess);
    uint64_t bad = 0;
    for (int t = 0; t < kThreads; ++t)
      for (uint64_t k = 0; k < copies; ++k)
        for (uint64_t b = 0; b < kChunk; ++b)
          bad += all[(t * copies + k) * kChunk + b] != uint8_t(t * 31 + k * 7 + b);
    EXPECT_EQ(bad, 0u) << "copied bytes differ";
    EXPECT_EQ(c->get_last_error(), Status::kSuccess);
  }
  // The worker's own count: every guest call became exactly one dispatched entry
  // (plus the fences, stream creates and setup calls, which are counted apart).
  const std::string log = w.stop();
  std::smatch m;
  auto count = [&](const char* op) -> uint64_t {
    std::regex re(std::string("\"") + op + "\":([0-9]+)");
    return std::regex_search(log, m, re) ? std::stoull(m[1]) : 0;
  };
  const uint64_t copies = kThreads * (kPerThread / kCopyEvery);
  EXPECT_EQ(count("Launch"), kThreads * kPerThread - copies) << log;
  EXPECT_GE(count("Memcpy"), copies) << log;
  EXPECT_EQ(count("errors"), 0u) << log;
}

}  // namespace
}  // namespace ordo::test

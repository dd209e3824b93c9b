// ordo-worker --trace: the seed scenario leaves a readable Chrome/Perfetto trace
// with one track per ring, a slice per call and an arrow for the event edge.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "guest/testing.h"
#include "harness.h"
#include "ordo/sim.h"

namespace ordo::test {
namespace {

TEST(Trace, SeedScenarioShowsTracksSlicesAndEdges) {
  const std::string path = unique_region("trace") + ".json";
  uint32_t s_ring = 0, s2_ring = 0;
  {
    WorkerProcess w({"--trace", path});
    {
      auto c = w.attach();
      const uint32_t k = kernel(*c, "ordo_slow_copy");
      uint64_t x = 0, out = 0;
      ASSERT_EQ(c->malloc(&x, 256), Status::kSuccess);
      ASSERT_EQ(c->malloc(&out, 256), Status::kSuccess);
      Stream s, s2;
      ASSERT_EQ(c->stream_create(&s, kStreamNonBlocking), Status::kSuccess);
      ASSERT_EQ(c->stream_create(&s2, kStreamNonBlocking), Status::kSuccess);
      s_ring = guest::ring_of_stream(*c, s);
      s2_ring = guest::ring_of_stream(*c, s2);
      Event e;
      ASSERT_EQ(c->event_create(&e), Status::kSuccess);
      sim::SlowCopyArgs a{out, x, 256, 1000, 0};
      ASSERT_EQ(c->launch(k, {1}, {1}, &a, sizeof a, s), Status::kSuccess);
      ASSERT_EQ(c->event_record(e, s), Status::kSuccess);
      ASSERT_EQ(c->stream_wait_event(s2, e), Status::kSuccess);
      ASSERT_EQ(c->memset_async(x, 1, 256, s2), Status::kSuccess);
      ASSERT_EQ(c->memset_async(out, 2, 256, kLegacyStream), Status::kSuccess);
      ASSERT_EQ(c->device_synchronize(), Status::kSuccess);
    }
    const std::string log = w.stop();
    ASSERT_NE(log.find("trace written to"), std::string::npos) << log;
  }
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string t = ss.str();
  unlink(path.c_str());
  ASSERT_EQ(t.rfind("{\"displayTimeUnit\"", 0), 0u) << t.substr(0, 200);
  // Balanced JSON structure (no string in this trace holds a bracket).
  int depth = 0;
  for (char ch : t) {
    depth += (ch == '{' || ch == '[') - (ch == '}' || ch == ']');
    ASSERT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);
  EXPECT_NE(t.find("\"name\":\"ring 0 (legacy default stream)\""), std::string::npos);
  const std::string tid_s = "\"tid\":" + std::to_string(s_ring) + ",";
  const std::string tid_s2 = "\"tid\":" + std::to_string(s2_ring) + ",";
  EXPECT_TRUE(std::regex_search(t, std::regex("\"name\":\"Launch\"[^\\n]*" + tid_s)));
  EXPECT_TRUE(std::regex_search(t, std::regex("\"name\":\"EventRecord\"[^\\n]*" + tid_s)));
  EXPECT_TRUE(std::regex_search(t, std::regex("\"name\":\"StreamWaitEvent\"[^\\n]*" + tid_s2 + "[^\\n]*\"edges\":1")));
  // The wait's edge is drawn from the record's ring to the wait's ring.
  EXPECT_TRUE(std::regex_search(t, std::regex("\"ph\":\"s\"[^\\n]*" + tid_s)));
  EXPECT_TRUE(std::regex_search(t, std::regex("\"ph\":\"f\"[^\\n]*" + tid_s2)));
  EXPECT_NE(t.find("\"name\":\"sync calls, slot"), std::string::npos);
}

}  // namespace
}  // namespace ordo::test

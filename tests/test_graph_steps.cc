// The graph steps format (src/transport/graph_steps.h): what the writer
// makes parses back to the same steps; malformed bytes are refused with a
// reason; and no bytes at all, however mutated, parse into a step that
// reaches outside them.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "transport/graph_steps.h"

namespace ordo {
namespace {

GraphStepWriter sample() {
  GraphStepWriter w;
  const uint8_t args[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  w.kernel({7, 256, {2, 3, 4}, {32, 2, 1}, sizeof args, 0}, args);
  w.memset({0x1000, 0xab, 4096});
  w.copy({0x2000, 0x3000, 77});
  w.kernel({8, 0, {1, 1, 1}, {1, 1, 1}, 0, 0}, nullptr);
  w.kernel({9, 0, {2, 3, 4}, {1, 1, 1}, 0, LaunchShape{{2, 1, 4}, true}.flags()}, nullptr);
  return w;
}

TEST(GraphSteps, WhatTheWriterMakesParsesBack) {
  const GraphStepWriter w = sample();
  std::vector<GraphStep> steps;
  std::string why;
  ASSERT_TRUE(parse_graph_steps(w.bytes(), &steps, &why)) << why;
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(w.steps(), 5u);
  EXPECT_EQ(w.bytes().size() % 8, 0u);
  ASSERT_EQ(steps[0].kind, StepKind::kKernel);
  EXPECT_EQ(steps[0].kernel.kernel, 7u);
  EXPECT_EQ(steps[0].kernel.shared_mem, 256u);
  EXPECT_EQ(steps[0].kernel.grid.z, 4u);
  EXPECT_EQ(steps[0].kernel.block.x, 32u);
  ASSERT_EQ(steps[0].kernel.args_size, 12u);
  EXPECT_EQ(std::to_integer<int>(steps[0].args[11]), 12);
  ASSERT_EQ(steps[1].kind, StepKind::kMemset);
  EXPECT_EQ(steps[1].memset.dst, 0x1000u);
  EXPECT_EQ(steps[1].memset.value, 0xabu);
  EXPECT_EQ(steps[1].memset.size, 4096u);
  ASSERT_EQ(steps[2].kind, StepKind::kCopy);
  EXPECT_EQ(steps[2].copy.src, 0x3000u);
  EXPECT_EQ(steps[2].copy.size, 77u);
  EXPECT_EQ(steps[3].kernel.args_size, 0u);
  LaunchShape shape;
  ASSERT_TRUE(LaunchShape::decode(steps[4].kernel.flags, &shape));
  EXPECT_EQ(shape.cluster.x, 2u);
  EXPECT_EQ(shape.cluster.y, 1u);
  EXPECT_EQ(shape.cluster.z, 4u);
  EXPECT_TRUE(shape.cooperative);
}

TEST(GraphSteps, MalformedBytesAreRefusedWithAReason) {
  const std::vector<std::byte> good = sample().bytes();
  auto put32 = [](std::vector<std::byte> b, size_t at, uint32_t v) {
    std::memcpy(&b[at], &v, 4);
    return b;
  };
  auto put64 = [](std::vector<std::byte> b, size_t at, uint64_t v) {
    std::memcpy(&b[at], &v, 8);
    return b;
  };
  const size_t memset_at = 8 + 40 + 16;  // the first kernel's header, its step, its padded arguments
  struct Case {
    const char* what;
    std::vector<std::byte> bytes;
  } cases[] = {
      {"no steps", {}},
      {"a header cut short", std::vector<std::byte>(good.begin(), good.begin() + 5)},
      {"a step cut short", std::vector<std::byte>(good.begin(), good.begin() + 30)},
      {"an unknown kind", put32(good, 0, 99)},
      {"kind zero", put32(good, 0, 0)},
      {"a misaligned size", put32(good, 4, 60)},
      {"a size past the end", put32(good, 4, 0xfffffff8u)},
      {"arguments longer than the step", put32(good, 8 + 32, 20)},
      {"arguments shorter than the step", put32(good, 8 + 32, 4)},
      {"arguments over CUDA's limit", put32(good, 8 + 32, kMaxGraphParamBytes + 1)},
      {"a zero grid dimension", put32(good, 8 + 8, 0)},
      {"a zero block dimension", put32(good, 8 + 28, 0)},
      {"unknown launch flags", put32(good, 8 + 36, 1u << 13)},
      {"a cluster that does not divide the grid", put32(good, 8 + 36, LaunchShape{{3, 1, 1}, false}.flags())},
      {"a memset of the wrong size", put32(good, memset_at + 4, 32)},
      {"a memset value that is no byte", put64(good, memset_at + 8 + 8, 0x100)},
  };
  for (const Case& c : cases) {
    std::vector<GraphStep> steps;
    std::string why;
    EXPECT_FALSE(parse_graph_steps(c.bytes, &steps, &why)) << c.what;
    EXPECT_FALSE(why.empty()) << c.what;
  }
  std::vector<std::byte> huge(kMaxGraphBytes + 8);
  std::vector<GraphStep> steps;
  std::string why;
  EXPECT_FALSE(parse_graph_steps(huge, &steps, &why));
}

TEST(GraphSteps, MutatedBytesNeverParseIntoStepsOutsideThem) {
  const std::vector<std::byte> good = sample().bytes();
  std::mt19937_64 rng(20261207);
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> b = good;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] = std::byte(rng());
    if (rng() % 8 == 0) b.resize(rng() % (b.size() + 1));
    std::vector<GraphStep> steps;
    std::string why;
    if (!parse_graph_steps(b, &steps, &why)) continue;
    ++accepted;
    ASSERT_FALSE(steps.empty());
    for (const GraphStep& st : steps) {
      ASSERT_TRUE(st.kind == StepKind::kKernel || st.kind == StepKind::kMemset || st.kind == StepKind::kCopy ||
                  st.kind == StepKind::kHandle || st.kind == StepKind::kCond || st.kind == StepKind::kBody);
      if (st.kind == StepKind::kCond || st.kind == StepKind::kBody) {
        ASSERT_LE(st.end, steps.size());
        ASSERT_GT(st.end, size_t(&st - steps.data()));
      }
      if (st.kind == StepKind::kKernel) {
        ASSERT_GE(st.args, b.data());
        ASSERT_LE(st.args + st.kernel.args_size, b.data() + b.size());
        ASSERT_NE(st.kernel.grid.x * st.kernel.block.x, 0u);
      }
      if (st.kind == StepKind::kMemset) {
        ASSERT_LE(st.memset.value, 0xffu);
      }
    }
  }
  EXPECT_GT(accepted, 100u) << "mutations of payload bytes should still parse";
}

// A WHILE inside an IF's first body, an ELSE body, and a SWITCH after it.
GraphStepWriter conditional_sample() {
  GraphStepWriter w;
  w.handle({0x11, 1, kCondAssignDefault});
  w.handle({0x22, 0, 0});
  w.cond({0x11, uint32_t(CondType::kIf), 2});
  size_t b = w.begin_body();
  w.memset({0x1000, 1, 8});
  w.cond({0x22, uint32_t(CondType::kWhile), 1});
  size_t inner = w.begin_body();
  w.kernel({7, 0, {1, 1, 1}, {1, 1, 1}, 0, 0}, nullptr);
  w.end_body(inner);
  w.end_body(b);
  b = w.begin_body();  // ELSE: empty
  w.end_body(b);
  w.cond({0x22, uint32_t(CondType::kSwitch), 3});
  for (int i = 0; i < 3; ++i) {
    b = w.begin_body();
    w.copy({0x2000, 0x3000, 8});
    w.end_body(b);
  }
  return w;
}

TEST(GraphSteps, ConditionalsNestAndKnowWhereTheyEnd) {
  const GraphStepWriter w = conditional_sample();
  std::vector<GraphStep> s;
  std::string why;
  ASSERT_TRUE(parse_graph_steps(w.bytes(), &s, &why)) << why;
  EXPECT_TRUE(has_control_flow(s));
  // 0,1 handles; 2 IF; 3 body0 [4 memset, 5 WHILE, 6 body [7 kernel]]; 8 ELSE []; 9 SWITCH; 10/12/14 bodies.
  ASSERT_EQ(s.size(), 16u);
  EXPECT_EQ(s[0].handle.handle, 0x11u);
  EXPECT_EQ(s[0].handle.flags, kCondAssignDefault);
  ASSERT_EQ(s[2].kind, StepKind::kCond);
  EXPECT_EQ(s[2].end, 9u);
  EXPECT_EQ(s[3].body.steps, 4u);
  EXPECT_EQ(s[3].end, 8u);
  EXPECT_EQ(s[5].end, 8u);
  EXPECT_EQ(s[6].end, 8u);
  EXPECT_EQ(s[8].body.steps, 0u);
  EXPECT_EQ(s[8].end, 9u);
  EXPECT_EQ(s[9].end, 16u);
  EXPECT_EQ(s[14].end, 16u);
  std::vector<GraphStep> plain;
  ASSERT_TRUE(parse_graph_steps(sample().bytes(), &plain, &why));
  EXPECT_FALSE(has_control_flow(plain));
}

TEST(GraphSteps, ConditionalsThatDoNotNestAreRefused) {
  auto refused = [](const GraphStepWriter& w, const char* what) {
    std::vector<GraphStep> s;
    std::string why;
    EXPECT_FALSE(parse_graph_steps(w.bytes(), &s, &why)) << what;
    EXPECT_FALSE(why.empty()) << what;
  };
  {
    GraphStepWriter w;
    w.cond({0x11, uint32_t(CondType::kIf), 1});
    size_t b = w.begin_body();
    w.end_body(b);
    refused(w, "a handle never declared");
  }
  {
    GraphStepWriter w;
    w.handle({0x11, 0, 0});
    w.handle({0x11, 0, 0});
    w.cond({0x11, uint32_t(CondType::kIf), 1});
    size_t b = w.begin_body();
    w.end_body(b);
    refused(w, "a handle declared twice");
  }
  {
    GraphStepWriter w;
    w.handle({0x11, 0, 4});
    refused(w, "unknown handle flags");
  }
  for (auto [type, bodies] : {std::pair{0u, 0u}, {0u, 3u}, {1u, 2u}, {2u, 0u}, {3u, 1u}}) {
    GraphStepWriter w;
    w.handle({0x11, 0, 0});
    w.cond({0x11, type, bodies});
    for (uint32_t i = 0; i < bodies; ++i) {
      size_t b = w.begin_body();
      w.end_body(b);
    }
    refused(w, "a type and body count CUDA does not allow");
  }
  {
    GraphStepWriter w;
    w.handle({0x11, 0, 0});
    w.cond({0x11, uint32_t(CondType::kIf), 2});
    size_t b = w.begin_body();
    w.end_body(b);
    refused(w, "a conditional missing a body");
  }
  {
    GraphStepWriter w;
    w.handle({0x11, 0, 0});
    w.begin_body();
    refused(w, "a body with no conditional");
  }
  {
    GraphStepWriter w;
    w.handle({0x11, 0, 0});
    w.cond({0x11, uint32_t(CondType::kIf), 1});
    const size_t b = w.begin_body();
    w.memset({0x1000, 1, 8});
    w.end_body(b);
    std::vector<std::byte> bytes = w.bytes();
    const uint32_t past = 5;  // more steps than follow
    std::memcpy(&bytes[bytes.size() - 8 - 24 - 8], &past, 4);
    std::vector<GraphStep> s;
    std::string why;
    EXPECT_FALSE(parse_graph_steps(bytes, &s, &why)) << "a body past the end";
  }
  {
    GraphStepWriter w;
    w.handle({0x11, 0, 0});
    w.cond({0x11, uint32_t(CondType::kIf), 1});
    const size_t b = w.begin_body();
    w.handle({0x22, 0, 0});
    w.end_body(b);
    refused(w, "a handle declared in a body");
  }
  {
    GraphStepWriter w;
    w.handle({0x11, 0, 0});
    std::vector<size_t> open;
    for (uint32_t d = 0; d <= kMaxCondDepth; ++d) {
      w.cond({0x11, uint32_t(CondType::kIf), 1});
      open.push_back(w.begin_body());
    }
    for (auto it = open.rbegin(); it != open.rend(); ++it) w.end_body(*it);
    refused(w, "conditionals nested too deep");
    GraphStepWriter ok;  // kMaxCondDepth itself is fine
    ok.handle({0x11, 0, 0});
    open.clear();
    for (uint32_t d = 0; d < kMaxCondDepth; ++d) {
      ok.cond({0x11, uint32_t(CondType::kIf), 1});
      open.push_back(ok.begin_body());
    }
    for (auto it = open.rbegin(); it != open.rend(); ++it) ok.end_body(*it);
    std::vector<GraphStep> s;
    std::string why;
    EXPECT_TRUE(parse_graph_steps(ok.bytes(), &s, &why)) << why;
  }
}

TEST(GraphSteps, MutatedConditionalsNeverParseIntoBodiesOutsideThem) {
  const std::vector<std::byte> good = conditional_sample().bytes();
  std::mt19937_64 rng(7);
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> b = good;
    for (int f = 0, n = 1 + int(rng() % 3); f < n; ++f) b[rng() % b.size()] = std::byte(rng() % 8);
    std::vector<GraphStep> s;
    std::string why;
    if (!parse_graph_steps(b, &s, &why)) continue;
    ++accepted;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k].kind == StepKind::kCond) {
        ASSERT_LE(s[k].end, s.size());
        size_t at = k + 1;
        for (uint32_t j = 0; j < s[k].cond.bodies; ++j) {
          ASSERT_LT(at, s.size());
          ASSERT_EQ(s[at].kind, StepKind::kBody);
          ASSERT_EQ(s[at].end, at + 1 + s[at].body.steps);
          at = s[at].end;
        }
        ASSERT_EQ(at, s[k].end);
      }
    }
  }
  EXPECT_GT(accepted, 100u);
}

}  // namespace
}  // namespace ordo

// The workload stream: requests drawn as they are taken, the same sequence
// as the whole-workload generator had before it streamed (golden hash), and
// no up-front cost for a huge --num-requests.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/clock.h"
#include "runtime/workload.h"

namespace symtp::runtime {
namespace {

model::ModelConfig SmallModel() {
  model::ModelConfig cfg;
  cfg.vocab = 512;
  cfg.max_seq_len = 4096;
  return cfg;
}

// FNV-1a over four workloads (fixed, uniform + Poisson + EOS, normal /
// lognormal, steady) of 200 requests each.
uint64_t WorkloadHash() {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (int variant = 0; variant < 4; ++variant) {
    JobOptions o;
    o.seed = 7 + variant;
    o.num_requests = 200;
    o.eos_id = variant == 1 ? 5 : -1;
    if (variant == 1) {
      o.prompt_len = {LengthKind::kUniform, 3, 40};
      o.arrival_rate = 50;
    }
    if (variant == 2) {
      o.prompt_len = {LengthKind::kNormal, 100, 30};
      o.output_len = {LengthKind::kLognormal, 3, 0.5};
    }
    if (variant == 3) o.steady_batch = 16;
    for (const WorkloadRequest& r : GenerateWorkload(o, SmallModel())) {
      mix(r.id);
      mix(static_cast<uint64_t>(r.max_new_tokens));
      mix(static_cast<uint64_t>(r.arrival_offset_ns));
      mix(r.sampling.seed);
      for (int32_t t : r.prompt) mix(static_cast<uint64_t>(t));
    }
  }
  return h;
}

TEST(WorkloadTest, SameSequenceAsBeforeStreaming) {
  // Computed with the generator as it was before it streamed (commit ee14dd8),
  // with the steady variant's output length as SteadyPrefillSteps sets it.
  EXPECT_EQ(WorkloadHash(), 0xbe80354ca5b59ac2ull);
}

// Decodes of the prompts already prefilled take one token each of a step's
// budget, so a large batch needs more prefill steps than tokens / budget.
TEST(WorkloadTest, SteadyPrefillStepsCountTheDecodesSharingTheBudget) {
  EXPECT_EQ(SteadyPrefillSteps(1, 1024, 2048), 1);
  EXPECT_EQ(SteadyPrefillSteps(2, 1024, 2048), 1);
  // 1024 tokens, then 1023 (one decode), 1023, and the last 2 tokens.
  EXPECT_EQ(SteadyPrefillSteps(3, 1024, 1024), 4);
  EXPECT_EQ(SteadyPrefillSteps(512, 1024, 2048), 295);  // 256 without the decodes
  // Decodes alone fill the budget before the batch is whole: still finite.
  EXPECT_GT(SteadyPrefillSteps(100, 8, 64), 0);
}

TEST(WorkloadTest, StreamMatchesTheWholeWorkloadAndPeekIsStable) {
  JobOptions o;
  o.seed = 3;
  o.num_requests = 50;
  o.prompt_len = {LengthKind::kUniform, 1, 300};
  o.arrival_rate = 10;
  const std::vector<WorkloadRequest> all = GenerateWorkload(o, SmallModel());
  WorkloadStream s(o, SmallModel());
  ASSERT_EQ(s.size(), 50);
  for (const WorkloadRequest& want : all) {
    ASSERT_FALSE(s.done());
    const WorkloadRequest& peek = s.Peek();
    EXPECT_EQ(peek.id, want.id);
    EXPECT_EQ(&s.Peek(), &peek);  // no new draw
    WorkloadRequest got = s.Take();
    EXPECT_EQ(got.prompt, want.prompt);
    EXPECT_EQ(got.max_new_tokens, want.max_new_tokens);
    EXPECT_EQ(got.arrival_offset_ns, want.arrival_offset_ns);
  }
  EXPECT_TRUE(s.done());
}

// Ten million requests of 4000-token prompts (160 GB if built up front):
// the stream starts at once and draws only what is taken.
TEST(WorkloadTest, HugeWorkloadCostsNothingUpFront) {
  JobOptions o;
  o.num_requests = 10'000'000;
  o.prompt_len = {LengthKind::kFixed, 4000, 0};
  const int64_t t0 = MonotonicNs();
  WorkloadStream s(o, SmallModel());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Take().prompt.size(), 4000u);
  EXPECT_EQ(s.size(), 10'000'000);
  EXPECT_FALSE(s.done());
  EXPECT_LT((MonotonicNs() - t0) / 1e9, 2.0);
}

}  // namespace
}  // namespace symtp::runtime

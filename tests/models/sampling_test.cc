#include "models/sampling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace symtp::model {
namespace {

using ::symtp::testing::StatusIs;

// Independent copy of MODEL.md's mix for the uniform.
uint64_t RefMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<float> RandomLogits(int v, uint32_t seed, float scale = 3.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> l(v);
  for (float& x : l) x = d(rng);
  return l;
}

TEST(SamplingTest, UniformFollowsTheFormula) {
  for (uint64_t seed : {0ull, 1ull, 42ull, ~0ull}) {
    for (uint64_t pos : {0ull, 1ull, 17ull, 4095ull}) {
      const uint64_t h = RefMix(seed * 0x9E3779B97F4A7C15ull + pos);
      const float want = static_cast<float>(static_cast<double>(h >> 40) / 16777216.0);
      EXPECT_EQ(SampleUniform(seed, pos), want);
      EXPECT_GE(want, 0.f);
      EXPECT_LT(want, 1.f);
    }
  }
}

TEST(SamplingTest, GreedyArgmaxTiesToLowestId) {
  EXPECT_EQ(SampleToken(std::vector<float>{1, 3, 3, 2}, {}, 0), 1);
  EXPECT_EQ(SampleToken(std::vector<float>{5, 5, 5}, {}, 9), 0);
  EXPECT_EQ(SampleToken(std::vector<float>{-1, -0.5f, -2}, {}, 0), 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(SampleToken(std::vector<float>{nan, 1, nan, 2}, {}, 0), 3);
  EXPECT_EQ(SampleToken(std::vector<float>{}, {}, 0), -1);
  for (uint32_t s = 0; s < 20; ++s) {
    const std::vector<float> l = RandomLogits(300, s);
    int best = 0;
    for (int i = 1; i < 300; ++i) if (l[i] > l[best]) best = i;
    EXPECT_EQ(SampleToken(l, {}, s), best);
    EXPECT_EQ(ArgMax(l), best);
  }
}

TEST(SamplingTest, TopK1IsGreedy) {
  for (uint32_t s = 0; s < 50; ++s) {
    std::vector<float> l = RandomLogits(257, 1000 + s);
    if (s % 5 == 0) l[200] = l[100] = 50.f;  // tie at the top: lowest id wins
    SamplingParams p{.temperature = 1.5f, .top_k = 1, .top_p = 1.f, .seed = s};
    EXPECT_EQ(SampleToken(l, p, s * 3), SampleToken(l, SamplingParams{}, 0));
  }
}

TEST(SamplingTest, ReproducibleForSeedAndPosition) {
  const std::vector<float> l = RandomLogits(64, 7, 1.f);
  SamplingParams p{.temperature = 1.f, .top_k = 0, .top_p = 1.f, .seed = 1234};
  SamplingScratch scratch;
  std::set<int32_t> seen;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    const int32_t a = SampleToken(l, p, pos);
    // Interleave unrelated calls: the draw depends only on (seed, position, logits).
    SamplingParams other{.temperature = 0.7f, .top_k = 5, .top_p = 0.9f, .seed = 99};
    (void)SampleToken(RandomLogits(100, static_cast<uint32_t>(pos)), other, pos + 1, &scratch);
    EXPECT_EQ(SampleToken(l, p, pos, &scratch), a);
    EXPECT_EQ(SampleToken(l, p, pos), a);
    seen.insert(a);
  }
  EXPECT_GT(seen.size(), 10u);  // not stuck on one token
}

TEST(SamplingTest, TwoEqualLogitsSplitAtHalf) {
  // w = [1, 1], t = u * 2: token 0 iff 1 > t, i.e. u < 0.5.
  SamplingParams p{.temperature = 1.f};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    EXPECT_EQ(SampleToken(std::vector<float>{2.f, 2.f}, p, 11),
              SampleUniform(seed, 11) < 0.5f ? 0 : 1);
  }
}

// Chi-square of counts over fixed seeds against softmax(l / T) renormalized
// over `support` (ids outside must never appear).
double ChiSquare(const std::vector<float>& l, float temperature, const std::vector<int>& support,
                 const SamplingParams& params, int draws, std::vector<int>* counts_out) {
  std::vector<int> counts(l.size(), 0);
  SamplingParams p = params;
  for (int i = 0; i < draws; ++i) {
    p.seed = static_cast<uint64_t>(i) * 7919 + 3;
    const int32_t t = SampleToken(l, p, 100 + i % 13);
    counts.at(t)++;
  }
  double z = 0;
  double mx = -1e30;
  for (int id : support) mx = std::max(mx, static_cast<double>(l[id]));
  for (int id : support) z += std::exp((l[id] - mx) / temperature);
  double chi2 = 0;
  int in_support = 0;
  for (int id : support) {
    const double expect = draws * std::exp((l[id] - mx) / temperature) / z;
    chi2 += (counts[id] - expect) * (counts[id] - expect) / expect;
    in_support += counts[id];
  }
  EXPECT_EQ(in_support, draws) << "tokens drawn outside the support";
  if (counts_out) *counts_out = counts;
  return chi2;
}

TEST(SamplingTest, EmpiricalDistributionMatchesSoftmax) {
  const std::vector<float> l = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.25f};
  // 7 degrees of freedom: P(chi2 > 40) ~ 1e-6; the seeds are fixed so this is deterministic.
  SamplingParams p{.temperature = 1.f};
  EXPECT_LT(ChiSquare(l, 1.f, {0, 1, 2, 3, 4, 5, 6, 7}, p, 20000, nullptr), 40.0);
  p.temperature = 0.5f;
  EXPECT_LT(ChiSquare(l, 0.5f, {0, 1, 2, 3, 4, 5, 6, 7}, p, 20000, nullptr), 40.0);
  p.temperature = 2.0f;
  EXPECT_LT(ChiSquare(l, 2.0f, {0, 1, 2, 3, 4, 5, 6, 7}, p, 20000, nullptr), 40.0);
  // top_k = 3 keeps ids 4, 5, 0 (logits 2, 1.5, 1).
  p = {.temperature = 1.f, .top_k = 3};
  EXPECT_LT(ChiSquare(l, 1.f, {4, 5, 0}, p, 20000, nullptr), 30.0);
}

TEST(SamplingTest, TopPRestrictsSupport) {
  // Probabilities at T=1 proportional to 8, 4, 2, 1, 1 (ids 2, 0, 4, 1, 3).
  const float ln2 = std::log(2.f);
  const std::vector<float> l = {2 * ln2, 0, 3 * ln2, 0, ln2};
  // total w = 1 + 0.5 + 0.25 + 0.125 + 0.125 = 2; cumulative 1, 1.5, 1.75, 1.875, 2.
  // Order: 2, 0, 4, then the tie 1, 3 by lower id.
  struct Case {
    float top_p;
    std::vector<int> support;
  } cases[] = {
      {0.3f, {2}},           // target 0.6 <= 1
      {0.45f, {2}},          // target 0.9 <= 1
      {0.6f, {2, 0}},        // target 1.2 <= 1.5
      {0.8f, {2, 0, 4}},     // target 1.6 <= 1.75
      {0.9f, {2, 0, 4, 1}},  // target 1.8 <= 1.875: id 3 (same logit as 1) is cut
      {1.0f, {2, 0, 4, 1, 3}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.top_p);
    SamplingParams p{.temperature = 1.f, .top_k = 0, .top_p = c.top_p};
    EXPECT_LT(ChiSquare(l, 1.f, c.support, p, 8000, nullptr), 30.0);
  }
  // top_p combined with top_k: top_k = 2 keeps {2, 0}; top_p 0.7 of 1.5 = 1.05 > 1 -> both.
  SamplingParams p{.temperature = 1.f, .top_k = 2, .top_p = 0.7f};
  EXPECT_LT(ChiSquare(l, 1.f, {2, 0}, p, 8000, nullptr), 30.0);
}

// Straight from MODEL.md, with a comparison sort.
int32_t ReferenceSample(const std::vector<float>& l, const SamplingParams& p, uint64_t position) {
  auto key = [](float x) { return std::isnan(x) ? -INFINITY : x; };
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return key(l[a]) > key(l[b]); });
  size_t kept = ids.size();
  if (p.top_k > 0) kept = std::min(kept, static_cast<size_t>(p.top_k));
  std::vector<double> w(kept), cum(kept);
  double total = 0;
  for (size_t i = 0; i < kept; ++i) {
    w[i] = std::exp((static_cast<double>(key(l[ids[i]])) - key(l[ids[0]])) / p.temperature);
    cum[i] = (total += w[i]);
  }
  if (p.top_p < 1.f) {
    size_t m = 1;
    while (m < kept && cum[m - 1] < static_cast<double>(p.top_p) * total) ++m;
    kept = m;
    total = cum[m - 1];
  }
  const double t = static_cast<double>(SampleUniform(p.seed, position)) * total;
  for (size_t i = 0; i < kept; ++i) {
    if (cum[i] > t) return ids[i];
  }
  return ids[kept - 1];
}

TEST(SamplingTest, OrderByLogitDescMatchesComparisonSort) {
  SamplingScratch scratch;
  std::vector<int32_t> order;
  for (int v : {1, 2, 7, 300, 5000}) {
    for (uint32_t seed = 0; seed < 4; ++seed) {
      std::mt19937 rng(seed * 100 + v);
      std::vector<float> l(v);
      const float specials[] = {0.f, -0.f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                                1.f, -1.f, 1e-40f, -1e-40f, 3.4e38f};
      for (float& x : l) {
        const int r = static_cast<int>(rng() % 10);
        // Many ties (quantized values) and every special value.
        x = r < 3 ? specials[rng() % 10] : static_cast<float>(static_cast<int>(rng() % 21) - 10) * 0.5f;
      }
      std::vector<int32_t> want(v);
      std::iota(want.begin(), want.end(), 0);
      auto key = [](float x) { return std::isnan(x) ? -INFINITY : x; };
      std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return key(l[a]) > key(l[b]); });
      OrderByLogitDesc(l, &order, &scratch);
      EXPECT_EQ(order, want) << "v=" << v << " seed=" << seed;
    }
  }
}

TEST(SamplingTest, MatchesReferenceSamplerExactly) {
  SamplingScratch scratch;
  for (uint32_t s = 0; s < 6; ++s) {
    std::vector<float> l = RandomLogits(1000, 500 + s, 2.f);
    for (int i = 0; i < 1000; i += 7) l[i] = l[i / 2];  // ties
    for (const SamplingParams& base :
         {SamplingParams{.temperature = 1.f}, SamplingParams{.temperature = 0.6f, .top_k = 5},
          SamplingParams{.temperature = 1.3f, .top_k = 500}, SamplingParams{.temperature = 1.f, .top_p = 0.8f},
          SamplingParams{.temperature = 0.9f, .top_k = 40, .top_p = 0.5f}}) {
      SamplingParams p = base;
      for (uint64_t seed = 0; seed < 30; ++seed) {
        p.seed = seed * 31 + s;
        EXPECT_EQ(SampleToken(l, p, seed + 3, &scratch), ReferenceSample(l, p, seed + 3))
            << "T=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p << " seed=" << p.seed;
      }
    }
  }
}

TEST(SamplingTest, ValidateParams) {
  EXPECT_OK(ValidateSamplingParams({}));
  EXPECT_OK(ValidateSamplingParams({.temperature = 0.7f, .top_k = 40, .top_p = 0.95f}));
  EXPECT_THAT(ValidateSamplingParams({.temperature = -1.f}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("temperature")));
  EXPECT_THAT(ValidateSamplingParams({.top_k = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("top_k")));
  EXPECT_THAT(ValidateSamplingParams({.top_p = 0.f}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("top_p")));
  EXPECT_THAT(ValidateSamplingParams({.top_p = 1.5f}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("top_p")));
}

}  // namespace
}  // namespace symtp::model

// Token sampling of docs/MODEL.md: greedy, or temperature / top-k / top-p
// with a counter-based uniform keyed by (request seed, position), so every
// rank, batch layout and backend draws the same token from the same logits.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace symtp::model {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy
  int top_k = 0;            // 0: off
  float top_p = 1.f;        // 1: off
  uint64_t seed = 0;
};

// InvalidArgument unless temperature is finite and >= 0, top_k >= 0 and
// top_p is in (0, 1].
absl::Status ValidateSamplingParams(const SamplingParams& p);

// float(mix(seed * 0x9E3779B97F4A7C15 + position) >> 40) * 2^-24, in [0, 1).
float SampleUniform(uint64_t seed, uint64_t position);

// Greedy argmax, ties to the lowest id. NaN logits never win (unless all are NaN).
int32_t ArgMax(absl::Span<const float> logits);

// Samples one token id from `logits` (all V of them). `position` is the
// position of the token being sampled (the sequence length before it is
// appended). temperature <= 0 (or NaN) is greedy. Weights and their sums are
// computed in double: w_i = exp((double(l_i) - double(l_max)) / temperature).
// NaN logits are ordered as -infinity. Returns -1 only for empty `logits`.
int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                    uint64_t position);

// Same, reusing caller-owned scratch (no allocation once warmed up).
struct SamplingScratch {
  std::vector<int32_t> order;
  std::vector<double> cum;
  std::vector<uint64_t> keys, tmp;
};
int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                    uint64_t position, SamplingScratch* scratch);

// Step 1 of the sampler, exposed for tests: all ids ordered by logit
// descending, ties (and -0.0 vs +0.0) by lower id, NaN as -infinity. A stable
// LSD radix sort (O(V), ~0.5 ms for V = 128256).
void OrderByLogitDesc(absl::Span<const float> logits, std::vector<int32_t>* order,
                      SamplingScratch* scratch);

}  // namespace symtp::model

#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"
#include "models/weights.h"

namespace symtp::model {
namespace {

inline float Key(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling temperature %g must be finite and >= 0", p.temperature));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("sampling top_k %d must be >= 0", p.top_k));
  }
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling top_p %g must be in (0, 1]", p.top_p));
  }
  return absl::OkStatus();
}

float SampleUniform(uint64_t seed, uint64_t position) {
  const uint64_t h = Mix64(seed * 0x9E3779B97F4A7C15ull + position);
  return static_cast<float>(h >> 40) * 0x1p-24f;
}

int32_t ArgMax(absl::Span<const float> logits) {
  if (logits.empty()) return -1;
  int32_t best = 0;
  float best_v = Key(logits[0]);
  for (size_t i = 1; i < logits.size(); ++i) {
    const float v = Key(logits[i]);
    if (v > best_v) {
      best_v = v;
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                    uint64_t position) {
  SamplingScratch scratch;
  return SampleToken(logits, params, position, &scratch);
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                    uint64_t position, SamplingScratch* scratch) {
  if (logits.empty()) return -1;
  if (!(params.temperature > 0.f)) return ArgMax(logits);
  const size_t v = logits.size();
  // 1. order by logit descending, ties by lower id (a strict total order).
  auto before = [&](int32_t a, int32_t b) {
    const float ka = Key(logits[a]), kb = Key(logits[b]);
    return ka > kb || (ka == kb && a < b);
  };
  std::vector<int32_t>& order = scratch->order;
  order.resize(v);
  std::iota(order.begin(), order.end(), 0);
  // 2. top-k.
  size_t kept = v;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < v) {
    kept = static_cast<size_t>(params.top_k);
    std::nth_element(order.begin(), order.begin() + (kept - 1), order.end(), before);
    std::sort(order.begin(), order.begin() + kept, before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }
  // 3. weights relative to the max, cumulative in order.
  const double lmax = Key(logits[order[0]]);
  const double temp = params.temperature;
  std::vector<double>& cum = scratch->cum;
  cum.resize(kept);
  double total = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    const double l = Key(logits[order[i]]);
    // An all -inf row (or -inf max) gives NaN; treat as weight 0 except the top.
    double w = std::exp((l - lmax) / temp);
    if (std::isnan(w)) w = (i == 0) ? 1.0 : 0.0;
    total += w;
    cum[i] = total;
  }
  // 4. top-p: shortest prefix whose cumulative weight reaches top_p * total.
  if (params.top_p < 1.f) {
    const double target = static_cast<double>(params.top_p) * total;
    size_t m = 1;
    while (m < kept && cum[m - 1] < target) ++m;
    kept = m;
    total = cum[kept - 1];
  }
  // 5. inverse CDF with the counter-based uniform.
  const double t = static_cast<double>(SampleUniform(params.seed, position)) * total;
  for (size_t i = 0; i < kept; ++i) {
    if (cum[i] > t) return order[i];
  }
  return order[kept - 1];
}

}  // namespace symtp::model

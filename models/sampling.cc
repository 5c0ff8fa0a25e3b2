#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <cstring>

#include "absl/strings/str_format.h"
#include "models/weights.h"

namespace symtp::model {
namespace {

inline float Key(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

// Unsigned key whose ascending order is Key(x) descending (-0.0 == +0.0).
inline uint32_t DescendingKey(float x) {
  x = Key(x);
  if (x == 0.f) x = 0.f;
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ~ascending;
}

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
  const size_t v = logits.size();
  if (v == 0) return -1;
  const float* x = logits.data();
  // Pass 1: the max over non-NaN values, 16 independent lanes (vectorizes;
  // max is exact, so the lane split cannot change the result).
  constexpr int kLanes = 16;
  float m[kLanes];
  for (float& l : m) l = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  for (; i + kLanes <= v; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  }
  for (; i < v; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
  float mx = m[0];
  for (int l = 1; l < kLanes; ++l) mx = m[l] > mx ? m[l] : mx;
  // Pass 2: the lowest id holding it (NaN counts as -inf).
  for (size_t j = 0; j < v; ++j) {
    if (Key(x[j]) == mx) return static_cast<int32_t>(j);
  }
  return 0;  // unreachable: some element equals the max
}

void OrderByLogitDesc(absl::Span<const float> logits, std::vector<int32_t>* order,
                      SamplingScratch* scratch) {
  const size_t v = logits.size();
  std::vector<uint64_t>& a = scratch->keys;
  std::vector<uint64_t>& b = scratch->tmp;
  a.resize(v);
  b.resize(v);
  for (size_t i = 0; i < v; ++i) {
    a[i] = (static_cast<uint64_t>(DescendingKey(logits[i])) << 32) | static_cast<uint32_t>(i);
  }
  // Stable LSD radix sort on the 32 key bits, 8 at a time; ids start ascending
  // so equal keys keep the lower id first.
  for (int shift = 32; shift < 64; shift += 8) {
    size_t count[257] = {0};
    for (size_t i = 0; i < v; ++i) ++count[((a[i] >> shift) & 0xFF) + 1];
    if (count[((a[0] >> shift) & 0xFF) + 1] == v) continue;  // one bucket: nothing moves
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (size_t i = 0; i < v; ++i) b[count[(a[i] >> shift) & 0xFF]++] = a[i];
    a.swap(b);
  }
  order->resize(v);
  for (size_t i = 0; i < v; ++i) (*order)[i] = static_cast<int32_t>(a[i] & 0xFFFFFFFFu);
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
  std::vector<int32_t>& order = scratch->order;
  // 2. top-k.
  size_t kept = v;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < v / 8) {
    // Selection on the packed (descending key, id) words: the same total order.
    kept = static_cast<size_t>(params.top_k);
    // A max-heap of the `kept` smallest words; most words fail the first compare.
    std::vector<uint64_t>& keys = scratch->keys;
    keys.clear();
    for (size_t i = 0; i < v; ++i) {
      const uint64_t k =
          (static_cast<uint64_t>(DescendingKey(logits[i])) << 32) | static_cast<uint32_t>(i);
      if (keys.size() < kept) {
        keys.push_back(k);
        std::push_heap(keys.begin(), keys.end());
      } else if (k < keys.front()) {
        std::pop_heap(keys.begin(), keys.end());
        keys.back() = k;
        std::push_heap(keys.begin(), keys.end());
      }
    }
    std::sort(keys.begin(), keys.end());
    order.resize(kept);
    for (size_t i = 0; i < kept; ++i) order[i] = static_cast<int32_t>(keys[i] & 0xFFFFFFFFu);
  } else {
    OrderByLogitDesc(logits, &order, scratch);
    if (params.top_k > 0) kept = std::min(v, static_cast<size_t>(params.top_k));
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

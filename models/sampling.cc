#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

namespace {

// Fills scratch->keys with the words (DescendingKey << 32 | id) sorted
// ascending: a stable LSD radix sort on the 32 key bits in 11/11/10-bit digits
// (ids start ascending, so equal keys keep the lower id first).
void SortKeys(absl::Span<const float> logits, SamplingScratch* scratch) {
  const size_t v = logits.size();
  std::vector<uint64_t>& a = scratch->keys;
  std::vector<uint64_t>& b = scratch->tmp;
  a.resize(v);
  b.resize(v);
  constexpr int kShift[3] = {32, 43, 54};
  constexpr uint64_t kMask[3] = {0x7FF, 0x7FF, 0x3FF};
  static thread_local size_t count[3][2049];
  std::memset(count, 0, sizeof(count));
  for (size_t i = 0; i < v; ++i) {
    const uint64_t w = (static_cast<uint64_t>(DescendingKey(logits[i])) << 32) | static_cast<uint32_t>(i);
    a[i] = w;
    for (int p = 0; p < 3; ++p) ++count[p][((w >> kShift[p]) & kMask[p]) + 1];
  }
  for (int p = 0; p < 3; ++p) {
    size_t* c = count[p];
    if (c[((a[0] >> kShift[p]) & kMask[p]) + 1] == v) continue;  // one bucket: nothing moves
    for (int d = 0; d < 2048; ++d) c[d + 1] += c[d];
    for (size_t i = 0; i < v; ++i) b[c[(a[i] >> kShift[p]) & kMask[p]]++] = a[i];
    a.swap(b);
  }
}

// Inverse of DescendingKey up to NaN -> -inf and -0 -> +0 (which Key() equates).
inline float KeyValue(uint64_t word) {
  const uint32_t ascending = ~static_cast<uint32_t>(word >> 32);
  const uint32_t b = (ascending & 0x80000000u) ? (ascending & 0x7FFFFFFFu) : ~ascending;
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

}  // namespace

void OrderByLogitDesc(absl::Span<const float> logits, std::vector<int32_t>* order,
                      SamplingScratch* scratch) {
  SortKeys(logits, scratch);
  const size_t v = logits.size();
  order->resize(v);
  for (size_t i = 0; i < v; ++i) (*order)[i] = static_cast<int32_t>(scratch->keys[i] & 0xFFFFFFFFu);
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
  // 1. Order by logit descending, ties by lower id, as sorted words
  //    (DescendingKey << 32 | id) in scratch->keys; 2. top-k.
  std::vector<uint64_t>& keys = scratch->keys;
  size_t kept = v;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < v / 8) {
    // A max-heap of the `kept` smallest words; most words fail the first compare.
    kept = static_cast<size_t>(params.top_k);
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
  } else {
    SortKeys(logits, scratch);
    if (params.top_k > 0) kept = std::min(v, static_cast<size_t>(params.top_k));
  }
  // 3. Weights relative to the max, cumulative in order (the logit values are
  //    read back from the sorted words: no gather).
  const double lmax = KeyValue(keys[0]);
  const double temp = params.temperature;
  std::vector<double>& cum = scratch->cum;
  cum.resize(kept);
  double total = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    const double l = KeyValue(keys[i]);
    // An all -inf row (or an infinite max) gives NaN; weight 1 for the top, 0 after.
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
  // 5. Inverse CDF with the counter-based uniform.
  const double t = static_cast<double>(SampleUniform(params.seed, position)) * total;
  size_t pick = kept - 1;
  for (size_t i = 0; i < kept; ++i) {
    if (cum[i] > t) {
      pick = i;
      break;
    }
  }
  return static_cast<int32_t>(keys[pick] & 0xFFFFFFFFu);
}

}  // namespace symtp::model

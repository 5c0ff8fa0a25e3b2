#include "common/histogram.h"

#include <algorithm>
#include <cmath>

namespace symtp {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

LatencyHistogram::LatencyHistogram(size_t max_samples)
    : max_samples_(max_samples == 0 ? 1 : max_samples) {}

void LatencyHistogram::Record(double v) {
  if (count_ == 0) {
    min_ = max_ = v;
  } else {
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }
  ++count_;
  sum_ += v;
  if (samples_.size() < max_samples_) {
    samples_.push_back(v);
    return;
  }
  // Reservoir sampling (xorshift64): keep each sample with probability k/n.
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  uint64_t j = rng_ % static_cast<uint64_t>(count_);
  if (j < max_samples_) samples_[j] = v;
}

void LatencyHistogram::Clear() {
  count_ = 0;
  sum_ = min_ = max_ = 0;
  samples_.clear();
}

double LatencyHistogram::Percentile(double p) const {
  if (samples_.empty()) return 0;
  std::vector<double> s = samples_;
  p = std::clamp(p, 0.0, 100.0);
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(s.size())));
  size_t idx = rank == 0 ? 0 : rank - 1;
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(idx), s.end());
  return s[idx];
}

LatencySummary LatencyHistogram::Summarize() const {
  LatencySummary out;
  out.count = count_;
  if (count_ == 0) return out;
  out.mean = sum_ / static_cast<double>(count_);
  out.min = min_;
  out.max = max_;
  std::vector<double> s = samples_;
  std::sort(s.begin(), s.end());
  auto at = [&](double p) {
    size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(s.size())));
    return s[rank == 0 ? 0 : rank - 1];
  };
  out.p50 = at(50);
  out.p90 = at(90);
  out.p99 = at(99);
  return out;
}

}  // namespace symtp

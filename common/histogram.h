// Latency statistics: count, mean, min, max and exact percentiles over the
// recorded samples (bounded: past `max_samples` it keeps a uniform reservoir).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace symtp {

// The middle value (the mean of the two middle ones for an even count); 0
// when empty.
double Median(std::vector<double> v);

struct LatencySummary {
  int64_t count = 0;
  double mean = 0, min = 0, max = 0;
  double p50 = 0, p90 = 0, p99 = 0;
};

class LatencyHistogram {
 public:
  explicit LatencyHistogram(size_t max_samples = 1 << 20);

  void Record(double value);
  void Clear();
  int64_t count() const { return count_; }

  // Percentile in [0, 100] by nearest rank over the kept samples; 0 if empty.
  double Percentile(double p) const;
  LatencySummary Summarize() const;

 private:
  size_t max_samples_;
  int64_t count_ = 0;
  double sum_ = 0, min_ = 0, max_ = 0;
  uint64_t rng_ = 0x9E3779B97F4A7C15ull;
  std::vector<double> samples_;
};

}  // namespace symtp

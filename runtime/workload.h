// The synthetic workload: request lengths drawn from the configured
// distributions, random prompt tokens, arrival times (closed loop, Poisson, or
// a steady batch). Deterministic in --seed, so every run of the same flags,
// on any backend and in either mode, asks for exactly the same tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "models/config.h"
#include "models/sampling.h"
#include "runtime/options.h"

namespace symtp::runtime {

struct WorkloadRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 1;
  model::SamplingParams sampling;
  int64_t arrival_offset_ns = 0;  // open loop only; 0 otherwise
};

// The workload as a stream: each request is drawn from the seeded generator
// when it is first looked at (Peek) and handed over by Take, so memory holds
// only the requests already admitted and not finished, whatever
// --num-requests is. The sequence is GenerateWorkload's, request for request.
class WorkloadStream {
 public:
  WorkloadStream(const JobOptions& opts, const model::ModelConfig& cfg);
  int size() const { return n_; }  // requests in the whole workload
  bool done() const { return next_ >= n_; }
  // The next request (done() must be false).
  const WorkloadRequest& Peek();
  WorkloadRequest Take();

 private:
  void Generate();
  const JobOptions opts_;  // copies: the stream may outlive its arguments
  const model::ModelConfig cfg_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
  double t_ = 0;
  int n_ = 0;
  int next_ = 0;
  int steady_plen_ = 0, steady_olen_ = 0;  // steady mode: every request's prompt and output lengths
  std::optional<WorkloadRequest> pending_;
};

// Steady mode: steps until a batch of n prompts of plen tokens is prefilled
// under a max_batched_tokens budget that the decodes of the prompts already
// done share.
int64_t SteadyPrefillSteps(int n, int plen, int max_batched_tokens);

// The whole workload at once (tests, small runs).
std::vector<WorkloadRequest> GenerateWorkload(const JobOptions& opts, const model::ModelConfig& cfg);

}  // namespace symtp::runtime

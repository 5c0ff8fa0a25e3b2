// The synthetic workload: request lengths drawn from the configured
// distributions, random prompt tokens, arrival times (closed loop, Poisson, or
// a steady batch). Deterministic in --seed, so every run of the same flags,
// on any backend and in either mode, asks for exactly the same tokens.
#pragma once

#include <cstdint>
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

std::vector<WorkloadRequest> GenerateWorkload(const JobOptions& opts, const model::ModelConfig& cfg);

}  // namespace symtp::runtime

// Per-step measurements and the run summary (summary.json, tokens.jsonl,
// Chrome trace), shared by the v1 scheduler and the v0 rank-0 loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "protocol/result.h"

#include "absl/status/status.h"
#include "runtime/options.h"

namespace symtp::runtime {

struct StepRecord {
  uint64_t step = 0;
  int32_t num_seqs = 0, num_tokens = 0, num_samples = 0;
  bool decode_only = false;
  int64_t plan_start_ns = 0;   // absolute CLOCK_MONOTONIC
  int64_t schedule_ns = 0;     // planning
  int64_t encode_ns = 0;       // diff encode (v1) / padded batch build (v0)
  int64_t publish_ns = 0;      // ring publish (v1) / broadcast (v0)
  int64_t published_at_ns = 0; // absolute
  int64_t done_at_ns = 0;      // absolute: all results in
  uint64_t wire_bytes = 0;     // diff bytes (v1) / broadcast bytes (v0)
  // Worker phases: max over ranks.
  int64_t recv_wait_ns = 0, apply_ns = 0, build_ns = 0, forward_ns = 0, sample_ns = 0,
          worker_total_ns = 0, device_forward_ns = 0;
  int64_t result_return_ns = 0;  // results in minus worker done (v1)
  int64_t gpu_idle_ns = 0;       // GPU idle before the step by events, max over ranks (0: unknown)
  int64_t worker_iter_ns = 0;    // v1: max over ranks of one worker loop period (wait + work)
  std::vector<proto::PhaseTimings> ranks;  // v1 with --trace: each rank's, in rank order
};

struct RequestRecord {
  uint64_t id = 0;
  int32_t prompt_len = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
  std::vector<int64_t> token_times_ns;
  int64_t arrival_ns = 0, first_token_ns = -1, finish_ns = -1;
};

struct RunSummaryInput {
  const JobOptions* opts = nullptr;
  std::string model_json;
  int64_t start_ns = 0, end_ns = 0;
  std::vector<StepRecord> steps;
  std::vector<RequestRecord> requests;
  std::string extra_json;  // appended object members, e.g. "\"scheduler\":{...}"
};

// Writes <out>/summary.json, <out>/tokens.jsonl, <out>/prompts.jsonl (and the
// trace if asked).
absl::Status WriteRunOutputs(const RunSummaryInput& in);

// A live one-line progress display on a terminal (quiet otherwise).
class Progress {
 public:
  explicit Progress(bool enabled, int total_requests);
  void Update(uint64_t step, int finished, uint64_t tokens);
  void Finish();

 private:
  bool enabled_;
  int total_;
  int64_t start_ns_, last_ns_ = 0;
};

}  // namespace symtp::runtime

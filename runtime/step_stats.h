// Per-step measurements and the run summary (summary.json, tokens.jsonl,
// Chrome trace), shared by the v1 scheduler and the v0 rank-0 loop.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "protocol/result.h"

#include "absl/status/status.h"
#include "runtime/options.h"

namespace symtp::runtime {

struct StepRecord {
  uint64_t step = 0;
  int32_t num_seqs = 0, num_tokens = 0, num_samples = 0;
  bool decode_only = false;
  bool graph = false;          // every rank's forward replayed a CUDA graph (v0: rank 0's)
  int64_t plan_start_ns = 0;   // absolute CLOCK_MONOTONIC
  int64_t schedule_ns = 0;     // planning
  int64_t encode_ns = 0;       // diff encode (v1) / padded batch build (v0)
  int64_t publish_ns = 0;      // ring publish (v1) / broadcast (v0)
  int64_t published_at_ns = 0; // absolute
  int64_t done_at_ns = 0;      // absolute: all results in
  uint64_t wire_bytes = 0;     // diff bytes (v1) / broadcast bytes (v0)
  int64_t context_tokens = 0;  // keys the step's sequences attend over, summed (sched::ContextTokens)
  // Worker phases: max over ranks.
  int64_t recv_wait_ns = 0, apply_ns = 0, build_ns = 0, forward_ns = 0, sample_ns = 0,
          worker_total_ns = 0, device_forward_ns = 0;
  int64_t result_return_ns = 0;  // results in minus worker done (v1)
  int64_t gpu_idle_ns = 0;       // GPU idle before the step by events, max over ranks (0: unknown)
  int64_t worker_iter_ns = 0;    // v1: max over ranks of one worker loop period (wait + work)
  std::vector<int64_t> rank_forward_ns;    // v1: each rank's forward (GPU time on cuda)
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
  // The measurement clock: start_ns is taken after every worker reported
  // ready (backend built, KV cache allocated); TTFT, E2E latency and the
  // throughputs are measured from it. startup_ns is the time before it, from
  // the process's start to every worker ready, reported separately.
  int64_t start_ns = 0, end_ns = 0, startup_ns = 0;
  std::vector<StepRecord> steps;
  std::vector<RequestRecord> requests;
  // One more summary.json member: its name and JSON value (e.g. "scheduler").
  std::pair<std::string, std::string> extra;
};

// One metric's distribution. count == 0 means the run or the backend has no
// such metric (summary.json writes null, the results block "n/a").
struct MetricStats {
  int64_t count = 0;
  double mean = 0, std = 0, min = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
  // Of `values` divided by `scale` (e.g. 1e6: ns to ms). Population std;
  // percentiles by nearest rank.
  static MetricStats Of(std::vector<double> values, double scale = 1.0);
  // {"count":..,"mean":..,"std":..,"min":..,"p50":..,"p90":..,"p95":..,"p99":..,"max":..}, or null.
  std::string ToJson() const;
};

// What a run measured, from RunSummaryInput (the numbers of the results block
// and summary.json).
struct RunMetrics {
  int requests = 0, finished = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double startup_s = 0, duration_s = 0;
  double request_throughput = 0, input_tokens_per_s = 0, output_tokens_per_s = 0,
         total_tokens_per_s = 0;
  MetricStats ttft_ms, tpot_ms, itl_ms, e2e_ms;
  int total_steps = 0, measured_steps = 0;
  // Measured decode-only steps, and those whose forward replayed a CUDA graph
  // on every rank (cuda backend).
  int decode_steps = 0, decode_graph_steps = 0;
  // Step period over the measured window: (last measured step's completion -
  // the first's) / the steps between them, an even number of steps where
  // there are three or more. 0 with fewer than two steps.
  double step_period_ms = 0;
  // The period over sliding windows of kPeriodWindow consecutive measured
  // steps (fewer when the run has fewer): pipelined v1 workers complete
  // steps in pairs, so one completion gap alternates between ~0 and two
  // steps; a window of an even number of steps does not.
  static constexpr int kPeriodWindow = 8;
  MetricStats iteration_ms;
  // The busiest rank's mean forward time over the measured steps (v1; 0:
  // unknown). The per-step maximum over ranks (forward_us) includes a rank's
  // wait for the slowest one at the all-reduces, so its mean can exceed the
  // step period; one rank's own forward passes cannot.
  double busiest_rank_forward_us = 0;
  MetricStats gpu_idle_us;  // by CUDA events; none on the cpu backend
  MetricStats schedule_us, encode_us, publish_us, recv_wait_us, apply_us, build_us, forward_us,
      device_forward_us, prefill_forward_us, decode_forward_us, sample_us, worker_total_us,
      result_return_us, wire_bytes;
  // Per measured step, the keys its sequences attend over, averaged over
  // them: what the step's attention reads (a steady decode's sequences
  // started decoding at different steps of the batch's chunked prefill, so
  // their contexts differ; a benchmark that compares against a fixed context
  // uses this one's median).
  MetricStats context;
};

RunMetrics ComputeRunMetrics(const RunSummaryInput& in);

// The results block printed on stdout at the end of every job, in the style
// of `vllm bench serve`.
std::string FormatResultsBlock(const RunSummaryInput& in, const RunMetrics& m);

// summary.json's text (docs/OUTPUTS.md has the schema).
std::string SummaryJson(const RunSummaryInput& in, const RunMetrics& m);

// requests.jsonl: one line per request with its arrival, first-token and
// finish times (seconds from the measurement start; null if not reached) and
// its token counts.
std::string RequestsJsonl(const RunSummaryInput& in);

// Prints the results block on stdout and writes <out>/summary.json,
// <out>/requests.jsonl, <out>/tokens.jsonl, <out>/prompts.jsonl (and the
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

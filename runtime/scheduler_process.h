// The v1 scheduler process: plans each step, publishes its diff to every
// worker, collects every rank's result, checks their digests and writes the
// run's outputs. It never touches a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "models/config.h"
#include "protocol/result.h"
#include "runtime/options.h"
#include "runtime/step_stats.h"
#include "runtime/workload.h"
#include "scheduler/scheduler.h"

namespace symtp::runtime {

// Returns the process exit code (runtime/layout.h's RunJobProcess).
int RunSchedulerProcess(const JobOptions& opts, const ProcArgs& proc);

// Feeds the workload to a scheduler as the flags say (a closed loop of
// --concurrency requests, Poisson arrivals, or a steady batch) and records
// each request, admitted and finished, in the run summary. Requests are drawn
// as they are admitted and forgotten once recorded, so memory follows the
// requests in flight, not the workload. Shared by the v1 scheduler process
// and v0's rank 0.
class WorkloadFeed {
 public:
  // Sets up `summary` for the run.
  WorkloadFeed(const JobOptions& opts, const model::ModelConfig& cfg, RunSummaryInput* summary);

  // Every worker is ready: the measurement clock starts (summary start_ns,
  // and startup_ns from `process_start_ns`).
  void StartClock(int64_t process_start_ns);
  // Admits every request due by `now`.
  absl::Status Admit(int64_t now, sched::Scheduler* sched);
  // Records the requests among `sampled` that finished; the scheduler then
  // forgets them.
  absl::Status RecordFinished(absl::Span<const proto::SampledToken> sampled,
                              sched::Scheduler* sched);
  // At the end: records the finished requests no sampled list named.
  void RecordRest(const sched::Scheduler& sched);
  // Sleeps until the next arrival or `until` (MonotonicNs time), whichever
  // comes first, and at most 10 ms: the caller loops.
  void WaitForArrival(int64_t until = INT64_MAX);

  bool all_admitted() const { return next_ >= n_; }
  // Requests not yet admitted arrive at their own times (an open loop).
  bool arrivals_due() const { return opts_.arrival_rate > 0 && !all_admitted(); }
  int size() const { return n_; }
  int finished() const { return finished_; }
  uint64_t tokens_out() const { return tokens_out_; }

 private:
  void Record(const sched::RequestOutput& o, RequestRecord* rr);

  const JobOptions& opts_;
  RunSummaryInput* summary_;
  WorkloadStream workload_;
  int n_, concurrency_;
  int next_ = 0, finished_ = 0;
  uint64_t tokens_out_ = 0;
  std::vector<bool> recorded_;
};

}  // namespace symtp::runtime

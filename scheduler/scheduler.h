// The v1 scheduler core: continuous batching with chunked prefill over a paged
// KV cache, preemption by recompute, and asynchronous (pipelined) planning.
// A single-threaded library object; the scheduler process owns one.
//
// ---------------------------------------------------------------------------
// Step loop (what the scheduler process does):
//
//   while (!sched.Done()) {
//     if (sched.CanPlan()) {                       // < max_inflight_steps outstanding
//       StepPlan plan;  sched.PlanNextStep(&plan);
//       if (!plan.idle) publish(EncodeDiff(plan.diff));   // step numbers 0, 1, 2, ...
//       else if (sched.num_inflight_steps() == 0) ...     // nothing to do: wait for arrivals
//     } else {
//       results = receive one StepResult per rank for the oldest in-flight step;
//       sched.OnStepResults(results);               // digest check + tokens
//     }
//   }
//   publish(EncodeDiff(sched.PlanEndOfJob().diff));
//
// ---------------------------------------------------------------------------
// Policy, per planned step (token budget max_batched_tokens):
//  1. Running requests in decode, oldest admission first: 1 token each. A
//     decode that needs a new KV block when none is free preempts the most
//     recently admitted running request not yet scheduled in this step (it may
//     be the request itself), repeatedly, until the block is available.
//  2. Running requests still in (chunked) prefill, oldest first: a chunk of
//     min(remaining prompt, prefill_chunk, budget left, what fits in the
//     free blocks) tokens. If not even one token fits, it preempts like (1).
//  3. Waiting requests, FCFS (preempted requests go back to the FRONT of the
//     queue), while running < max_running_seqs and budget remains: admitted
//     with a first chunk of min(prompt, prefill_chunk, budget) tokens if its
//     blocks are free; otherwise admission stops for this step (no preemption
//     to admit). Admission sends the request as a `new` request in the diff.
//  Preemption is by recompute: the victim's blocks are freed, it is listed in
//  `preempted` (workers drop it) and it later re-enters as a new request whose
//  prompt is its original prompt followed by every token generated so far.
//
// ---------------------------------------------------------------------------
// Asynchronous planning and the catch-up (the contract with the workers):
//  - Up to max_inflight_steps (D) steps may be planned and published before
//    the results of the oldest come back. Results must be passed in step
//    order (the per-rank result rings are FIFO).
//  - Sampled tokens are never sent to workers: every rank samples them and
//    appends them to its own copy of the request, so a step planned before the
//    previous step's results are known can still schedule the decode of the
//    token that step will sample. The scheduler assumes every running request
//    continues.
//  - Max-token stops are exact and known in advance: the step that samples a
//    request's max_new_tokens-th token is the last step that schedules it. Its
//    blocks are freed right after that step is planned and it is listed in
//    `finished` of the next planned diff. No token is wasted.
//  - EOS stops are data-dependent. When OnStepResult for step t shows request
//    r sampled its EOS token, r already appears (as a decode) in the steps
//    t+1 .. t+k already planned (k <= D-1). Then:
//      * r's output ends with the EOS token; the tokens r samples in steps
//        t+1 .. t+k are discarded when their results arrive (counted in
//        stats().discarded_after_eos);
//      * r's blocks are freed immediately and r is listed in `finished` of the
//        next diff planned (step t+k+1). Reusing those blocks in step t+k+1 is
//        safe because workers execute steps in order: steps t+1..t+k, which
//        still write r's KV into them, run before step t+k+1, whose diff first
//        removes r.
//    With D = 1 there is no catch-up (k = 0); with D = 2, at most one wasted
//    decode per EOS.
//  - Abort(id) behaves like an EOS seen now: every token not yet received is
//    discarded (also when the request had already been fully planned up to
//    max_new_tokens), its blocks are freed and it is listed in `aborted` of
//    the next diff if the workers hold it (a waiting or preempted request is
//    simply dropped).
//  - A preempted request's tokens still in flight are real tokens (its KV was
//    valid when they were computed): they are kept, and the request is not
//    re-admitted before all of them have arrived (its new prompt must contain
//    them). An EOS among them finishes it without re-admission.
//  - Outputs (tokens, timestamps) are recorded when results arrive. A request
//    is finished (RequestOutput::finished) when it can receive no more tokens:
//    stopped (EOS / max tokens / abort) and all its in-flight results in.
// ---------------------------------------------------------------------------
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "models/sampling.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "scheduler/block_manager.h"

namespace symtp::sched {

struct SchedulerConfig {
  int32_t max_running_seqs = 256;     // requests admitted (holding KV) at once
  int32_t max_batched_tokens = 8192;  // tokens scheduled per step
  int32_t num_kv_blocks = 8192;
  int32_t block_size = 16;         // must be 16 (docs/MODEL.md)
  int32_t max_seq_len = 4096;      // prompt + max_new_tokens of any request
  int32_t prefill_chunk = 512;     // max prefill tokens per request per step; 0 = budget only
  int32_t max_inflight_steps = 2;  // async depth D >= 1 (1 = synchronous)

  // InvalidArgument naming the field; also requires num_kv_blocks to hold one
  // request of max_seq_len (so a lone request always makes progress).
  absl::Status Validate() const;
};

enum class FinishReason { kNone = 0, kEos, kMaxTokens, kAborted };

struct RequestOutput {
  uint64_t id = 0;
  int32_t prompt_len = 0;
  std::vector<int32_t> tokens;          // generated tokens; ends with EOS if that stopped it
  std::vector<int64_t> token_times_ns;  // when each token's result was processed
  int64_t arrival_ns = 0;
  int64_t first_token_ns = -1;  // TTFT = first_token_ns - arrival_ns
  int64_t finish_ns = -1;
  FinishReason finish_reason = FinishReason::kNone;
  bool finished = false;  // no more tokens will be appended
  int32_t num_preemptions = 0;
};

struct ScheduledRequest {
  uint64_t id = 0;
  int32_t start = 0;       // position of the first scheduled token (tokens computed before)
  int32_t num_tokens = 0;  // tokens scheduled this step
  bool samples = false;    // its last scheduled token is sampled this step
  bool is_new = false;     // sent as a new request (first admission or resume)
};

struct StepPlan {
  // True when there was nothing to schedule and no event to deliver: no step
  // number was consumed and nothing must be published.
  bool idle = true;
  proto::StepDiff diff;
  // In scheduling order: decodes, then prefill chunks, then admissions.
  std::vector<ScheduledRequest> scheduled;
  int32_t num_tokens = 0;
  int32_t num_samples = 0;
};

// Keys the step's sequences attend over, summed: a sequence's last scheduled
// token attends over start + num_tokens positions (its own included).
int64_t ContextTokens(const StepPlan& plan);

struct SchedulerStats {
  uint64_t steps = 0;
  uint64_t scheduled_tokens = 0;
  uint64_t prefill_tokens = 0;  // includes recomputed tokens of resumed requests
  uint64_t decode_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t discarded_tokens = 0;     // sampled after an EOS or abort: eos + abort below
  uint64_t discarded_after_eos = 0;  // the async catch-up waste (0 with depth 1)
  uint64_t discarded_after_abort = 0;
  uint64_t finished_requests = 0;
};

class Scheduler {
 public:
  static absl::StatusOr<Scheduler> Create(const SchedulerConfig& config);
  Scheduler(Scheduler&&) = default;
  Scheduler& operator=(Scheduler&&) = default;

  // Queues a request. AlreadyExists for a known id (finished ones included,
  // until ReleaseOutput); InvalidArgument for an empty prompt, a negative
  // token, max_new_tokens < 1, prompt + max_new_tokens > max_seq_len, a
  // negative eos id or invalid sampling params.
  absl::Status AddRequest(uint64_t id, std::vector<int32_t> prompt, int32_t max_new_tokens,
                          const model::SamplingParams& sampling,
                          std::optional<int32_t> eos_id = std::nullopt,
                          int64_t now_ns = MonotonicNs());

  // Stops a request: every token not received yet is discarded (see the
  // catch-up above), even when all of them are already planned (max tokens).
  // NotFound for an unknown id; OK and no effect on a finished request or one
  // stopped by EOS.
  absl::Status Abort(uint64_t id, int64_t now_ns = MonotonicNs());

  bool CanPlan() const;

  // Plans the next step into `plan` (its vectors are reused). FailedPrecondition
  // when max_inflight_steps are outstanding or after PlanEndOfJob.
  absl::Status PlanNextStep(StepPlan* plan);
  absl::StatusOr<StepPlan> PlanNextStep();

  // The final step: schedules nothing, delivers pending finished/aborted ids
  // and sets kDiffFlagEndOfJob. FailedPrecondition unless every request has
  // stopped (results may still be in flight).
  absl::StatusOr<StepPlan> PlanEndOfJob();

  // Consumes the result of the oldest in-flight step (one rank's, or any
  // rank's after CheckDigests). InvalidArgument if it is not the oldest
  // in-flight step, or the sampled list is not exactly the requests planned to
  // sample in that step (unknown / missing / duplicate id: named).
  // FailedPrecondition if no step is in flight.
  absl::Status OnStepResult(const proto::StepResult& result, int64_t now_ns = MonotonicNs());

  // CheckDigests over all ranks' results of one step, then OnStepResult.
  absl::Status OnStepResults(absl::Span<const proto::StepResult> ranks,
                             int64_t now_ns = MonotonicNs());

  // OK when every result is for `step` and all digests agree. Otherwise
  // Internal: names the step, the ranks that disagree with the first result's
  // rank and, when their sampled tokens differ, the first differing request.
  static absl::Status CheckDigests(uint64_t step, absl::Span<const proto::StepResult> results);

  // True when every added request is finished and no step is in flight.
  bool Done() const { return num_unfinished_ == 0 && inflight_.empty(); }

  // nullptr for an unknown (or released) id.
  const RequestOutput* GetOutput(uint64_t id) const;
  // Forgets a finished request (its id may then be reused). FailedPrecondition
  // if it is not finished, NotFound if unknown.
  absl::Status ReleaseOutput(uint64_t id);

  const SchedulerConfig& config() const { return config_; }
  const SchedulerStats& stats() const { return stats_; }
  uint64_t next_step() const { return next_step_; }
  int32_t num_running() const { return num_running_; }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_inflight_steps() const { return static_cast<int32_t>(inflight_.size()); }
  int32_t num_free_blocks() const { return blocks_.num_free(); }
  int32_t num_unfinished() const { return num_unfinished_; }

 private:
  enum class State { kWaiting, kRunning, kStopped };
  struct Request {
    uint64_t id = 0;
    std::vector<int32_t> prompt;
    proto::SamplingParams sampling;
    int32_t max_new_tokens = 0;
    std::optional<int32_t> eos_id;
    State state = State::kWaiting;
    bool discard = false;  // stopped by EOS / abort: later tokens are discarded
    bool eos_seen = false;
    bool on_worker = false;                         // workers hold its state
    std::vector<int32_t> blocks;                    // its block table
    int32_t worker_prompt_len = 0;                  // prompt length sent at the last admission
    int32_t num_computed = 0;                       // tokens whose KV the planned steps compute
    int32_t planned_samples = 0;                    // tokens sampled by all planned steps
    absl::InlinedVector<uint64_t, 4> sample_steps;  // in-flight steps sampling it, ascending
    uint64_t admit_seq = 0;
    int32_t running_index = -1;
    std::list<Request*>::iterator waiting_it;
    uint64_t scheduled_step = ~uint64_t{0};
    uint64_t preempted_step = ~uint64_t{0};
    uint64_t result_mark = 0;
    RequestOutput out;

    int32_t tokens_known() const { return static_cast<int32_t>(prompt.size()) + planned_samples; }
    bool prefilling() const { return num_computed < worker_prompt_len; }
  };
  struct InflightStep {
    uint64_t step = 0;
    int32_t num_samples = 0;
  };

  explicit Scheduler(const SchedulerConfig& config, BlockManager blocks);

  // Frees r's blocks and takes it out of running (state -> kStopped).
  absl::Status StopRunning(Request* r);
  // Preempts the most recently admitted running request not scheduled in
  // `step` (r itself is always one) for r's `what`; true when that was r.
  absl::StatusOr<bool> PreemptFor(Request* r, uint64_t step, proto::StepDiff* diff,
                                  const char* what);
  void Schedule(Request* r, int32_t n, bool is_new, uint64_t step, StepPlan* plan);
  void MaybeComplete(Request* r, int64_t now_ns);
  void CompactRunning();

  SchedulerConfig config_;
  BlockManager blocks_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> running_;  // admission order; nullptr = removed (compacted each plan)
  std::list<Request*> waiting_;    // FCFS; preempted requests at the front
  std::deque<InflightStep> inflight_;
  std::vector<uint64_t> pending_finished_;
  std::vector<uint64_t> pending_aborted_;
  std::vector<Request*> step_requests_;  // scratch: requests scheduled in the step being planned
  uint64_t next_step_ = 0;
  uint64_t next_admit_seq_ = 0;
  uint64_t result_epoch_ = 0;
  int32_t num_running_ = 0;
  int32_t num_unfinished_ = 0;
  bool ended_ = false;
  SchedulerStats stats_;
};

}  // namespace symtp::sched

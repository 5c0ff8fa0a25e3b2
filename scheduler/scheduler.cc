#include "scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace symtp::sched {

int64_t ContextTokens(const StepPlan& plan) {
  int64_t keys = 0;
  for (const ScheduledRequest& r : plan.scheduled) keys += r.start + r.num_tokens;
  return keys;
}

absl::Status SchedulerConfig::Validate() const {
  auto bad = [](const char* field, int64_t v, const char* want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("scheduler config: %s = %d, must be %s", field, v, want));
  };
  if (max_running_seqs < 1) return bad("max_running_seqs", max_running_seqs, ">= 1");
  if (max_running_seqs > static_cast<int64_t>(proto::kMaxEntriesPerList)) {
    return bad("max_running_seqs", max_running_seqs, "<= 2^20");
  }
  if (max_batched_tokens < 1) return bad("max_batched_tokens", max_batched_tokens, ">= 1");
  if (block_size != proto::kBlockSize) return bad("block_size", block_size, "16");
  if (max_seq_len < 2) return bad("max_seq_len", max_seq_len, ">= 2");
  if (prefill_chunk < 0) return bad("prefill_chunk", prefill_chunk, ">= 0");
  if (max_inflight_steps < 1 || max_inflight_steps > 64) {
    return bad("max_inflight_steps", max_inflight_steps, "in [1, 64]");
  }
  if (num_kv_blocks < 1 || num_kv_blocks > (1 << 30)) {
    return bad("num_kv_blocks", num_kv_blocks, "in [1, 2^30]");
  }
  const int32_t one_seq = BlocksForTokens(max_seq_len, block_size);
  if (num_kv_blocks < one_seq) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "scheduler config: num_kv_blocks = %d cannot hold one sequence of max_seq_len %d "
        "(%d blocks)",
        num_kv_blocks, max_seq_len, one_seq));
  }
  return absl::OkStatus();
}

absl::StatusOr<Scheduler> Scheduler::Create(const SchedulerConfig& config) {
  SYMTP_RETURN_IF_ERROR(config.Validate());
  SYMTP_ASSIGN_OR_RETURN(BlockManager blocks, BlockManager::Create(config.num_kv_blocks));
  return Scheduler(config, std::move(blocks));
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager blocks)
    : config_(config), blocks_(std::move(blocks)) {}

absl::Status Scheduler::AddRequest(uint64_t id, std::vector<int32_t> prompt, int32_t max_new_tokens,
                                   const model::SamplingParams& sampling,
                                   std::optional<int32_t> eos_id, int64_t now_ns) {
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrFormat("request %d already exists", id));
  }
  if (ended_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("request %d added after the end of the job", id));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: empty prompt", id));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("request %d: prompt[%d] = %d is negative", id, i, prompt[i]));
    }
  }
  if (max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request %d: max_new_tokens %d < 1", id, max_new_tokens));
  }
  if (static_cast<int64_t>(prompt.size()) + max_new_tokens > config_.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request %d: prompt %d + max_new_tokens %d exceeds max_seq_len %d", id,
                        prompt.size(), max_new_tokens, config_.max_seq_len));
  }
  if (eos_id.has_value() && *eos_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request %d: eos id %d is negative", id, *eos_id));
  }
  absl::Status s = model::ValidateSamplingParams(sampling);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("request ", id, ": ", s.message()));

  auto r = std::make_unique<Request>();
  r->id = id;
  r->prompt = std::move(prompt);
  r->sampling = {sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed};
  r->max_new_tokens = max_new_tokens;
  r->eos_id = eos_id;
  r->out.id = id;
  r->out.prompt_len = static_cast<int32_t>(r->prompt.size());
  r->out.arrival_ns = now_ns;
  r->state = State::kWaiting;
  waiting_.push_back(r.get());
  r->waiting_it = std::prev(waiting_.end());
  requests_.emplace(id, std::move(r));
  ++num_unfinished_;
  return absl::OkStatus();
}

absl::Status Scheduler::StopRunning(Request* r) {
  absl::Status s = blocks_.Free(r->blocks);
  if (!s.ok()) return absl::InternalError(absl::StrCat("request ", r->id, ": ", s.message()));
  r->blocks.clear();
  running_[r->running_index] = nullptr;
  r->running_index = -1;
  --num_running_;
  r->state = State::kStopped;
  return absl::OkStatus();
}

void Scheduler::MaybeComplete(Request* r, int64_t now_ns) {
  if (r->state == State::kStopped && r->sample_steps.empty() && !r->out.finished) {
    r->out.finished = true;
    r->out.finish_ns = now_ns;
    --num_unfinished_;
    ++stats_.finished_requests;
  }
}

absl::Status Scheduler::Abort(uint64_t id, int64_t now_ns) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrFormat("abort of unknown request %d", id));
  }
  Request* r = it->second.get();
  if (r->out.finished || r->discard) return absl::OkStatus();
  if (r->state == State::kStopped) {
    // Stopped by max tokens with results still in flight: drop those tokens.
  } else if (r->state == State::kRunning) {
    SYMTP_RETURN_IF_ERROR(StopRunning(r));
    pending_aborted_.push_back(id);
    r->on_worker = false;
  } else {  // waiting: the workers do not hold it
    waiting_.erase(r->waiting_it);
    r->state = State::kStopped;
  }
  r->discard = true;
  r->out.finish_reason = FinishReason::kAborted;
  MaybeComplete(r, now_ns);
  return absl::OkStatus();
}

bool Scheduler::CanPlan() const {
  return !ended_ && static_cast<int32_t>(inflight_.size()) < config_.max_inflight_steps;
}

void Scheduler::CompactRunning() {
  size_t w = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Request* r = running_[i];
    if (r == nullptr) continue;
    r->running_index = static_cast<int32_t>(w);
    running_[w++] = r;
  }
  running_.resize(w);
}

absl::StatusOr<bool> Scheduler::PreemptFor(Request* r, uint64_t step, proto::StepDiff* diff,
                                           const char* what) {
  Request* v = nullptr;
  for (size_t i = running_.size(); v == nullptr && i-- > 0;) {
    if (running_[i] != nullptr && running_[i]->scheduled_step != step) v = running_[i];
  }
  if (v == nullptr) return absl::InternalError(absl::StrCat("no preemption victim for a ", what));
  SYMTP_RETURN_IF_ERROR(StopRunning(v));
  v->state = State::kWaiting;
  v->on_worker = false;
  v->num_computed = 0;
  v->worker_prompt_len = 0;
  v->preempted_step = step;
  waiting_.push_front(v);
  v->waiting_it = waiting_.begin();
  diff->preempted.push_back(v->id);
  ++v->out.num_preemptions;
  ++stats_.preemptions;
  return v == r;
}

void Scheduler::Schedule(Request* r, int32_t n, bool is_new, uint64_t step, StepPlan* plan) {
  const bool samples = r->num_computed + n == r->tokens_known();
  ScheduledRequest sr;
  sr.id = r->id;
  sr.start = r->num_computed;
  sr.num_tokens = n;
  sr.samples = samples;
  sr.is_new = is_new;
  plan->scheduled.push_back(sr);
  plan->num_tokens += n;
  if (r->prefilling()) {
    stats_.prefill_tokens += static_cast<uint64_t>(n);
  } else {
    stats_.decode_tokens += static_cast<uint64_t>(n);
  }
  r->scheduled_step = step;
  r->num_computed += n;
  if (samples) {
    ++r->planned_samples;
    r->sample_steps.push_back(step);
    ++plan->num_samples;
  }
  step_requests_.push_back(r);
}

absl::StatusOr<StepPlan> Scheduler::PlanNextStep() {
  StepPlan plan;
  SYMTP_RETURN_IF_ERROR(PlanNextStep(&plan));
  return plan;
}

absl::Status Scheduler::PlanNextStep(StepPlan* plan) {
  if (ended_) return absl::FailedPreconditionError("PlanNextStep after PlanEndOfJob");
  if (static_cast<int32_t>(inflight_.size()) >= config_.max_inflight_steps) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot plan step %d: %d steps in flight (max_inflight_steps %d); feed results first",
        next_step_, inflight_.size(), config_.max_inflight_steps));
  }
  const uint64_t step = next_step_;
  const int32_t bs = config_.block_size;
  const int32_t chunk = config_.prefill_chunk > 0 ? config_.prefill_chunk : INT32_MAX;
  proto::StepDiff& diff = plan->diff;
  diff.Clear();
  diff.step = step;
  plan->scheduled.clear();
  plan->num_tokens = 0;
  plan->num_samples = 0;
  plan->idle = false;
  step_requests_.clear();
  CompactRunning();
  int32_t budget = config_.max_batched_tokens;
  absl::Status s;

  // 1. Decodes, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request* r = running_[i];
    if (r == nullptr || r->prefilling()) continue;
    const int32_t need =
        BlocksForTokens(r->num_computed + 1, bs) - static_cast<int32_t>(r->blocks.size());
    bool self_preempted = false;
    while (!self_preempted && need > blocks_.num_free()) {
      SYMTP_ASSIGN_OR_RETURN(self_preempted, PreemptFor(r, step, &diff, "decode"));
    }
    if (self_preempted) continue;
    const size_t first_new = r->blocks.size();
    if (!(s = blocks_.Allocate(need, &r->blocks)).ok()) return absl::InternalError(s.message());
    diff.AddContinuing(r->id, 1, absl::MakeConstSpan(r->blocks).subspan(first_new));
    Schedule(r, 1, false, step, plan);
    --budget;
  }

  // 2. Chunked prefill of running requests, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request* r = running_[i];
    if (r == nullptr || !r->prefilling() || r->scheduled_step == step) continue;
    int32_t n = std::min({r->tokens_known() - r->num_computed, budget, chunk});
    bool self_preempted = false;
    int64_t fit = 0;  // tokens r's blocks and the free ones hold
    while (!self_preempted &&
           (fit = (static_cast<int64_t>(r->blocks.size()) + blocks_.num_free()) * bs -
                  r->num_computed) < 1) {
      SYMTP_ASSIGN_OR_RETURN(self_preempted, PreemptFor(r, step, &diff, "prefill"));
    }
    if (self_preempted) continue;
    n = static_cast<int32_t>(std::min<int64_t>(n, fit));
    const int32_t need =
        BlocksForTokens(r->num_computed + n, bs) - static_cast<int32_t>(r->blocks.size());
    const size_t first_new = r->blocks.size();
    if (need > 0 && !(s = blocks_.Allocate(need, &r->blocks)).ok()) {
      return absl::InternalError(s.message());
    }
    diff.AddContinuing(r->id, static_cast<uint32_t>(n),
                       absl::MakeConstSpan(r->blocks).subspan(first_new));
    Schedule(r, n, false, step, plan);
    budget -= n;
  }

  // 3. Admissions, FCFS (resumed requests first).
  for (auto it = waiting_.begin();
       it != waiting_.end() && budget > 0 && num_running_ < config_.max_running_seqs;) {
    Request* r = *it;
    if (!r->sample_steps.empty() || r->preempted_step == step) {
      ++it;  // its in-flight tokens are not all back yet / preempted in this very step
      continue;
    }
    const int32_t prompt_len = r->tokens_known();
    const int32_t n = std::min({prompt_len, budget, chunk});
    const int32_t need = BlocksForTokens(n, bs);
    if (need > blocks_.num_free()) break;
    it = waiting_.erase(it);
    r->state = State::kRunning;
    r->on_worker = true;
    r->admit_seq = next_admit_seq_++;
    r->running_index = static_cast<int32_t>(running_.size());
    running_.push_back(r);
    ++num_running_;
    r->num_computed = 0;
    r->worker_prompt_len = prompt_len;
    if (!(s = blocks_.Allocate(need, &r->blocks)).ok()) return absl::InternalError(s.message());
    proto::NewRequest& nr = diff.new_requests.emplace_back();
    nr.id = r->id;
    nr.prompt.reserve(prompt_len);
    nr.prompt.assign(r->prompt.begin(), r->prompt.end());
    // Resumed after preemption: the tokens generated so far join the prompt.
    nr.prompt.insert(nr.prompt.end(), r->out.tokens.begin(), r->out.tokens.end());
    nr.sampling = r->sampling;
    nr.max_new_tokens = static_cast<uint32_t>(r->max_new_tokens - r->planned_samples);
    nr.eos_id = r->eos_id;
    nr.num_scheduled = static_cast<uint32_t>(n);
    nr.block_ids = r->blocks;
    Schedule(r, n, true, step, plan);
    budget -= n;
  }

  diff.finished.swap(pending_finished_);
  diff.aborted.swap(pending_aborted_);
  pending_finished_.clear();
  pending_aborted_.clear();

  if (plan->scheduled.empty() && diff.finished.empty() && diff.aborted.empty() &&
      diff.preempted.empty()) {
    plan->idle = true;  // nothing to publish; the step number is not consumed
    return absl::OkStatus();
  }

  // Requests whose last allowed token is sampled in this step stop now: their
  // blocks are free for the next step and the next diff lists them finished.
  for (Request* r : step_requests_) {
    if (r->planned_samples >= r->max_new_tokens && r->state == State::kRunning) {
      if (!(s = StopRunning(r)).ok()) return s;
      r->on_worker = false;
      r->out.finish_reason = FinishReason::kMaxTokens;
      pending_finished_.push_back(r->id);
    }
  }

  inflight_.push_back({step, plan->num_samples});
  ++next_step_;
  ++stats_.steps;
  stats_.scheduled_tokens += static_cast<uint64_t>(plan->num_tokens);
  return absl::OkStatus();
}

absl::StatusOr<StepPlan> Scheduler::PlanEndOfJob() {
  if (ended_) return absl::FailedPreconditionError("PlanEndOfJob called twice");
  if (num_running_ > 0 || !waiting_.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "PlanEndOfJob with %d running and %d waiting requests", num_running_, waiting_.size()));
  }
  if (static_cast<int32_t>(inflight_.size()) >= config_.max_inflight_steps) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot plan the final step %d: %d steps in flight", next_step_, inflight_.size()));
  }
  StepPlan plan;
  plan.idle = false;
  plan.diff.step = next_step_;
  plan.diff.flags = proto::kDiffFlagEndOfJob;
  plan.diff.finished.swap(pending_finished_);
  plan.diff.aborted.swap(pending_aborted_);
  inflight_.push_back({next_step_, 0});
  ++next_step_;
  ++stats_.steps;
  ended_ = true;
  return plan;
}

absl::Status Scheduler::OnStepResult(const proto::StepResult& result, int64_t now_ns) {
  if (inflight_.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "result for step %d (rank %d) but no step is in flight", result.step, result.rank));
  }
  const InflightStep& front = inflight_.front();
  if (result.step != front.step) {
    return absl::InvalidArgumentError(
        absl::StrFormat("result for step %d (rank %d), expected the oldest in-flight step %d",
                        result.step, result.rank, front.step));
  }
  const uint64_t step = front.step;
  if (static_cast<int64_t>(result.sampled.size()) != front.num_samples) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d (rank %d): %d sampled tokens, the plan samples %d", step,
                        result.rank, result.sampled.size(), front.num_samples));
  }
  // Validate everything before changing any state. Requests seen in this
  // call are marked with a per-call epoch to catch duplicates.
  const uint64_t epoch = ++result_epoch_;
  for (size_t i = 0; i < result.sampled.size(); ++i) {
    const proto::SampledToken& t = result.sampled[i];
    auto it = requests_.find(t.request_id);
    if (it == requests_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d (rank %d): sampled[%d] is for unknown request %d", step,
                          result.rank, i, t.request_id));
    }
    Request* r = it->second.get();
    if (r->sample_steps.empty() || r->sample_steps.front() != step) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "step %d (rank %d): sampled[%d] is for request %d, which does not sample in this "
          "step",
          step, result.rank, i, t.request_id));
    }
    if (r->result_mark == epoch) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "step %d (rank %d): request %d sampled twice", step, result.rank, t.request_id));
    }
    if (t.token < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d (rank %d): request %d sampled negative token %d", step,
                          result.rank, t.request_id, t.token));
    }
    r->result_mark = epoch;
  }
  // Apply.
  for (const proto::SampledToken& t : result.sampled) {
    Request* r = requests_.find(t.request_id)->second.get();
    r->sample_steps.erase(r->sample_steps.begin());
    if (r->discard) {
      ++stats_.discarded_tokens;
      ++(r->eos_seen ? stats_.discarded_after_eos : stats_.discarded_after_abort);
    } else {
      if (r->out.tokens.empty()) r->out.first_token_ns = now_ns;
      r->out.tokens.push_back(t.token);
      r->out.token_times_ns.push_back(now_ns);
      if (r->eos_id.has_value() && t.token == *r->eos_id) {
        r->discard = true;
        r->eos_seen = true;
        r->out.finish_reason = FinishReason::kEos;
        if (r->state == State::kRunning) {
          SYMTP_RETURN_IF_ERROR(StopRunning(r));
          r->on_worker = false;
          pending_finished_.push_back(r->id);
        } else if (r->state == State::kWaiting) {  // preempted; workers dropped it already
          waiting_.erase(r->waiting_it);
          r->state = State::kStopped;
        }
      }
    }
    MaybeComplete(r, now_ns);
  }
  inflight_.pop_front();
  return absl::OkStatus();
}

absl::Status Scheduler::OnStepResults(absl::Span<const proto::StepResult> ranks, int64_t now_ns) {
  if (ranks.empty()) return absl::InvalidArgumentError("OnStepResults with no results");
  SYMTP_RETURN_IF_ERROR(CheckDigests(ranks[0].step, ranks));
  return OnStepResult(ranks[0], now_ns);
}

absl::Status Scheduler::CheckDigests(uint64_t step, absl::Span<const proto::StepResult> results) {
  if (results.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("step %d: no results to check", step));
  }
  for (const proto::StepResult& r : results) {
    if (r.step != step) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "digest check of step %d: rank %d returned a result for step %d", step, r.rank, r.step));
    }
  }
  const proto::StepResult& ref = results[0];
  // The sampled tokens are compared too: a pipelined worker's digest of step
  // t covers the tokens of the steps before t only (its tokens are still on
  // the device when the digest is taken).
  std::vector<uint32_t> bad;
  bool digests_agree = true;
  for (const proto::StepResult& r : results) {
    if (r.digest != ref.digest) digests_agree = false;
    if (r.digest != ref.digest || r.sampled != ref.sampled) bad.push_back(r.rank);
  }
  if (bad.empty()) return absl::OkStatus();
  std::string detail = "sampled tokens identical; the cached state diverged";
  for (const proto::StepResult& r : results) {
    if (r.digest == ref.digest && r.sampled == ref.sampled) continue;
    const size_t n = std::min(r.sampled.size(), ref.sampled.size());
    bool found = false;
    for (size_t i = 0; i < n; ++i) {
      if (r.sampled[i] == ref.sampled[i]) continue;
      if (r.sampled[i].request_id == ref.sampled[i].request_id) {
        detail = absl::StrFormat(
            "first difference: request %d sampled %d on rank %d, %d on rank %d",
            ref.sampled[i].request_id, ref.sampled[i].token, ref.rank, r.sampled[i].token, r.rank);
      } else {
        detail = absl::StrFormat(
            "first difference at sample %d: request %d on rank %d, request %d on rank %d", i,
            ref.sampled[i].request_id, ref.rank, r.sampled[i].request_id, r.rank);
      }
      found = true;
      break;
    }
    if (!found && r.sampled.size() != ref.sampled.size()) {
      detail = absl::StrFormat("rank %d sampled %d tokens, rank %d sampled %d", ref.rank,
                               ref.sampled.size(), r.rank, r.sampled.size());
      found = true;
    }
    if (found) break;
  }
  if (digests_agree) {
    return absl::InternalError(absl::StrFormat("step %d: sampled tokens differ: ranks [%s] disagree with rank %d (%s)",
                                               step, absl::StrJoin(bad, ", "), ref.rank, detail));
  }
  return absl::InternalError(absl::StrFormat(
      "step %d: state digest mismatch: rank %d has 0x%016x, ranks [%s] disagree (%s)", step,
      ref.rank, ref.digest, absl::StrJoin(bad, ", "), detail));
}

const RequestOutput* Scheduler::GetOutput(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second->out;
}

absl::Status Scheduler::ReleaseOutput(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrFormat("release of unknown request %d", id));
  }
  if (!it->second->out.finished) {
    return absl::FailedPreconditionError(
        absl::StrFormat("release of request %d, which is not finished", id));
  }
  requests_.erase(it);
  return absl::OkStatus();
}

}  // namespace symtp::sched

#include "runtime/scheduler_process.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "ipc/ring.h"
#include "protocol/diff.h"
#include "runtime/job_sizing.h"
#include "runtime/layout.h"
#include "runtime/publish_pacer.h"

namespace symtp::runtime {

WorkloadFeed::WorkloadFeed(const JobOptions& opts, const model::ModelConfig& cfg,
                           RunSummaryInput* summary)
    : opts_(opts), summary_(summary), workload_(opts, cfg), n_(workload_.size()) {
  concurrency_ = opts.arrival_rate > 0 || opts.steady_batch > 0
                     ? n_ : (opts.concurrency > 0 ? opts.concurrency : opts.max_batch);
  summary->opts = &opts;
  summary->model_json = model::ToJson(cfg);
  summary->requests.resize(n_);
  recorded_.assign(n_, false);
}

void WorkloadFeed::StartClock(int64_t process_start_ns) {
  summary_->start_ns = MonotonicNs();
  summary_->startup_ns = summary_->start_ns - process_start_ns;
}

absl::Status WorkloadFeed::Admit(int64_t now, sched::Scheduler* sched) {
  while (next_ < n_ && next_ - finished_ < concurrency_ &&
         (opts_.arrival_rate <= 0 ||
          summary_->start_ns + workload_.Peek().arrival_offset_ns <= now)) {
    WorkloadRequest w = workload_.Take();
    RequestRecord& rr = summary_->requests[next_];
    rr.id = w.id;
    rr.prompt_len = static_cast<int32_t>(w.prompt.size());
    if (!opts_.out_dir.empty()) rr.prompt = w.prompt;
    // An open-loop request arrives at its Poisson time, not when this loop
    // next looks (after a step's results, or v0's whole step): the wait
    // between the two is queueing the request sees, and TTFT / E2E count it.
    rr.arrival_ns = opts_.arrival_rate > 0 ? summary_->start_ns + w.arrival_offset_ns : now;
    SYMTP_RETURN_IF_ERROR(sched->AddRequest(
        w.id, std::move(w.prompt), w.max_new_tokens, w.sampling,
        opts_.eos_id >= 0 ? std::optional<int32_t>(opts_.eos_id) : std::nullopt, rr.arrival_ns));
    ++next_;
  }
  return absl::OkStatus();
}

void WorkloadFeed::Record(const sched::RequestOutput& o, RequestRecord* rr) {
  rr->tokens = o.tokens;
  rr->token_times_ns = o.token_times_ns;
  rr->first_token_ns = o.first_token_ns;
  rr->finish_ns = o.finish_ns;
}

absl::Status WorkloadFeed::RecordFinished(absl::Span<const proto::SampledToken> sampled,
                                          sched::Scheduler* sched) {
  for (const proto::SampledToken& t : sampled) {
    const sched::RequestOutput* o = sched->GetOutput(t.request_id);
    if (o == nullptr || !o->finished || recorded_[t.request_id]) continue;
    recorded_[t.request_id] = true;
    ++finished_;
    tokens_out_ += o->tokens.size();
    Record(*o, &summary_->requests[t.request_id]);
    SYMTP_RETURN_IF_ERROR(sched->ReleaseOutput(t.request_id));
  }
  return absl::OkStatus();
}

void WorkloadFeed::RecordRest(const sched::Scheduler& sched) {
  for (int i = 0; i < n_; ++i) {
    if (recorded_[i]) continue;
    if (const sched::RequestOutput* o = sched.GetOutput(i)) Record(*o, &summary_->requests[i]);
  }
}

void WorkloadFeed::WaitForArrival(int64_t until) {
  const int64_t next =
      all_admitted() ? INT64_MAX : summary_->start_ns + workload_.Peek().arrival_offset_ns;
  if (next == INT64_MAX && until == INT64_MAX) return;
  const int64_t wait = std::min(next, until) - MonotonicNs();
  if (wait > 0) usleep(static_cast<useconds_t>(std::min<int64_t>(wait / 1000, 10'000)));
}

namespace {

// One scheduler process. Run() is the loop: admit what arrived, plan and
// publish the next step while the pipeline has room (at low load no sooner
// than the pacer says: runtime/publish_pacer.h), otherwise collect the
// oldest step's results, otherwise wait for the next arrival.
class SchedulerProcess {
 public:
  SchedulerProcess(const JobOptions& opts, JobHandle* job)
      : opts_(opts), job_(job), pacer_(opts.late_publish, int64_t{opts.publish_lead_us} * 1000) {}

  absl::Status Run(int64_t process_start_ns) {
    SYMTP_RETURN_IF_ERROR(Start(process_start_ns));
    while (!feed_->all_admitted() || !sched_->Done()) {
      SYMTP_RETURN_IF_ERROR(CheckAbort(job_->control));
      SYMTP_RETURN_IF_ERROR(feed_->Admit(MonotonicNs(), &*sched_));
      // Late publishing: the next step waits, for arrivals to join it, until
      // shortly before the step ahead should end, or until that step's
      // results show it ended sooner. Waits in slices of at most 50 us,
      // admitting arrivals between them.
      if (const int64_t at = PlanAt(); MonotonicNs() < at && !OldestResultsReady()) {
        pacing_ = true;
        feed_->WaitForArrival(std::min(at, MonotonicNs() + 50'000));
        continue;
      }
      SYMTP_ASSIGN_OR_RETURN(bool published, PlanAndPublish());
      if (published) continue;
      pacing_ = false;  // the wait ended with nothing to plan: no step was paced
      if (!inflight_.empty()) {
        SYMTP_RETURN_IF_ERROR(CollectOldest());
      } else if (feed_->all_admitted()) {
        return absl::InternalError("scheduler has unfinished requests but nothing to plan or wait for");
      } else {
        feed_->WaitForArrival();
      }
    }
    return Finish();
  }

 private:
  Deadline StepDeadline() const { return Deadline::AfterNs(opts_.step_timeout_ms * 1'000'000); }

  // Attaches to the rings, waits for every worker (their KV caches size the
  // scheduler's) and starts the clock.
  absl::Status Start(int64_t process_start_ns) {
    SYMTP_ASSIGN_OR_RETURN(cfg_, ResolveModel(opts_));
    SYMTP_ASSIGN_OR_RETURN(diffs_, ipc::RingProducer::Create(*job_->diff_ring, "scheduler"));
    for (int r = 0; r < opts_.tp; ++r) {
      SYMTP_ASSIGN_OR_RETURN(ipc::RingConsumer c,
                             ipc::RingConsumer::Attach(job_->result_rings[r], 0, "scheduler"));
      results_.push_back(std::move(c));
    }
    sched::SchedulerConfig sc = JobSchedulerConfig(opts_, cfg_);
    SYMTP_ASSIGN_OR_RETURN(sc.num_kv_blocks, AgreedKvBlocks(opts_, cfg_, job_, StepDeadline()));
    if (KvBlocksFromWorkers(opts_)) {
      SYMTP_LOG(INFO, "sched") << "KV cache: " << sc.num_kv_blocks
                               << " blocks (the smallest the workers allocated)";
    }
    SYMTP_ASSIGN_OR_RETURN(sched_, sched::Scheduler::Create(sc));
    feed_.emplace(opts_, cfg_, &summary_);
    progress_.emplace(opts_.progress, feed_->size());
    rank_results_.resize(opts_.tp);
    job_->SetPhase(ProcPhase::kRunning);
    feed_->StartClock(process_start_ns);  // AgreedKvBlocks waited for every worker
    return absl::OkStatus();
  }

  // When the pacer would plan the next step (0: now).
  int64_t PlanAt() const {
    if (!sched_->CanPlan()) return 0;
    PublishPacer::Ahead ahead;
    ahead.steps = static_cast<int>(inflight_.size());
    if (!inflight_.empty()) {
      const StepRecord& newest = summary_.steps[inflight_.back()];
      ahead.decode_only = newest.decode_only;
      ahead.num_seqs = newest.num_seqs;
    }
    return pacer_.PlanAt(ahead, feed_->arrivals_due() && sched_->num_waiting() == 0);
  }

  // Whether every rank's result of the oldest step in flight is in.
  bool OldestResultsReady() {
    for (ipc::RingConsumer& c : results_) {
      if (!c.Ready()) return false;
    }
    return true;
  }

  // Plans the next step and publishes its diff, when the scheduler has room
  // for another step in flight and anything to run.
  absl::StatusOr<bool> PlanAndPublish() {
    if (!sched_->CanPlan()) return false;
    const int64_t t0 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(sched_->PlanNextStep(&plan_), "planning");
    if (plan_.idle) return false;
    const int64_t t1 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR(proto::EncodeDiff(plan_.diff, &wire_));
    const int64_t t2 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(diffs_->Publish(wire_, StepDeadline()),
                              absl::StrCat("publishing step ", plan_.diff.step));
    const int64_t t3 = MonotonicNs();
    StepRecord rec;
    rec.plan_start_ns = t0;
    rec.step = plan_.diff.step;
    rec.num_seqs = static_cast<int32_t>(plan_.scheduled.size());
    rec.num_tokens = plan_.num_tokens;
    rec.num_samples = plan_.num_samples;
    rec.context_tokens = sched::ContextTokens(plan_);
    rec.decode_only = plan_.num_tokens == static_cast<int32_t>(plan_.scheduled.size());
    rec.schedule_ns = t1 - t0;
    rec.encode_ns = t2 - t1;
    rec.publish_ns = t3 - t2;
    rec.published_at_ns = t3;
    rec.wire_bytes = wire_.size();
    summary_.steps.push_back(rec);
    inflight_.push_back(summary_.steps.size() - 1);
    paced_steps_ += pacing_;
    pacing_ = false;
    return true;
  }

  // Reads every rank's result of the oldest step in flight, hands them to
  // the scheduler (which checks the digests) and records the step.
  absl::Status CollectOldest() {
    StepRecord& rec = summary_.steps[inflight_.front()];
    for (int r = 0; r < opts_.tp; ++r) {
      SYMTP_RETURN_IF_ERROR_CTX(results_[r].Read(&rbuf_, StepDeadline()).status(),
                                absl::StrCat("waiting for worker rank ", r, "'s result of step ", rec.step));
      SYMTP_RETURN_IF_ERROR_CTX(proto::DecodeResultInto(rbuf_, &rank_results_[r]),
                                absl::StrCat("result of worker rank ", r));
    }
    const int64_t done = MonotonicNs();
    RecordRankTimings(done, &rec);
    SYMTP_RETURN_IF_ERROR(sched_->OnStepResults(rank_results_, done));
    pacer_.OnCollected(done, rec.forward_ns, rec.decode_only, rec.num_seqs);
    inflight_.pop_front();
    SYMTP_RETURN_IF_ERROR(feed_->RecordFinished(rank_results_[0].sampled, &*sched_));
    progress_->Update(rec.step, feed_->finished(), feed_->tokens_out());
    return absl::OkStatus();
  }

  // The step's worker phases: the maximum over ranks.
  void RecordRankTimings(int64_t done, StepRecord* rec) {
    rec->done_at_ns = done;
    rec->graph = !rank_results_.empty();
    int64_t result_at = 0;
    for (const proto::StepResult& res : rank_results_) {
      const proto::PhaseTimings& pt = res.timings;
      rec->recv_wait_ns = std::max<int64_t>(rec->recv_wait_ns, pt.recv_wait_ns);
      rec->apply_ns = std::max<int64_t>(rec->apply_ns, pt.apply_ns);
      rec->build_ns = std::max<int64_t>(rec->build_ns, pt.build_ns);
      rec->forward_ns = std::max<int64_t>(rec->forward_ns, pt.forward_ns);
      rec->rank_forward_ns.push_back(pt.forward_ns);
      rec->sample_ns = std::max<int64_t>(rec->sample_ns, pt.sample_ns);
      rec->gpu_idle_ns = std::max<int64_t>(rec->gpu_idle_ns, pt.gpu_idle_ns);
      rec->graph = rec->graph && res.graph;
      if (!opts_.trace_file.empty()) rec->ranks.push_back(pt);
      result_at = std::max<int64_t>(result_at, static_cast<int64_t>(pt.result_at_ns));
      rec->worker_total_ns = std::max<int64_t>(rec->worker_total_ns, pt.total_ns);
      rec->worker_iter_ns = std::max<int64_t>(rec->worker_iter_ns, pt.recv_wait_ns + pt.total_ns);
    }
    // Results in minus the last rank's publish (one clock for all processes).
    rec->result_return_ns =
        result_at > 0 ? std::max<int64_t>(0, done - result_at)
                      : std::max<int64_t>(0, done - (rec->published_at_ns + rec->worker_total_ns));
    // The workers report GPU time by events as their forward time on CUDA.
    if (opts_.resolved_backend == BackendKind::kCuda) rec->device_forward_ns = rec->forward_ns;
  }

  // Ends the job for the workers and writes the outputs.
  absl::Status Finish() {
    feed_->RecordRest(*sched_);
    SYMTP_ASSIGN_OR_RETURN(sched::StepPlan end, sched_->PlanEndOfJob());
    SYMTP_RETURN_IF_ERROR(proto::EncodeDiff(end.diff, &wire_));
    SYMTP_RETURN_IF_ERROR_CTX(diffs_->Publish(wire_, StepDeadline()), "publishing end of job");
    summary_.end_ns = MonotonicNs();
    progress_->Finish();
    const sched::SchedulerStats& st = sched_->stats();
    summary_.extra = {"scheduler", JsonWriter().Open('{').Field("steps", st.steps)
                                       .Field("prefill_tokens", st.prefill_tokens)
                                       .Field("decode_tokens", st.decode_tokens)
                                       .Field("preemptions", st.preemptions)
                                       .Field("discarded_after_eos", st.discarded_after_eos)
                                       .Field("max_inflight", opts_.max_inflight)
                                       .Field("paced_steps", paced_steps_).Close().Take()};
    SYMTP_LOG(INFO, "sched") << "done: " << feed_->size() << " requests, " << summary_.steps.size()
                             << " steps, " << feed_->tokens_out() << " tokens in "
                             << (summary_.end_ns - summary_.start_ns) / 1e9
                             << " s (start-up before it " << summary_.startup_ns / 1e9 << " s)";
    SYMTP_RETURN_IF_ERROR_CTX(WriteRunOutputs(summary_), "writing outputs");
    return absl::OkStatus();
  }

  const JobOptions& opts_;
  JobHandle* job_;
  model::ModelConfig cfg_;
  std::optional<ipc::RingProducer> diffs_;
  std::vector<ipc::RingConsumer> results_;
  std::optional<sched::Scheduler> sched_;
  RunSummaryInput summary_;
  std::optional<WorkloadFeed> feed_;
  std::optional<Progress> progress_;
  std::deque<size_t> inflight_;  // indices into summary_.steps
  PublishPacer pacer_;
  bool pacing_ = false;     // the step being planned waited for the pacer
  int64_t paced_steps_ = 0;  // steps that did
  sched::StepPlan plan_;
  std::vector<uint8_t> wire_, rbuf_;
  std::vector<proto::StepResult> rank_results_;
};

}  // namespace

int RunSchedulerProcess(const JobOptions& opts, const ProcArgs& proc) {
  const int64_t process_start_ns = MonotonicNs();
  return RunJobProcess(proc, opts.tp, ProcIndex(ProcRole::kScheduler, 0), [&](JobHandle* job) {
    return SchedulerProcess(opts, job).Run(process_start_ns);
  });
}

}  // namespace symtp::runtime

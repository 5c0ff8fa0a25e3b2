#include "runtime/processes.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "ipc/ring.h"
#include "models/config.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "runtime/backend.h"
#include "runtime/job.h"
#include "runtime/layout.h"
#include "runtime/step_stats.h"
#include "runtime/v0.h"
#include "runtime/workload.h"
#include "scheduler/scheduler.h"
#include "worker/state/worker_state.h"

namespace symtp::runtime {
namespace {

constexpr int64_t kHeartbeatPeriodNs = 50'000'000;

absl::StatusOr<model::ModelConfig> ResolveModel(const JobOptions& opts) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::PresetConfig(opts.model));
  SYMTP_RETURN_IF_ERROR(model::ApplyOverrides(opts.model_overrides, &cfg));
  SYMTP_RETURN_IF_ERROR(model::ValidateForTp(cfg, opts.tp));
  return cfg;
}

// ---------------------------------------------------------------- scheduler

absl::Status SchedulerMain(const JobOptions& opts, JobHandle* job, int64_t process_start_ns) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg, ResolveModel(opts));
  SYMTP_ASSIGN_OR_RETURN(ipc::RingProducer diffs,
                         ipc::RingProducer::Create(*job->diff_ring, "scheduler"));
  std::vector<ipc::RingConsumer> results;
  for (int r = 0; r < opts.tp; ++r) {
    SYMTP_ASSIGN_OR_RETURN(ipc::RingConsumer c,
                           ipc::RingConsumer::Attach(job->result_rings[r], 0, "scheduler"));
    results.push_back(std::move(c));
  }
  sched::SchedulerConfig sc = JobSchedulerConfig(opts, cfg);
  SYMTP_ASSIGN_OR_RETURN(sc.num_kv_blocks,
                         AgreedKvBlocks(opts, cfg, job,
                                        Deadline::AfterNs(opts.step_timeout_ms * 1'000'000)));
  if (KvBlocksFromWorkers(opts)) {
    SYMTP_LOG(INFO, "sched") << "KV cache: " << sc.num_kv_blocks
                             << " blocks (the smallest the workers allocated)";
  }
  SYMTP_ASSIGN_OR_RETURN(sched::Scheduler sched, sched::Scheduler::Create(sc));
  WorkloadStream workload(opts, cfg);  // drawn as admitted: memory is what is in flight
  const int n = workload.size();
  const int concurrency = opts.arrival_rate > 0 ? n
                          : opts.steady_batch > 0 ? n
                          : (opts.concurrency > 0 ? opts.concurrency : opts.max_batch);
  job->SetPhase(ProcPhase::kRunning);

  RunSummaryInput summary;
  summary.opts = &opts;
  summary.model_json = model::ToJson(cfg);
  summary.requests.resize(n);
  // Every worker is ready (AgreedKvBlocks waited for them): the clock starts.
  const int64_t start = MonotonicNs();
  summary.start_ns = start;
  summary.startup_ns = start - process_start_ns;
  int next = 0, finished = 0;
  uint64_t tokens_out = 0;
  std::deque<size_t> inflight;  // indices into summary.steps
  std::vector<uint8_t> wire, rbuf;
  std::vector<proto::StepResult> rank_results(opts.tp);
  sched::StepPlan plan;
  Progress progress(opts.progress, n);
  const auto step_deadline = [&] { return Deadline::AfterNs(opts.step_timeout_ms * 1'000'000); };
  std::vector<bool> recorded(n, false);

  auto admit = [&](int64_t now) -> absl::Status {
    while (next < n && next - finished < concurrency &&
           (opts.arrival_rate <= 0 || start + workload.Peek().arrival_offset_ns <= now)) {
      WorkloadRequest w = workload.Take();
      summary.requests[next].id = w.id;
      summary.requests[next].prompt_len = static_cast<int32_t>(w.prompt.size());
      if (!opts.out_dir.empty()) summary.requests[next].prompt = w.prompt;
      summary.requests[next].arrival_ns = now;
      SYMTP_RETURN_IF_ERROR(sched.AddRequest(
          w.id, std::move(w.prompt), w.max_new_tokens, w.sampling,
          opts.eos_id >= 0 ? std::optional<int32_t>(opts.eos_id) : std::nullopt, now));
      ++next;
    }
    return absl::OkStatus();
  };

  while (next < n || !sched.Done()) {
    SYMTP_RETURN_IF_ERROR(CheckAbort(job->control));
    int64_t now = MonotonicNs();
    SYMTP_RETURN_IF_ERROR(admit(now));
    bool published = false;
    if (sched.CanPlan()) {
      int64_t t0 = MonotonicNs();
      SYMTP_RETURN_IF_ERROR_CTX(sched.PlanNextStep(&plan), "planning");
      if (!plan.idle) {
        StepRecord rec;
        rec.plan_start_ns = t0;
        int64_t t1 = MonotonicNs();
        SYMTP_RETURN_IF_ERROR(proto::EncodeDiff(plan.diff, &wire));
        int64_t t2 = MonotonicNs();
        SYMTP_RETURN_IF_ERROR_CTX(diffs.Publish(wire, step_deadline()),
                                  absl::StrCat("publishing step ", plan.diff.step));
        int64_t t3 = MonotonicNs();
        rec.step = plan.diff.step;
        rec.num_seqs = static_cast<int32_t>(plan.scheduled.size());
        rec.num_tokens = plan.num_tokens;
        rec.num_samples = plan.num_samples;
        rec.decode_only = plan.num_tokens == static_cast<int32_t>(plan.scheduled.size());
        rec.schedule_ns = t1 - t0;
        rec.encode_ns = t2 - t1;
        rec.publish_ns = t3 - t2;
        rec.published_at_ns = t3;
        rec.wire_bytes = wire.size();
        summary.steps.push_back(rec);
        inflight.push_back(summary.steps.size() - 1);
        published = true;
      }
    }
    if (published) continue;
    if (!inflight.empty()) {
      StepRecord& rec = summary.steps[inflight.front()];
      for (int r = 0; r < opts.tp; ++r) {
        SYMTP_RETURN_IF_ERROR_CTX(results[r].Read(&rbuf, step_deadline()).status(),
                                  absl::StrCat("waiting for worker rank ", r, "'s result of step ", rec.step));
        SYMTP_RETURN_IF_ERROR_CTX(proto::DecodeResultInto(rbuf, &rank_results[r]),
                                  absl::StrCat("result of worker rank ", r));
      }
      int64_t done = MonotonicNs();
      rec.done_at_ns = done;
      int64_t result_at = 0;
      for (const proto::StepResult& res : rank_results) {
        rec.recv_wait_ns = std::max<int64_t>(rec.recv_wait_ns, res.timings.recv_wait_ns);
        rec.apply_ns = std::max<int64_t>(rec.apply_ns, res.timings.apply_ns);
        rec.build_ns = std::max<int64_t>(rec.build_ns, res.timings.build_ns);
        rec.forward_ns = std::max<int64_t>(rec.forward_ns, res.timings.forward_ns);
        rec.rank_forward_ns.push_back(res.timings.forward_ns);
        rec.sample_ns = std::max<int64_t>(rec.sample_ns, res.timings.sample_ns);
        rec.gpu_idle_ns = std::max<int64_t>(rec.gpu_idle_ns, res.timings.gpu_idle_ns);
        const proto::PhaseTimings& pt = res.timings;
        if (!opts.trace_file.empty()) rec.ranks.push_back(pt);
        result_at = std::max<int64_t>(result_at, static_cast<int64_t>(pt.result_at_ns));
        rec.worker_total_ns = std::max<int64_t>(rec.worker_total_ns, res.timings.total_ns);
        rec.worker_iter_ns = std::max<int64_t>(
            rec.worker_iter_ns, res.timings.recv_wait_ns + res.timings.total_ns);
      }
      // Results in minus the last rank's publish (one clock for all processes).
      rec.result_return_ns = result_at > 0
                                 ? std::max<int64_t>(0, done - result_at)
                                 : std::max<int64_t>(0, done - (rec.published_at_ns + rec.worker_total_ns));
      // The workers report GPU time by events as their forward time on CUDA.
      if (opts.resolved_backend == "cuda") rec.device_forward_ns = rec.forward_ns;
      SYMTP_RETURN_IF_ERROR(sched.OnStepResults(rank_results, done));
      inflight.pop_front();
      for (const proto::SampledToken& t : rank_results[0].sampled) {
        const sched::RequestOutput* o = sched.GetOutput(t.request_id);
        if (o && o->finished && !recorded[t.request_id]) {
          recorded[t.request_id] = true;
          ++finished;
          RequestRecord& rr = summary.requests[t.request_id];
          rr.tokens = o->tokens;
          rr.token_times_ns = o->token_times_ns;
          rr.first_token_ns = o->first_token_ns;
          rr.finish_ns = o->finish_ns;
          tokens_out += o->tokens.size();
          // Recorded: the scheduler forgets it (its prompt included), so
          // memory follows the requests in flight, not the workload.
          SYMTP_RETURN_IF_ERROR(sched.ReleaseOutput(t.request_id));
        }
      }
      progress.Update(rec.step, finished, tokens_out);
      continue;
    }
    // Idle: wait for the next arrival (bounded sleep; the loop re-checks).
    if (next < n) {
      int64_t wait = start + workload.Peek().arrival_offset_ns - MonotonicNs();
      if (wait > 0) usleep(static_cast<useconds_t>(std::min<int64_t>(wait / 1000, 10'000)));
    } else if (!sched.Done()) {
      return absl::InternalError("scheduler has unfinished requests but nothing to plan or wait for");
    }
  }
  // Any request finished without passing through a sampled list above.
  for (int i = 0; i < n; ++i) {
    if (recorded[i]) continue;
    if (const sched::RequestOutput* o = sched.GetOutput(i)) {
      RequestRecord& rr = summary.requests[i];
      rr.tokens = o->tokens;
      rr.token_times_ns = o->token_times_ns;
      rr.first_token_ns = o->first_token_ns;
      rr.finish_ns = o->finish_ns;
    }
  }
  SYMTP_ASSIGN_OR_RETURN(sched::StepPlan end, sched.PlanEndOfJob());
  SYMTP_RETURN_IF_ERROR(proto::EncodeDiff(end.diff, &wire));
  SYMTP_RETURN_IF_ERROR_CTX(diffs.Publish(wire, step_deadline()), "publishing end of job");
  summary.end_ns = MonotonicNs();
  progress.Finish();
  const sched::SchedulerStats& st = sched.stats();
  summary.extra_json = absl::StrCat(
      "\"scheduler\": {\"steps\": ", st.steps, ", \"prefill_tokens\": ", st.prefill_tokens,
      ", \"decode_tokens\": ", st.decode_tokens, ", \"preemptions\": ", st.preemptions,
      ", \"discarded_after_eos\": ", st.discarded_after_eos, ", \"max_inflight\": ",
      opts.max_inflight, "}");
  SYMTP_LOG(INFO, "sched") << "done: " << n << " requests, " << summary.steps.size()
                           << " steps, " << tokens_out << " tokens in "
                           << (summary.end_ns - start) / 1e9 << " s (start-up before it "
                           << summary.startup_ns / 1e9 << " s)";
  SYMTP_RETURN_IF_ERROR_CTX(WriteRunOutputs(summary), "writing outputs");
  return absl::OkStatus();
}

// ---------------------------------------------------------------- worker (v1)

absl::Status WorkerMain(const JobOptions& opts, const ProcArgs& proc, JobHandle* job,
                        int64_t process_start_ns) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg, ResolveModel(opts));
  const int rank = proc.rank;
  std::unique_ptr<Backend> backend;
  if (opts.resolved_backend == "cuda") {
#if defined(SYMTP_HAVE_GPU_MODEL)
    SYMTP_ASSIGN_OR_RETURN(backend, CreateCudaBackend(opts, cfg, rank, proc.device, job));
#else
    return absl::UnimplementedError("this build has no CUDA backend");
#endif
  } else {
    SYMTP_ASSIGN_OR_RETURN(backend, CreateCpuBackend(opts, cfg, rank, job));
  }
  // The scheduler plans with the smallest KV cache any rank allocated.
  job->self->kv_blocks.store(backend->num_kv_blocks(), std::memory_order_release);
  if (opts.mode == "v0") return RunV0Worker(opts, cfg, rank, job, backend.get(), process_start_ns);

  const std::string label = absl::StrCat("worker rank ", rank);
  SYMTP_ASSIGN_OR_RETURN(ipc::RingConsumer diffs,
                         ipc::RingConsumer::Attach(*job->diff_ring, rank, label));
  SYMTP_ASSIGN_OR_RETURN(ipc::RingProducer results,
                         ipc::RingProducer::Create(job->result_rings[rank], label));
  worker::WorkerStateConfig wc;
  wc.num_kv_blocks = backend->num_kv_blocks();  // >= what the scheduler plans with
  wc.max_seq_len = JobMaxSeqLen(opts, cfg);
  wc.block_size = cfg.block_size;
  SYMTP_ASSIGN_OR_RETURN(worker::WorkerState state, worker::WorkerState::Create(wc));
  SYMTP_LOG(INFO, "worker") << label << ": " << backend->Describe();
  job->SetPhase(ProcPhase::kRunning);

  // The loop is pipelined: step t + 1 is applied, built and launched while
  // step t still runs on the device (its sampled tokens feed step t + 1 on
  // the device; the state holds placeholders for them), then step t is
  // collected and its result published. When diff t + 1 is not there yet
  // the worker collects and publishes step t first (the scheduler may need
  // that result to plan). Placeholders are confirmed with the real tokens
  // at a fixed point - after the next step's ApplySampledPending - so every
  // rank's digest sequence is the same whichever order happened.
  struct Launched {
    uint64_t step = 0;
    std::vector<uint64_t> ids;
    std::vector<int32_t> positions;
    uint64_t digest = 0;
    int64_t recv_wait_ns = 0, apply_ns = 0, build_ns = 0, received_at = 0, launched_at = 0;
  };
  struct Confirm {
    std::vector<uint64_t> ids;
    std::vector<int32_t> positions;
    std::vector<int32_t> tokens;
  };
  std::vector<uint8_t> buf, out;
  proto::StepDiff diff;
  model::BatchInput batch;
  proto::StepResult result;
  result.rank = static_cast<uint32_t>(rank);
  std::optional<Launched> inflight;
  std::optional<Confirm> deferred;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> prev_samples;  // id -> (position, index)
  std::vector<int32_t> prev_rows;
  int64_t last_publish_ns = 0;
  int64_t launches = 0, overlapped = 0;
  auto report = [&] {
    SYMTP_LOG(INFO, "worker") << label << ": " << launches << " steps, " << overlapped
                              << " launched while the previous step was still in flight";
  };
  auto step_deadline = [&] { return Deadline::AfterNs(opts.step_timeout_ms * 1'000'000); };

  // Collects the oldest launched step and publishes its result; returns its
  // tokens for ConfirmSampled.
  auto finish = [&](Launched& l) -> absl::StatusOr<Confirm> {
    Confirm c;
    BackendTimings bt;
    SYMTP_RETURN_IF_ERROR_CTX(backend->Collect(&c.tokens, &bt), absl::StrCat("step ", l.step));
    if (c.tokens.size() != l.ids.size()) {
      return absl::InternalError(absl::StrFormat("step %d: the backend sampled %d tokens, %d expected",
                                                 l.step, c.tokens.size(), l.ids.size()));
    }
    result.step = l.step;
    result.digest = l.digest;
    result.sampled.resize(l.ids.size());
    for (size_t i = 0; i < l.ids.size(); ++i) result.sampled[i] = {l.ids[i], c.tokens[i]};
    const int64_t now = MonotonicNs();
    result.timings.recv_at_ns = static_cast<uint64_t>(l.received_at);
    result.timings.launch_at_ns = static_cast<uint64_t>(l.launched_at);
    result.timings.collect_at_ns = static_cast<uint64_t>(now);
    result.timings.recv_wait_ns = l.recv_wait_ns;
    result.timings.apply_ns = l.apply_ns;
    result.timings.build_ns = l.build_ns;
    result.timings.forward_ns = bt.device_forward_ns > 0 ? bt.device_forward_ns : bt.forward_ns;
    result.timings.sample_ns = bt.sample_ns;
    result.timings.gpu_idle_ns = bt.device_idle_ns;
    // The worker's period for this step (publish to publish) less the wait
    // for its diff: the scheduler's iteration time is recv_wait + total.
    result.timings.total_ns =
        last_publish_ns > 0 ? std::max<int64_t>(0, now - last_publish_ns - l.recv_wait_ns)
                            : now - l.received_at;
    result.timings.result_at_ns = static_cast<uint64_t>(MonotonicNs());
    SYMTP_RETURN_IF_ERROR(proto::EncodeResult(result, &out));
    SYMTP_RETURN_IF_ERROR_CTX(results.Publish(out, step_deadline()), "publishing the step result");
    last_publish_ns = MonotonicNs();
    job->self->step.store(static_cast<int64_t>(l.step), std::memory_order_relaxed);
    c.ids = std::move(l.ids);
    c.positions = std::move(l.positions);
    return c;
  };

  for (;;) {
    if (inflight) {
      // Diff t + 1 (launch it first) or step t done (publish it first).
      const Deadline d = step_deadline();
      for (uint32_t i = 0;; ++i) {
        if (opts.pipeline && diffs.Ready()) break;
        if (backend->OldestDone() || ((i & 4095) == 0 && d.Expired())) {
          SYMTP_ASSIGN_OR_RETURN(Confirm c, finish(*inflight));
          deferred = std::move(c);
          inflight.reset();
          break;
        }
        if ((i & 4095) == 0) SYMTP_RETURN_IF_ERROR(CheckAbort(job->control));
      }
    }
    const int64_t t0 = MonotonicNs();
    absl::StatusOr<uint64_t> seq = diffs.Read(&buf, step_deadline());
    if (!seq.ok()) {
      if (absl::IsOutOfRange(seq.status())) {  // closed and drained
        if (inflight) SYMTP_RETURN_IF_ERROR(finish(*inflight).status());
        report();
        return absl::OkStatus();
      }
      return Annotate(seq.status(), "waiting for the next diff");
    }
    const int64_t t1 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(proto::DecodeDiffInto(buf, &diff), absl::StrCat("diff record ", *seq));
    SYMTP_RETURN_IF_ERROR(state.ApplyDiff(diff));
    if (diff.end_of_job()) {
      if (inflight) SYMTP_RETURN_IF_ERROR(finish(*inflight).status());
      report();
      return absl::OkStatus();
    }
    const int64_t t2 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR(state.BuildInput(&batch));
    prev_rows.clear();
    if (!state.input_pending().empty()) {
      prev_rows.assign(batch.tokens.size(), -1);
      for (const worker::PendingInput& p : state.input_pending()) {
        auto it = prev_samples.find(p.request_id);
        if (it == prev_samples.end() || it->second.first != p.position) {
          return absl::InternalError(absl::StrFormat(
              "step %d: request %d's input token at position %d is pending but the previous "
              "step did not sample it",
              diff.step, p.request_id, p.position));
        }
        prev_rows[p.token_index] = it->second.second;
      }
    }
    const int64_t t3 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(
        backend->Launch(batch, state.sample_params(), state.sample_positions(), prev_rows),
        absl::StrCat("step ", diff.step));
    Launched l;
    l.step = diff.step;
    l.ids.assign(state.sample_request_ids().begin(), state.sample_request_ids().end());
    l.positions.assign(state.sample_positions().begin(), state.sample_positions().end());
    l.recv_wait_ns = t1 - t0;
    l.apply_ns = t2 - t1;
    l.build_ns = t3 - t2;
    l.received_at = t1;
    l.launched_at = t3;
    prev_samples.clear();
    for (size_t i = 0; i < l.ids.size(); ++i) {
      prev_samples[l.ids[i]] = {l.positions[i], static_cast<int32_t>(i)};
    }
    SYMTP_RETURN_IF_ERROR(state.ApplySampledPending());
    l.digest = state.Digest();
    if (deferred) {
      SYMTP_RETURN_IF_ERROR(state.ConfirmSampled(deferred->ids, deferred->positions, deferred->tokens));
      deferred.reset();
    }
    ++launches;
    if (inflight) {
      ++overlapped;
      SYMTP_ASSIGN_OR_RETURN(Confirm c, finish(*inflight));
      SYMTP_RETURN_IF_ERROR(state.ConfirmSampled(c.ids, c.positions, c.tokens));
    }
    inflight = std::move(l);
  }
}

template <typename Body>
int RunProcess(const JobOptions& opts, const ProcArgs& proc, int proc_index, Body body) {
  absl::StatusOr<std::unique_ptr<JobHandle>> job = AttachJob(proc.job, proc_index, opts.tp);
  if (!job.ok()) {
    std::fprintf(stderr, "symtp %s: %s\n", ProcName(proc_index).c_str(), job.status().ToString().c_str());
    return 1;
  }
  (*job)->self->pid.store(getpid(), std::memory_order_release);
  HeartbeatThread heartbeat((*job)->self, kHeartbeatPeriodNs);
  (*job)->SetPhase(ProcPhase::kReady);
  absl::Status s = body(job->get());
  if (!s.ok()) {
    // An abort requested by someone else is not this process's failure.
    if (absl::IsAborted(s) || !CheckAbort((*job)->control).ok()) {
      SYMTP_LOG(WARN, "proc") << ProcName(proc_index) << " stopping: " << s.message();
      return 3;
    }
    SYMTP_LOG(ERROR, "proc") << ProcName(proc_index) << ": " << s;
    (*job)->Fail(s);
    return 1;
  }
  (*job)->SetPhase(ProcPhase::kDone);
  return 0;
}

}  // namespace

int RunSchedulerProcess(const JobOptions& opts, const ProcArgs& proc) {
  const int64_t process_start_ns = MonotonicNs();
  return RunProcess(opts, proc, 0,
                    [&](JobHandle* job) { return SchedulerMain(opts, job, process_start_ns); });
}

int RunWorkerProcess(const JobOptions& opts, const ProcArgs& proc) {
  if (proc.rank < 0 || proc.rank >= opts.tp) {
    std::fprintf(stderr, "symtp worker: --rank must be in [0, %d)\n", opts.tp);
    return 2;
  }
  const int64_t process_start_ns = MonotonicNs();
  return RunProcess(opts, proc, 1 + proc.rank, [&](JobHandle* job) {
    return WorkerMain(opts, proc, job, process_start_ns);
  });
}

}  // namespace symtp::runtime

#include "runtime/worker_process.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "ipc/ring.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "runtime/backend.h"
#include "runtime/job_sizing.h"
#include "runtime/layout.h"
#include "runtime/v0.h"
#include "worker/state/worker_state.h"

namespace symtp::runtime {
namespace {

// The v1 worker loop, pipelined: step t + 1 is applied, built and launched
// while step t still runs on the device (its sampled tokens feed step t + 1
// on the device; the state holds placeholders for them), then step t is
// collected and its result published. When diff t + 1 is not there yet the
// worker collects and publishes step t first (the scheduler may need that
// result to plan). Placeholders are confirmed with the real tokens at a fixed
// point - after the next step's ApplySampledPending - so every rank's digest
// sequence is the same whichever order happened. --pipeline=false publishes
// each step before reading the next diff.
class PipelinedStepper {
 public:
  PipelinedStepper(const JobOptions& opts, int rank, JobHandle* job, Backend* backend)
      : opts_(opts), job_(job), backend_(backend), label_(absl::StrCat("worker rank ", rank)) {
    result_.rank = static_cast<uint32_t>(rank);
  }

  absl::Status Run(const model::ModelConfig& cfg) {
    SYMTP_RETURN_IF_ERROR(Start(cfg));
    for (;;) {
      if (inflight_) SYMTP_RETURN_IF_ERROR(WaitForNextDiffOrOldestDone());
      SYMTP_ASSIGN_OR_RETURN(bool more, ReadAndApplyDiff());
      if (!more) break;
      SYMTP_RETURN_IF_ERROR(BuildAndLaunch());
    }
    if (inflight_) SYMTP_RETURN_IF_ERROR(Publish(*inflight_).status());
    const std::string stats = backend_->RunStats();
    SYMTP_LOG(INFO, "worker") << label_ << ": " << launches_ << " steps, " << overlapped_
                              << " launched while the previous step was still in flight"
                              << (stats.empty() ? "" : "; ") << stats;
    return absl::OkStatus();
  }

 private:
  // A launched step, until its result is published.
  struct Launched {
    uint64_t step = 0;
    std::vector<uint64_t> ids;
    std::vector<int32_t> positions;
    uint64_t digest = 0;
    int64_t recv_wait_ns = 0, apply_ns = 0, build_ns = 0, received_at = 0, launched_at = 0;
  };
  // A published step's tokens, for WorkerState::ConfirmSampled.
  struct Confirm {
    std::vector<uint64_t> ids;
    std::vector<int32_t> positions;
    std::vector<int32_t> tokens;
  };

  Deadline StepDeadline() const { return Deadline::AfterNs(opts_.step_timeout_ms * 1'000'000); }

  absl::Status Start(const model::ModelConfig& cfg) {
    SYMTP_ASSIGN_OR_RETURN(diffs_, ipc::RingConsumer::Attach(*job_->diff_ring,
                                                             static_cast<int>(result_.rank), label_));
    SYMTP_ASSIGN_OR_RETURN(results_,
                           ipc::RingProducer::Create(job_->result_rings[result_.rank], label_));
    worker::WorkerStateConfig wc;
    wc.num_kv_blocks = backend_->num_kv_blocks();  // >= what the scheduler plans with
    wc.max_seq_len = JobMaxSeqLen(opts_, cfg);
    wc.block_size = cfg.block_size;
    SYMTP_ASSIGN_OR_RETURN(state_, worker::WorkerState::Create(wc));
    SYMTP_LOG(INFO, "worker") << label_ << ": " << backend_->Describe();
    job_->SetPhase(ProcPhase::kRunning);
    return absl::OkStatus();
  }

  // With a step in flight: returns once diff t + 1 is there (to launch it
  // first) or, having published it, once step t is done.
  absl::Status WaitForNextDiffOrOldestDone() {
    const Deadline d = StepDeadline();
    for (uint32_t i = 0;; ++i) {
      if (opts_.pipeline && diffs_->Ready()) return absl::OkStatus();
      if (backend_->OldestDone() || ((i & 4095) == 0 && d.Expired())) {
        SYMTP_ASSIGN_OR_RETURN(deferred_, Publish(*inflight_));
        inflight_.reset();
        return absl::OkStatus();
      }
      if ((i & 4095) == 0) SYMTP_RETURN_IF_ERROR(CheckAbort(job_->control));
    }
  }

  // Reads the next diff and applies it to the state; false at the end of
  // the job (the ring closed and drained, or the end-of-job diff).
  absl::StatusOr<bool> ReadAndApplyDiff() {
    const int64_t t0 = MonotonicNs();
    absl::StatusOr<uint64_t> seq = diffs_->Read(&buf_, StepDeadline());
    if (absl::IsOutOfRange(seq.status())) return false;  // closed and drained
    if (!seq.ok()) return Annotate(seq.status(), "waiting for the next diff");
    const int64_t t1 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(proto::DecodeDiffInto(buf_, &diff_), absl::StrCat("diff record ", *seq));
    SYMTP_RETURN_IF_ERROR(state_->ApplyDiff(diff_));
    if (diff_.end_of_job()) return false;
    next_ = Launched{};
    next_.step = diff_.step;
    next_.recv_wait_ns = t1 - t0;
    next_.received_at = t1;
    next_.apply_ns = MonotonicNs() - t1;
    return true;
  }

  // Builds the step's input, launches it, closes the step in the state with
  // placeholders, then confirms the tokens of the step published last and
  // publishes the one still in flight.
  absl::Status BuildAndLaunch() {
    const int64_t t2 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR(state_->BuildInput(&batch_));
    SYMTP_RETURN_IF_ERROR(state_->PreviousSampleRows(&prev_rows_));
    const int64_t t3 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(backend_->Launch(batch_, state_->sample_params(),
                                               state_->sample_positions(), prev_rows_),
                              absl::StrCat("step ", diff_.step));
    Launched& l = next_;
    l.ids.assign(state_->sample_request_ids().begin(), state_->sample_request_ids().end());
    l.positions.assign(state_->sample_positions().begin(), state_->sample_positions().end());
    l.build_ns = t3 - t2;
    l.launched_at = t3;
    SYMTP_RETURN_IF_ERROR(state_->ApplySampledPending());
    l.digest = state_->Digest();
    if (deferred_) {
      SYMTP_RETURN_IF_ERROR(
          state_->ConfirmSampled(deferred_->ids, deferred_->positions, deferred_->tokens));
      deferred_.reset();
    }
    ++launches_;
    if (inflight_) {
      ++overlapped_;
      SYMTP_ASSIGN_OR_RETURN(Confirm c, Publish(*inflight_));
      SYMTP_RETURN_IF_ERROR(state_->ConfirmSampled(c.ids, c.positions, c.tokens));
    }
    inflight_ = std::move(l);
    return absl::OkStatus();
  }

  // Collects the oldest launched step and publishes its result; returns its
  // tokens for ConfirmSampled.
  absl::StatusOr<Confirm> Publish(Launched& l) {
    Confirm c;
    BackendTimings bt;
    SYMTP_RETURN_IF_ERROR_CTX(backend_->Collect(&c.tokens, &bt), absl::StrCat("step ", l.step));
    if (c.tokens.size() != l.ids.size()) {
      return absl::InternalError(absl::StrFormat("step %d: the backend sampled %d tokens, %d expected",
                                                 l.step, c.tokens.size(), l.ids.size()));
    }
    result_.step = l.step;
    result_.digest = l.digest;
    result_.sampled.resize(l.ids.size());
    for (size_t i = 0; i < l.ids.size(); ++i) result_.sampled[i] = {l.ids[i], c.tokens[i]};
    const int64_t now = MonotonicNs();
    proto::PhaseTimings& t = result_.timings;
    t.recv_at_ns = static_cast<uint64_t>(l.received_at);
    t.launch_at_ns = static_cast<uint64_t>(l.launched_at);
    t.collect_at_ns = static_cast<uint64_t>(now);
    t.recv_wait_ns = l.recv_wait_ns;
    t.apply_ns = l.apply_ns;
    t.build_ns = l.build_ns;
    t.forward_ns = bt.device_forward_ns > 0 ? bt.device_forward_ns : bt.forward_ns;
    t.sample_ns = bt.sample_ns;
    t.gpu_idle_ns = bt.device_idle_ns;
    result_.graph = bt.graph;
    // The worker's period for this step (publish to publish) less the wait
    // for its diff: the scheduler's iteration time is recv_wait + total.
    t.total_ns = last_publish_ns_ > 0
                     ? std::max<int64_t>(0, now - last_publish_ns_ - l.recv_wait_ns)
                     : now - l.received_at;
    t.result_at_ns = static_cast<uint64_t>(MonotonicNs());
    SYMTP_RETURN_IF_ERROR(proto::EncodeResult(result_, &out_));
    SYMTP_RETURN_IF_ERROR_CTX(results_->Publish(out_, StepDeadline()), "publishing the step result");
    last_publish_ns_ = MonotonicNs();
    job_->self->step.store(static_cast<int64_t>(l.step), std::memory_order_relaxed);
    c.ids = std::move(l.ids);
    c.positions = std::move(l.positions);
    return c;
  }

  const JobOptions& opts_;
  JobHandle* job_;
  Backend* backend_;
  const std::string label_;
  std::optional<ipc::RingConsumer> diffs_;
  std::optional<ipc::RingProducer> results_;
  std::optional<worker::WorkerState> state_;
  std::vector<uint8_t> buf_, out_;
  proto::StepDiff diff_;
  model::BatchInput batch_;
  std::vector<int32_t> prev_rows_;
  proto::StepResult result_;
  Launched next_;                    // read and applied, not yet launched
  std::optional<Launched> inflight_;  // launched, not yet published
  std::optional<Confirm> deferred_;   // published, not yet confirmed in the state
  int64_t last_publish_ns_ = 0;
  int64_t launches_ = 0, overlapped_ = 0;
};

absl::Status WorkerMain(const JobOptions& opts, const ProcArgs& proc, JobHandle* job,
                        int64_t process_start_ns) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg, ResolveModel(opts));
  BatchBroadcast* v0 = nullptr;
  BatchBroadcast** want_v0 = opts.mode == Mode::kV0 ? &v0 : nullptr;
  std::unique_ptr<Backend> backend;
  if (opts.resolved_backend == BackendKind::kCuda) {
#if defined(SYMTP_HAVE_GPU_MODEL)
    SYMTP_ASSIGN_OR_RETURN(backend, CreateCudaBackend(opts, cfg, proc.rank, proc.device, job, want_v0));
#else
    return absl::UnimplementedError("this build has no CUDA backend");
#endif
  } else {
    SYMTP_ASSIGN_OR_RETURN(backend, CreateCpuBackend(opts, cfg, proc.rank, job, want_v0));
  }
  // The scheduler plans with the smallest KV cache any rank allocated.
  job->self->kv_blocks.store(backend->num_kv_blocks(), std::memory_order_release);
  if (v0 != nullptr) {
    return RunV0Worker(opts, cfg, proc.rank, job, backend.get(), v0, process_start_ns);
  }
  return PipelinedStepper(opts, proc.rank, job, backend.get()).Run(cfg);
}

}  // namespace

int RunWorkerProcess(const JobOptions& opts, const ProcArgs& proc) {
  if (proc.rank < 0 || proc.rank >= opts.tp) {
    std::fprintf(stderr, "symtp worker: --rank must be in [0, %d)\n", opts.tp);
    return 2;
  }
  const int64_t process_start_ns = MonotonicNs();
  return RunJobProcess(proc, opts.tp, ProcIndex(ProcRole::kWorker, proc.rank),
                       [&](JobHandle* job) { return WorkerMain(opts, proc, job, process_start_ns); });
}

}  // namespace symtp::runtime

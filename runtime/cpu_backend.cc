#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "models/cpu_model.h"
#include "models/sharding.h"
#include "runtime/job.h"
#include "runtime/backend.h"
#include "runtime/shm_host_comm.h"

namespace symtp::runtime {

namespace {

int MaxLen(const LengthDist& d, int cap) {
  if (d.kind == "fixed") return std::min(cap, static_cast<int>(d.a));
  if (d.kind == "uniform") return std::min(cap, static_cast<int>(d.b));
  return cap;
}

class CpuBackend : public Backend {
 public:
  CpuBackend(std::unique_ptr<ShmHostComm> comm, model::CpuModel m)
      : comm_(std::move(comm)), model_(std::move(m)) {}

  absl::Status Step(const model::BatchInput& in, absl::Span<const model::SamplingParams> params,
                    absl::Span<const int32_t> positions, std::vector<int32_t>* tokens,
                    BackendTimings* t) override {
    int64_t t0 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(model_.Forward(in, &logits_), "cpu forward");
    int64_t t1 = MonotonicNs();
    const int vocab = model_.config().vocab;
    if (params.size() != in.sample_index.size() || positions.size() != params.size()) {
      return absl::InternalError("sample params/positions do not match the batch's sample rows");
    }
    tokens->resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      (*tokens)[i] = model::SampleToken(
          absl::Span<const float>(logits_.data() + i * vocab, vocab), params[i],
          static_cast<uint64_t>(positions[i]), &scratch_);
    }
    t->forward_ns = t1 - t0;
    t->sample_ns = MonotonicNs() - t1;
    return absl::OkStatus();
  }

  absl::Status ForwardOnly(const model::BatchInput& in, BackendTimings* t) override {
    int64_t t0 = MonotonicNs();
    SYMTP_RETURN_IF_ERROR_CTX(model_.Forward(in, &logits_), "cpu forward");
    t->forward_ns = MonotonicNs() - t0;
    return absl::OkStatus();
  }

  absl::Status BroadcastBatch(void* data, size_t bytes, int root) override {
    return comm_->Broadcast(data, bytes, root);
  }

  const std::vector<float>& logits() const { return logits_; }
  std::string Describe() const override {
    return absl::StrCat("cpu (fp32), kv cache ", model_.kv_cache_bytes() >> 20, " MiB (",
                        model_.num_kv_blocks(), " blocks)");
  }
  int num_kv_blocks() const override { return model_.num_kv_blocks(); }

 private:
  std::unique_ptr<ShmHostComm> comm_;
  model::CpuModel model_;
  std::vector<float> logits_;
  model::SamplingScratch scratch_;
};

}  // namespace

sched::SchedulerConfig JobSchedulerConfig(const JobOptions& opts, const model::ModelConfig& cfg) {
  sched::SchedulerConfig sc;
  sc.max_running_seqs = opts.steady_batch > 0 ? opts.steady_batch : opts.max_batch;
  sc.max_batched_tokens = opts.max_batched_tokens;
  sc.num_kv_blocks = NumKvBlocks(opts, cfg);
  sc.block_size = cfg.block_size;
  sc.max_seq_len = JobMaxSeqLen(opts, cfg);
  sc.prefill_chunk = opts.prefill_chunk;
  sc.max_inflight_steps = opts.mode == "v0" ? 1 : opts.max_inflight;  // v0 is synchronous by design
  return sc;
}

int JobMaxSeqLen(const JobOptions& opts, const model::ModelConfig& cfg) {
  int cap = cfg.max_seq_len;
  int per_seq;
  if (opts.steady_batch > 0) {
    const int64_t prefill_steps =
        (static_cast<int64_t>(opts.steady_batch) * opts.steady_context + opts.max_batched_tokens - 1) /
        opts.max_batched_tokens;
    per_seq = opts.steady_context + opts.warmup_steps + opts.steady_steps +
              static_cast<int>(prefill_steps) + 8;
  } else {
    per_seq = MaxLen(opts.prompt_len, cap) + MaxLen(opts.output_len, cap);
  }
  return std::min(per_seq, cap);
}

absl::Status Backend::Launch(const model::BatchInput& in,
                             absl::Span<const model::SamplingParams> params,
                             absl::Span<const int32_t> positions,
                             absl::Span<const int32_t> prev_sample) {
  if (in_flight_ >= kMaxInFlight) {
    return absl::FailedPreconditionError(
        absl::StrCat("Launch with ", in_flight_, " steps in flight (at most ", kMaxInFlight, ")"));
  }
  const model::BatchInput* input = &in;
  if (!prev_sample.empty()) {
    if (prev_sample.size() != in.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Launch: ", prev_sample.size(),
                                                     " prev_sample entries for ",
                                                     in.tokens.size(), " input tokens"));
    }
    substituted_ = in;
    for (size_t i = 0; i < prev_sample.size(); ++i) {
      const int32_t j = prev_sample[i];
      if (j < 0) continue;
      if (static_cast<size_t>(j) >= last_sampled_.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Launch: input token ", i, " takes sampled token ", j,
                         " of the previous step, which sampled ", last_sampled_.size()));
      }
      substituted_.tokens[i] = last_sampled_[j];
    }
    input = &substituted_;
  }
  Done d;
  SYMTP_RETURN_IF_ERROR(Step(*input, params, positions, &d.tokens, &d.timings));
  last_sampled_ = d.tokens;
  done_.push_back(std::move(d));
  ++in_flight_;
  return absl::OkStatus();
}

absl::Status Backend::Collect(std::vector<int32_t>* tokens, BackendTimings* timings) {
  if (done_.empty()) return absl::FailedPreconditionError("Collect with no step in flight");
  *tokens = std::move(done_.front().tokens);
  *timings = done_.front().timings;
  done_.pop_front();
  --in_flight_;
  return absl::OkStatus();
}

bool KvBlocksFromWorkers(const JobOptions& opts) {
  return opts.num_kv_blocks <= 0 && (opts.kv_cache_mib > 0 || opts.kv_cache_fraction > 0);
}

int KvBlocksForBytes(const model::ModelConfig& cfg, int rank, int tp, size_t elem_bytes,
                     double bytes) {
  absl::StatusOr<model::ShardLayout> layout = model::MakeShardLayout(cfg, rank, tp);
  if (!layout.ok()) return 0;
  const double per_block = static_cast<double>(model::KvCacheBytesPerBlock(cfg, *layout, elem_bytes));
  return static_cast<int>(std::min(bytes / per_block, static_cast<double>(1 << 28)));
}

absl::StatusOr<int> AgreedKvBlocks(const JobOptions& opts, const model::ModelConfig& cfg,
                                   JobHandle* job, Deadline deadline) {
  // Every worker reports its KV cache once its backend is built: that is
  // also the job's "every worker ready" (the measurement clock starts after).
  while (true) {
    SYMTP_RETURN_IF_ERROR(CheckAbort(job->control));
    int agreed = INT32_MAX, missing = -1;
    for (int r = 0; r < opts.tp; ++r) {
      const ProcSlot& slot = job->control->procs[ProcIndex(ProcRole::kWorker, r)];
      const int n = slot.kv_blocks.load(std::memory_order_acquire);
      if (n > 0) {
        agreed = std::min(agreed, n);
      } else if (missing < 0) {
        missing = r;
      }
    }
    if (missing < 0) return KvBlocksFromWorkers(opts) ? agreed : NumKvBlocks(opts, cfg);
    if (deadline.Expired()) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "worker rank %d did not report ready (its KV cache size) in time (--step-timeout-ms %d)",
          missing, opts.step_timeout_ms));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

int NumKvBlocks(const JobOptions& opts, const model::ModelConfig& cfg) {
  if (opts.num_kv_blocks > 0) return opts.num_kv_blocks;
  const int per_seq = JobMaxSeqLen(opts, cfg);
  int batch = opts.steady_batch > 0 ? opts.steady_batch : opts.max_batch;
  return batch * ((per_seq + 15) / 16 + 1) + 16;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const JobOptions& opts,
                                                          const model::ModelConfig& cfg,
                                                          int rank, JobHandle* job) {
  SYMTP_ASSIGN_OR_RETURN(std::unique_ptr<ShmHostComm> comm,
                         ShmHostComm::Attach(job->hostcomm, job->hostcomm_bytes, rank, job->control,
                                             opts.step_timeout_ms * 1'000'000));
  const int blocks = opts.kv_cache_mib > 0
                         ? KvBlocksForBytes(cfg, rank, opts.tp, sizeof(float),
                                            opts.kv_cache_mib * 1048576.0)
                         : NumKvBlocks(opts, cfg);
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv-cache-mib %g holds no KV block on rank %d", opts.kv_cache_mib, rank));
  }
  SYMTP_ASSIGN_OR_RETURN(model::CpuModel m,
                         model::CpuModel::Create(cfg, rank, opts.tp, blocks,
                                                 opts.tp > 1 ? comm.get() : nullptr));
  return std::unique_ptr<Backend>(new CpuBackend(std::move(comm), std::move(m)));
}

}  // namespace symtp::runtime

// The CPU backend of a worker: CpuModel with the shared-memory collectives.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "models/cpu_model.h"
#include "runtime/backend.h"
#include "runtime/job_sizing.h"
#include "runtime/shm_host_comm.h"
#include "runtime/v0.h"

namespace symtp::runtime {

namespace {

class CpuBackend : public Backend, public BatchBroadcast {
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
    tokens->clear();
    if (params.empty()) {  // forward only
      t->forward_ns = t1 - t0;
      return absl::OkStatus();
    }
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

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return comm_->Broadcast(data, bytes, root);
  }
  absl::StatusOr<void*> HostBuffer(size_t bytes) override {
    if (host_buffer_.size() < bytes) host_buffer_.resize(bytes);
    return host_buffer_.data();
  }

  std::string Describe() const override {
    return absl::StrCat("cpu (fp32), kv cache ", model_.kv_cache_bytes() >> 20, " MiB (",
                        model_.num_kv_blocks(), " blocks)");
  }
  int num_kv_blocks() const override { return model_.num_kv_blocks(); }

 private:
  std::unique_ptr<ShmHostComm> comm_;
  model::CpuModel model_;
  std::vector<float> logits_;
  std::vector<char> host_buffer_;  // v0's batch tensors (HostBuffer)
  model::SamplingScratch scratch_;
};

}  // namespace

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

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const JobOptions& opts,
                                                          const model::ModelConfig& cfg,
                                                          int rank, JobHandle* job,
                                                          BatchBroadcast** v0) {
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
  auto b = std::make_unique<CpuBackend>(std::move(comm), std::move(m));
  if (v0 != nullptr) *v0 = b.get();
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace symtp::runtime

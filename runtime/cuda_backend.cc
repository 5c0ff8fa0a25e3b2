// The CUDA backend of a worker: GpuModel on this rank's GPU, NCCL (and the
// custom one-shot all-reduce below the crossover) for the tensor-parallel
// collectives, bootstrapped through the job's shared memory.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/gpu_power.h"
#include "common/log.h"
#include "common/paired_ab.h"
#include "common/status_macros.h"
#include "kernels/allreduce/dispatcher.h"
#include "kernels/allreduce/peer_exchange.h"
#include "kernels/nccl/nccl_comm.h"
#include "models/cuda/gpu_model.h"
#include "runtime/backend.h"
#include "runtime/shm_barrier.h"

namespace symtp::runtime {
namespace {

// --gemm-tuning-file (kernels::ResolveGemmTuningFile), except that "auto"
// gives no table to a run that tunes or autotunes GEMMs itself (those
// compare against the heuristic).
absl::StatusOr<std::shared_ptr<const kernels::GemmTuningTable>> ResolveGemmTuning(
    const JobOptions& opts, int rank) {
  const std::string& f = opts.gemm_tuning_file;
  const bool automatic = f == "auto";
  if (automatic && (!opts.gemm_tune_out.empty() || opts.gemm_autotune > 1)) return nullptr;
  SYMTP_ASSIGN_OR_RETURN(std::optional<kernels::FoundGemmTuningTable> found,
                         kernels::ResolveGemmTuningFile(f));
  if (automatic && rank == 0) {
    SYMTP_LOG(INFO, "worker") << "--gemm-tuning-file=auto: "
                              << (found ? absl::StrCat(found->path, " (", found->table.size(),
                                                       " GEMM shapes)")
                                        : absl::StrCat("no table in ",
                                                       kernels::DefaultGemmTuningDir(),
                                                       " for this device and cuBLASLt: "
                                                       "cuBLASLt's heuristic"));
  }
  if (!found) return nullptr;
  return std::make_shared<const kernels::GemmTuningTable>(std::move(found->table));
}

// PeerExchange over the control block's exchange area: every worker writes
// its bytes into its row, a barrier, everyone copies all rows, a barrier.
class ShmPeerExchange : public kernels::PeerExchange {
 public:
  ShmPeerExchange(ControlBlock* cb, int rank, int tp) : cb_(cb), rank_(rank), tp_(tp) {}
  absl::Status AllGather(const void* mine, size_t bytes, void* all, Deadline deadline) override {
    if (bytes > kExchangeBytesPerRank) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "peer exchange of %d bytes exceeds the %d-byte slot", bytes, kExchangeBytesPerRank));
    }
    std::memcpy(cb_->exchange[rank_], mine, bytes);
    SYMTP_RETURN_IF_ERROR(
        BarrierWait(&cb_->exchange_barrier, tp_, cb_, tp_, deadline, "peer exchange"));
    for (int r = 0; r < tp_; ++r) {
      std::memcpy(static_cast<uint8_t*>(all) + r * bytes, cb_->exchange[r], bytes);
    }
    return BarrierWait(&cb_->exchange_barrier, tp_, cb_, tp_, deadline, "peer exchange (exit)");
  }
  absl::Status Barrier(Deadline deadline) override {
    return BarrierWait(&cb_->exchange_barrier, tp_, cb_, tp_, deadline, "peer barrier");
  }

 private:
  ControlBlock* cb_;
  int rank_, tp_;
};

// This rank's communicator of the TP group: NCCL, or the custom all-reduce
// with NCCL behind it (--allreduce). `pinned_crossover` > 0 pins the
// dispatcher's crossover instead of calibrating it (auto).
absl::StatusOr<std::unique_ptr<kernels::DeviceComm>> MakeComm(const JobOptions& opts, int rank,
                                                              int device,
                                                              kernels::PeerExchange* exchange,
                                                              Deadline boot,
                                                              size_t pinned_crossover) {
  // NCCL unique id from rank 0 to everyone through the exchange area.
  ncclUniqueId id{};
  if (rank == 0) {
    SYMTP_ASSIGN_OR_RETURN(id, kernels::NcclComm::NewUniqueId());
  }
  std::vector<ncclUniqueId> ids(opts.tp);
  SYMTP_RETURN_IF_ERROR_CTX(exchange->AllGather(&id, sizeof(id), ids.data(), boot), "NCCL id");
  SYMTP_ASSIGN_OR_RETURN(std::unique_ptr<kernels::NcclComm> nccl,
                         kernels::NcclComm::Create(ids[0], rank, opts.tp, device, boot));
  if (opts.allreduce == "nccl") return std::unique_ptr<kernels::DeviceComm>(std::move(nccl));
  kernels::AllReduceDispatcher::Options o;
  o.calibrate = opts.allreduce == "auto" && pinned_crossover == 0;
  o.crossover_bytes = opts.allreduce == "custom" ? (size_t{1} << 20)
                      : pinned_crossover > 0     ? pinned_crossover
                                                 : opts.crossover_bytes;
  o.max_custom_bytes = std::max<size_t>(size_t{1} << 20, o.crossover_bytes);
  SYMTP_ASSIGN_OR_RETURN(auto d, kernels::AllReduceDispatcher::Create(
                                     rank, opts.tp, device, std::move(nccl), exchange, boot, o));
  SYMTP_LOG(INFO, "worker") << "rank " << rank << " all-reduce: " << d->Describe();
  return std::unique_ptr<kernels::DeviceComm>(std::move(d));
}

class CudaBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const JobOptions& opts,
                                                             const model::ModelConfig& cfg,
                                                             int rank, int device, JobHandle* job) {
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend());
    b->opts_ = opts;
    b->rank_ = rank;
    b->control_ = job->control;
    b->device_ = device < 0 ? rank : device;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(b->device_));
    SYMTP_ASSIGN_OR_RETURN(b->stream_, cuda::Stream::Create());
    SYMTP_ASSIGN_OR_RETURN(b->sync_, cuda::Event::Create());
    for (Slot& sl : b->slots_) {
      SYMTP_ASSIGN_OR_RETURN(sl.start, cuda::Event::Create(/*timing=*/true));
      SYMTP_ASSIGN_OR_RETURN(sl.end, cuda::Event::Create(/*timing=*/true));
    }
    const Deadline boot =
        Deadline::AfterNs(std::max<int64_t>(opts.step_timeout_ms, 120'000) * 1'000'000);
    ShmPeerExchange exchange(job->control, rank, opts.tp);
    if (opts.tp > 1) {
      SYMTP_ASSIGN_OR_RETURN(b->comm_, MakeComm(opts, rank, b->device_, &exchange, boot, 0));
      // One more communicator per extra micro-batch (each runs on its own
      // stream; the custom all-reduce is one ordered instance per
      // communicator), dispatching at the first one's crossover.
      const int micro = opts.micro_batches == 0 ? 2 : opts.micro_batches;
      size_t crossover = opts.crossover_bytes;
      if (auto* d = dynamic_cast<kernels::AllReduceDispatcher*>(b->comm_.get())) {
        crossover = d->crossover_bytes();
      }
      for (int m = 1; m < micro; ++m) {
        SYMTP_ASSIGN_OR_RETURN(std::unique_ptr<kernels::DeviceComm> c,
                               MakeComm(opts, rank, b->device_, &exchange, boot, crossover));
        b->micro_comms_.push_back(std::move(c));
      }
    }
    model::GpuModelOptions mo;
    mo.dtype = opts.dtype == "fp32" ? kernels::DType::kF32 : kernels::DType::kBF16;
    // KV cache: --kv-cache-fraction of the memory left after the weights,
    // --kv-cache-mib, or what the workload needs (NumKvBlocks).
    mo.kv_cache_memory_fraction = opts.kv_cache_fraction;
    mo.num_kv_blocks = opts.kv_cache_fraction > 0 ? 0
                       : opts.kv_cache_mib > 0
                           ? KvBlocksForBytes(cfg, rank, opts.tp, opts.dtype == "fp32" ? 4 : 2,
                                              opts.kv_cache_mib * 1048576.0)
                           : NumKvBlocks(opts, cfg);
    if (opts.kv_cache_fraction <= 0 && mo.num_kv_blocks < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--kv-cache-mib %g holds no KV block on rank %d", opts.kv_cache_mib, rank));
    }
    mo.max_batch_tokens = opts.max_batched_tokens;
    mo.max_seqs = opts.steady_batch > 0 ? std::max(opts.steady_batch, 1) : opts.max_batch;
    mo.num_buckets = opts.buckets;
    mo.bucket_gemm_sm_margin = opts.gemm_sm_margin;
    mo.gemm_autotune_candidates = opts.gemm_autotune;
    SYMTP_ASSIGN_OR_RETURN(mo.gemm_tuning, ResolveGemmTuning(opts, rank));
    if (opts.gemm_skinny_max_m >= 0) mo.gemm_skinny_max_m = opts.gemm_skinny_max_m;
    mo.comm_stream_high_priority = opts.comm_priority == "high";
    if (opts.attention == "tiled") {
      mo.attention_decode_kernel = kernels::DecodeKernel::kTiled;
      mo.attention_prefill_kernel = kernels::PrefillKernel::kTiled;
    } else if (opts.attention == "warp-streamed") {
      mo.attention_decode_kernel = kernels::DecodeKernel::kWarpStreamed;
      mo.attention_prefill_kernel = kernels::PrefillKernel::kTiled;
    } else {
      mo.attention_decode_kernel = kernels::DecodeKernel::kTensorCore;
      mo.attention_prefill_kernel = kernels::PrefillKernel::kTensorCore;
    }
    mo.cuda_graphs = opts.cuda_graphs;
    mo.host_logits = false;
    mo.bench_skip_allreduce = opts.bench_skip_allreduce;
    mo.micro_batches = opts.micro_batches;
    mo.micro_batch_min_rows = opts.micro_batch_min_rows;
    mo.micro_batch_gemm_sm_margin = opts.micro_batch_sm_margin;
    std::vector<kernels::DeviceComm*> micro_comms;
    for (auto& c : b->micro_comms_) micro_comms.push_back(c.get());
    SYMTP_ASSIGN_OR_RETURN(model::GpuModel m,
                           model::GpuModel::Create(cfg, rank, opts.tp, b->device_, mo,
                                                   b->comm_.get(), micro_comms));
    b->model_.emplace(std::move(m));
    if (!opts.gemm_tune_out.empty()) SYMTP_RETURN_IF_ERROR(b->StartTuning());
    return b;
  }

  absl::Status Step(const model::BatchInput& in, absl::Span<const model::SamplingParams> params,
                    absl::Span<const int32_t> positions, std::vector<int32_t>* tokens,
                    BackendTimings* t) override {
    SYMTP_RETURN_IF_ERROR(Launch(in, params, positions, {}));
    return Collect(tokens, t);
  }

  absl::Status ForwardOnly(const model::BatchInput& in, BackendTimings* t) override {
    SYMTP_RETURN_IF_ERROR(Launch(in, {}, {}, {}));
    std::vector<int32_t> none;
    return Collect(&none, t);
  }

  // Enqueues the step and returns: the GPU may still be running the previous
  // one. Input tokens with prev_sample[i] >= 0 come from the previous step's
  // sampled tokens on the device (GpuModel's token_from_prev_sample).
  absl::Status Launch(const model::BatchInput& in, absl::Span<const model::SamplingParams> params,
                      absl::Span<const int32_t> positions,
                      absl::Span<const int32_t> prev_sample) override {
    (void)positions;  // the model derives them from the batch (same values)
    if (in_flight_ >= kMaxInFlight) {
      return absl::FailedPreconditionError(
          absl::StrCat("Launch with ", in_flight_, " steps in flight"));
    }
    std::optional<PairedAb::Step> tag;
    if (tune_) SYMTP_RETURN_IF_ERROR_CTX(TuneBeforeLaunch(in, &tag), "GEMM tuning");
    Slot& sl = slots_[launched_ % kSlots];
    sl.tune = tag;
    sl.fed = false;
    step_opts_.sampling.assign(params.begin(), params.end());
    step_opts_.copy_logits = false;
    step_opts_.token_from_prev_sample.assign(prev_sample.begin(), prev_sample.end());
    sl.host_t0 = MonotonicNs();
    CUDA_RETURN_IF_ERROR(cudaEventRecord(sl.start.get(), stream_.get()));
    SYMTP_RETURN_IF_ERROR(model_->Forward(in, stream_.get(), step_opts_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(sl.end.get(), stream_.get()));
    sl.model_step = model_->steps_enqueued() - 1;
    sl.sampled = !params.empty();
    ++launched_;
    ++in_flight_;
    return absl::OkStatus();
  }

  bool OldestDone() override {
    if (in_flight_ == 0) return true;
    return cudaEventQuery(slots_[collected_ % kSlots].end.get()) != cudaErrorNotReady;
  }

  absl::Status Collect(std::vector<int32_t>* tokens, BackendTimings* t) override {
    if (in_flight_ == 0) return absl::FailedPreconditionError("Collect with no step in flight");
    Slot& sl = slots_[collected_ % kSlots];
    SYMTP_RETURN_IF_ERROR(WaitWithComm(sl.end.get()));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, sl.start.get(), sl.end.get()));
    t->forward_ns = MonotonicNs() - sl.host_t0;
    t->device_forward_ns = static_cast<int64_t>(ms * 1e6);
    SYMTP_RETURN_IF_ERROR(FeedTuner(sl));
    t->device_idle_ns = 0;
    // GPU idle between the previous step's last op and this step's first
    // (negative, i.e. 0, when this step was queued before that one ended).
    if (collected_ > 0) {
      const Slot& prev = slots_[(collected_ - 1) % kSlots];
      float idle_ms = 0;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&idle_ms, prev.end.get(), sl.start.get()));
      // 1 ns: measured, none (0 means unknown).
      t->device_idle_ns = std::max<int64_t>(1, static_cast<int64_t>(idle_ms * 1e6));
    }
    if (sl.sampled) {
      absl::Span<const int32_t> out = model_->host_tokens_of(sl.model_step);
      tokens->assign(out.begin(), out.end());
    } else {
      tokens->clear();
    }
    ++collected_;
    --in_flight_;
    return absl::OkStatus();
  }

  absl::Status BroadcastBatch(void* data, size_t bytes, int root) override {
    if (opts_.tp == 1) return absl::OkStatus();
    if (bcast_.bytes() < bytes) {
      SYMTP_ASSIGN_OR_RETURN(bcast_,
                             cuda::DeviceBuffer::Create(std::max(bytes, bcast_.bytes() * 2)));
    }
    const int rank = comm_->rank();
    // v0: the root's host tensors go to its GPU, NCCL broadcasts them, and
    // the other ranks bring them to the host where the step input is built.
    if (rank == root) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(bcast_.get(), data, bytes, cudaMemcpyHostToDevice, stream_.get()));
    }
    const size_t count = (bytes + 1) / 2;
    SYMTP_RETURN_IF_ERROR(
        comm_->Broadcast(bcast_.get(), count, kernels::DType::kBF16, root, stream_.get()));
    if (rank != root) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(data, bcast_.get(), bytes, cudaMemcpyDeviceToHost, stream_.get()));
    }
    return SyncStream();
  }

  std::string Describe() const override {
    return absl::StrFormat(
        "cuda device %d, %s, weights %d MiB, kv cache %d MiB (%d blocks), micro-batches %s, "
        "buckets %d, graphs %s",
        device_, opts_.dtype, model_->weight_bytes() >> 20, model_->kv_cache_bytes() >> 20,
        model_->num_kv_blocks(),
        opts_.micro_batches == 0 ? std::string("auto") : absl::StrCat(opts_.micro_batches),
        opts_.buckets, opts_.cuda_graphs ? "on" : "off");
  }
  int num_kv_blocks() const override { return model_->num_kv_blocks(); }

  ~CudaBackend() override {
    if (tune_ && !tune_done_) {
      SYMTP_LOG(WARN, "worker") << "GEMM tuning did not finish: " << tune_step_ << " of "
                                << tune_->total_steps() + 1
                                << " decode steps of the steady batch ran; nothing written to "
                                << opts_.gemm_tune_out;
    }
    // The model (its streams may still reference the communicators) goes
    // first; a communicator with an error is aborted so nothing can hang.
    model_.reset();
    for (auto& c : micro_comms_) {
      if (!c->Poll().ok()) c->Abort();
    }
    if (comm_) {
      if (!comm_->Poll().ok()) comm_->Abort();
    }
  }

 private:
  struct Slot;
  CudaBackend() = default;

  // First asynchronous error of any communicator (a dead peer); aborts them
  // all on one, so no collective of another micro-batch can hang.
  absl::Status PollComms() {
    for (kernels::DeviceComm* c : AllComms()) {
      absl::Status st = c->Poll();
      if (!st.ok()) {
        AbortComms();
        return st;
      }
    }
    return absl::OkStatus();
  }
  void AbortComms() {
    for (kernels::DeviceComm* c : AllComms()) c->Abort();
  }
  std::vector<kernels::DeviceComm*> AllComms() const {
    std::vector<kernels::DeviceComm*> all;
    if (comm_) all.push_back(comm_.get());
    for (const auto& c : micro_comms_) all.push_back(c.get());
    return all;
  }

  // Waits for `ev` with the step deadline, polling the communicator so that a
  // dead peer is an error instead of a hang.
  absl::Status WaitWithComm(cudaEvent_t ev, const char* what = "GPU step") {
    Deadline d = Deadline::AfterNs(opts_.step_timeout_ms * 1'000'000);
    const int64_t spin_start = MonotonicNs();
    bool slow = false;
    for (int i = 0;; ++i) {
      cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) CUDA_RETURN_IF_ERROR(e);
      if ((i & 255) == 0) SYMTP_RETURN_IF_ERROR(PollComms());
      if (d.Expired()) {
        AbortComms();
        return absl::DeadlineExceededError(
            absl::StrCat(what, " did not complete before the step deadline"));
      }
      // Spin while a step is short (the host must notice completion within
      // a microsecond or two: that latency is GPU idle time); back off only
      // for long waits, where 50 us is noise.
      if (!slow && (i & 63) == 63) slow = MonotonicNs() - spin_start > 20'000'000;
      if (slow) usleep(50);
    }
    return absl::OkStatus();
  }

  // Waits for everything enqueued on the stream so far (v0's broadcast).
  absl::Status SyncStream() {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(sync_.get(), stream_.get()));
    return WaitWithComm(sync_.get(), "broadcast");
  }

  // ---- In-run GEMM tuning (--gemm-tune-out) ----
  // Decode steps of the steady batch run in PairedAb's schedule, each with
  // one of the model's GEMM plan sets (GpuModel::AddGemmSet; each set keeps
  // its own CUDA graphs, so switching costs nothing): the setup steps plan
  // every decode GEMM shape with autotuning in a set of their own; rank 0's
  // picks then go to every rank through a file and become set B (planned
  // from them as a table, so every rank runs the same algorithms); then
  // rounds A B B A of --gemm-tune-window steps each (default: one step)
  // alternate between set 0 (cuBLASLt's heuristic, A) and set B, the first
  // round untimed (each set's eager and capturing steps). After the last
  // round rank 0 decides (every rank follows it), writes the winning
  // algorithms to --gemm-tune-out, and the rest of the run keeps that set.
  enum class GemmArm { kHeuristic, kAutotune, kTable };

  absl::Status StartTuning() {
    PairedAbOptions o;
    o.setup_steps = JobOptions::kGemmTuneSetupSteps;
    o.window_steps = opts_.gemm_tune_window;
    o.discard_steps = 0;
    o.discard_rounds = 1;
    o.rounds = opts_.gemm_tune_rounds;
    o.margin = opts_.gemm_tune_margin;
    SYMTP_ASSIGN_OR_RETURN(PairedAb ab, PairedAb::Create(o));
    tune_.emplace(std::move(ab));
    // Shapes the output file already holds are kept (tune batch sizes one
    // run at a time into one table); a file that is not a usable table is
    // an error now, not after the run.
    std::error_code ec;
    if (std::filesystem::exists(opts_.gemm_tune_out, ec)) {
      absl::StatusOr<kernels::GemmTuningTable> t =
          kernels::GemmTuningTable::Load(opts_.gemm_tune_out);
      if (!t.ok()) return Annotate(t.status(), "--gemm-tune-out (an existing file)");
      SYMTP_ASSIGN_OR_RETURN(const kernels::GemmTuningIdentity here,
                             kernels::CurrentGemmTuningIdentity());
      SYMTP_RETURN_IF_ERROR_CTX(t->CheckUsableOn(here), "--gemm-tune-out (an existing file)");
      tune_base_ = *std::move(t);
    }
    // The power state during the comparison (NVML; without it, no readings).
    char bus[32] = {};
    CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof(bus), device_));
    absl::StatusOr<GpuPowerProbe> probe = GpuPowerProbe::Open(bus);
    if (probe.ok()) {
      power_probe_.emplace(*std::move(probe));
    } else {
      SYMTP_LOG(INFO, "worker") << "GEMM tuning without power readings: " << probe.status();
    }
    return absl::OkStatus();
  }

  // Picks the GEMM set of the step about to be launched.
  absl::Status TuneBeforeLaunch(const model::BatchInput& in, std::optional<PairedAb::Step>* tag) {
    // Only decode steps of the whole steady batch advance the schedule;
    // other steps (prefill, a partial batch) run with the set in use,
    // untimed.
    const int S = in.num_seqs();
    if (S == 0 || in.num_tokens() != S || static_cast<int>(in.sample_index.size()) != S) {
      return absl::OkStatus();
    }
    if (S != opts_.steady_batch) {
      ++tune_other_batch_steps_;
      return absl::OkStatus();
    }
    const int64_t i = tune_step_++;
    GemmArm want = final_arm_;
    if (i == 0) {
      SYMTP_ASSIGN_OR_RETURN(autotune_set_,
                             model_->AddGemmSet(nullptr, opts_.gemm_tune_candidates));
    }
    if (!tune_done_ && i < tune_->total_steps()) {
      const PairedAb::Step st = tune_->Plan(i);
      want = st.setup              ? GemmArm::kAutotune
             : st.arm == AbArm::kA ? GemmArm::kHeuristic
                                   : GemmArm::kTable;
      if (st.timed) *tag = st;
      // Every fourth timed step: is the GPU at its power cap?
      if (st.timed && power_probe_ && (i & 3) == 0) {
        absl::StatusOr<GpuPowerSample> ps = power_probe_->Read();
        if (ps.ok()) {
          ++power_samples_;
          power_capped_ += ps->power_capped() ? 1 : 0;
          sm_mhz_sum_ += ps->sm_clock_mhz;
          power_w_sum_ += ps->power_w;
          power_limit_w_ = ps->power_limit_w;
        }
      }
      if (!st.setup && autotune_set_ > 0) {
        // The setup is over: its picks become set B on every rank.
        SYMTP_RETURN_IF_ERROR(DrainLaunched());
        SYMTP_RETURN_IF_ERROR(ShareCandidates());
        SYMTP_RETURN_IF_ERROR(model_->UseGemmSet(0));
        SYMTP_RETURN_IF_ERROR(model_->DropGemmSet(autotune_set_));
        autotune_set_ = 0;
        SYMTP_ASSIGN_OR_RETURN(table_set_, model_->AddGemmSet(candidates_, 1));
      }
    } else if (!tune_done_) {
      SYMTP_RETURN_IF_ERROR(DrainLaunched());
      SYMTP_RETURN_IF_ERROR(FinishTuning());
      want = final_arm_;
      SYMTP_RETURN_IF_ERROR(model_->UseGemmSet(want == GemmArm::kTable ? table_set_ : 0));
      if (want != GemmArm::kTable) SYMTP_RETURN_IF_ERROR(model_->DropGemmSet(table_set_));
      return absl::OkStatus();
    }
    return model_->UseGemmSet(want == GemmArm::kAutotune ? autotune_set_
                              : want == GemmArm::kTable  ? table_set_
                                                         : 0);
  }

  // Waits for every launched step (they stay uncollected) and gives the
  // tuner their times.
  absl::Status DrainLaunched() {
    if (launched_ == collected_) return absl::OkStatus();
    SYMTP_RETURN_IF_ERROR(
        WaitWithComm(slots_[(launched_ - 1) % kSlots].end.get(), "GEMM tuning: launched steps"));
    for (int64_t k = collected_; k < launched_; ++k) {
      SYMTP_RETURN_IF_ERROR(FeedTuner(slots_[k % kSlots]));
    }
    return absl::OkStatus();
  }

  // A completed step's time, once, if the schedule times it.
  absl::Status FeedTuner(Slot& sl) {
    if (!tune_ || !sl.tune || sl.fed) return absl::OkStatus();
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, sl.start.get(), sl.end.get()));
    sl.fed = true;
    return tune_->Record(*sl.tune, 1e3 * ms);
  }

  // Rank 0's autotuned plans, saved next to the output; every rank loads
  // them (same algorithms everywhere, as with --gemm-tuning-file).
  absl::Status ShareCandidates() {
    const std::string path = opts_.gemm_tune_out + ".candidates";
    const Deadline d = Deadline::AfterNs(opts_.step_timeout_ms * 1'000'000);
    ShmPeerExchange ex(control_, rank_, opts_.tp);
    if (rank_ == 0) {
      SYMTP_ASSIGN_OR_RETURN(const kernels::GemmTuningTable picks,
                             model_->GemmPlans(autotune_set_));
      SYMTP_RETURN_IF_ERROR(picks.Save(path));
    }
    SYMTP_RETURN_IF_ERROR_CTX(ex.Barrier(d), "sharing the autotuned picks");
    SYMTP_ASSIGN_OR_RETURN(kernels::GemmTuningTable t, kernels::GemmTuningTable::Load(path));
    SYMTP_RETURN_IF_ERROR_CTX(ex.Barrier(d), "sharing the autotuned picks (loaded)");
    if (rank_ == 0) std::filesystem::remove(path);
    candidates_ = std::make_shared<const kernels::GemmTuningTable>(std::move(t));
    return absl::OkStatus();
  }

  // Rank 0's verdict for everyone; rank 0 writes the table and a summary.
  absl::Status FinishTuning() {
    tune_done_ = true;
    const absl::StatusOr<PairedAb::Result> r = tune_->Decide();
    struct Verdict {
      int32_t ok = 0;
      int32_t table_wins = 0;
    } mine, all[kMaxRanks];
    mine.ok = r.ok();
    mine.table_wins = r.ok() && r->winner == AbArm::kB;
    ShmPeerExchange ex(control_, rank_, opts_.tp);
    SYMTP_RETURN_IF_ERROR_CTX(ex.AllGather(&mine, sizeof(mine), all,
                                           Deadline::AfterNs(opts_.step_timeout_ms * 1'000'000)),
                              "agreeing on the verdict");
    if (!r.ok()) return r.status();
    if (!all[0].ok) return absl::FailedPreconditionError("rank 0 could not decide");
    final_arm_ = all[0].table_wins ? GemmArm::kTable : GemmArm::kHeuristic;
    if (rank_ != 0) return absl::OkStatus();

    if (!candidates_) return absl::InternalError("GEMM tuning finished without its picks");
    // Set 0's algorithms for the shapes tuned (it also planned prefill's).
    SYMTP_ASSIGN_OR_RETURN(const kernels::GemmTuningTable set0, model_->GemmPlans(0));
    kernels::GemmTuningTable heuristic(set0.identity());
    for (const auto& [key, e] : candidates_->entries()) {
      if (const kernels::GemmTuningEntry* h = set0.Find(key)) heuristic.Put(key, *h);
    }
    const kernels::GemmTuningTable& won = all[0].table_wins ? *candidates_ : heuristic;
    kernels::GemmTuningTable out =
        tune_base_ ? *tune_base_ : kernels::GemmTuningTable(won.identity());
    for (const auto& [key, e] : won.entries()) out.Put(key, e);
    SYMTP_RETURN_IF_ERROR(out.Save(opts_.gemm_tune_out));
    // Which picks differ from the heuristic's algorithms.
    std::string differ;
    int n_differ = 0;
    for (const auto& [key, e] : candidates_->entries()) {
      const kernels::GemmTuningEntry* h = heuristic.Find(key);
      if (h != nullptr && h->algo == e.algo) continue;
      ++n_differ;
      absl::StrAppendFormat(&differ,
                            "%s    {\"shape\": \"%s\", \"pick\": \"%s\", \"pick_us\": %.3f, "
                            "\"heuristic_us\": %.3f}",
                            n_differ > 1 ? ",\n" : "", kernels::DescribeGemmKey(key), e.description,
                            e.pick_us, e.heuristic_us);
    }
    const std::string verdict = PairedAb::Describe(*r, opts_.gemm_tune_margin);
    // Arms that alternate every few steps run at one clock: at a power cap a
    // run with only the winner may gain less (its speed lowers the clock).
    std::string power = "no readings", power_json = "null";
    const bool capped = power_samples_ > 0 && 2 * power_capped_ >= power_samples_;
    if (power_samples_ > 0) {
      const double n = power_samples_;
      power = absl::StrFormat(
          "SM clock %.0f MHz, %.0f of %.0f W, at the power cap in %d of %d readings%s",
          sm_mhz_sum_ / n, power_w_sum_ / n, power_limit_w_, power_capped_, power_samples_,
          capped ? ": both arms ran at one power-capped clock, so a run with only the faster set "
                   "may gain less (check with separate runs)"
                 : "");
      power_json = absl::StrFormat(
          "{\"sm_clock_mhz\": %.0f, \"power_w\": %.1f, \"power_limit_w\": %.1f, "
          "\"power_capped_readings\": %d, \"readings\": %d}",
          sm_mhz_sum_ / n, power_w_sum_ / n, power_limit_w_, power_capped_, power_samples_);
    }
    SYMTP_LOG(INFO, "worker") << "GEMM tuning at batch " << opts_.steady_batch
                              << ": picks (B) vs heuristic (A), at one clock: " << verdict << "; "
                              << n_differ << " of " << candidates_->size()
                              << " shapes picked another algorithm; wrote "
                              << (all[0].table_wins ? "the picks" : "the heuristic's algorithms")
                              << " to " << opts_.gemm_tune_out << "; power: " << power;
    std::string rounds;
    for (size_t k = 0; k < r->ratio.size(); ++k) {
      absl::StrAppendFormat(&rounds,
                            "%s    {\"heuristic_us\": %.1f, \"picks_us\": %.1f, \"ratio\": %.5f}",
                            k ? ",\n" : "", r->a_median[k], r->b_median[k], r->ratio[k]);
    }
    // Every timed step, per window: to check afterwards what the verdict
    // rests on (e.g. B after A against B after B).
    std::string windows;
    for (size_t w = 0; w < tune_->values().size(); ++w) {
      if (tune_->values()[w].empty()) continue;
      absl::StrAppendFormat(&windows, "%s[\"%s\"", windows.empty() ? "" : ", ",
                            AbArmName(PairedAb::WindowArm(static_cast<int>(w))));
      for (double v : tune_->values()[w]) absl::StrAppendFormat(&windows, ", %.1f", v);
      windows += "]";
    }
    std::ofstream js(opts_.gemm_tune_out + ".json");
    js << absl::StrFormat(
        "{\n  \"batch\": %d,\n  \"tp\": %d,\n  \"winner\": \"%s\",\n  \"median_ratio\": %.5f,\n"
        "  \"margin\": %.4f,\n  \"window_steps\": %d,\n  \"timed_steps\": [%d, %d],\n"
        "  \"steps_of_other_batches\": %d,\n  \"rounds\": [\n%s\n  ],\n  \"differing_picks\": "
        "[\n%s\n  ],\n"
        "  \"verdict\": \"%s\",\n  \"power\": %s,\n  \"windows\": [%s]\n}\n",
        opts_.steady_batch, opts_.tp, all[0].table_wins ? "picks" : "heuristic", r->median_ratio,
        opts_.gemm_tune_margin, opts_.gemm_tune_window, r->samples_a, r->samples_b,
        tune_other_batch_steps_, rounds, differ, verdict, power_json, windows);
    if (!js) {
      return absl::UnavailableError(absl::StrCat("writing ", opts_.gemm_tune_out, ".json failed"));
    }
    return absl::OkStatus();
  }

  JobOptions opts_;
  int device_ = 0;
  int rank_ = 0;
  ControlBlock* control_ = nullptr;
  std::optional<PairedAb> tune_;
  GemmArm final_arm_ = GemmArm::kHeuristic;
  int autotune_set_ = 0, table_set_ = 0;  // GpuModel GEMM sets (0: none)
  int64_t tune_step_ = 0;
  int tune_other_batch_steps_ = 0;
  bool tune_done_ = false;
  std::shared_ptr<const kernels::GemmTuningTable> candidates_;
  std::optional<kernels::GemmTuningTable> tune_base_;
  std::optional<GpuPowerProbe> power_probe_;
  int power_samples_ = 0, power_capped_ = 0;
  double sm_mhz_sum_ = 0, power_w_sum_ = 0, power_limit_w_ = 0;
  std::unique_ptr<kernels::DeviceComm> comm_;
  std::vector<std::unique_ptr<kernels::DeviceComm>> micro_comms_;  // micro-batches 1, 2, ...
  std::optional<model::GpuModel> model_;
  cuda::Stream stream_;
  cuda::Event sync_;  // SyncStream's
  // Per launched step (a ring; at most kMaxInFlight in flight, and the
  // previous collected step's events stay intact for the idle measurement).
  struct Slot {
    cuda::Event start, end;
    int64_t model_step = 0;
    int64_t host_t0 = 0;
    bool sampled = false;
    std::optional<PairedAb::Step> tune;  // timed by the GEMM tuning
    bool fed = false;                    // its time went to the tuner
  };
  static constexpr int kSlots = 4;
  static_assert(kSlots >= kMaxInFlight + 2);
  Slot slots_[kSlots];
  int64_t launched_ = 0, collected_ = 0;
  cuda::DeviceBuffer bcast_;
  model::StepOptions step_opts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const JobOptions& opts,
                                                           const model::ModelConfig& cfg, int rank,
                                                           int device, JobHandle* job) {
  SYMTP_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b,
                         CudaBackend::Create(opts, cfg, rank, device, job));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace symtp::runtime

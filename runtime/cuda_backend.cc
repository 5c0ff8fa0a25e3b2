// The CUDA backend of a worker: GpuModel on this rank's GPU, NCCL (and the
// custom one-shot all-reduce below the crossover) for the tensor-parallel
// collectives, bootstrapped through the job's shared memory.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/allreduce/dispatcher.h"
#include "kernels/allreduce/peer_exchange.h"
#include "kernels/nccl/nccl_comm.h"
#include "models/cuda/gpu_model.h"
#include "runtime/backend.h"
#include "runtime/job_sizing.h"
#include "runtime/shm_barrier.h"
#include "runtime/v0.h"

namespace symtp::runtime {
namespace {

// --exchange-transport resolved. The copy engines send each chunk to every
// peer (one-shot), so their bytes grow with TP - 1: they hide part of the
// all-reduce at TP 2 and lose at TP 4, where the all-reduce kernels on a side
// stream gain (llama-8b prefill on H100 x2 / x4:
// bench/results/h100x2/copy_exchange/, bench/results/h100x4/copy_exchange_tp4/,
// bench/results/h100x4/exchange_allreduce/).
model::ExchangeTransport ExchangeTransportFor(const JobOptions& opts) {
  const bool copy = opts.exchange_transport == ExchangeTransport::kAuto
                        ? opts.tp == 2
                        : opts.exchange_transport == ExchangeTransport::kCopy;
  return copy ? model::ExchangeTransport::kCopy : model::ExchangeTransport::kAllReduce;
}

// --exchange-min-rows resolved: -1 picks by TP (two chunks pay from 2048 rows
// at TP 2 and from 4096 at TP 4; TP 8 was not measured).
int ExchangeMinRows(const JobOptions& opts) {
  if (opts.exchange_min_rows >= 0) return opts.exchange_min_rows;
  return opts.tp == 2 ? 2048 : opts.tp == 4 ? 4096 : 0;
}

// The exchange as the worker's start-up line names it.
const char* ExchangeName(const JobOptions& opts) {
  if (ExchangeMinRows(opts) <= 0) return "off";
  return ExchangeTransportFor(opts) == model::ExchangeTransport::kCopy ? "copy" : "allreduce";
}

// --custom-allreduce-max-bytes resolved: -1 picks by TP. The capacity covers
// decode's row-parallel messages (rows x hidden x 2 bytes: 4 MiB at batch 512
// of a 4096-wide model); at TP 4 also prefill's 16 MiB messages and exchange
// chunks, which the two-shot kernel all-reduces faster than NCCL there
// (llama-8b / 70b prefill on H100 x4: bench/results/h100x4/exchange_allreduce/).
// TP 2 and 8 keep 8 MiB (16 MiB not measured there).
size_t CustomAllReduceMaxBytes(const JobOptions& opts) {
  if (opts.custom_allreduce_max_bytes >= 0) {
    return static_cast<size_t>(opts.custom_allreduce_max_bytes);
  }
  return static_cast<size_t>(opts.tp == 4 ? 16 : 8) << 20;
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

class CudaBackend : public Backend, public BatchBroadcast {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const JobOptions& opts,
                                                             const model::ModelConfig& cfg,
                                                             int rank, int device, JobHandle* job) {
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend());
    b->opts_ = opts;
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
      // NCCL unique id from rank 0 to everyone through the exchange area.
      ncclUniqueId id{};
      if (rank == 0) {
        SYMTP_ASSIGN_OR_RETURN(id, kernels::NcclComm::NewUniqueId());
      }
      std::vector<ncclUniqueId> ids(opts.tp);
      SYMTP_RETURN_IF_ERROR_CTX(exchange.AllGather(&id, sizeof(id), ids.data(), boot), "NCCL id");
      SYMTP_ASSIGN_OR_RETURN(std::unique_ptr<kernels::NcclComm> nccl,
                             kernels::NcclComm::Create(ids[0], rank, opts.tp, b->device_, boot));
      if (opts.allreduce == AllReduce::kNccl) {
        b->comm_ = std::move(nccl);
      } else {
        kernels::AllReduceDispatcher::Options o;
        o.calibrate = opts.allreduce == AllReduce::kAuto;
        // Above the calibrated crossover, or the capacity, NCCL.
        const size_t cap = CustomAllReduceMaxBytes(opts);
        o.crossover_bytes = opts.allreduce == AllReduce::kCustom ? cap : opts.crossover_bytes;
        o.max_custom_bytes = cap;
        if (opts.custom_allreduce_ll_max_bytes > 0) {
          o.custom.ll_max_bytes = static_cast<size_t>(opts.custom_allreduce_ll_max_bytes);
          o.custom.fused_ll_max_bytes = o.custom.ll_max_bytes;
        }
        if (opts.custom_allreduce_ll128_max_bytes >= 0) {
          o.custom.ll128_max_bytes = static_cast<size_t>(opts.custom_allreduce_ll128_max_bytes);
        }
        if (opts.custom_allreduce_two_shot_min_bytes >= 0) {  // 0: never
          o.custom.two_shot_min_bytes =
              static_cast<size_t>(opts.custom_allreduce_two_shot_min_bytes);
        }
        const int exchange_min_rows = ExchangeMinRows(opts);
        if (exchange_min_rows > 0 && opts.max_batched_tokens >= exchange_min_rows &&
            ExchangeTransportFor(opts) == model::ExchangeTransport::kCopy) {
          // Receive slots for a whole step's rows.
          o.custom.copy_bytes = static_cast<size_t>(opts.max_batched_tokens) * cfg.hidden *
                                DTypeSize(opts.dtype);
        }
        SYMTP_ASSIGN_OR_RETURN(
            auto d, kernels::AllReduceDispatcher::Create(rank, opts.tp, b->device_, std::move(nccl),
                                                         &exchange, boot, o));
        SYMTP_LOG(INFO, "worker") << "rank " << rank << " all-reduce: " << d->Describe();
        b->comm_ = std::move(d);
      }
    }
    model::GpuModelOptions mo;
    mo.dtype = opts.dtype;
    // KV cache: --kv-cache-fraction of the memory left after the weights,
    // --kv-cache-mib, or what the workload needs (NumKvBlocks).
    mo.kv_cache_memory_fraction = opts.kv_cache_fraction;
    mo.num_kv_blocks = opts.kv_cache_fraction > 0 ? 0
                       : opts.kv_cache_mib > 0
                           ? KvBlocksForBytes(cfg, rank, opts.tp, DTypeSize(opts.dtype),
                                              opts.kv_cache_mib * 1048576.0)
                           : NumKvBlocks(opts, cfg);
    if (opts.kv_cache_fraction <= 0 && mo.num_kv_blocks < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--kv-cache-mib %g holds no KV block on rank %d", opts.kv_cache_mib, rank));
    }
    mo.max_batch_tokens = opts.max_batched_tokens;
    mo.max_seqs = opts.steady_batch > 0 ? std::max(opts.steady_batch, 1) : opts.max_batch;
    mo.exchange_min_rows = ExchangeMinRows(opts);
    mo.exchange_transport = ExchangeTransportFor(opts);
    const bool tiled = opts.attention == Attention::kTiled;
    mo.attention_decode_kernel = tiled ? kernels::DecodeKernel::kTiled : kernels::DecodeKernel::kTensorCore;
    mo.attention_prefill_kernel = tiled ? kernels::PrefillKernel::kTiled : kernels::PrefillKernel::kTensorCore;
    mo.cuda_graphs = opts.cuda_graphs;
    mo.host_logits = false;
    mo.fuse_allreduce_norm = opts.fuse_allreduce_norm;
    mo.gemv_max_rows = opts.gemv_max_rows;
    mo.gemv_allreduce_push = opts.gemv_allreduce_push;
    mo.gemv_swiglu = opts.gemv_swiglu;
    mo.defer_norm = opts.defer_norm;
    // The candidates' all-gather needs every rank to sample the step with the
    // same parameters: v1's workers do; v0 samples on rank 0 alone.
    mo.sharded_sampling = opts.sharded_sampling && opts.mode == Mode::kV1;
    mo.bench_skip_allreduce = opts.bench_skip_allreduce;
    SYMTP_ASSIGN_OR_RETURN(
        model::GpuModel m,
        model::GpuModel::Create(cfg, rank, opts.tp, b->device_, mo, b->comm_.get()));
    b->model_.emplace(std::move(m));
    if (opts.gpu_warmup) {
      const int64_t t0 = MonotonicNs();
      SYMTP_RETURN_IF_ERROR_CTX(b->model_->WarmUp(b->stream_.get(), boot),
                                absl::StrCat("rank ", rank, " GPU warm-up"));
      SYMTP_LOG(INFO, "worker") << absl::StrFormat("rank %d warm-up: %.0f ms", rank,
                                                   (MonotonicNs() - t0) / 1e6);
    }
    return b;
  }

  absl::Status Step(const model::BatchInput& in, absl::Span<const model::SamplingParams> params,
                    absl::Span<const int32_t> positions, std::vector<int32_t>* tokens,
                    BackendTimings* t) override {
    SYMTP_RETURN_IF_ERROR(Launch(in, params, positions, {}));
    return Collect(tokens, t);
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
    Slot& sl = slots_[launched_ % kSlots];
    step_opts_.sampling.assign(params.begin(), params.end());
    step_opts_.copy_logits = false;
    step_opts_.token_from_prev_sample.assign(prev_sample.begin(), prev_sample.end());
    sl.host_t0 = MonotonicNs();
    CUDA_RETURN_IF_ERROR(cudaEventRecord(sl.start.get(), stream_.get()));
    const int64_t replays = model_->graph_stats().replays;
    SYMTP_RETURN_IF_ERROR(model_->Forward(in, stream_.get(), step_opts_));
    sl.graph = model_->graph_stats().replays > replays;
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
    t->device_idle_ns = 0;
    t->graph = sl.graph;
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

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
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
        comm_->Broadcast(bcast_.get(), count, DType::kBF16, root, stream_.get()));
    if (rank != root) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(data, bcast_.get(), bytes, cudaMemcpyDeviceToHost, stream_.get()));
    }
    return SyncStream();
  }
  absl::StatusOr<void*> HostBuffer(size_t bytes) override {
    if (host_buffer_.bytes() < bytes) {
      host_buffer_ = {};  // free the old one first
      SYMTP_ASSIGN_OR_RETURN(host_buffer_, cuda::PinnedBuffer::Create(bytes + bytes / 2));
    }
    return host_buffer_.get();
  }

  std::string Describe() const override {
    return absl::StrFormat(
        "cuda device %d, %s, weights %d MiB, kv cache %d MiB (%d blocks), exchange-min-rows %d "
        "(%s), decode graphs %s",
        device_, Name(opts_.dtype), model_->weight_bytes() >> 20, model_->kv_cache_bytes() >> 20,
        model_->num_kv_blocks(), ExchangeMinRows(opts_), ExchangeName(opts_),
        opts_.cuda_graphs
            ? absl::StrCat("at batch ", absl::StrJoin(model_->graph_batch_sizes(), ","))
            : std::string("off"));
  }
  std::string RunStats() const override {
    if (!opts_.cuda_graphs) return {};
    const model::GraphStats g = model_->graph_stats();
    return absl::StrFormat(
        "CUDA graphs: %d steps replayed, %d captured, %d failed to capture, %d steps eager "
        "(prefill and mixed steps, a batch size's first step, decode batches above the largest "
        "graph)",
        g.replays, g.captures, g.capture_failures, g.eager_steps);
  }
  int num_kv_blocks() const override { return model_->num_kv_blocks(); }

  ~CudaBackend() override {
    if (comm_) {
      if (!comm_->Poll().ok()) comm_->Abort();
    }
  }

 private:
  CudaBackend() = default;

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
      if (comm_ && (i & 255) == 0) SYMTP_RETURN_IF_ERROR(comm_->Poll());
      if (d.Expired()) {
        if (comm_) comm_->Abort();
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

  JobOptions opts_;
  int device_ = 0;
  std::unique_ptr<kernels::DeviceComm> comm_;
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
    bool graph = false;  // Forward replayed (or captured and launched) a graph
  };
  static constexpr int kSlots = 4;
  static_assert(kSlots >= kMaxInFlight + 2);
  Slot slots_[kSlots];
  int64_t launched_ = 0, collected_ = 0;
  cuda::DeviceBuffer bcast_;
  cuda::PinnedBuffer host_buffer_;  // v0's batch tensors (HostBuffer)
  model::StepOptions step_opts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const JobOptions& opts,
                                                           const model::ModelConfig& cfg, int rank,
                                                           int device, JobHandle* job,
                                                           BatchBroadcast** v0) {
  SYMTP_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b,
                         CudaBackend::Create(opts, cfg, rank, device, job));
  if (v0 != nullptr) *v0 = b.get();
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace symtp::runtime

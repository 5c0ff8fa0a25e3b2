// GpuModel: one tensor-parallel rank of the docs/MODEL.md model on one GPU.
//
// Everything is planned once in Create(): the weight shard (generated on the
// device, bit-exact with the CPU reference's fp32 weights, or rounded once to
// bf16), the paged KV cache, persistent device input buffers, pinned staging
// and output buffers, and the workspaces. A step then:
//
//   1. validates the BatchInput on the host and packs it into one of two
//      pinned staging slots (the slot's previous copy has long completed; the
//      wait for it has a deadline);
//   2. copies it asynchronously into the persistent device inputs on `stream`;
//   3. runs the forward pass on `stream` (cuBLASLt GEMMs, the kernels of
//      kernels/ops, the row-parallel all-reduces of wo / w_down through the
//      DeviceComm, the vocab-parallel all-gather of the logits), eagerly or,
//      for a steady decode batch, by replaying a CUDA graph captured for its
//      padded batch size;
//   4. optionally samples on the device (tokens stay in a device buffer the
//      next step can read directly) and copies tokens / logits to pinned host
//      memory asynchronously, then records the step's done-event.
//
// Row-parallel layers (wo, w_down) run their GEMM, then the all-reduce with
// the residual add and the next RMSNorm fused where the communicator can. A
// step of at least GpuModelOptions::exchange_min_rows rows instead runs them
// in row chunks (the mission's buckets): chunk c's all-reduce runs on a side
// stream (a copy-engine send, or the communicator's all-reduce), entered and
// left by CUDA events, while chunk c+1's GEMM runs on `stream`. No
// device-wide synchronization anywhere in a step.
//
// Thread-compatibility: one thread drives a GpuModel. Every call makes
// `device` current on the calling thread.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "kernels/comm.h"
#include "kernels/ops/attention.h"
#include "models/batch.h"
#include "models/config.h"
#include "models/sampling.h"
#include "models/sharding.h"

namespace symtp::model {

enum class ExchangeTransport { kCopy, kAllReduce };

struct GpuModelOptions {
  // Activations, weights and KV cache: kF32 or kBF16 (GEMMs accumulate fp32).
  kernels::DType dtype = kernels::DType::kBF16;
  // KV cache size: exactly num_kv_blocks blocks per layer when > 0, else
  // kv_cache_memory_fraction of the device memory still free after every
  // other allocation.
  int num_kv_blocks = 0;
  double kv_cache_memory_fraction = 0.5;
  // Capacities: tokens per step, sequences per step, sampled rows per step
  // (0: max_seqs).
  int max_batch_tokens = 2048;
  int max_seqs = 256;
  int max_sampled_rows = 0;
  // Steps of at least exchange_min_rows rows (TP > 1) split each layer's
  // row-parallel outputs into two row chunks: chunk 0's all-reduce runs on a
  // side stream beside chunk 1's GEMM, and the layer runs chunk by chunk
  // from the O projection to the next layer's QKV GEMM, so only the
  // attention waits for both. Each chunk's GEMMs read the weights again, so
  // the chunks must stay compute bound: on H100 x2 (llama-8b, TP 2) two
  // chunks gained from 2048 rows on and lost at 512, and more chunks gained
  // less (bench/results/h100x2/copy_exchange/). 0: off.
  int exchange_min_rows = 2048;
  // kCopy: each chunk sent to every peer by the copy engines (no SMs) and
  // summed by the residual + RMSNorm kernel (needs a communicator with a
  // copy exchange large enough, kernels::DeviceComm::CopyExchangeBytes).
  // Its bytes grow with TP - 1: it pays at TP 2 and loses at TP 4
  // (bench/results/h100x4/copy_exchange_tp4/). kAllReduce: the
  // communicator's all-reduce of each chunk on a side stream of the greatest
  // priority, then AddRmsNorm; it shares the SMs with the GEMM beside it and
  // pays at TP 4 from 4096 rows (bench/results/h100x4/exchange_allreduce/).
  ExchangeTransport exchange_transport = ExchangeTransport::kCopy;
  // Run each row-parallel all-reduce together with the residual add and
  // RMSNorm after it as one kernel where the communicator can
  // (DeviceComm::FusesResidualNorm: the custom all-reduce's sizes); false:
  // the all-reduce, then AddRmsNorm.
  bool fuse_allreduce_norm = true;
  // Decode batches (one token per sequence, every sequence sampled in
  // order) of up to the largest graph batch size are padded to the next
  // graph batch size (eager too, so graph and eager compute the same bits);
  // with cuda_graphs, the second step of a padded size captures a graph and
  // later steps replay it (the first runs eagerly: NCCL and cuBLASLt set up
  // lazily). Empty: 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256,
  // 320, 384, 448, 512 up to max_seqs, and the largest decode batch the
  // options allow (max_seqs, or fewer tokens or sampled rows) where it is
  // below 512 and not among them; larger batches run eagerly.
  bool cuda_graphs = true;
  std::vector<int> graph_batch_sizes;
  // Copy the logits to pinned host memory (allocates max_sampled_rows x
  // vocab floats of pinned memory).
  bool host_logits = true;
  // TP > 1, steps that sample on the device without copying the logits, and
  // whose rows are all greedy or top-k with top_k <= kernels::
  // kSampleExactCap: each rank keeps its vocabulary shard's top candidates
  // and only those are all-gathered (kernels::SelectShardCandidates), the
  // same tokens as gathering every logit. Other steps gather the logits.
  // Every rank must then sample the same steps with the same parameters (a
  // rank that does not sample would gather logits while the others gather
  // candidates: the collective would not match).
  bool sharded_sampling = true;
  // Split-K chunk of decode attention, in positions: the smallest chunk when
  // attention_balance_splits, else the chunk of every decode step.
  int attention_split_chunk = 256;
  // With the tensor-core decode kernel in bf16, plan each decode step's
  // chunk from its context lengths (kernels::PlanDecodeSplitChunk: split
  // until the blocks fill the decode kernel's resident slots, no split when
  // two splits would pass them). The tiled
  // kernel keeps the fixed chunk: on an H200 it ran slower with fewer splits
  // at batch 32-64.
  bool attention_balance_splits = true;
  // Attention kernels (kernels/ops/attention.h) of decode steps and of
  // every other step; kTensorCore applies to bf16 (fp32 runs kTiled).
  kernels::DecodeKernel attention_decode_kernel = kernels::DecodeKernel::kTensorCore;
  kernels::PrefillKernel attention_prefill_kernel = kernels::PrefillKernel::kTensorCore;
  size_t gemm_workspace_bytes = size_t{32} << 20;
  // GEMMs with fewer rows than this run without the workspace, so cuBLASLt's
  // heuristic picks a kernel that needs no separate split-K reduction: at
  // decode's M <= 128 those were as fast or faster in a CUDA graph on an
  // H100 (llama-8b TP=2 qkv 11.9 vs 14.7 us at M = 32, TP=1 down 44.8 vs
  // 53.2 us at M = 128), and a step saves two reduction launches per layer;
  // at M = 256 the split-K kernels win again (gate_up). 0: always use it.
  int gemm_workspace_min_rows = 129;
  // bf16 GEMMs of at most this many rows (<= kernels::kGemvMaxRows) run
  // kernels::Gemv, which streams the weights on every SM and starts reading
  // them while the kernel before it finishes; 0: cuBLASLt always.
  int gemv_max_rows = 4;
  // A row-parallel GEMM that runs Gemv before a fused custom all-reduce +
  // RMSNorm (LL) sends its output to every rank itself (kernels::GemvPush),
  // so the fused kernel only receives, and without waiting for the GEMV to
  // complete (llama-8b decode batch 1-4: 0.965-0.985x the step at TP 2,
  // 0.979-0.982x at TP 4; bench/results/h100x2/gemv_allreduce_push/).
  bool gemv_allreduce_push = true;
  // Where the gate/up GEMM runs Gemv, it applies SwiGLU's activation as it
  // flushes (kernels::GemvSwiGlu, the same bits) and no SiluMul kernel runs
  // (llama-8b decode batch 1 / 2 / 4: 0.991 / 0.986 / 0.973x the step at TP 2,
  // batch 1 / 4: 0.985 / 0.966x at TP 4; bench/results/h100x2/gemv_swiglu/).
  bool gemv_swiglu = true;
  // TP 1, bf16: each layer's RMSNorm weights are folded into the QKV and
  // gate/up weights at start-up (rounded to bf16), and a step of at most 128
  // rows runs no AddRmsNorm kernel before the final norm: the O and down
  // GEMMs add their products to the residual stream in their epilogue, the
  // QKV and gate/up GEMMs read the residual stream, and each row's norm
  // factor is applied to their output by the GEMV itself where it runs
  // (kernels::GemmArgs::a_rms_eps), else by the RoPE and SiLU kernels after
  // them (kernels::DeferredNorm). Longer steps run the AddRmsNorm kernels
  // with the folded (unit) weights. Two kernels fewer per layer.
  bool defer_norm = true;
  // Benchmark only: skip the row-parallel all-reduces (wrong results for
  // TP > 1) to measure how much of them the copy exchange hides. With it, a
  // TP > 1 shard may also run alone (no DeviceComm: one rank's kernels on
  // one GPU, e.g. to time its GEMM shapes); it then samples from its own
  // vocabulary shard, skipping the LM-head all-gather.
  bool bench_skip_allreduce = false;
};

struct StepOptions {
  // One entry per in.sample_index entry: sample those rows on the device
  // (token position = positions[sample_index[i]] + 1, the sequence length
  // before the sampled token is appended). Empty: no sampling, logits only.
  std::vector<SamplingParams> sampling;
  // Copy this step's logits to pinned host memory (needs
  // GpuModelOptions::host_logits).
  bool copy_logits = true;
  // Empty, or one entry per token: >= 0 replaces tokens[t] with the token
  // the previous step sampled for its row j (read on the device, never
  // through the host); -1 keeps the host token.
  std::vector<int32_t> token_from_prev_sample;
};

// Per-class device time of the last profiled step (eager steps only).
struct StepProfile {
  double gemm_ms = 0;          // column-parallel GEMMs and the LM head
  double attention_ms = 0;     // paged attention (+ split-K merge)
  double row_parallel_ms = 0;  // wo / w_down GEMMs and their all-reduces
  double other_ms = 0;         // norms, RoPE, KV write, SiLU, sampling, gathers
  double total_ms = 0;
};

struct GraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t capture_failures = 0;
  int64_t eager_steps = 0;
  int64_t sharded_sampling_steps = 0;  // steps sampled from the shards' candidates
  int64_t exchange_steps = 0;          // steps run over the exchange's row chunks
};

class GpuModel {
 public:
  // `comm` (nullptr or size 1: TP = 1) must have rank() == tp_rank and
  // size() == tp_size and outlive the model. Errors: InvalidArgument
  // (config, TP, comm, options, unsupported head_dim), ResourceExhausted
  // (device memory), CUDA errors.
  static absl::StatusOr<GpuModel> Create(const ModelConfig& cfg, int tp_rank, int tp_size,
                                         int device, const GpuModelOptions& options,
                                         kernels::DeviceComm* comm);

  GpuModel(GpuModel&&) noexcept;
  GpuModel& operator=(GpuModel&&) noexcept;
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;
  ~GpuModel();

  // Enqueues one step on `stream` (a non-default stream; every rank of a TP
  // group calls Forward with the same batch and options). Returns once the
  // work is enqueued; outputs are ready after WaitForStep() (or once
  // step_done_event() completes) and stay valid until the next Forward.
  // Errors: InvalidArgument (batch over capacity or invalid), CUDA / comm
  // errors.
  absl::Status Forward(const BatchInput& in, cudaStream_t stream,
                       const StepOptions& options = StepOptions());

  // Runs, once and eagerly, the step shapes a job meets first: a prefill of
  // max_batch_tokens rows over up to 8 sequences (the exchange's row chunks
  // where they apply), then a decode step at each CUDA graph batch size over
  // up to 512 keys a sequence, sampling greedy and top-k / top-p rows; then
  // the layer GEMMs and the LM head alone over a ladder of row counts (every
  // 8 rows to 2048, every 64 above). A shape's first cuBLASLt call costs
  // host time that stalls the GPU: the library's first heuristic query per
  // output type (40-110 ms), about 0.2 ms a new shape's heuristic and about
  // 2.5 ms a kernel's first launch. Paid here, it is out of the first
  // requests' latency. It writes only KV cache
  // blocks (every real position is written before it is read), captures and
  // counts no graph, leaves graph_stats() as it was and starts the step count
  // again at 0. Every rank of a TP group calls it (its steps all-reduce).
  // Skipped in a kernel-trace build while recording (the timeline starts at
  // the first real step).
  absl::Status WarmUp(cudaStream_t stream, Deadline deadline);

  // Blocks until the last step's outputs are on the host, or the deadline
  // (DeadlineExceeded). Surfaces asynchronous CUDA errors.
  absl::Status WaitForStep(Deadline deadline);
  cudaEvent_t step_done_event() const;

  // The last step's outputs (host: after WaitForStep).
  int num_sampled() const;
  absl::Span<const float> host_logits() const;    // [num_sampled, vocab] if copied
  absl::Span<const int32_t> host_tokens() const;  // [num_sampled] if sampled
  // Tokens of step `step` (0-based count of Forward calls) on the host, once
  // an event recorded after that Forward completed; valid until Forward
  // number step + 2 is enqueued (the two newest steps have their own
  // buffers, so a caller can read step t while step t + 1 runs). Empty if
  // the step did not sample or is out of that window.
  absl::Span<const int32_t> host_tokens_of(int64_t step) const;
  int64_t steps_enqueued() const;
  // [num_sampled, vocab], fp32; after a step that gathered the logits (not
  // one that sampled from the shards' candidates: sharded_sampling).
  const float* device_logits() const;
  const int32_t* device_tokens() const;  // [num_sampled]

  // Per-class timing with events around each op of eager steps (adds event
  // records; replayed graph steps are not profiled).
  void set_profiling(bool on);
  // Of the last profiled step; call after WaitForStep.
  absl::StatusOr<StepProfile> LastStepProfile();
  GraphStats graph_stats() const;
  // The decode batch sizes that get a CUDA graph (GpuModelOptions::
  // graph_batch_sizes as this model applies them), ascending; empty without
  // cuda_graphs.
  std::vector<int> graph_batch_sizes() const;
  // Test hook: the next CUDA graph capture fails with `status` after its step
  // has been recorded (the capture is ended and discarded as for any failed
  // capture), so that batch shape runs eagerly from then on.
  void FailNextCaptureForTesting(absl::Status status);

  const ModelConfig& config() const;
  const ShardLayout& layout() const;
  const GpuModelOptions& options() const;
  int num_kv_blocks() const;
  size_t weight_bytes() const;
  size_t kv_cache_bytes() const;
  // This rank's cache of one layer on the device,
  // [num_blocks, block_size, kv_heads_local, head_dim] of options().dtype.
  const void* k_cache(int layer) const;
  const void* v_cache(int layer) const;

 private:
  struct State;
  explicit GpuModel(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace symtp::model

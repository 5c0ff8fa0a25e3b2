#include "models/cuda/gpu_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/env.h"
#include "common/kernel_trace.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/layer_ops.h"
#include "kernels/ops/sampling.h"
#include "kernels/ops/weight_init.h"
#include "models/weights.h"

namespace symtp::model {
namespace {

using kernels::DType;

constexpr size_t kAlign = 256;
// Row chunks of the exchange per row-parallel output (GpuModelOptions::
// exchange_min_rows: more chunks hid less than two).
constexpr int kMaxExchangeChunks = 2;
size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Offsets of named sub-buffers inside one allocation.
class Carver {
 public:
  size_t Take(size_t bytes) {
    const size_t off = size_;
    size_ = AlignUp(size_ + bytes);
    return off;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

template <typename T>
T* At(const cuda::DeviceBuffer& b, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(b.get()) + off);
}
template <typename T>
T* At(const cuda::PinnedBuffer& b, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(b.get()) + off);
}

void* Offset(void* p, size_t bytes) { return static_cast<char*>(p) + bytes; }
const void* Offset(const void* p, size_t bytes) { return static_cast<const char*>(p) + bytes; }

using cuda::WaitEvent;

enum OpClass : int { kClsGemm = 0, kClsAttn = 1, kClsRowPar = 2, kClsOther = 3 };

struct LayerPtrs {
  void* attn_norm = nullptr;
  void* mlp_norm = nullptr;
  void* wqkv = nullptr;   // [QW + 2 KVW, H]
  void* wo = nullptr;     // [H, QW]
  void* wgu = nullptr;    // [2 FL, H]
  void* wdown = nullptr;  // [H, FL]
  void* k_cache = nullptr;
  void* v_cache = nullptr;
};

// Offsets of the per-step input arrays in the pinned staging slots and in the
// device input buffer. Block tables sit at a fixed offset after the others
// (compact [S, width] in staging, [max_seqs, cap_blocks] on the device).
// The other arrays are packed for each step's shape (StepInputs) into the
// region before them, at the same offsets on both sides, so that one copy
// carries them (each copy is a copy-engine round trip the step waits for).
struct InputLayout {
  size_t block_tables;  // also the capacity of the packed region before it
  size_t bytes;         // of each staging slot and of the device input buffer
};

// Offsets of one step's packed inputs: rows token rows, `items` attention
// items and `sampled` sampled rows (16-byte aligned each). A CUDA graph's key
// fixes all three (padded decode: items = sampled = rows), so a replay finds
// its inputs where its capture read them.
struct StepInputs {
  size_t tokens, positions, slots, prev_row, split_chunk, items, sample_rows, params, end;
};
StepInputs PackStepInputs(int rows, int items, int sampled) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off = (off + bytes + 15) / 16 * 16;
    return o;
  };
  StepInputs p;
  const size_t r4 = static_cast<size_t>(rows) * 4;
  p.tokens = take(r4);
  p.positions = take(r4);
  p.slots = take(r4);
  p.prev_row = take(r4);
  p.split_chunk = take(4);
  p.items = take(static_cast<size_t>(items) * sizeof(kernels::AttentionItem));
  p.sample_rows = take(static_cast<size_t>(sampled) * 4);
  p.params = take(static_cast<size_t>(sampled) * sizeof(kernels::DeviceSamplingParams));
  p.end = off;
  return p;
}

// The shape of one enqueued forward pass (what a CUDA graph bakes in).
struct StepShape {
  int rows = 0;  // token rows (padded for graph batches)
  int num_items = 0;
  int max_item_tokens = 1;
  int splits = 1;
  int split_chunk = 0;  // decode: this step's split-K chunk (uploaded with the inputs)
  int split_grid = 0;   // PagedAttentionArgs::split_grid (graphs: fewer blocks than splits)
  int num_sampled = 0;  // LM-head rows
  bool sample = false;
  bool forward_tokens = false;
  // > 0: sample from the shards' top candidates, this many slots per row
  // and rank (GpuModelOptions::sharded_sampling); 0: gather the logits.
  int shard_k = 0;
};

}  // namespace

struct GpuModel::State {
  ModelConfig cfg;
  ShardLayout layout;
  GpuModelOptions opt;
  kernels::DeviceComm* comm = nullptr;
  int device = 0;
  int tp = 1;
  DType dt = DType::kBF16;
  size_t esz = 2;
  int H = 0, D = 0, NHl = 0, NKVl = 0, QW = 0, KVW = 0, QKVW = 0, FL = 0, VL = 0, V = 0;
  int num_sms = 0;
  int plan_blocks_per_sm = 1;  // kernels::DecodePlanBlocksPerSm at this head dim and page
  // GpuModelOptions::defer_norm in effect (TP 1, bf16): the norm weights are
  // folded into the QKV and gate/up weights, and steps of at most
  // kDeferNormMaxRows rows run no AddRmsNorm before the final norm.
  bool defer_norm = false;
  int max_tokens = 0, max_seqs = 0, max_sampled = 0, max_items = 0, cap_blocks = 0, max_splits = 1,
      num_blocks = 0;
  std::vector<int> graph_sizes;
  size_t weight_bytes = 0, kv_bytes = 0;

  kernels::CublasLtHandle gemm;
  // The exchange's sends run on `side`. Events [op * kMaxExchangeChunks
  // + chunk]: the chunk ready on the main stream (edge in) and its send
  // complete on the side stream (edge out).
  cuda::Stream side;
  std::vector<cuda::Event> ev_chunk_ready, ev_chunk_sent;
  cuda::Event step_done;
  cuda::Event staging_done[2];
  bool staging_used[2] = {false, false};

  cuda::DeviceBuffer weights, kv, acts, inputs;
  cuda::PinnedBuffer staging[2];
  cuda::PinnedBuffer host_logits_buf, host_tokens_buf;
  InputLayout in_layout{};

  void* embed = nullptr;
  std::vector<LayerPtrs> L;
  void* final_norm = nullptr;
  void* lm_head = nullptr;
  double2* rope = nullptr;

  void *x = nullptr, *h = nullptr, *qkv = nullptr, *attn = nullptr, *proj = nullptr, *gu = nullptr,
       *act = nullptr, *hs = nullptr;
  float *logits_local = nullptr, *gathered = nullptr, *logits = nullptr;
  int32_t* sampled = nullptr;
  void* attn_ws = nullptr;
  size_t attn_ws_bytes = 0;
  void* gemm_ws = nullptr;

  // Device inputs.
  int32_t *d_tokens = nullptr, *d_positions = nullptr, *d_slots = nullptr, *d_prev_row = nullptr,
          *d_block_tables = nullptr, *d_sample_rows = nullptr, *d_split_chunk = nullptr;
  kernels::AttentionItem* d_items = nullptr;
  kernels::DeviceSamplingParams* d_params = nullptr;
  // Points the device inputs at a step's packed layout in `inputs` (what
  // Enqueue, and so a graph's capture, reads).
  void SetStepInputs(const StepInputs& pk) {
    d_tokens = At<int32_t>(inputs, pk.tokens);
    d_positions = At<int32_t>(inputs, pk.positions);
    d_slots = At<int32_t>(inputs, pk.slots);
    d_prev_row = At<int32_t>(inputs, pk.prev_row);
    d_items = At<kernels::AttentionItem>(inputs, pk.items);
    d_sample_rows = At<int32_t>(inputs, pk.sample_rows);
    d_params = At<kernels::DeviceSamplingParams>(inputs, pk.params);
    d_split_chunk = At<int32_t>(inputs, pk.split_chunk);
  }

  // Step bookkeeping.
  int64_t step = 0;
  int last_num_sampled = 0;
  int half_num_sampled[2] = {-1, -1};  // tokens in host_tokens_buf half (step & 1); -1: none
  bool last_sampled = false;
  bool last_logits_copied = false;
  std::vector<kernels::AttentionItem> items_scratch;

  // (padded batch, sampled, StepShape::shard_k, the decode attention splits)
  using GraphKey = std::tuple<int, bool, int, bool>;
  std::map<GraphKey, cuda::GraphExec> graphs;
  std::map<GraphKey, int> seen;
  std::set<GraphKey> failed;
  GraphStats stats;
  // SYMTP_KERNEL_TRACE_OUT, read once at Init: where teardown writes the
  // kernel timeline (empty: not recording). Recording stops at the first
  // decode step with fewer sequences than an earlier one: a steady job's
  // drain would otherwise overwrite its full-batch steps in the ring.
  std::string trace_out;
  int trace_max_seqs = 0;
  bool trace_paused = false;
  absl::Status inject_capture_failure;  // FailNextCaptureForTesting; OK: none

  bool profiling = false;
  bool prof_active = false;
  bool prof_valid = false;
  std::vector<cuda::Event> prof_ev;
  std::vector<int> prof_cls;
  int prof_n = 0;

  absl::Status Init();
  absl::Status InitWeights(cudaStream_t s);
  absl::Status Forward(const BatchInput& in, cudaStream_t stream, const StepOptions& so);
  absl::Status WarmUp(cudaStream_t stream, Deadline deadline);
  bool warming = false;  // WarmUp's steps: eager, no graph bookkeeping
  absl::Status Enqueue(const StepShape& sh, cudaStream_t s);
  absl::StatusOr<cuda::GraphExec> Capture(const StepShape& sh, cudaStream_t s);
  // out = in x w, summed over the ranks; then, unless norm_weight is null,
  // x += out and h = RMSNorm(x) * norm_weight (fused into the all-reduce
  // where the communicator can).
  absl::Status RowParallel(const void* in, int k, const void* w, void* out, int rows,
                           const void* norm_weight, cudaStream_t s);
  // Row chunks of this step's exchange (1: the step runs RowParallel).
  int ExchangeChunks(int rows) const;
  // The exchange's chunks go by the copy engines (else by the all-reduce).
  bool CopyExchange() const { return opt.exchange_transport == ExchangeTransport::kCopy; }
  // Layer l from its O projection to the next layer's QKV GEMM (none after
  // the last layer), chunk by chunk over the exchange.
  absl::Status ChunkedLayerTail(int l, int rows, int chunks, const void* next_norm,
                                cudaStream_t s);
  // accumulate: C += A · Wᵀ in the GEMM's epilogue.
  absl::Status Gemm(const void* a, const void* w, void* c, int m, int n, int k, DType out_dt,
                    cudaStream_t s, bool accumulate = false);
  // The arguments Gemm runs, and running them (the GEMV where it takes them).
  kernels::GemmArgs GemmArgsFor(const void* a, const void* w, void* c, int m, int n, int k,
                                DType out_dt, bool accumulate) const;
  absl::Status RunGemm(const kernels::GemmArgs& g, cudaStream_t s);
  // A deferred step's GEMM of the residual stream x (QKV, gate/up): where
  // the GEMV takes it, it applies the rows' norm factors itself and
  // *factored is true; otherwise the kernel after it must (DeferredNorm).
  absl::Status NormInGemm(const void* w, void* c, int m, int n, cudaStream_t s, bool* factored);
  // Whether Gemm runs `g` on kernels::Gemv rather than cuBLASLt.
  bool TakesGemv(const kernels::GemmArgs& g) const {
    return g.m <= opt.gemv_max_rows && kernels::GemvSupports(g);
  }
  absl::Status Mark(int cls, cudaStream_t s);
  // StepShape::shard_k for a step that samples with `params` on the device.
  int ShardedSamplingSlots(absl::Span<const SamplingParams> params) const;
};

namespace {

kernels::DeviceSamplingParams ToDeviceParams(const SamplingParams& sp, uint64_t position) {
  kernels::DeviceSamplingParams p;
  p.temperature = sp.temperature;
  p.top_k = sp.top_k;
  p.top_p = sp.top_p;
  p.seed = sp.seed;
  p.position = position;
  return p;
}

// The most rows a step defers its norms at (GpuModelOptions::defer_norm).
// On an H200 (llama-8b TP 1) the deferral took the step to 0.98x at 8-64
// rows and 0.99x at 128, but was level at 256 and 1.01x on a 4096-token
// prefill (not broken down by kernel): a norm kernel's fixed cost is what
// it saves, and that matters only in short steps.
constexpr int kDeferNormMaxRows = 128;

std::vector<int> DefaultGraphSizes() {
  return {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512};
}

}  // namespace

kernels::GemmArgs GpuModel::State::GemmArgsFor(const void* a, const void* w, void* c, int m, int n,
                                               int k, DType out_dt, bool accumulate) const {
  const bool ws = m >= opt.gemm_workspace_min_rows;
  kernels::GemmArgs g = kernels::ContiguousGemmArgs(a, w, c, m, n, k, dt, ws ? gemm_ws : nullptr,
                                                    ws ? opt.gemm_workspace_bytes : 0);
  g.out_dtype = out_dt;
  g.accumulate = accumulate;
  return g;
}

absl::Status GpuModel::State::RunGemm(const kernels::GemmArgs& g, cudaStream_t s) {
  if (TakesGemv(g)) return kernels::Gemv(g, s);
  return kernels::Gemm(gemm, g, s);
}

absl::Status GpuModel::State::Gemm(const void* a, const void* w, void* c, int m, int n, int k,
                                   DType out_dt, cudaStream_t s, bool accumulate) {
  return RunGemm(GemmArgsFor(a, w, c, m, n, k, out_dt, accumulate), s);
}

absl::Status GpuModel::State::NormInGemm(const void* w, void* c, int m, int n, cudaStream_t s,
                                         bool* factored) {
  kernels::GemmArgs g = GemmArgsFor(x, w, c, m, n, H, dt, false);
  *factored = TakesGemv(g);
  if (*factored) g.a_rms_eps = cfg.rms_eps;
  return RunGemm(g, s);
}

absl::Status GpuModel::State::Mark(int cls, cudaStream_t s) {
  if (!prof_active) return absl::OkStatus();
  while (static_cast<int>(prof_ev.size()) <= prof_n) {
    SYMTP_ASSIGN_OR_RETURN(cuda::Event e, cuda::Event::Create(/*timing=*/true));
    prof_ev.push_back(std::move(e));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(prof_ev[prof_n].get(), s));
  if (prof_n > 0) prof_cls.push_back(cls);
  ++prof_n;
  return absl::OkStatus();
}

int GpuModel::State::ShardedSamplingSlots(absl::Span<const SamplingParams> params) const {
  if (!opt.sharded_sampling || tp <= 1 || comm == nullptr) return 0;
  int k = 1;
  for (const SamplingParams& sp : params) {
    const kernels::DeviceSamplingParams p = ToDeviceParams(sp, 0);
    if (!kernels::ShardedSamplingTakes(p, V, kernels::kSampleExactCap)) return 0;
    if (p.temperature > 0.f) k = std::max(k, p.top_k);
  }
  int slots = 1;  // a power of two (kSampleExactCap is one): few distinct graphs
  while (slots < k) slots *= 2;
  return 2 * slots <= VL ? slots : 0;
}

absl::Status GpuModel::State::RowParallel(const void* in, int k, const void* w, void* out, int rows,
                                          const void* norm_weight, cudaStream_t s) {
  const bool reduce = comm != nullptr && !opt.bench_skip_allreduce;
  if (reduce && norm_weight != nullptr && opt.fuse_allreduce_norm) {
    // The residual add + RMSNorm after the sum, fused into the all-reduce
    // where the communicator takes this shape.
    const kernels::ResidualNorm norm{x, norm_weight, h, rows, H, cfg.rms_eps};
    if (comm->FusesResidualNorm(norm, dt)) {
      // Where the GEMM is a GEMV and the communicator allows it, the GEMV
      // sends its output itself and the fused kernel only receives (the
      // GEMV reads neither x nor h, which the fused kernel may write while
      // the GEMV still runs).
      const kernels::GemmArgs g =
          kernels::ContiguousGemmArgs(in, w, out, rows, H, k, dt, nullptr, 0);
      kernels::LLPush push;
      kernels::ResidualNorm pushed = norm;
      if (opt.gemv_allreduce_push && TakesGemv(g) && comm->ProducerPush(norm, dt, &push)) {
        SYMTP_RETURN_IF_ERROR(kernels::GemvPush(g, push, s));
        pushed.pushed = true;
      } else {
        SYMTP_RETURN_IF_ERROR(Gemm(in, w, out, rows, H, k, dt, s));
      }
      return Annotate(comm->AllReduceResidualNorm(out, pushed, dt, s),
                      "row-parallel all-reduce + residual + RMSNorm");
    }
  }
  SYMTP_RETURN_IF_ERROR(Gemm(in, w, out, rows, H, k, dt, s));
  if (reduce) {
    SYMTP_RETURN_IF_ERROR_CTX(comm->AllReduceSum(out, static_cast<size_t>(rows) * H, dt, s),
                              "row-parallel all-reduce");
  }
  if (norm_weight == nullptr) return absl::OkStatus();
  return kernels::AddRmsNorm(x, out, norm_weight, h, rows, H, cfg.rms_eps, dt, s);
}

int GpuModel::State::ExchangeChunks(int rows) const {
  if (opt.exchange_min_rows <= 0 || comm == nullptr || tp <= 1 || opt.bench_skip_allreduce ||
      rows < opt.exchange_min_rows || rows < 2 ||
      (CopyExchange() && comm->CopyExchangeBytes() < static_cast<size_t>(rows) * H * esz)) {
    return 1;
  }
  return kMaxExchangeChunks;
}

absl::Status GpuModel::State::ChunkedLayerTail(int l, int rows, int chunks, const void* next_norm,
                                               cudaStream_t s) {
  const LayerPtrs& w = L[l];
  const void* next_qkv = l + 1 < cfg.layers ? L[l + 1].wqkv : nullptr;
  // Chunks of whole 64-row tiles; the last may be short (or, at fewer than
  // 65 rows, absent).
  const int per = ((rows + chunks - 1) / chunks + 63) / 64 * 64;
  const int n_chunks = (rows + per - 1) / per;
  auto rows_of = [&](int c) { return std::min(per, rows - c * per); };
  auto flag = [&](int op, int c) { return (l * 2 + op) * kMaxExchangeChunks + c; };
  const size_t row_bytes = static_cast<size_t>(H) * esz;
  const bool copy = CopyExchange();
  // Edge in: the side stream waits for exactly this chunk's GEMM; its send
  // (the copies, or the chunk's whole all-reduce) records the edge out that
  // the chunk's receive waits for.
  auto send = [&](int op, int c) -> absl::Status {
    const int e = op * kMaxExchangeChunks + c;
    const size_t off = static_cast<size_t>(c) * per * row_bytes;
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_chunk_ready[e].get(), s));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side.get(), ev_chunk_ready[e].get(), 0));
    if (copy) {
      SYMTP_RETURN_IF_ERROR_CTX(comm->CopySend(Offset(proj, off), off, rows_of(c) * row_bytes, op,
                                               flag(op, c), side.get()),
                                absl::StrCat("layer ", l, " copy exchange send, op ", op, " chunk ", c));
    } else {
      SYMTP_RETURN_IF_ERROR_CTX(
          comm->AllReduceSum(Offset(proj, off), static_cast<size_t>(rows_of(c)) * H, dt, side.get()),
          absl::StrCat("layer ", l, " exchange all-reduce, op ", op, " chunk ", c));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_chunk_sent[e].get(), side.get()));
    return absl::OkStatus();
  };
  auto receive = [&](int op, int c, const void* norm_weight) -> absl::Status {
    const int e = op * kMaxExchangeChunks + c;
    const size_t off = static_cast<size_t>(c) * per * row_bytes;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, ev_chunk_sent[e].get(), 0));
    if (!copy) {  // the chunk is summed: residual add + RMSNorm
      return kernels::AddRmsNorm(Offset(x, off), Offset(proj, off), norm_weight, Offset(h, off),
                                 rows_of(c), H, cfg.rms_eps, dt, s);
    }
    const kernels::ResidualNorm norm{Offset(x, off), norm_weight, Offset(h, off), rows_of(c), H,
                                     cfg.rms_eps};
    return Annotate(comm->CopyReceiveResidualNorm(Offset(proj, off), static_cast<int64_t>(c) * per,
                                                  op, flag(op, c), norm, dt, s),
                    absl::StrCat("layer ", l, " copy exchange + RMSNorm, op ", op, " chunk ", c));
  };
  for (int c = 0; c < n_chunks; ++c) {
    const size_t r0 = static_cast<size_t>(c) * per;
    SYMTP_RETURN_IF_ERROR(Gemm(Offset(attn, r0 * QW * esz), w.wo, Offset(proj, r0 * row_bytes),
                               rows_of(c), H, QW, dt, s));
    SYMTP_RETURN_IF_ERROR(send(0, c));
  }
  for (int c = 0; c < n_chunks; ++c) {
    const size_t r0 = static_cast<size_t>(c) * per;
    SYMTP_RETURN_IF_ERROR(receive(0, c, w.mlp_norm));
    if (next_norm == nullptr) continue;  // nothing reads this step's last MLP
    void* gu_c = Offset(gu, r0 * 2 * FL * esz);
    void* act_c = Offset(act, r0 * FL * esz);
    SYMTP_RETURN_IF_ERROR(Gemm(Offset(h, r0 * row_bytes), w.wgu, gu_c, rows_of(c), 2 * FL, H, dt, s));
    SYMTP_RETURN_IF_ERROR(kernels::SiluMul(gu_c, act_c, rows_of(c), FL, dt, s));
    SYMTP_RETURN_IF_ERROR(
        Gemm(act_c, w.wdown, Offset(proj, r0 * row_bytes), rows_of(c), H, FL, dt, s));
    SYMTP_RETURN_IF_ERROR(send(1, c));
  }
  if (next_norm == nullptr) return absl::OkStatus();
  for (int c = 0; c < n_chunks; ++c) {
    const size_t r0 = static_cast<size_t>(c) * per;
    SYMTP_RETURN_IF_ERROR(receive(1, c, next_norm));
    if (next_qkv != nullptr) {
      SYMTP_RETURN_IF_ERROR(Gemm(Offset(h, r0 * row_bytes), next_qkv, Offset(qkv, r0 * QKVW * esz),
                                 rows_of(c), QKVW, H, dt, s));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuModel::State::Enqueue(const StepShape& sh, cudaStream_t s) {
  const int rows = sh.rows;
  const float eps = cfg.rms_eps;
  SYMTP_RETURN_IF_ERROR(Mark(kClsOther, s));
  if (sh.forward_tokens) {
    SYMTP_RETURN_IF_ERROR(kernels::ForwardSampledTokens(d_tokens, sampled, d_prev_row, rows, s));
  }
  SYMTP_RETURN_IF_ERROR(kernels::EmbeddingLookup(d_tokens, embed, x, rows, H, V, dt, s));
  SYMTP_RETURN_IF_ERROR(Mark(kClsOther, s));
  const int chunks = ExchangeChunks(rows);
  // The deferred norm (defer_norm), up to kDeferNormMaxRows rows: the
  // residual stream x is the QKV and gate/up GEMMs' input, the O and down
  // GEMMs add into it, and each row's norm factor is applied by the GEMV
  // that reads x where it runs, else by the RoPE and SiLU kernels after it.
  const bool defer = defer_norm && chunks <= 1 && rows <= kDeferNormMaxRows;
  const void* norm_in = defer ? x : h;
  const kernels::DeferredNorm dnorm{x, H, eps}, no_norm{};
  if (chunks > 1 && CopyExchange()) {
    SYMTP_RETURN_IF_ERROR_CTX(comm->CopyBeginStep(s), "copy exchange step");
  }
  for (int l = 0; l < cfg.layers; ++l) {
    const LayerPtrs& w = L[l];
    if (l == 0 && !defer) {  // later layers' attention norm ran with the previous all-reduce
      SYMTP_RETURN_IF_ERROR(kernels::AddRmsNorm(x, nullptr, w.attn_norm, h, rows, H, eps, dt, s));
      SYMTP_RETURN_IF_ERROR(Mark(kClsOther, s));
    }
    bool qkv_factored = false;  // the QKV GEMV applied the deferred norm
    if (l == 0 || chunks <= 1) {  // a chunked layer ran the next one's QKV GEMM
      SYMTP_RETURN_IF_ERROR(defer ? NormInGemm(w.wqkv, qkv, rows, QKVW, s, &qkv_factored)
                                  : Gemm(h, w.wqkv, qkv, rows, QKVW, H, dt, s));
      SYMTP_RETURN_IF_ERROR(Mark(kClsGemm, s));
    }
    SYMTP_RETURN_IF_ERROR(kernels::ApplyRopeWriteKv(
        qkv, QKVW, NHl, NKVl, D, d_positions, d_slots, rows, rope, cfg.max_seq_len, w.k_cache,
        w.v_cache, dt, s, defer && !qkv_factored ? dnorm : no_norm));
    SYMTP_RETURN_IF_ERROR(Mark(kClsOther, s));
    kernels::PagedAttentionArgs a;
    a.q = qkv;
    a.q_row_stride = QKVW;
    a.k_cache = w.k_cache;
    a.v_cache = w.v_cache;
    a.cache_slots = static_cast<int64_t>(num_blocks) * cfg.block_size;
    a.out = attn;
    a.positions = d_positions;
    a.block_tables = d_block_tables;
    a.block_table_stride = cap_blocks;
    a.block_size = cfg.block_size;
    a.items = d_items;
    a.num_items = sh.num_items;
    a.max_item_tokens = sh.max_item_tokens;
    a.num_tokens = rows;
    a.num_q_heads = NHl;
    a.num_kv_heads = NKVl;
    a.head_dim = D;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    a.num_splits = sh.splits;
    a.split_grid = sh.split_grid;
    a.split_chunk = opt.attention_split_chunk;
    a.split_chunk_dev = d_split_chunk;  // this step's chunk (a graph replays with it)
    a.workspace = attn_ws;
    a.workspace_bytes = attn_ws_bytes;
    a.decode_kernel = opt.attention_decode_kernel;
    a.prefill_kernel = opt.attention_prefill_kernel;
    SYMTP_RETURN_IF_ERROR_CTX(kernels::PagedAttention(a, dt, s), absl::StrCat("layer ", l));
    SYMTP_RETURN_IF_ERROR(Mark(kClsAttn, s));
    if (chunks > 1) {
      const void* next_norm =
          l + 1 < cfg.layers ? L[l + 1].attn_norm : sh.num_sampled > 0 ? final_norm : nullptr;
      SYMTP_RETURN_IF_ERROR(ChunkedLayerTail(l, rows, chunks, next_norm, s));
      SYMTP_RETURN_IF_ERROR(Mark(kClsRowPar, s));
      continue;
    }
    SYMTP_RETURN_IF_ERROR(defer ? Gemm(attn, w.wo, x, rows, H, QW, dt, s, /*accumulate=*/true)
                                : RowParallel(attn, QW, w.wo, proj, rows, w.mlp_norm, s));
    SYMTP_RETURN_IF_ERROR(Mark(kClsRowPar, s));
    kernels::GemmArgs gu_args =
        kernels::ContiguousGemmArgs(norm_in, w.wgu, act, rows, 2 * FL, H, dt, nullptr, 0);
    // Where the gate/up GEMM is a GEMV, it writes SiLU(gate) * up itself.
    const bool swiglu =
        opt.gemv_swiglu && TakesGemv(gu_args) && kernels::GemvSwiGluSupports(gu_args);
    bool gu_factored = false;  // the gate/up GEMV applied the deferred norm
    if (swiglu) {
      if (defer) gu_args.a_rms_eps = eps;
      SYMTP_RETURN_IF_ERROR(kernels::GemvSwiGlu(gu_args, s));
    } else {
      SYMTP_RETURN_IF_ERROR(defer ? NormInGemm(w.wgu, gu, rows, 2 * FL, s, &gu_factored)
                                  : Gemm(h, w.wgu, gu, rows, 2 * FL, H, dt, s));
    }
    SYMTP_RETURN_IF_ERROR(Mark(kClsGemm, s));
    if (!swiglu) {
      SYMTP_RETURN_IF_ERROR(
          kernels::SiluMul(gu, act, rows, FL, dt, s, defer && !gu_factored ? dnorm : no_norm));
    }
    SYMTP_RETURN_IF_ERROR(Mark(kClsOther, s));
    // The next layer's attention norm, or the final norm when this step
    // samples (a step that samples nothing needs neither).
    const bool last = l + 1 == cfg.layers;
    const void* next_norm = !last ? L[l + 1].attn_norm : sh.num_sampled > 0 ? final_norm : nullptr;
    if (defer) {  // the next layer's norm is deferred too; the final one is not
      SYMTP_RETURN_IF_ERROR(Gemm(act, w.wdown, x, rows, H, FL, dt, s, /*accumulate=*/true));
      if (last && next_norm != nullptr) {
        SYMTP_RETURN_IF_ERROR(
            kernels::AddRmsNorm(x, nullptr, final_norm, h, rows, H, eps, dt, s));
      }
    } else {
      SYMTP_RETURN_IF_ERROR(RowParallel(act, FL, w.wdown, proj, rows, next_norm, s));
    }
    SYMTP_RETURN_IF_ERROR(Mark(kClsRowPar, s));
  }
  if (sh.num_sampled == 0) return absl::OkStatus();
  if (cfg.layers == 0) {
    SYMTP_RETURN_IF_ERROR(kernels::AddRmsNorm(x, nullptr, final_norm, h, rows, H, eps, dt, s));
  }
  SYMTP_RETURN_IF_ERROR(kernels::GatherRows(h, H, d_sample_rows, hs, H, sh.num_sampled, H, dt, s));
  SYMTP_RETURN_IF_ERROR(Mark(kClsOther, s));
  SYMTP_RETURN_IF_ERROR(Gemm(hs, lm_head, logits_local, sh.num_sampled, VL, H, DType::kF32, s));
  if (sh.shard_k > 0) {
    // Vocabulary-parallel sampling: the shards' candidates, not the logits,
    // are gathered (the logits buffers hold them: shard_k <= VL / 2).
    const int k = sh.shard_k;
    auto* cand = reinterpret_cast<uint64_t*>(logits);
    auto* all = reinterpret_cast<uint64_t*>(gathered);
    SYMTP_RETURN_IF_ERROR(kernels::SelectShardCandidates(
        logits_local, sh.num_sampled, VL, layout.tp_rank * VL, d_params, k, cand, s));
    SYMTP_RETURN_IF_ERROR_CTX(
        comm->AllGather(cand, all, static_cast<size_t>(sh.num_sampled) * k * 2, DType::kF32, s),
        "sampling candidates all-gather");
    SYMTP_RETURN_IF_ERROR(Mark(kClsGemm, s));
    SYMTP_RETURN_IF_ERROR(
        kernels::SampleFromCandidates(all, tp, sh.num_sampled, k, V, d_params, sampled, s));
    return Mark(kClsOther, s);
  }
  const float* sample_from = logits;
  int sample_vocab = V;
  if (tp > 1 && comm == nullptr) {  // a shard alone (bench_skip_allreduce): its own vocabulary
    sample_from = logits_local;
    sample_vocab = VL;
  } else if (tp > 1) {
    SYMTP_RETURN_IF_ERROR_CTX(
        comm->AllGather(logits_local, gathered, static_cast<size_t>(sh.num_sampled) * VL,
                        DType::kF32, s),
        "LM-head all-gather");
    SYMTP_RETURN_IF_ERROR(
        kernels::AssembleVocabShards(gathered, logits, sh.num_sampled, VL, tp, s));
  }
  SYMTP_RETURN_IF_ERROR(Mark(kClsGemm, s));
  if (sh.sample) {
    SYMTP_RETURN_IF_ERROR(
        kernels::SampleTokens(sample_from, sh.num_sampled, sample_vocab, d_params, sampled, s));
    SYMTP_RETURN_IF_ERROR(Mark(kClsOther, s));
  }
  return absl::OkStatus();
}

absl::StatusOr<cuda::GraphExec> GpuModel::State::Capture(const StepShape& sh, cudaStream_t s) {
  const bool was_prof = prof_active;
  prof_active = false;
  absl::StatusOr<cuda::GraphExec> exec = cuda::GraphExec::Capture(s, [&]() -> absl::Status {
    SYMTP_RETURN_IF_ERROR(Enqueue(sh, s));
    return std::exchange(inject_capture_failure, absl::OkStatus());
  });
  prof_active = was_prof;
  if (!exec.ok()) return Annotate(exec.status(), "during CUDA graph capture");
  return exec;
}

absl::Status GpuModel::State::Forward(const BatchInput& in, cudaStream_t stream,
                                      const StepOptions& so) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError("GpuModel::Forward: needs a non-default stream");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  SYMTP_RETURN_IF_ERROR_CTX(in.Validate(cfg, num_blocks),
                            absl::StrFormat("GpuModel rank %d", layout.tp_rank));
  const int T = in.num_tokens(), S = in.num_seqs();
  const int NS = static_cast<int>(in.sample_index.size());
  if (T > max_tokens || S > max_seqs || NS > max_sampled) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GpuModel::Forward: batch of %d tokens / %d sequences / %d sampled rows is over the "
        "capacity %d / %d / %d (GpuModelOptions)",
        T, S, NS, max_tokens, max_seqs, max_sampled));
  }
  const bool sample = !so.sampling.empty();
  if (sample && static_cast<int>(so.sampling.size()) != NS) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GpuModel::Forward: %d sampling params for %d sampled rows", so.sampling.size(), NS));
  }
  for (const SamplingParams& p : so.sampling) SYMTP_RETURN_IF_ERROR(ValidateSamplingParams(p));
  const bool fwd = !so.token_from_prev_sample.empty();
  if (fwd) {
    if (static_cast<int>(so.token_from_prev_sample.size()) != T) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GpuModel::Forward: token_from_prev_sample has %d entries for %d tokens",
                          so.token_from_prev_sample.size(), T));
    }
    for (int32_t j : so.token_from_prev_sample) {
      if (j >= 0 && (!last_sampled || j >= last_num_sampled)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "GpuModel::Forward: token_from_prev_sample row %d, but the previous step sampled %d "
            "rows",
            j, last_sampled ? last_num_sampled : 0));
      }
    }
  }
  const bool copy_logits = so.copy_logits && opt.host_logits;

  // ---- plan
  bool decode = T > 0 && T == S && NS == S;
  for (int i = 0; decode && i < NS; ++i) decode = in.sample_index[i] == i;
  if (!trace_out.empty() && decode && !trace_paused) {
    if (S < trace_max_seqs) {
      SYMTP_RETURN_IF_ERROR(WaitEvent(step_done.get(), Deadline::AfterMs(30'000),
                                      "GpuModel: pausing the kernel trace"));
      SYMTP_RETURN_IF_ERROR(trace::Pause());
      trace_paused = true;
    }
    trace_max_seqs = std::max(trace_max_seqs, S);
  }
  int P = T;
  bool padded = false;
  if (decode && !graph_sizes.empty() && S <= graph_sizes.back()) {
    P = *std::lower_bound(graph_sizes.begin(), graph_sizes.end(), S);
    padded = true;
  }
  StepShape sh;
  sh.rows = P;
  sh.sample = sample;
  sh.num_sampled = padded ? P : NS;
  sh.shard_k = sample && !copy_logits ? ShardedSamplingSlots(so.sampling) : 0;
  if (sh.shard_k > 0) ++stats.sharded_sampling_steps;
  sh.forward_tokens = fwd || padded;
  if (decode) {
    items_scratch.resize(P);
    for (int i = 0; i < P; ++i) items_scratch[i] = kernels::AttentionItem{i, i, 1, 0};
    sh.max_item_tokens = 1;
    int max_ctx = 1;
    for (int c : in.context_len) max_ctx = std::max(max_ctx, c);
    const bool balance = opt.attention_balance_splits && dt == DType::kBF16 &&
                         opt.attention_decode_kernel == kernels::DecodeKernel::kTensorCore;
    const int chunk =
        balance ? kernels::PlanDecodeSplitChunk(in.context_len, NKVl, plan_blocks_per_sm * num_sms,
                                                opt.attention_split_chunk)
                : opt.attention_split_chunk;
    sh.split_chunk = chunk;
    sh.splits = std::min(max_splits, (max_ctx + chunk - 1) / chunk);
  } else {
    int per = kernels::MaxAttentionItemTokens(NHl, NKVl, dt, D, opt.attention_prefill_kernel);
    int longest = 1;
    for (int s = 0; s < S; ++s) longest = std::max(longest, in.seq_start[s + 1] - in.seq_start[s]);
    per = std::min(per, longest);
    kernels::BuildAttentionItems(in.seq_start, per, &items_scratch);
    sh.max_item_tokens = per;
    sh.splits = 1;
  }
  sh.num_items = static_cast<int>(items_scratch.size());
  if (ExchangeChunks(sh.rows) > 1) ++stats.exchange_steps;
  if (sh.num_items > max_items) {
    return absl::InternalError(
        absl::StrFormat("GpuModel: %d attention items > capacity %d", sh.num_items, max_items));
  }

  // ---- stage (pinned slot, then async copies into the persistent inputs)
  const int slot = static_cast<int>(step & 1);
  if (staging_used[slot]) {
    SYMTP_RETURN_IF_ERROR(WaitEvent(staging_done[slot].get(), Deadline::AfterMs(60'000),
                                    "GpuModel staging slot reuse"));
  }
  const InputLayout& il = in_layout;
  const cuda::PinnedBuffer& st = staging[slot];
  const StepInputs pk = PackStepInputs(P, sh.num_items, sh.num_sampled);
  if (pk.end > il.block_tables) {
    return absl::InternalError(absl::StrFormat(
        "GpuModel: step inputs of %d bytes > their region of %d", pk.end, il.block_tables));
  }
  int32_t* h_tokens = At<int32_t>(st, pk.tokens);
  int32_t* h_pos = At<int32_t>(st, pk.positions);
  int32_t* h_slots = At<int32_t>(st, pk.slots);
  int32_t* h_prev = At<int32_t>(st, pk.prev_row);
  auto* h_items = At<kernels::AttentionItem>(st, pk.items);
  int32_t* h_rows = At<int32_t>(st, pk.sample_rows);
  auto* h_params = At<kernels::DeviceSamplingParams>(st, pk.params);
  int32_t* h_bt = At<int32_t>(st, il.block_tables);
  int32_t* h_chunk = At<int32_t>(st, pk.split_chunk);
  *h_chunk = sh.split_chunk > 0 ? sh.split_chunk : opt.attention_split_chunk;
  for (int t = 0; t < T; ++t) {
    h_tokens[t] = in.tokens[t];
    h_pos[t] = in.positions[t];
    h_slots[t] = in.slot_mapping[t];
    h_prev[t] = fwd ? so.token_from_prev_sample[t] : -1;
  }
  for (int t = T; t < P; ++t) {  // padding rows: no position, no cache slot
    h_tokens[t] = 0;
    h_pos[t] = -1;
    h_slots[t] = -1;
    h_prev[t] = -1;
  }
  std::memcpy(h_items, items_scratch.data(), items_scratch.size() * sizeof(kernels::AttentionItem));
  for (int i = 0; i < sh.num_sampled; ++i) h_rows[i] = i < NS ? in.sample_index[i] : i;
  if (sample) {
    for (int i = 0; i < sh.num_sampled; ++i) {
      kernels::DeviceSamplingParams p;
      if (i < NS) {
        p = ToDeviceParams(so.sampling[i],
                           static_cast<uint64_t>(in.positions[in.sample_index[i]]) + 1);
      }
      h_params[i] = p;
    }
  }
  const int width = std::min(in.max_blocks_per_seq, cap_blocks);
  for (int s = 0; s < S && width > 0; ++s) {
    std::memcpy(h_bt + static_cast<size_t>(s) * width,
                in.block_tables.data() + static_cast<size_t>(s) * in.max_blocks_per_seq,
                static_cast<size_t>(width) * sizeof(int32_t));
  }
  // One copy for the packed arrays (the parts a step does not use, e.g. the
  // sampling parameters of a step that samples nothing, are never read).
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(inputs.get(), st.get(), pk.end, cudaMemcpyHostToDevice, stream));
  SetStepInputs(pk);
  if (S > 0 && width > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        d_block_tables, static_cast<size_t>(cap_blocks) * sizeof(int32_t), h_bt,
        static_cast<size_t>(width) * sizeof(int32_t), static_cast<size_t>(width) * sizeof(int32_t),
        static_cast<size_t>(S), cudaMemcpyHostToDevice, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_done[slot].get(), stream));
  staging_used[slot] = true;

  // ---- run: graph replay, capture, or eager
  bool done = false;
  if (padded && opt.cuda_graphs && T > 0 && !warming) {
    // Steps whose attention the planner leaves whole get their own graph,
    // without the split merge (one kernel boundary a layer fewer); a row the
    // attention stores itself is the same bits in either graph
    // (Split0StoresRow).
    const bool split = sh.splits > 1;
    const GraphKey key{P, sample, sh.shard_k, split};
    auto it = graphs.find(key);
    if (it == graphs.end() && !failed.count(key) && seen[key]++ >= 1) {
      StepShape gsh = sh;
      if (split) {
        gsh.splits = max_splits;  // the partition depends only on the chunk: same bits
        // ... but launch only about the blocks the planner fills the SMs with
        // at this batch (its slots over P x kv heads); the
        // tensor-core kernel's blocks walk the rest of a step's splits (long
        // outliers).
        const int64_t pairs = static_cast<int64_t>(std::max(1, P)) * NKVl;
        const int64_t slots = static_cast<int64_t>(plan_blocks_per_sm) * num_sms;
        gsh.split_grid = static_cast<int>(
            std::clamp<int64_t>((slots + pairs - 1) / pairs, 1, std::max(1, max_splits)));
      }
      absl::StatusOr<cuda::GraphExec> exec = Capture(gsh, stream);
      if (exec.ok()) {
        it = graphs.emplace(key, std::move(*exec)).first;
        ++stats.captures;
      } else {
        ++stats.capture_failures;
        failed.insert(key);
        SYMTP_LOG(WARN, "gpu_model") << "CUDA graph capture for batch " << P
                                     << " failed, running eagerly: " << exec.status().ToString();
      }
    }
    if (it != graphs.end()) {
      SYMTP_RETURN_IF_ERROR(it->second.Launch(stream));
      ++stats.replays;
      done = true;
    }
  }
  if (!done && T > 0) {
    prof_active = profiling;
    prof_n = 0;
    prof_cls.clear();
    const absl::Status es = Enqueue(sh, stream);
    prof_active = false;
    prof_valid = profiling && es.ok();
    SYMTP_RETURN_IF_ERROR(es);
    ++stats.eager_steps;
  } else if (done) {
    prof_valid = false;
  }

  // ---- outputs
  if (sample && NS > 0) {
    // Two halves by step parity: a pipelined caller reads step t's tokens
    // while step t + 1 (which copies into the other half) runs.
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_tokens_buf.as<int32_t>() + (step & 1) * max_sampled,
                                         sampled, static_cast<size_t>(NS) * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, stream));
  }
  if (copy_logits && NS > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_logits_buf.get(), logits,
                                         static_cast<size_t>(NS) * V * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(step_done.get(), stream));
  last_num_sampled = NS;
  half_num_sampled[step & 1] = sample ? NS : -1;
  last_sampled = sample;
  last_logits_copied = copy_logits;
  ++step;
  return absl::OkStatus();
}

absl::Status GpuModel::State::WarmUp(cudaStream_t s, Deadline deadline) {
  if (!trace_out.empty()) return absl::OkStatus();
  const int B = cfg.block_size;
  const GraphStats saved_stats = stats;
  StepOptions so;
  so.copy_logits = false;
  // Waits for everything enqueued so far in short slices, polling the
  // communicator between them, so that a peer that dies during the warm-up
  // is an error at once.
  auto wait_done = [&](const char* what) -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(step_done.get(), s));
    for (;;) {
      const absl::Status w = WaitEvent(step_done.get(), Deadline::AfterMs(10), what);
      if (!absl::IsDeadlineExceeded(w)) return w;
      if (comm != nullptr) SYMTP_RETURN_IF_ERROR_CTX(comm->Poll(), what);
      if (deadline.Expired()) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": the GPU did not finish in time"));
      }
    }
  };
  auto run = [&](const BatchInput& in, bool mixed) -> absl::Status {
    // Greedy rows (which TP > 1 may sample from the shards' candidates), and
    // with `mixed` every other row with temperature, top-k and top-p (from
    // the gathered logits).
    so.sampling.assign(in.sample_index.size(), SamplingParams{});
    for (size_t i = 1; mixed && i < so.sampling.size(); i += 2) {
      so.sampling[i] = SamplingParams{0.8f, 40, 0.9f, i};
    }
    warming = true;
    const absl::Status st = Forward(in, s, so);
    warming = false;
    SYMTP_RETURN_IF_ERROR(st);
    return wait_done("GpuModel warm-up step");
  };

  // Prefill: max_tokens rows over `seqs` sequences in consecutive blocks.
  const int seqs = std::max(1, std::min({8, max_seqs, max_sampled, num_blocks}));
  const int per_seq_cap = std::min(cfg.max_seq_len, (num_blocks / seqs) * B);
  const int total = std::min(max_tokens, seqs * per_seq_cap);
  BatchBuilder prefill(B, cap_blocks);
  std::vector<int32_t> tokens, table;
  int next_block = 0, first_len = 0;
  for (int i = 0; i < seqs && total > 0; ++i) {
    const int len = total / seqs + (i < total % seqs ? 1 : 0);
    if (len == 0) continue;
    if (i == 0) first_len = len;
    tokens.resize(len);
    for (int t = 0; t < len; ++t) tokens[t] = static_cast<int32_t>((7919u * (t + 31u * i)) % V);
    table.resize((len + B - 1) / B);
    for (int32_t& b : table) b = next_block++;
    SYMTP_RETURN_IF_ERROR(prefill.Add(tokens, 0, table, /*sample_last=*/true));
  }
  if (prefill.batch().num_tokens() > 0) SYMTP_RETURN_IF_ERROR(run(prefill.batch(), /*mixed=*/true));

  // Decode: each sequence attends over the prefill's first sequence's full
  // blocks (`shared`, written above) plus its new token, alone at the start
  // of a block of its own, so no key it reads is unwritten.
  const int shared = std::min({first_len / B, 512 / B, (cfg.max_seq_len - 1) / B});
  for (size_t k = 0; k < graph_sizes.size(); ++k) {
    const int P = graph_sizes[k];
    if (shared + P > num_blocks) break;
    BatchBuilder decode(B, cap_blocks);
    table.resize(shared + 1);
    for (int j = 0; j < shared; ++j) table[j] = j;
    for (int i = 0; i < P; ++i) {
      table[shared] = shared + i;
      const int32_t token = static_cast<int32_t>((104729u * (i + 1)) % V);
      SYMTP_RETURN_IF_ERROR(decode.Add({&token, 1}, shared * B, table, /*sample_last=*/true));
    }
    SYMTP_RETURN_IF_ERROR(run(decode.batch(), /*mixed=*/k % 2 == 1));
  }

  // A ladder of row counts through the layer GEMMs and the LM head, with
  // layer 0's weights: cuBLASLt's choice for M changes kernel about every 8
  // rows, and a row count between two rungs mostly takes a kernel that one
  // of them loaded (of the four llama-8b TP 2 layer GEMMs' first launches
  // over M = 1..2048, 91% fall on the rungs). Local GEMMs only: no rank
  // waits for another.
  if (cfg.layers > 0) {
    const LayerPtrs& w = L[0];
    // The operands the steps use: with the deferred norm the residual stream
    // is the input and the accumulated output (its values do not matter here).
    for (int m = 8; m <= max_tokens; m += m < 2048 ? 8 : 64) {
      const bool defer = defer_norm && m <= kDeferNormMaxRows;
      void* in = defer ? x : h;
      void* out = defer ? x : proj;
      SYMTP_RETURN_IF_ERROR(Gemm(in, w.wqkv, qkv, m, QKVW, H, dt, s));
      SYMTP_RETURN_IF_ERROR(Gemm(attn, w.wo, out, m, H, QW, dt, s, defer));
      SYMTP_RETURN_IF_ERROR(Gemm(in, w.wgu, gu, m, 2 * FL, H, dt, s));
      SYMTP_RETURN_IF_ERROR(Gemm(act, w.wdown, out, m, H, FL, dt, s, defer));
      if (m <= max_sampled) {
        SYMTP_RETURN_IF_ERROR(Gemm(hs, lm_head, logits_local, m, VL, H, DType::kF32, s));
      }
    }
    SYMTP_RETURN_IF_ERROR(wait_done("GpuModel warm-up GEMMs"));
  }

  stats = saved_stats;
  step = 0;
  last_num_sampled = 0;
  half_num_sampled[0] = half_num_sampled[1] = -1;
  last_sampled = false;
  last_logits_copied = false;
  return absl::OkStatus();
}

absl::Status GpuModel::State::InitWeights(cudaStream_t s) {
  auto fill = [&](const std::string& name, void* dst, int64_t dst_row_offset) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(ShardSpec spec, GetShardSpec(cfg, layout, name));
    kernels::SyntheticBlock b;
    b.key = spec.key;
    b.kind = static_cast<kernels::SyntheticKind>(static_cast<int>(spec.kind));
    b.scale = spec.scale;
    b.global_cols = spec.global_cols;
    b.row_begin = spec.row_begin;
    b.rows = spec.rows;
    b.col_begin = spec.col_begin;
    b.cols = spec.cols;
    b.dst_ld = spec.cols;
    return kernels::InitSyntheticWeight(
        Offset(dst, static_cast<size_t>(dst_row_offset) * spec.cols * esz), dt, b, s);
  };
  SYMTP_RETURN_IF_ERROR(fill("embed", embed, 0));
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    LayerPtrs& w = L[l];
    SYMTP_RETURN_IF_ERROR(fill(p + "attn_norm", w.attn_norm, 0));
    SYMTP_RETURN_IF_ERROR(fill(p + "mlp_norm", w.mlp_norm, 0));
    SYMTP_RETURN_IF_ERROR(fill(p + "wq", w.wqkv, 0));
    SYMTP_RETURN_IF_ERROR(fill(p + "wk", w.wqkv, QW));
    SYMTP_RETURN_IF_ERROR(fill(p + "wv", w.wqkv, QW + KVW));
    SYMTP_RETURN_IF_ERROR(fill(p + "wo", w.wo, 0));
    SYMTP_RETURN_IF_ERROR(fill(p + "w_gate", w.wgu, 0));
    SYMTP_RETURN_IF_ERROR(fill(p + "w_up", w.wgu, FL));
    SYMTP_RETURN_IF_ERROR(fill(p + "w_down", w.wdown, 0));
  }
  SYMTP_RETURN_IF_ERROR(fill("final_norm", final_norm, 0));
  SYMTP_RETURN_IF_ERROR(fill("lm_head", lm_head, 0));
  if (defer_norm) {  // the final norm stays: the LM head reads h
    for (int l = 0; l < cfg.layers; ++l) {
      LayerPtrs& w = L[l];
      SYMTP_RETURN_IF_ERROR(kernels::FoldNormWeight(w.wqkv, QKVW, H, w.attn_norm, dt, s));
      SYMTP_RETURN_IF_ERROR(kernels::FoldNormWeight(w.wgu, 2 * FL, H, w.mlp_norm, dt, s));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuModel::State::Init() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  dt = opt.dtype;
  if (dt != DType::kF32 && dt != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("GpuModel: dtype must be float or bfloat16, got ", kernels::DTypeName(dt)));
  }
  esz = kernels::DTypeSize(dt);
  defer_norm = opt.defer_norm && tp == 1 && dt == DType::kBF16;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  trace_out = env::KernelTraceOut().value_or("");
  if (!trace_out.empty()) SYMTP_RETURN_IF_ERROR(trace::Enable(23));  // 320 MiB
  H = cfg.hidden;
  D = cfg.head_dim;
  NHl = layout.q_heads_local;
  NKVl = layout.kv_heads_local;
  QW = NHl * D;
  KVW = NKVl * D;
  QKVW = QW + 2 * KVW;
  FL = layout.ffn_local;
  VL = layout.vocab_local;
  V = cfg.vocab;
  if (D != 32 && D != 64 && D != 128) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GpuModel: head_dim %d unsupported (32, 64, 128)", D));
  }
  plan_blocks_per_sm = std::max(1, kernels::DecodePlanBlocksPerSm(D, cfg.block_size));
  if (kernels::MaxAttentionItemTokens(NHl, NKVl) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GpuModel: GQA group %d > 64", NKVl > 0 ? NHl / NKVl : 0));
  }
  if (H > 12288) return absl::InvalidArgumentError("GpuModel: hidden > 12288");
  if (opt.gemv_max_rows < 0 || opt.gemv_max_rows > kernels::kGemvMaxRows) {
    return absl::InvalidArgumentError(absl::StrFormat("GpuModel: gemv_max_rows %d outside [0, %d]",
                                                      opt.gemv_max_rows, kernels::kGemvMaxRows));
  }
  if (opt.max_batch_tokens < 1 || opt.max_seqs < 1 || opt.attention_split_chunk < 16 ||
      opt.max_sampled_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GpuModel: bad options max_batch_tokens=%d max_seqs=%d "
                        "attention_split_chunk=%d max_sampled_rows=%d",
                        opt.max_batch_tokens, opt.max_seqs, opt.attention_split_chunk,
                        opt.max_sampled_rows));
  }
  if (opt.exchange_min_rows < 0 ||
      (opt.exchange_min_rows > 0 && CopyExchange() &&
       cfg.layers * 2 * kMaxExchangeChunks > kernels::kCopyExchangeFlags)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GpuModel: exchange_min_rows %d: negative, or %d layers x 2 x %d chunks past the copy "
        "exchange's %d flags",
        opt.exchange_min_rows, cfg.layers, kMaxExchangeChunks, kernels::kCopyExchangeFlags));
  }
  max_tokens = opt.max_batch_tokens;
  max_seqs = opt.max_seqs;
  max_sampled = opt.max_sampled_rows > 0 ? opt.max_sampled_rows : max_seqs;
  max_items = std::max(max_tokens, max_seqs);
  cap_blocks = (cfg.max_seq_len + cfg.block_size - 1) / cfg.block_size;
  max_splits = (cfg.max_seq_len + opt.attention_split_chunk - 1) / opt.attention_split_chunk;
  std::vector<int> sizes =
      opt.graph_batch_sizes.empty() ? DefaultGraphSizes() : opt.graph_batch_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const int gmax = std::min({max_seqs, max_tokens, max_sampled});
  for (int g : sizes) {
    if (g >= 1 && g <= gmax) graph_sizes.push_back(g);
  }
  // The default sizes end with the job's own largest decode batch where it
  // falls between two of them, so no decode batch of the job runs eagerly
  // (a step of more rows than the largest graph launches kernel by kernel).
  if (opt.graph_batch_sizes.empty() && gmax < sizes.back() &&
      (graph_sizes.empty() || graph_sizes.back() < gmax)) {
    graph_sizes.push_back(gmax);
  }

  SYMTP_ASSIGN_OR_RETURN(cuda::Stream init_stream, cuda::Stream::Create());
  const cudaStream_t s = init_stream.get();

  // ---- weights
  {
    Carver c;
    const size_t o_embed = c.Take(static_cast<size_t>(V) * H * esz);
    struct LOff {
      size_t an, mn, qkv, wo, gu, down;
    };
    std::vector<LOff> lo(cfg.layers);
    for (auto& o : lo) {
      o.an = c.Take(static_cast<size_t>(H) * esz);
      o.mn = c.Take(static_cast<size_t>(H) * esz);
      o.qkv = c.Take(static_cast<size_t>(QKVW) * H * esz);
      o.wo = c.Take(static_cast<size_t>(H) * QW * esz);
      o.gu = c.Take(static_cast<size_t>(2) * FL * H * esz);
      o.down = c.Take(static_cast<size_t>(H) * FL * esz);
    }
    const size_t o_fn = c.Take(static_cast<size_t>(H) * esz);
    const size_t o_lm = c.Take(static_cast<size_t>(VL) * H * esz);
    const size_t o_rope = c.Take(static_cast<size_t>(cfg.max_seq_len) * (D / 2) * sizeof(double2));
    SYMTP_ASSIGN_OR_RETURN(weights, cuda::DeviceBuffer::Create(c.size()));
    weight_bytes = c.size();
    embed = At<void>(weights, o_embed);
    L.resize(cfg.layers);
    for (int l = 0; l < cfg.layers; ++l) {
      L[l].attn_norm = At<void>(weights, lo[l].an);
      L[l].mlp_norm = At<void>(weights, lo[l].mn);
      L[l].wqkv = At<void>(weights, lo[l].qkv);
      L[l].wo = At<void>(weights, lo[l].wo);
      L[l].wgu = At<void>(weights, lo[l].gu);
      L[l].wdown = At<void>(weights, lo[l].down);
    }
    final_norm = At<void>(weights, o_fn);
    lm_head = At<void>(weights, o_lm);
    rope = At<double2>(weights, o_rope);
    SYMTP_RETURN_IF_ERROR(InitWeights(s));
    SYMTP_RETURN_IF_ERROR(kernels::BuildRopeTable(rope, cfg.max_seq_len, D, cfg.rope_theta, s));
  }

  // ---- activations and workspaces
  {
    Carver c;
    const size_t T = max_tokens;
    const size_t o_x = c.Take(T * H * esz), o_h = c.Take(T * H * esz);
    const size_t o_qkv = c.Take(T * QKVW * esz), o_attn = c.Take(T * QW * esz);
    const size_t o_proj = c.Take(T * H * esz), o_gu = c.Take(T * 2 * FL * esz);
    const size_t o_act = c.Take(T * FL * esz);
    const size_t o_hs = c.Take(static_cast<size_t>(max_sampled) * H * esz);
    const size_t o_ll = c.Take(static_cast<size_t>(max_sampled) * VL * sizeof(float));
    const size_t o_ga =
        tp > 1 ? c.Take(static_cast<size_t>(tp) * max_sampled * VL * sizeof(float)) : 0;
    const size_t o_lg = tp > 1 ? c.Take(static_cast<size_t>(max_sampled) * V * sizeof(float)) : 0;
    const size_t o_smp = c.Take(static_cast<size_t>(max_sampled) * sizeof(int32_t));
    attn_ws_bytes =
        max_splits > 1 ? kernels::PagedAttentionWorkspaceBytes(max_seqs, NHl, D, max_splits) : 0;
    const size_t o_aws = c.Take(attn_ws_bytes);
    const size_t o_gws = c.Take(opt.gemm_workspace_bytes);
    SYMTP_ASSIGN_OR_RETURN(acts, cuda::DeviceBuffer::Create(c.size()));
    x = At<void>(acts, o_x);
    h = At<void>(acts, o_h);
    qkv = At<void>(acts, o_qkv);
    attn = At<void>(acts, o_attn);
    proj = At<void>(acts, o_proj);
    gu = At<void>(acts, o_gu);
    act = At<void>(acts, o_act);
    hs = At<void>(acts, o_hs);
    logits_local = At<float>(acts, o_ll);
    gathered = tp > 1 ? At<float>(acts, o_ga) : nullptr;
    logits = tp > 1 ? At<float>(acts, o_lg) : logits_local;
    sampled = At<int32_t>(acts, o_smp);
    attn_ws = attn_ws_bytes ? At<void>(acts, o_aws) : nullptr;
    gemm_ws = At<void>(acts, o_gws);
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(sampled, 0, static_cast<size_t>(max_sampled) * sizeof(int32_t), s));
  }

  // ---- step inputs (device) and pinned staging
  {
    InputLayout& il = in_layout;
    Carver c;
    // The packed region holds any step's arrays (StepInputs at capacity).
    const StepInputs at_capacity = PackStepInputs(max_tokens, max_items, max_sampled);
    c.Take(at_capacity.end);
    il.block_tables = c.Take(static_cast<size_t>(max_seqs) * cap_blocks * 4);
    il.bytes = c.size();
    SYMTP_ASSIGN_OR_RETURN(inputs, cuda::DeviceBuffer::Create(il.bytes));
    for (auto& st : staging) {
      SYMTP_ASSIGN_OR_RETURN(st, cuda::PinnedBuffer::Create(il.bytes));
    }
    d_block_tables = At<int32_t>(inputs, il.block_tables);
    SetStepInputs(at_capacity);
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(inputs.get(), 0, il.bytes, s));
    SYMTP_ASSIGN_OR_RETURN(host_tokens_buf,
                           cuda::PinnedBuffer::Create(2 * static_cast<size_t>(max_sampled) * 4));
    if (opt.host_logits) {
      SYMTP_ASSIGN_OR_RETURN(host_logits_buf,
                             cuda::PinnedBuffer::Create(static_cast<size_t>(max_sampled) * V * 4));
    }
  }

  // ---- KV cache, last: it may take a fraction of what is left
  {
    const size_t per_block_layer =
        static_cast<size_t>(cfg.block_size) * NKVl * D * esz;  // K (or V) of one layer
    const size_t per_block = KvCacheBytesPerBlock(cfg, layout, esz);
    int64_t blocks = opt.num_kv_blocks;
    if (blocks <= 0) {
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      size_t free_b = 0, total_b = 0;
      CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
      const double frac = std::clamp(opt.kv_cache_memory_fraction, 0.0, 0.95);
      blocks = static_cast<int64_t>(static_cast<double>(free_b) * frac) /
               static_cast<int64_t>(std::max<size_t>(per_block, 1));
    }
    blocks = std::min<int64_t>(blocks, INT32_MAX / cfg.block_size);
    if (blocks < 1) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "GpuModel: no device memory left for the KV cache (%d bytes a block)", per_block));
    }
    num_blocks = static_cast<int>(blocks);
    kv_bytes = per_block * static_cast<size_t>(blocks);
    SYMTP_ASSIGN_OR_RETURN(kv, cuda::DeviceBuffer::Create(kv_bytes));
    const size_t layer_bytes = per_block_layer * static_cast<size_t>(blocks);
    for (int l = 0; l < cfg.layers; ++l) {
      L[l].k_cache = At<void>(kv, (2 * static_cast<size_t>(l)) * layer_bytes);
      L[l].v_cache = At<void>(kv, (2 * static_cast<size_t>(l) + 1) * layer_bytes);
    }
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv.get(), 0, kv_bytes, s));
  }

  SYMTP_ASSIGN_OR_RETURN(gemm, kernels::CublasLtHandle::Create());
  if (opt.exchange_min_rows > 0) {
    // The all-reduce kernels' blocks enter ahead of the GEMM's waiting ones
    // (the copy engines need no SMs).
    int least = 0, greatest = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SYMTP_ASSIGN_OR_RETURN(
        side, cuda::Stream::Create(CopyExchange() ? 0 : greatest));
    for (int i = 0; i < 2 * kMaxExchangeChunks; ++i) {
      SYMTP_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create());
      SYMTP_ASSIGN_OR_RETURN(cuda::Event e2, cuda::Event::Create());
      ev_chunk_ready.push_back(std::move(e1));
      ev_chunk_sent.push_back(std::move(e2));
    }
  }
  SYMTP_ASSIGN_OR_RETURN(step_done, cuda::Event::Create());
  for (auto& e : staging_done) {
    SYMTP_ASSIGN_OR_RETURN(e, cuda::Event::Create());
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  // Nothing has run yet: the done-event of "step -1" is complete.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(step_done.get(), s));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  SYMTP_LOG(INFO, "gpu_model") << absl::StrFormat(
      "rank %d/%d on GPU %d: %s %s, weights %.2f GiB, KV cache %d blocks (%.2f GiB), graphs %s",
      layout.tp_rank, tp, device, cfg.name, kernels::DTypeName(dt),
      static_cast<double>(weight_bytes) / (1 << 30), num_blocks,
      static_cast<double>(kv_bytes) / (1 << 30), opt.cuda_graphs ? "on" : "off");
  return absl::OkStatus();
}

// ------------------------------------------------------------------ public

absl::StatusOr<GpuModel> GpuModel::Create(const ModelConfig& cfg, int tp_rank, int tp_size,
                                          int device, const GpuModelOptions& options,
                                          kernels::DeviceComm* comm) {
  SYMTP_ASSIGN_OR_RETURN(ShardLayout layout, MakeShardLayout(cfg, tp_rank, tp_size));
  if (comm == nullptr && tp_size != 1 && !options.bench_skip_allreduce) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GpuModel: tp_size %d needs a DeviceComm", tp_size));
  }
  if (comm != nullptr && (comm->rank() != tp_rank || comm->size() != tp_size)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GpuModel: DeviceComm is rank %d of %d, model is rank %d of %d",
                        comm->rank(), comm->size(), tp_rank, tp_size));
  }
  auto s = std::make_unique<State>();
  s->cfg = cfg;
  s->layout = layout;
  s->opt = options;
  s->comm = comm;
  s->device = device;
  s->tp = tp_size;
  SYMTP_RETURN_IF_ERROR_CTX(
      s->Init(), absl::StrFormat("GpuModel::Create(%s, rank %d/%d)", cfg.name, tp_rank, tp_size));
  return GpuModel(std::move(s));
}

GpuModel::GpuModel(std::unique_ptr<State> s) : s_(std::move(s)) {}
GpuModel::GpuModel(GpuModel&&) noexcept = default;
GpuModel& GpuModel::operator=(GpuModel&&) noexcept = default;
GpuModel::~GpuModel() {
  if (s_ && s_->step_done.get() != nullptr) {
    cudaSetDevice(s_->device);
    // The last step may still use the buffers about to be freed (cudaFree
    // would wait for the device anyway; this bounds the wait and says so).
    const absl::Status st =
        WaitEvent(s_->step_done.get(), Deadline::AfterMs(30'000), "GpuModel teardown");
    if (!st.ok()) {
      SYMTP_LOG(WARN, "gpu_model") << st.ToString();
    }
    if (st.ok() && !s_->trace_out.empty()) {  // only once the recording kernels are done
      const absl::Status ts =
          trace::DumpAndDisable(absl::StrCat(s_->trace_out, ".rank", s_->layout.tp_rank, ".bin"));
      if (!ts.ok()) SYMTP_LOG(WARN, "gpu_model") << ts.ToString();
    }
  }
}

absl::Status GpuModel::Forward(const BatchInput& in, cudaStream_t stream,
                               const StepOptions& options) {
  if (!s_) return absl::FailedPreconditionError("GpuModel: used after move");
  return s_->Forward(in, stream, options);
}

absl::Status GpuModel::WarmUp(cudaStream_t stream, Deadline deadline) {
  if (!s_) return absl::FailedPreconditionError("GpuModel: used after move");
  return s_->WarmUp(stream, deadline);
}

absl::Status GpuModel::WaitForStep(Deadline deadline) {
  if (!s_) return absl::FailedPreconditionError("GpuModel: used after move");
  CUDA_RETURN_IF_ERROR(cudaSetDevice(s_->device));
  return WaitEvent(s_->step_done.get(), deadline, "GpuModel::WaitForStep");
}

cudaEvent_t GpuModel::step_done_event() const { return s_->step_done.get(); }
int GpuModel::num_sampled() const { return s_->last_num_sampled; }

absl::Span<const float> GpuModel::host_logits() const {
  if (!s_->last_logits_copied) return {};
  return absl::MakeConstSpan(s_->host_logits_buf.as<float>(),
                             static_cast<size_t>(s_->last_num_sampled) * s_->V);
}
absl::Span<const int32_t> GpuModel::host_tokens() const {
  if (!s_->last_sampled || s_->step == 0) return {};
  return host_tokens_of(s_->step - 1);
}
absl::Span<const int32_t> GpuModel::host_tokens_of(int64_t step) const {
  if (step < 0 || step >= s_->step || s_->step > step + 2) return {};
  const int n = s_->half_num_sampled[step & 1];
  if (n < 0) return {};
  return absl::MakeConstSpan(s_->host_tokens_buf.as<int32_t>() + (step & 1) * s_->max_sampled,
                             static_cast<size_t>(n));
}
int64_t GpuModel::steps_enqueued() const { return s_->step; }
const float* GpuModel::device_logits() const { return s_->logits; }
const int32_t* GpuModel::device_tokens() const { return s_->sampled; }

void GpuModel::set_profiling(bool on) { s_->profiling = on; }

absl::StatusOr<StepProfile> GpuModel::LastStepProfile() {
  State& st = *s_;
  if (!st.prof_valid) {
    return absl::FailedPreconditionError(
        "GpuModel::LastStepProfile: the last step was not an eagerly profiled step");
  }
  StepProfile p;
  for (int i = 1; i < st.prof_n; ++i) {
    float ms = 0.f;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, st.prof_ev[i - 1].get(), st.prof_ev[i].get()));
    switch (st.prof_cls[i - 1]) {
      case kClsGemm:
        p.gemm_ms += ms;
        break;
      case kClsAttn:
        p.attention_ms += ms;
        break;
      case kClsRowPar:
        p.row_parallel_ms += ms;
        break;
      default:
        p.other_ms += ms;
        break;
    }
    p.total_ms += ms;
  }
  return p;
}

GraphStats GpuModel::graph_stats() const { return s_->stats; }
std::vector<int> GpuModel::graph_batch_sizes() const {
  return s_->opt.cuda_graphs ? s_->graph_sizes : std::vector<int>{};
}
void GpuModel::FailNextCaptureForTesting(absl::Status status) {
  s_->inject_capture_failure = std::move(status);
}
const ModelConfig& GpuModel::config() const { return s_->cfg; }
const ShardLayout& GpuModel::layout() const { return s_->layout; }
const GpuModelOptions& GpuModel::options() const { return s_->opt; }
int GpuModel::num_kv_blocks() const { return s_->num_blocks; }
size_t GpuModel::weight_bytes() const { return s_->weight_bytes; }
size_t GpuModel::kv_cache_bytes() const { return s_->kv_bytes; }
const void* GpuModel::k_cache(int layer) const {
  return layer >= 0 && layer < s_->cfg.layers ? s_->L[layer].k_cache : nullptr;
}
const void* GpuModel::v_cache(int layer) const {
  return layer >= 0 && layer < s_->cfg.layers ? s_->L[layer].v_cache : nullptr;
}

}  // namespace symtp::model

#include "models/cpu_model.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/cpu_gemm.h"
#include "models/cpu_ops.h"

namespace symtp::model {
namespace {

struct LayerWeights {
  std::vector<float> attn_norm, mlp_norm;
  std::vector<float> wqkv;   // [q_local*D + 2*kv_local*D, H]: wq rows, wk rows, wv rows
  std::vector<float> wo;     // [H, q_local*D]
  std::vector<float> wgu;    // [2*F_local, H]: w_gate rows, then w_up rows
  std::vector<float> wdown;  // [H, F_local]
  std::vector<float> k_cache, v_cache;
};

size_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return size_t{8} << 30;
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

constexpr size_t kDefaultMaxHostBytes = size_t{4} << 30;

double GiB(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

struct CpuModel::State {
  ModelConfig cfg;
  ShardLayout layout;
  int num_kv_blocks = 0;
  HostComm* comm = nullptr;
  LocalComm local_comm;

  std::vector<float> embed;       // [V, H]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [H]
  std::vector<float> lm_head;     // [V_local, H]
  cpu::RopeTable rope;
  std::vector<int> q_to_kv;       // local q head -> local kv head

  // Step scratch (grow only).
  std::vector<float> x, h, qkv, attn, o, gu, act;
  std::vector<float> logits_local, gathered;
  std::vector<int32_t> token_seq, rows, sample_row;
  cpu::MatMulScratch mm;
  cpu::AttentionScratch att;

  int q_width() const { return layout.q_heads_local * cfg.head_dim; }
  int kv_width() const { return layout.kv_heads_local * cfg.head_dim; }
  size_t kv_floats_per_layer() const {
    return static_cast<size_t>(num_kv_blocks) * cfg.block_size * kv_width();
  }

  absl::Status Fill(absl::string_view name, float* dst, size_t n) {
    SYMTP_ASSIGN_OR_RETURN(ShardSpec spec, GetShardSpec(cfg, layout, name));
    return MaterializeShard(spec, absl::MakeSpan(dst, n));
  }

  absl::Status Forward(const BatchInput& in, std::vector<float>* logits);
};

static void Grow(std::vector<float>* v, size_t n) {
  if (v->size() < n) v->resize(n);
}

absl::StatusOr<CpuModel> CpuModel::Create(const ModelConfig& cfg, int tp_rank, int tp_size,
                                          int num_kv_blocks, HostComm* comm,
                                          const CpuModelOptions& options) {
  SYMTP_ASSIGN_OR_RETURN(ShardLayout layout, MakeShardLayout(cfg, tp_rank, tp_size));
  if (num_kv_blocks < 1 || num_kv_blocks > INT32_MAX / cfg.block_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CpuModel: num_kv_blocks %d must be in [1, %d]", num_kv_blocks,
                        INT32_MAX / cfg.block_size));
  }
  if (comm == nullptr && tp_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CpuModel: tp_size %d needs a HostComm", tp_size));
  }
  if (comm != nullptr && (comm->rank() != tp_rank || comm->size() != tp_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CpuModel: HostComm is rank %d of %d, model is rank %d of %d", comm->rank(),
        comm->size(), tp_rank, tp_size));
  }
  auto s = std::make_unique<State>();
  s->cfg = cfg;
  s->layout = layout;
  s->num_kv_blocks = num_kv_blocks;
  s->comm = comm != nullptr ? comm : &s->local_comm;

  const size_t H = cfg.hidden, D = cfg.head_dim, V = cfg.vocab;
  const size_t qw = s->q_width(), kvw = s->kv_width(), fl = layout.ffn_local;
  const size_t per_layer = 2 * H + (qw + 2 * kvw) * H + H * qw + 2 * fl * H + H * fl;
  const size_t weight_floats =
      V * H + cfg.layers * per_layer + H + static_cast<size_t>(layout.vocab_local) * H;
  const size_t kv_bytes = 2 * cfg.layers * s->kv_floats_per_layer() * sizeof(float);
  const size_t rope_bytes = static_cast<size_t>(cfg.max_seq_len) * D * sizeof(double);
  const size_t total = weight_floats * sizeof(float) + kv_bytes + rope_bytes;
  const size_t limit = options.max_host_bytes ? options.max_host_bytes
                                              : std::min(kDefaultMaxHostBytes, PhysicalMemoryBytes() / 2);
  if (total > limit) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "CpuModel: rank %d/%d of model '%s' needs %.2f GiB of fp32 weights + %.2f GiB KV cache "
        "(%d blocks), over the host limit of %.2f GiB (CpuModelOptions::max_host_bytes); the "
        "CPU reference is meant for small shapes such as 'tiny'",
        tp_rank, tp_size, cfg.name, GiB(weight_floats * sizeof(float)), GiB(kv_bytes),
        num_kv_blocks, GiB(limit)));
  }

  s->embed.resize(V * H);
  SYMTP_RETURN_IF_ERROR(s->Fill("embed", s->embed.data(), s->embed.size()));
  s->layers.resize(cfg.layers);
  for (int l = 0; l < cfg.layers; ++l) {
    LayerWeights& w = s->layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    w.attn_norm.resize(H);
    w.mlp_norm.resize(H);
    w.wqkv.resize((qw + 2 * kvw) * H);
    w.wo.resize(H * qw);
    w.wgu.resize(2 * fl * H);
    w.wdown.resize(H * fl);
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "attn_norm", w.attn_norm.data(), H));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "mlp_norm", w.mlp_norm.data(), H));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "wq", w.wqkv.data(), qw * H));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "wk", w.wqkv.data() + qw * H, kvw * H));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "wv", w.wqkv.data() + (qw + kvw) * H, kvw * H));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "wo", w.wo.data(), H * qw));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "w_gate", w.wgu.data(), fl * H));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "w_up", w.wgu.data() + fl * H, fl * H));
    SYMTP_RETURN_IF_ERROR(s->Fill(p + "w_down", w.wdown.data(), H * fl));
    w.k_cache.assign(s->kv_floats_per_layer(), 0.f);
    w.v_cache.assign(s->kv_floats_per_layer(), 0.f);
  }
  s->final_norm.resize(H);
  SYMTP_RETURN_IF_ERROR(s->Fill("final_norm", s->final_norm.data(), H));
  s->lm_head.resize(static_cast<size_t>(layout.vocab_local) * H);
  SYMTP_RETURN_IF_ERROR(s->Fill("lm_head", s->lm_head.data(), s->lm_head.size()));
  s->rope = cpu::RopeTable(cfg.head_dim, cfg.rope_theta, cfg.max_seq_len);
  s->q_to_kv.resize(layout.q_heads_local);
  for (int h = 0; h < layout.q_heads_local; ++h) {
    s->q_to_kv[h] = LocalKvHeadForQHead(cfg, layout, h);
  }
  return CpuModel(std::move(s));
}

CpuModel::CpuModel(std::unique_ptr<State> s) : s_(std::move(s)) {}
CpuModel::CpuModel(CpuModel&&) noexcept = default;
CpuModel& CpuModel::operator=(CpuModel&&) noexcept = default;
CpuModel::~CpuModel() = default;

const ModelConfig& CpuModel::config() const { return s_->cfg; }
const ShardLayout& CpuModel::layout() const { return s_->layout; }
int CpuModel::num_kv_blocks() const { return s_->num_kv_blocks; }
size_t CpuModel::kv_cache_bytes() const {
  return 2 * s_->cfg.layers * s_->kv_floats_per_layer() * sizeof(float);
}
size_t CpuModel::weight_bytes() const {
  size_t n = s_->embed.size() + s_->final_norm.size() + s_->lm_head.size();
  for (const LayerWeights& w : s_->layers) {
    n += w.attn_norm.size() + w.mlp_norm.size() + w.wqkv.size() + w.wo.size() + w.wgu.size() +
         w.wdown.size();
  }
  return n * sizeof(float);
}
absl::Span<const float> CpuModel::k_cache(int layer) const {
  if (layer < 0 || layer >= s_->cfg.layers) return {};
  return s_->layers[layer].k_cache;
}
absl::Span<const float> CpuModel::v_cache(int layer) const {
  if (layer < 0 || layer >= s_->cfg.layers) return {};
  return s_->layers[layer].v_cache;
}

absl::Status CpuModel::Forward(const BatchInput& in, std::vector<float>* logits) {
  if (s_ == nullptr) return absl::FailedPreconditionError("CpuModel: used after move");
  return s_->Forward(in, logits);
}

absl::Status CpuModel::State::Forward(const BatchInput& in, std::vector<float>* logits) {
  SYMTP_RETURN_IF_ERROR_CTX(in.Validate(cfg, num_kv_blocks),
                            absl::StrFormat("CpuModel rank %d", layout.tp_rank));
  const int T = in.num_tokens();
  const int S = in.num_seqs();
  const int NS = static_cast<int>(in.sample_index.size());
  const int H = cfg.hidden, D = cfg.head_dim, L = cfg.layers;
  const int QW = q_width(), KVW = kv_width(), QKVW = QW + 2 * KVW, FL = layout.ffn_local;
  const int VL = layout.vocab_local, V = cfg.vocab, B = cfg.block_size;
  logits->resize(static_cast<size_t>(NS) * V);
  if (T == 0) return absl::OkStatus();

  token_seq.resize(T);
  for (int s = 0; s < S; ++s) {
    for (int t = in.seq_start[s]; t < in.seq_start[s + 1]; ++t) token_seq[t] = s;
  }
  // Rows the last layer needs past attention: the sampled tokens, sorted, unique.
  rows.assign(in.sample_index.begin(), in.sample_index.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const int R = static_cast<int>(rows.size());

  Grow(&x, static_cast<size_t>(T) * H);
  Grow(&h, static_cast<size_t>(std::max(T, NS)) * H);  // NS > T with repeated sample_index
  Grow(&qkv, static_cast<size_t>(T) * QKVW);
  Grow(&attn, static_cast<size_t>(T) * QW);
  Grow(&o, static_cast<size_t>(T) * H);
  Grow(&gu, static_cast<size_t>(T) * 2 * FL);
  Grow(&act, static_cast<size_t>(T) * FL);

  for (int t = 0; t < T; ++t) {
    std::memcpy(&x[static_cast<size_t>(t) * H], &embed[static_cast<size_t>(in.tokens[t]) * H],
                H * sizeof(float));
  }
  for (int l = 0; l < L; ++l) {
    LayerWeights& w = layers[l];
    const bool last = (l == L - 1);
    // Attention block: QKV, RoPE, cache write for every token.
    cpu::RmsNorm(x.data(), w.attn_norm.data(), T, H, cfg.rms_eps, h.data());
    cpu::MatMulTransB(h.data(), H, T, H, w.wqkv.data(), QKVW, qkv.data(), QKVW, &mm);
    for (int t = 0; t < T; ++t) {
      float* row = &qkv[static_cast<size_t>(t) * QKVW];
      const int p = in.positions[t];
      cpu::ApplyRope(row, layout.q_heads_local, rope, p);
      cpu::ApplyRope(row + QW, layout.kv_heads_local, rope, p);
      const size_t slot = static_cast<size_t>(in.slot_mapping[t]);
      std::memcpy(&w.k_cache[slot * KVW], row + QW, KVW * sizeof(float));
      std::memcpy(&w.v_cache[slot * KVW], row + QW + KVW, KVW * sizeof(float));
    }
    const cpu::PagedKvView kv{w.k_cache.data(), w.v_cache.data(), B, layout.kv_heads_local, D};
    const int TQ = last ? R : T;
    for (int i = 0; i < TQ; ++i) {
      const int t = last ? rows[i] : i;
      const int s = token_seq[t];
      cpu::AttendOne(&qkv[static_cast<size_t>(t) * QKVW], layout.q_heads_local, q_to_kv.data(),
                     kv, &in.block_tables[static_cast<size_t>(s) * in.max_blocks_per_seq],
                     in.positions[t] + 1, &attn[static_cast<size_t>(i) * QW], &att);
    }
    if (last && R != T) {
      // Compact the residual to the sampled rows (rows is increasing, rows[i] >= i).
      for (int i = 0; i < R; ++i) {
        if (rows[i] != i) {
          std::memcpy(&x[static_cast<size_t>(i) * H], &x[static_cast<size_t>(rows[i]) * H],
                      H * sizeof(float));
        }
      }
    }
    const int n = last ? R : T;
    if (n == 0) break;
    cpu::MatMulTransB(attn.data(), QW, n, QW, w.wo.data(), H, o.data(), H, &mm);
    SYMTP_RETURN_IF_ERROR_CTX(comm->AllReduceSum(o.data(), static_cast<size_t>(n) * H),
                              absl::StrFormat("CpuModel layer %d attention all-reduce", l));
    for (size_t i = 0; i < static_cast<size_t>(n) * H; ++i) x[i] += o[i];
    // MLP block.
    cpu::RmsNorm(x.data(), w.mlp_norm.data(), n, H, cfg.rms_eps, h.data());
    cpu::MatMulTransB(h.data(), H, n, H, w.wgu.data(), 2 * FL, gu.data(), 2 * FL, &mm);
    for (int i = 0; i < n; ++i) {
      const float* g = &gu[static_cast<size_t>(i) * 2 * FL];
      cpu::SiluMul(g, g + FL, FL, &act[static_cast<size_t>(i) * FL]);
    }
    cpu::MatMulTransB(act.data(), FL, n, FL, w.wdown.data(), H, o.data(), H, &mm);
    SYMTP_RETURN_IF_ERROR_CTX(comm->AllReduceSum(o.data(), static_cast<size_t>(n) * H),
                              absl::StrFormat("CpuModel layer %d MLP all-reduce", l));
    for (size_t i = 0; i < static_cast<size_t>(n) * H; ++i) x[i] += o[i];
  }
  if (NS == 0) return absl::OkStatus();
  // Final norm + LM head on the sampled rows, in sample_index order.
  sample_row.resize(NS);
  for (int i = 0; i < NS; ++i) {
    sample_row[i] = static_cast<int32_t>(
        std::lower_bound(rows.begin(), rows.end(), in.sample_index[i]) - rows.begin());
  }
  for (int i = 0; i < NS; ++i) {
    cpu::RmsNorm(&x[static_cast<size_t>(sample_row[i]) * H], final_norm.data(), 1, H,
                 cfg.rms_eps, &h[static_cast<size_t>(i) * H]);
  }
  const int N = layout.tp_size;
  if (N == 1) {
    cpu::MatMulTransB(h.data(), H, NS, H, lm_head.data(), VL, logits->data(), V, &mm);
    return absl::OkStatus();
  }
  Grow(&logits_local, static_cast<size_t>(NS) * VL);
  Grow(&gathered, static_cast<size_t>(N) * NS * VL);
  cpu::MatMulTransB(h.data(), H, NS, H, lm_head.data(), VL, logits_local.data(), VL, &mm);
  SYMTP_RETURN_IF_ERROR_CTX(
      comm->AllGather(logits_local.data(), static_cast<size_t>(NS) * VL, gathered.data()),
      "CpuModel LM-head all-gather");
  for (int r = 0; r < N; ++r) {
    for (int i = 0; i < NS; ++i) {
      std::memcpy(logits->data() + static_cast<size_t>(i) * V + static_cast<size_t>(r) * VL,
                  &gathered[(static_cast<size_t>(r) * NS + i) * VL], VL * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace symtp::model

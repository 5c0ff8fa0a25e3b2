#include "models/sharding.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace symtp::model {

absl::StatusOr<ShardLayout> MakeShardLayout(const ModelConfig& cfg, int tp_rank, int tp_size) {
  SYMTP_RETURN_IF_ERROR(ValidateForTp(cfg, tp_size));
  if (tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tp_rank %d out of range for tp_size %d", tp_rank, tp_size));
  }
  const int n = tp_size, r = tp_rank;
  ShardLayout l;
  l.tp_rank = r;
  l.tp_size = n;
  l.q_heads_local = cfg.heads / n;
  l.q_head_begin = r * l.q_heads_local;
  if (cfg.kv_heads >= n) {
    l.kv_heads_local = cfg.kv_heads / n;
    l.kv_head_begin = r * l.kv_heads_local;
  } else {
    l.kv_heads_local = 1;
    l.kv_head_begin = r / (n / cfg.kv_heads);
  }
  l.ffn_local = cfg.ffn / n;
  l.ffn_begin = r * l.ffn_local;
  l.vocab_local = cfg.vocab / n;
  l.vocab_begin = r * l.vocab_local;
  return l;
}

size_t KvCacheBytesPerBlock(const ModelConfig& cfg, const ShardLayout& layout, size_t elem_bytes) {
  return 2 * static_cast<size_t>(cfg.layers) * cfg.block_size * layout.kv_heads_local *
         cfg.head_dim * elem_bytes;
}

int LocalKvHeadForQHead(const ModelConfig& cfg, const ShardLayout& layout, int local_q_head) {
  const int group = cfg.heads / cfg.kv_heads;
  return (layout.q_head_begin + local_q_head) / group - layout.kv_head_begin;
}

std::vector<std::string> TensorNames(const ModelConfig& cfg) {
  std::vector<std::string> names = {"embed"};
  for (int l = 0; l < cfg.layers; ++l) {
    for (const char* t : {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up",
                          "w_down"}) {
      names.push_back(absl::StrCat("layers.", l, ".", t));
    }
  }
  names.push_back("final_norm");
  names.push_back("lm_head");
  return names;
}

absl::StatusOr<ShardSpec> GetShardSpec(const ModelConfig& cfg, const ShardLayout& layout,
                                       absl::string_view tensor_name) {
  const int64_t H = cfg.hidden, D = cfg.head_dim, NH = cfg.heads, NKV = cfg.kv_heads,
                F = cfg.ffn, V = cfg.vocab;
  ShardSpec s;
  s.name = std::string(tensor_name);
  s.key = TensorKey(cfg.seed, tensor_name);
  auto linear = [&](int64_t grows, int64_t gcols, int64_t rb, int64_t rn, int64_t cb,
                    int64_t cn, int64_t fan_in) {
    s.kind = WeightKind::kLinear;
    s.scale = LinearScale(static_cast<int>(fan_in));
    s.global_rows = grows;
    s.global_cols = gcols;
    s.row_begin = rb;
    s.rows = rn;
    s.col_begin = cb;
    s.cols = cn;
  };
  auto vector1d = [&](WeightKind kind, int64_t n) {
    s.kind = kind;
    s.scale = 1.f;
    s.global_rows = 1;
    s.global_cols = n;
    s.rows = 1;
    s.cols = n;
  };
  const int64_t q_rows = layout.q_heads_local * D, q_begin = layout.q_head_begin * D;
  const int64_t kv_rows = layout.kv_heads_local * D, kv_begin = layout.kv_head_begin * D;
  if (tensor_name == "embed") {
    s.kind = WeightKind::kEmbedding;
    s.scale = 1.f;
    s.global_rows = s.rows = V;
    s.global_cols = s.cols = H;
    return s;
  }
  if (tensor_name == "final_norm") {
    vector1d(WeightKind::kNorm, H);
    return s;
  }
  if (tensor_name == "lm_head") {
    linear(V, H, layout.vocab_begin, layout.vocab_local, 0, H, H);
    return s;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(tensor_name, '.');
  int layer = -1;
  if (parts.size() != 3 || parts[0] != "layers" || !absl::SimpleAtoi(parts[1], &layer) ||
      layer < 0 || layer >= cfg.layers || absl::StrCat(layer) != parts[1]) {
    return absl::InvalidArgumentError(absl::StrCat("unknown tensor name '", tensor_name,
                                                   "' for model '", cfg.name, "' with ",
                                                   cfg.layers, " layers"));
  }
  absl::string_view t = parts[2];
  if (t == "attn_norm" || t == "mlp_norm") {
    vector1d(WeightKind::kNorm, H);
  } else if (t == "wq") {
    linear(NH * D, H, q_begin, q_rows, 0, H, H);
  } else if (t == "wk" || t == "wv") {
    linear(NKV * D, H, kv_begin, kv_rows, 0, H, H);
  } else if (t == "wo") {
    linear(H, NH * D, 0, H, q_begin, q_rows, NH * D);
  } else if (t == "w_gate" || t == "w_up") {
    linear(F, H, layout.ffn_begin, layout.ffn_local, 0, H, H);
  } else if (t == "w_down") {
    linear(H, F, 0, H, layout.ffn_begin, layout.ffn_local, F);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tensor name '", tensor_name, "' (bad tensor '", t, "')"));
  }
  return s;
}

absl::Status MaterializeShard(const ShardSpec& spec, absl::Span<float> out) {
  if (static_cast<int64_t>(out.size()) != spec.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MaterializeShard(%s): output has %d floats, shard has %d", spec.name, out.size(),
        spec.size()));
  }
  for (int64_t r = 0; r < spec.rows; ++r) {
    const uint64_t base =
        static_cast<uint64_t>((spec.row_begin + r) * spec.global_cols + spec.col_begin);
    float* dst = out.data() + r * spec.cols;
    for (int64_t c = 0; c < spec.cols; ++c) {
      dst[c] = SyntheticWeight(spec.key, base + static_cast<uint64_t>(c), spec.kind, spec.scale);
    }
  }
  return absl::OkStatus();
}

std::vector<float> ShardWeights(const ModelConfig& cfg, const ShardLayout& layout,
                                absl::string_view tensor_name) {
  auto spec = GetShardSpec(cfg, layout, tensor_name);
  if (!spec.ok()) return {};
  std::vector<float> out(static_cast<size_t>(spec->size()));
  if (!MaterializeShard(*spec, absl::MakeSpan(out)).ok()) return {};
  return out;
}

}  // namespace symtp::model

// Tensor-parallel sharding of docs/MODEL.md: which heads / ffn columns / vocab
// rows a rank owns, and the mapping from a rank's local tensor to the global
// synthetic weight function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/config.h"
#include "models/weights.h"

namespace symtp::model {

struct ShardLayout {
  int tp_rank = 0, tp_size = 1;
  int q_heads_local = 0, q_head_begin = 0;    // [r*NH/N, (r+1)*NH/N)
  int kv_heads_local = 0, kv_head_begin = 0;  // NKV>=N: [r*NKV/N, ..); else 1 head, r/(N/NKV)
  int ffn_local = 0, ffn_begin = 0;           // [r*F/N, (r+1)*F/N)
  int vocab_local = 0, vocab_begin = 0;       // [r*V/N, (r+1)*V/N)
};

// ValidateForTp(cfg, tp_size) and 0 <= tp_rank < tp_size, else InvalidArgument.
absl::StatusOr<ShardLayout> MakeShardLayout(const ModelConfig& cfg, int tp_rank, int tp_size);

// KV cache bytes of one block (block_size positions) on a rank: K and V of
// every layer for the rank's kv heads, `elem_bytes` per element.
size_t KvCacheBytesPerBlock(const ModelConfig& cfg, const ShardLayout& layout, size_t elem_bytes);

// Local kv head (0-based on this rank) used by local q head `local_q_head`
// (GQA: global q head h uses global kv head h / (NH/NKV)).
int LocalKvHeadForQHead(const ModelConfig& cfg, const ShardLayout& layout, int local_q_head);

// How one rank's shard of a named tensor maps onto the global tensor: local
// element (r, c) of the row-major [rows, cols] shard is global element
// (row_begin + r, col_begin + c), i.e. global flat index
// (row_begin + r) * global_cols + col_begin + c, and its value is
// SyntheticWeight(key, that index, kind, scale). 1-D tensors (norms) have
// global_rows = rows = 1.
struct ShardSpec {
  std::string name;
  WeightKind kind = WeightKind::kLinear;
  float scale = 1.f;  // LinearScale(fan_in) for kLinear, else 1
  uint64_t key = 0;   // TensorKey(cfg.seed, name)
  int64_t global_rows = 0, global_cols = 0;
  int64_t row_begin = 0, rows = 0;
  int64_t col_begin = 0, cols = 0;
  int64_t size() const { return rows * cols; }
};

// All tensor names of the model in a fixed order: embed, then per layer
// attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down, then final_norm,
// lm_head.
std::vector<std::string> TensorNames(const ModelConfig& cfg);

// Unknown tensor name or bad layer index -> InvalidArgument.
absl::StatusOr<ShardSpec> GetShardSpec(const ModelConfig& cfg, const ShardLayout& layout,
                                       absl::string_view tensor_name);

// Fills `out` (exactly spec.size() floats, row-major) with the shard.
absl::Status MaterializeShard(const ShardSpec& spec, absl::Span<float> out);

// Materialize one rank's fp32 shard of a named tensor (row-major,
// [out_local, in_local]) from the global function. Returns an empty vector
// for an unknown name (use GetShardSpec for the error).
std::vector<float> ShardWeights(const ModelConfig& cfg, const ShardLayout& layout,
                                absl::string_view tensor_name);

}  // namespace symtp::model

// Model shapes: presets, command-line overrides and the tensor-parallel
// divisibility rules of docs/MODEL.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace symtp::model {

struct ModelConfig {
  std::string name;
  int hidden = 0;    // H
  int layers = 0;    // L
  int heads = 0;     // NH
  int kv_heads = 0;  // NKV
  int head_dim = 0;  // D = H / NH
  int ffn = 0;       // F
  int vocab = 0;     // V
  float rope_theta = 10000.f;
  float rms_eps = 1e-5f;
  int block_size = 16;  // KV-cache block size B
  int max_seq_len = 4096;
  uint64_t seed = 1234;
};

// The preset names PresetConfig() accepts, in table order.
const std::vector<std::string>& PresetNames();

// tiny, small, llama-8b-shape, llama-70b-shape (docs/MODEL.md table).
// Unknown name -> InvalidArgument listing the valid names.
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

// Applies "key=value[,key=value...]" (e.g. "layers=4,max_seq_len=2048,seed=7")
// to `cfg`. Keys: hidden, layers, heads, kv_heads, head_dim, ffn, vocab,
// rope_theta, rms_eps, block_size, max_seq_len, seed. When hidden or heads is
// overridden and head_dim is not, head_dim is re-derived as hidden / heads.
// An empty string changes nothing. Unknown/duplicate key, unparsable or
// non-positive value, or a resulting config that fails ValidateConfig ->
// InvalidArgument; `cfg` is left unchanged on error.
absl::Status ApplyOverrides(absl::string_view overrides, ModelConfig* cfg);

// PresetConfig(preset) followed by ApplyOverrides(overrides).
absl::StatusOr<ModelConfig> MakeConfig(absl::string_view preset, absl::string_view overrides);

// Shape sanity independent of TP: positive sizes, head_dim * heads == hidden,
// head_dim even (RoPE rotate-half), heads % kv_heads == 0 (GQA), finite
// positive rope_theta / rms_eps, seed anything.
absl::Status ValidateConfig(const ModelConfig& cfg);

// ValidateConfig plus docs/MODEL.md's TP rules: tp_size >= 1, NH % N == 0,
// F % N == 0, V % N == 0, and NKV % N == 0 or N % NKV == 0.
absl::Status ValidateForTp(const ModelConfig& cfg, int tp_size);

// One-line JSON object with every field.
std::string ToJson(const ModelConfig& cfg);

// Number of parameters of the whole (unsharded) model.
size_t ParamCount(const ModelConfig& cfg);

}  // namespace symtp::model

#include "models/config.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace symtp::model {
namespace {

ModelConfig Make(const char* name, int h, int l, int nh, int nkv, int f, int v) {
  ModelConfig c;
  c.name = name;
  c.hidden = h;
  c.layers = l;
  c.heads = nh;
  c.kv_heads = nkv;
  c.head_dim = h / nh;
  c.ffn = f;
  c.vocab = v;
  return c;
}

absl::Status ParsePositiveInt(absl::string_view key, absl::string_view value, int* out) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v) || v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model override ", key, "='", value,
                                                   "': expected a positive integer"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParsePositiveFloat(absl::string_view key, absl::string_view value, float* out) {
  float v = 0;
  if (!absl::SimpleAtof(value, &v) || !std::isfinite(v) || !(v > 0.f)) {
    return absl::InvalidArgumentError(absl::StrCat("model override ", key, "='", value,
                                                   "': expected a positive finite number"));
  }
  *out = v;
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string>* names = new std::vector<std::string>{
      "tiny", "small", "llama-8b-shape", "llama-70b-shape"};
  return *names;
}

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  if (name == "tiny") return Make("tiny", 256, 2, 8, 2, 512, 512);
  if (name == "small") return Make("small", 2048, 4, 16, 4, 5632, 16384);
  if (name == "llama-8b-shape") return Make("llama-8b-shape", 4096, 32, 32, 8, 14336, 128256);
  if (name == "llama-70b-shape") return Make("llama-70b-shape", 8192, 80, 64, 8, 28672, 128256);
  return absl::InvalidArgumentError(absl::StrCat("unknown model preset '", name,
                                                 "'; valid presets: ",
                                                 absl::StrJoin(PresetNames(), ", ")));
}

absl::Status ApplyOverrides(absl::string_view overrides, ModelConfig* cfg) {
  ModelConfig c = *cfg;
  absl::string_view all = absl::StripAsciiWhitespace(overrides);
  if (all.empty()) return absl::OkStatus();
  std::set<std::string> seen;
  for (absl::string_view item : absl::StrSplit(all, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("model override '", item, "' in '", overrides, "': expected key=value"));
    }
    absl::string_view key = absl::StripAsciiWhitespace(kv[0]);
    absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
    if (!seen.insert(std::string(key)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("model override key '", key, "' given twice in '", overrides, "'"));
    }
    absl::Status st;
    if (key == "hidden") {
      st = ParsePositiveInt(key, value, &c.hidden);
    } else if (key == "layers") {
      st = ParsePositiveInt(key, value, &c.layers);
    } else if (key == "heads") {
      st = ParsePositiveInt(key, value, &c.heads);
    } else if (key == "kv_heads") {
      st = ParsePositiveInt(key, value, &c.kv_heads);
    } else if (key == "head_dim") {
      st = ParsePositiveInt(key, value, &c.head_dim);
    } else if (key == "ffn") {
      st = ParsePositiveInt(key, value, &c.ffn);
    } else if (key == "vocab") {
      st = ParsePositiveInt(key, value, &c.vocab);
    } else if (key == "block_size") {
      st = ParsePositiveInt(key, value, &c.block_size);
    } else if (key == "max_seq_len") {
      st = ParsePositiveInt(key, value, &c.max_seq_len);
    } else if (key == "rope_theta") {
      st = ParsePositiveFloat(key, value, &c.rope_theta);
    } else if (key == "rms_eps") {
      st = ParsePositiveFloat(key, value, &c.rms_eps);
    } else if (key == "seed") {
      uint64_t s = 0;
      if (!absl::SimpleAtoi(value, &s)) {
        st = absl::InvalidArgumentError(absl::StrCat(
            "model override seed='", value, "': expected an unsigned 64-bit integer"));
      }
      c.seed = s;
    } else {
      st = absl::InvalidArgumentError(absl::StrCat(
          "unknown model override key '", key,
          "'; valid keys: hidden, layers, heads, kv_heads, head_dim, ffn, vocab, rope_theta, "
          "rms_eps, block_size, max_seq_len, seed"));
    }
    if (!st.ok()) return st;
  }
  if ((seen.count("hidden") || seen.count("heads")) && !seen.count("head_dim") &&
      c.heads > 0) {
    c.head_dim = c.hidden / c.heads;
  }
  absl::Status st = ValidateConfig(c);
  if (!st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model overrides '", overrides, "': ", st.message()));
  }
  *cfg = std::move(c);
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> MakeConfig(absl::string_view preset, absl::string_view overrides) {
  SYMTP_ASSIGN_OR_RETURN(ModelConfig cfg, PresetConfig(preset));
  SYMTP_RETURN_IF_ERROR(ApplyOverrides(overrides, &cfg));
  return cfg;
}

absl::Status ValidateConfig(const ModelConfig& c) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("model config '", c.name, "': ", what));
  };
  if (c.hidden <= 0 || c.layers <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 ||
      c.ffn <= 0 || c.vocab <= 0 || c.block_size <= 0 || c.max_seq_len <= 0) {
    return bad(absl::StrCat("every size must be positive: ", ToJson(c)));
  }
  if (c.head_dim % 2 != 0) {
    return bad(absl::StrFormat("head_dim (%d) must be even for rotate-half RoPE", c.head_dim));
  }
  if (c.heads % c.kv_heads != 0) {
    return bad(absl::StrFormat("heads (%d) must be a multiple of kv_heads (%d)", c.heads,
                               c.kv_heads));
  }
  if (!std::isfinite(c.rope_theta) || !(c.rope_theta > 0.f) || !std::isfinite(c.rms_eps) ||
      !(c.rms_eps > 0.f)) {
    return bad("rope_theta and rms_eps must be positive and finite");
  }
  // Keep every flat index of a KV-cache position in int32 range for slot math.
  if (static_cast<int64_t>(c.max_seq_len) + c.block_size > std::numeric_limits<int32_t>::max()) {
    return bad("max_seq_len too large");
  }
  return absl::OkStatus();
}

absl::Status ValidateForTp(const ModelConfig& c, int n) {
  SYMTP_RETURN_IF_ERROR(ValidateConfig(c));
  std::vector<std::string> errors;
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model '%s': tensor-parallel size %d must be >= 1", c.name, n));
  }
  if (c.heads % n != 0) errors.push_back(absl::StrFormat("heads (%d) %% tp (%d) != 0", c.heads, n));
  if (c.ffn % n != 0) errors.push_back(absl::StrFormat("ffn (%d) %% tp (%d) != 0", c.ffn, n));
  if (c.vocab % n != 0) errors.push_back(absl::StrFormat("vocab (%d) %% tp (%d) != 0", c.vocab, n));
  if (c.kv_heads % n != 0 && n % c.kv_heads != 0) {
    errors.push_back(absl::StrFormat(
        "kv_heads (%d) and tp (%d): neither divides the other", c.kv_heads, n));
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("model '%s' cannot be split %d ways: %s",
                                                      c.name, n, absl::StrJoin(errors, "; ")));
  }
  return absl::OkStatus();
}

std::string ToJson(const ModelConfig& c) {
  JsonWriter j;
  j.Open('{').Field("name", c.name).Field("hidden", c.hidden).Field("layers", c.layers);
  j.Field("heads", c.heads).Field("kv_heads", c.kv_heads).Field("head_dim", c.head_dim);
  j.Field("ffn", c.ffn).Field("vocab", c.vocab).Key("rope_theta").Raw(absl::StrFormat("%.9g", c.rope_theta));
  j.Key("rms_eps").Raw(absl::StrFormat("%.9g", c.rms_eps)).Field("block_size", c.block_size);
  j.Field("max_seq_len", c.max_seq_len).Field("seed", c.seed).Field("params", ParamCount(c));
  return j.Close().Take();
}

size_t ParamCount(const ModelConfig& c) {
  const size_t h = c.hidden, q = static_cast<size_t>(c.heads) * c.head_dim,
               kv = static_cast<size_t>(c.kv_heads) * c.head_dim, f = c.ffn, v = c.vocab;
  const size_t per_layer = 2 * h + q * h + 2 * kv * h + h * q + 3 * f * h;
  return v * h + c.layers * per_layer + h + v * h;
}

}  // namespace symtp::model

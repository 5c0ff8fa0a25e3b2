// The synthetic weight function of docs/MODEL.md. Every element is a pure
// function of (seed, tensor name, global flat index), so any TP degree (and
// the GPU weight generator) computes exactly the same bits.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace symtp::model {

// splitmix64 finalizer including the golden-ratio increment (MODEL.md "mix").
inline constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a 64 over the bytes of `s`.
uint64_t Fnv1a64(absl::string_view s);

// mix(seed ^ fnv1a64(name)).
uint64_t TensorKey(uint64_t seed, absl::string_view name);

// float(sqrt(3.0 / fan_in)), computed in double and rounded once.
float LinearScale(int fan_in);

enum class WeightKind { kLinear, kEmbedding, kNorm };

// s = 2 * float(mix(key + index) >> 40) * 2^-24 - 1 (exact, in [-1, 1)).
inline float SyntheticUniform(uint64_t key, uint64_t index) {
  const uint64_t h = Mix64(key + index);
  const float u = static_cast<float>(h >> 40) * 0x1p-24f;  // exact
  return 2.0f * u - 1.0f;                                 // exact
}

// kLinear: s * scale (one rounding); kEmbedding: s; kNorm: s * 0.125f + 1.0f
// (the product is exact, one rounding). `scale` is used only for kLinear.
inline float SyntheticWeight(uint64_t key, uint64_t index, WeightKind kind, float scale) {
  const float s = SyntheticUniform(key, index);
  switch (kind) {
    case WeightKind::kLinear:
      return s * scale;
    case WeightKind::kEmbedding:
      return s;
    case WeightKind::kNorm:
      return s * 0.125f + 1.0f;
  }
  return s;
}

}  // namespace symtp::model

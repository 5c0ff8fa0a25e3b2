#include "models/weights.h"

#include <cmath>

namespace symtp::model {

uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint64_t>(static_cast<unsigned char>(c));
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t TensorKey(uint64_t seed, absl::string_view name) { return Mix64(seed ^ Fnv1a64(name)); }

float LinearScale(int fan_in) {
  return static_cast<float>(std::sqrt(3.0 / static_cast<double>(fan_in)));
}

}  // namespace symtp::model

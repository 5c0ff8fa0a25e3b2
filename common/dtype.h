// The element type of device tensors and collectives (kernels, the CUDA model,
// the all-reduce). Host-only code may name it too: nothing here needs CUDA.
#pragma once

#include <cstddef>

namespace symtp {

enum class DType { kF32, kBF16, kF16 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) {
  return t == DType::kF32 ? "float" : t == DType::kBF16 ? "bfloat16" : "half";
}

}  // namespace symtp

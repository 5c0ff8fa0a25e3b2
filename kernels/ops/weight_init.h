// Synthetic weights generated directly on the device (docs/MODEL.md
// "Synthetic weights"), bit-exact with model::SyntheticWeight: no host
// materialization, so a 70B-shape shard initializes in milliseconds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace symtp::kernels {

// Same meaning and order as model::WeightKind.
enum class SyntheticKind : int { kLinear = 0, kEmbedding = 1, kNorm = 2 };

// Which part of the global [global_rows, global_cols] tensor to generate and
// where to put it: local element (r, c), 0 <= r < rows, 0 <= c < cols, is the
// global element (row_begin + r, col_begin + c) (global flat index
// (row_begin + r) * global_cols + col_begin + c) and is stored at
// dst[r * dst_ld + c] (dst_ld = cols when 0). Mirrors model::ShardSpec.
struct SyntheticBlock {
  uint64_t key = 0;  // model::TensorKey(seed, name)
  SyntheticKind kind = SyntheticKind::kLinear;
  float scale = 1.f;  // model::LinearScale(fan_in), used by kLinear only
  int64_t global_cols = 0;
  int64_t row_begin = 0, rows = 0;
  int64_t col_begin = 0, cols = 0;
  int64_t dst_ld = 0;
};

// Writes the block as fp32 (the exact MODEL.md bits) or bf16 (those bits
// rounded to nearest-even). Enqueued on `stream`; InvalidArgument on bad
// shapes or dtype.
absl::Status InitSyntheticWeight(void* dst, DType dtype, const SyntheticBlock& block,
                                 cudaStream_t stream);

// Folds an RMSNorm's weight into the linear layer after it, for a norm left
// to the GEMM's consumer (layer_ops.h DeferredNorm): w[r, c] = w[r, c] *
// gamma[c] rounded to dtype for every row of w ([rows, cols], row-major),
// then gamma[c] = 1, so that the AddRmsNorm kernels that still run before
// this layer (steps that do not defer the norm) apply only the factor.
// Enqueued on `stream`; InvalidArgument on bad shapes or dtype.
absl::Status FoldNormWeight(void* w, int64_t rows, int64_t cols, void* gamma, DType dtype,
                            cudaStream_t stream);

}  // namespace symtp::kernels

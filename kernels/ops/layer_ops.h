// The non-GEMM, non-attention kernels of one decoder step (docs/MODEL.md
// "Forward pass"): embedding lookup, fused residual-add + RMSNorm, RoPE, KV
// cache write, SiLU-and-multiply, row gather, vocab-shard assembly and token
// forwarding from the previous step's samples.
//
// Conventions for every launcher here:
//  - activations are row-major [rows, width] of `dtype` (float or bfloat16);
//    intermediate arithmetic is fp32 and each output is rounded once;
//  - all pointers are device pointers; the work is enqueued on `stream` and
//    the call returns InvalidArgument for bad shapes, or the launch error;
//  - rows = 0 is a no-op.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace symtp::kernels {

// An RMSNorm applied by the kernel after the GEMM it precedes
// (GpuModelOptions::defer_norm): the GEMM read the un-normalized residual
// stream x, with the norm's weight folded into its columns (FoldNormWeight,
// weight_init.h); since a row's factor commutes with the product, the
// consumer multiplies row r of the GEMM's output by
//   1 / sqrt(mean(x[r]^2) + eps),   x[r] = x + r * hidden (elements, dtype),
// summed in fp32. x == nullptr: no norm.
struct DeferredNorm {
  const void* x = nullptr;
  int hidden = 0;
  float eps = 0.f;
};

// out[r, :] = table[tokens[r], :]; a token outside [0, vocab) gives a zero
// row (callers validate tokens on the host; this only keeps reads in bounds).
absl::Status EmbeddingLookup(const int32_t* tokens, const void* table, void* out, int64_t rows,
                             int hidden, int vocab, DType dtype, cudaStream_t stream);

// Fused residual add and RMSNorm, one row per block:
//   if delta != nullptr: residual[r] = residual[r] + delta[r]   (rounded to dtype)
//   out[r] = residual[r] / sqrt(mean(residual[r]^2) + eps) * weight
// `out` must not alias `residual` or `delta`. hidden <= 12288.
absl::Status AddRmsNorm(void* residual, const void* delta, const void* weight, void* out,
                        int64_t rows, int hidden, float eps, DType dtype, cudaStream_t stream);

// RoPE table for positions [0, max_pos): table[p * head_dim/2 + i] =
// {cos(p*f_i), sin(p*f_i)}, f_i = theta^(-2i/head_dim), all in double on the
// device, as the CPU reference computes it. max_pos * head_dim/2 entries.
absl::Status BuildRopeTable(double2* table, int max_pos, int head_dim, float theta,
                            cudaStream_t stream);

// Rotate-half RoPE in place on `num_heads` consecutive heads of each row:
// head h of row r starts at x + r * row_stride + h * head_dim (elements).
//   out[i] = x[i] c - x[i+D/2] s,  out[i+D/2] = x[i+D/2] c + x[i] s
// with {c, s} = table[positions[r]], evaluated in double and rounded once
// (bitwise what the CPU reference computes in fp32). Rows with a negative
// position are left unchanged (padding); positions >= max_pos likewise.
// head_dim <= 2048.
absl::Status ApplyRope(void* x, int64_t row_stride, int num_heads, int head_dim,
                       const int32_t* positions, int64_t rows, const double2* table, int max_pos,
                       DType dtype, cudaStream_t stream);

// Paged KV-cache write: for each row r with slot = slot_mapping[r] >= 0,
//   k_cache[slot, :, :] = k[r, :num_kv_heads*head_dim],  same for v,
// where the cache is [num_blocks * block_size, num_kv_heads, head_dim] and
// k/v rows start at k + r * row_stride (elements). Negative slots are skipped.
absl::Status WriteKvCache(const void* k, const void* v, int64_t row_stride,
                          const int32_t* slot_mapping, void* k_cache, void* v_cache, int64_t rows,
                          int num_kv_heads, int head_dim, DType dtype, cudaStream_t stream);

// ApplyRope on the q and k heads of packed qkv rows, then WriteKvCache of
// their k and v parts, in one kernel with the same results as the two calls:
// row r holds num_q_heads q heads at qkv + r * row_stride, then num_kv_heads
// k heads, then num_kv_heads v heads (head_dim elements each). Rotated k
// (unrotated where the position is outside [0, max_pos)) and v go to cache
// slot slot_mapping[r] when it is >= 0. With `norm`, each row's q, k and v
// are first multiplied by its factor (q and k before the rotation, which
// then runs on the fp32 products); a row whose position is outside [0,
// max_pos) keeps its q heads as they are.
absl::Status ApplyRopeWriteKv(void* qkv, int64_t row_stride, int num_q_heads, int num_kv_heads,
                              int head_dim, const int32_t* positions, const int32_t* slot_mapping,
                              int64_t rows, const double2* table, int max_pos, void* k_cache,
                              void* v_cache, DType dtype, cudaStream_t stream,
                              const DeferredNorm& norm = {});

// out[r, i] = silu(in[r, i]) * in[r, ffn + i], silu(z) = z / (1 + exp(-z)),
// for in = [gate | up] of width 2*ffn. With `norm`, gate and up are first
// multiplied by row r's factor (in fp32): out = silu(g s) * (u s).
absl::Status SiluMul(const void* gate_up, void* out, int64_t rows, int ffn, DType dtype,
                     cudaStream_t stream, const DeferredNorm& norm = {});

// dst[i, :] = src[index[i], :] for i < rows (row strides in elements).
absl::Status GatherRows(const void* src, int64_t src_ld, const int32_t* index, void* dst,
                        int64_t dst_ld, int64_t rows, int64_t cols, DType dtype,
                        cudaStream_t stream);

// Vocab-parallel logits after an AllGather: gathered is [tp][rows][vocab_local]
// (rank-major); out is [rows][tp * vocab_local] with rank r's slice at columns
// [r * vocab_local, (r+1) * vocab_local).
absl::Status AssembleVocabShards(const float* gathered, float* out, int64_t rows, int vocab_local,
                                 int tp, cudaStream_t stream);

// tokens[r] = prev_tokens[prev_row[r]] where prev_row[r] >= 0 (the token was
// sampled on the device by the previous step); others keep the host value.
absl::Status ForwardSampledTokens(int32_t* tokens, const int32_t* prev_tokens,
                                  const int32_t* prev_row, int64_t rows, cudaStream_t stream);

}  // namespace symtp::kernels

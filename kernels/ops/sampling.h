// Token sampling on the device (docs/MODEL.md "Sampling"), drawing what
// model::SampleToken draws from the same logits: greedy argmax (ties to the
// lowest id, NaN ordered as -inf), or temperature / top-k / top-p with the
// counter-based uniform of (seed, position).
//
// One block per row over the full vocabulary. Two paths for temperature > 0:
//  - exact (kept candidates <= kSampleExactCap, i.e. 1 <= top_k <= cap, or a
//    vocabulary <= cap): the candidates are selected (radix select on the
//    64-bit key (ordered logit, ~id)), sorted in shared memory, and one
//    thread runs the reference's own loop (double weights, sequential
//    cumulative sums, same comparisons): the same token as the CPU up to
//    last-ulp differences between the device's and glibc's exp;
//  - general (no top-k over a large vocabulary): top-p and the draw are found
//    by radix selects on cumulative weight; the weights are double but summed
//    in another order than the CPU's sequential sum, so a draw whose uniform
//    falls within ~1e-15 (relative) of a token boundary may differ.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace symtp::kernels {

inline constexpr int kSampleExactCap = 2048;

// Per row; plain data, copied to the device with the step's inputs.
struct DeviceSamplingParams {
  float temperature = 0.f;  // <= 0 or NaN: greedy
  int32_t top_k = 0;        // 0: off
  float top_p = 1.f;        // 1: off
  int32_t reserved = 0;
  uint64_t seed = 0;
  uint64_t position = 0;  // position of the token being sampled
};

// tokens[r] = the token drawn from logits[r, 0:vocab] (fp32, row-major, row
// stride `vocab`) with params[r]. All pointers are device pointers.
absl::Status SampleTokens(const float* logits, int64_t rows, int vocab,
                          const DeviceSamplingParams* params, int32_t* tokens, cudaStream_t stream);

}  // namespace symtp::kernels

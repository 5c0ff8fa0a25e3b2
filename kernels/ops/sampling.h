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

// Vocabulary-parallel sampling, for TP > 1 where each rank holds the logits
// of its vocabulary shard: instead of gathering every rank's logits, each
// rank keeps its row's top candidates and only those are gathered.
//  1. SelectShardCandidates on every rank: cand[row][0..kmax) = the 64-bit
//     sort keys (ordered logit, ~global id) of the shard's largest
//     max(1, top_k) logits of the row (1 for a greedy row), the other slots 0;
//     the shard's id i is global id vocab_offset + i.
//  2. An all-gather of cand (rows * kmax keys per rank) into
//     gathered[shard][row][kmax], shards in vocabulary order.
//  3. SampleFromCandidates: the token SampleTokens draws from the full row
//     (the global top-k is among the shards' top-k; same keys, same sort,
//     same reference loop), for every row that ShardedSamplingTakes.
// Rows that it does not take (temperature > 0 with no top-k, or a top-k
// over kmax or kSampleExactCap) need the full logits: SampleTokens.
bool ShardedSamplingTakes(const DeviceSamplingParams& p, int vocab, int kmax);
absl::Status SelectShardCandidates(const float* logits, int64_t rows, int vocab_local,
                                   int vocab_offset, const DeviceSamplingParams* params, int kmax,
                                   uint64_t* cand, cudaStream_t stream);
absl::Status SampleFromCandidates(const uint64_t* gathered, int shards, int64_t rows, int kmax,
                                  int vocab, const DeviceSamplingParams* params, int32_t* tokens,
                                  cudaStream_t stream);

}  // namespace symtp::kernels

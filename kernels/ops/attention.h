// Paged grouped-query attention over the KV cache of docs/MODEL.md, one
// kernel for decode (one query token per sequence, split-K over long
// contexts, flash-decoding style) and for prefill / chunked prefill (several
// query tokens of a sequence per block, causal by position).
//
// Every query token t at position p = positions[t] attends over the keys at
// positions 0..p of its sequence, read from the paged cache through the
// sequence's block table (slot(j) = table[j / B] * B + j % B), so the cache
// must already hold this step's keys (WriteKvCache runs first). The work is
// described by "items": one item = up to max_item_tokens consecutive query
// tokens of one sequence; a block handles one (item, kv head, split) and all
// the q heads of that kv head (GQA: q head h uses kv head h / (NH/NKV)), so
// each key is read once per group. A token with a negative position gets a
// zero output (padding rows of a CUDA-graph batch).
//
// Host-side planning (BuildAttentionItems, the split choice) is separate from
// the launch so that a launch with fixed grid sizes can be captured in a CUDA
// graph and replayed with new item contents.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace symtp::kernels {

struct AttentionItem {
  int32_t seq = 0;          // row of block_tables
  int32_t token_begin = 0;  // first query token (index into positions / q / out)
  int32_t num_tokens = 0;   // consecutive query tokens, 0 <= num_tokens <= max_item_tokens
  int32_t reserved = 0;
};

// Which kernel runs decode launches (max_item_tokens == 1):
//  - kTiled: the block-tiled kernel that also runs prefill (16-key tiles in
//    shared memory, 4 barriers per tile, fp32 arithmetic). 17-40% of the copy
//    bandwidth at context 1024 on an H200.
//  - kTensorCore (GpuModel's default): bf16 with 16-byte aligned q rows and
//    caches (other launches run the tiled kernel): both products on mma.sync
//    tensor cores. Groups <= 8 run the decode kernel (keys and head dims in
//    the M dimension, S^T = K Q^T and O^T = V^T P^T, K/V tiles copied in
//    whole 128-byte lines through a per-warp cp.async ring;
//    internal/mma_decode_kernel.cuh), larger groups the prefill kernel
//    (internal/mma_prefill_kernel.cuh). With the split chunk GpuModel plans
//    (PlanDecodeSplitChunk) 61-95% of the copy bandwidth on an H200 at
//    batch 32-512.
enum class DecodeKernel { kTiled, kTensorCore };
// Which kernel runs every other launch (prefill, chunked prefill, mixed
// batches): the tiled kernel, or the tensor-core kernel (bf16 only).
enum class PrefillKernel { kTiled, kTensorCore };

const char* DecodeKernelName(DecodeKernel k);  // "tiled", "tensor-core"
const char* PrefillKernelName(PrefillKernel k);

struct PagedAttentionArgs {
  // q head h of token t: q + t * q_row_stride + h * head_dim (elements).
  const void* q = nullptr;
  int64_t q_row_stride = 0;
  // One layer's cache, [num_blocks * block_size, num_kv_heads, head_dim].
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  // Rows of each cache (num_blocks * block_size). When set (> 0), the
  // tensor-core decode kernel copies K/V tiles of head dim 128 with TMA
  // through tensor maps of that size (faster, same bits); 0 keeps its
  // 16-byte cp.async copies.
  int64_t cache_slots = 0;
  // [num_tokens, num_q_heads * head_dim].
  void* out = nullptr;
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride]
  int block_table_stride = 0;
  int block_size = 16;
  const AttentionItem* items = nullptr;  // device array [num_items]
  int num_items = 0;
  // Upper bound on any item's num_tokens (host-known: it picks the kernel);
  // at most MaxAttentionItemTokens(num_q_heads, num_kv_heads, dtype,
  // head_dim, prefill_kernel).
  int max_item_tokens = 1;
  int num_tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;   // 32, 64 or 128
  float scale = 0.f;  // softmax scale, 1 / sqrt(head_dim)
  // Split-K: the keys of a sequence are cut into chunks of split_chunk
  // positions ([s*chunk, (s+1)*chunk)); split s of every item runs in its own
  // block and a second kernel merges the partial softmaxes. The partition
  // depends only on split_chunk, never on num_splits (which only has to
  // cover the longest context: ceil(max_context / split_chunk)), so a CUDA
  // graph captured with a larger num_splits computes the same bits.
  // num_splits = 1: no split, no workspace.
  int num_splits = 1;
  int split_chunk = 256;
  // When set, the chunk is read from this device int32 (> 0) when the
  // kernels run and split_chunk is ignored: a captured CUDA graph then
  // replays with each step's chunk (GpuModel plans one per decode step with
  // PlanDecodeSplitChunk and uploads it with the step's inputs).
  const int32_t* split_chunk_dev = nullptr;
  void* workspace = nullptr;  // PagedAttentionWorkspaceBytes(...) bytes when num_splits > 1
  size_t workspace_bytes = 0;
  DecodeKernel decode_kernel = DecodeKernel::kTiled;
  PrefillKernel prefill_kernel = PrefillKernel::kTiled;
  // Tensor-core kernel only (the others launch num_splits): > 0 launches
  // min(split_grid, num_splits) blocks per (item, kv head), each walking the
  // splits z, z + split_grid, ...; same partition, same bits. A CUDA graph
  // must size num_splits for the longest context (GpuModel: max_seq_len /
  // smallest chunk, 16 at 4096 / 256); with split_grid it need not launch
  // that many blocks: each reserves its ~98 KB of shared memory before it
  // finds its split empty, and 15 of 16 empty blocks per item made graph
  // steps slower than eager ones.
  int split_grid = 0;
};

#ifdef __CUDACC__
// The split-K chunk a kernel uses (device code only).
__device__ __forceinline__ int SplitChunk(int chunk, const int32_t* chunk_dev) {
  return chunk_dev != nullptr ? max(1, *chunk_dev) : chunk;
}
__device__ __forceinline__ int SplitChunk(const PagedAttentionArgs& a) {
  return SplitChunk(a.split_chunk, a.split_chunk_dev);
}
// Whether split 0's block stores a row of position `pos` normalized itself
// (every key it has lies in the first chunk) instead of writing split-K
// partials; MergeSplitsKernel skips the tokens with keys that this holds
// for (0 <= pos < chunk: one active split).
__device__ __forceinline__ bool Split0StoresRow(int pos, int chunk) { return pos < chunk; }
#endif

// Largest max_item_tokens every kernel takes: 64 / (num_q_heads / num_kv_heads).
int MaxAttentionItemTokens(int num_q_heads, int num_kv_heads);
// Largest max_item_tokens a launch with this dtype, head dim and prefill
// kernel takes: 128 query rows an item for the bf16 tensor-core prefill
// at head dim 128 (the wgmma kernel: two warpgroups of 64 rows, each K/V
// tile shared by 128 rows), 64 otherwise.
int MaxAttentionItemTokens(int num_q_heads, int num_kv_heads, DType dtype, int head_dim,
                           PrefillKernel prefill_kernel);

// The split-K chunk for a decode step over sequences of these context lengths
// (keys per sequence): at least min_chunk, and otherwise the chunk whose
// (sequence, kv head, split) blocks fill the block_slots it is given
// (GpuModel: DecodePlanBlocksPerSm x SMs), spread evenly over the longest
// context, never past them: a block pays a fixed cost (its query, block
// table and epilogue, and the merge's share) per split, so blocks beyond the
// slots (a second wave) cost more than the SMs they fill. Returns a chunk >=
// max(context) (no split) when two splits would pass the slots; GpuModel's
// graph for such a step has no merge kernel.
int PlanDecodeSplitChunk(absl::Span<const int32_t> context_lens, int num_kv_heads, int block_slots,
                         int min_chunk);

// Blocks of the tensor-core decode kernel resident on one SM at this head
// dim (its shared memory and launch bounds; 0 on an error or an unsupported
// head dim). Needs a current CUDA device.
int TensorCoreDecodeBlocksPerSm(int head_dim);

// Blocks per SM that GpuModel's split planner fills (PlanDecodeSplitChunk's
// block_slots over the SMs): 1 where the tensor-core decode kernel copies its
// K/V tiles by TMA (head dim 128, pages of a multiple of 16 slots, with
// cache_slots set), else TensorCoreDecodeBlocksPerSm. With TMA copies one
// block per SM over a whole context reads it faster than two resident blocks
// over its halves plus their merge (llama-8b TP=2 batch 32 on H100: 30.7
// against 33.5 us); where the cp.async form needs both resident blocks to
// stream, two splits filling them were the faster plan (the step 0.976x).
int DecodePlanBlocksPerSm(int head_dim, int block_size);

// Workspace of a split-K launch (fp32 partial outputs and softmax stats).
size_t PagedAttentionWorkspaceBytes(int num_tokens, int num_q_heads, int head_dim, int num_splits);

// Cuts every sequence s (tokens [seq_start[s], seq_start[s+1])) into items of
// at most max_tokens_per_item tokens, appending to `items` (cleared first).
void BuildAttentionItems(absl::Span<const int32_t> seq_start, int max_tokens_per_item,
                         std::vector<AttentionItem>* items);

// Enqueues the attention (and, for num_splits > 1, the merge) on `stream`.
// InvalidArgument on unsupported head_dim / group size / dtype or a missing
// workspace.
absl::Status PagedAttention(const PagedAttentionArgs& args, DType dtype, cudaStream_t stream);

namespace internal {
// Per-dtype launchers (attention_f32.cu, attention_bf16.cu).
absl::Status LaunchPagedAttentionF32(const PagedAttentionArgs& a, cudaStream_t stream);
absl::Status LaunchPagedAttentionBF16(const PagedAttentionArgs& a, cudaStream_t stream);
// Tensor-core kernels (mma_attention_bf16.cu dispatches); they read q rows and
// K/V rows in 16-byte pieces, so they take only launches where
// MmaAttentionAligned holds (LaunchMmaAttentionBF16 checks it for the two
// launchers below, which do not check it again).
bool MmaAttentionAligned(const PagedAttentionArgs& a);
absl::Status LaunchMmaAttentionBF16(const PagedAttentionArgs& a, cudaStream_t stream);
// Its launches with at most 8 query rows per item and kv head
// (max_item_tokens x group <= 8) run this kernel (mma_decode_bf16.cu).
absl::Status LaunchMmaDecodeBF16(const PagedAttentionArgs& a, cudaStream_t stream);
// The others (more than 8 rows) run this kernel (mma_prefill_bf16.cu), which
// takes items of up to kMmaPrefillWideRows query rows (tokens x group) at
// head dim 128 and 64 at the others.
absl::Status LaunchMmaPrefillBF16(const PagedAttentionArgs& a, cudaStream_t stream);
inline constexpr int kMmaPrefillWideRows = 128;
// Launches whose items have more than 64 rows (at most kMmaPrefillWideRows,
// head dim 128, one split): FlashAttention-3's layout on wgmma (sm_90a,
// wgmma_prefill_bf16.cu); LaunchMmaPrefillBF16 hands them over.
absl::Status LaunchWgmmaPrefillBF16(const PagedAttentionArgs& a, cudaStream_t stream);
}  // namespace internal

}  // namespace symtp::kernels

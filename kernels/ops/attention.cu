// Paged attention: argument checks, item planning, dtype dispatch and the
// split-K merge (kernels/ops/attention.h).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/internal/device_utils.cuh"

namespace symtp::kernels {
namespace {

// out[t, h, :] = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M) over the
// splits that hold keys of token t (s < ceil((pos_t + 1) / chunk)). A token
// whose keys all lie in split 0 was stored by the attention kernel itself
// (the same value the merge of one split computes: e^0 = 1, so num / den is
// acc / l bit for bit) and is skipped: a decode step whose contexts fit one
// chunk (large batches, where the planner does not split) then reads and
// writes no partials. Launched with programmatic dependent launch: its blocks
// start while the attention kernel finishes and wait for it here (a block
// that skips waits too, so this grid never completes before the attention).
template <typename T>
__global__ void MergeSplitsKernel(const float* __restrict__ part, const float2* __restrict__ ml,
                                  const int32_t* __restrict__ positions, T* __restrict__ out,
                                  int num_q_heads, int head_dim, int num_splits, int chunk_arg,
                                  const int32_t* __restrict__ chunk_dev) {
  SYMTP_TRACE_KERNEL(kMergeSplits);
  internal::GridDependencyWait();
  internal::AllowDependentLaunch();  // the O projection may start loading its weights
  const int chunk = SplitChunk(chunk_arg, chunk_dev);
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int d = threadIdx.x;
  const int pos = positions[t];
  const int nact = pos < 0 ? 0 : min(num_splits, pos / chunk + 1);
  if (nact == 1) return;  // stored by the attention kernel (Split0StoresRow)
  const int64_t base = (t * num_q_heads + h) * num_splits;
  float m = -INFINITY;
  for (int s = 0; s < nact; ++s) m = fmaxf(m, ml[base + s].x);
  float num = 0.f, den = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < nact; ++s) {
      const float2 st = ml[base + s];
      if (st.x == -INFINITY) continue;
      const float w = expf(st.x - m);
      den = fmaf(st.y, w, den);
      num = fmaf(part[(base + s) * head_dim + d], w, num);
    }
  }
  out[(t * num_q_heads + h) * head_dim + d] = internal::FromFloat<T>(den > 0.f ? num / den : 0.f);
}

}  // namespace

const char* DecodeKernelName(DecodeKernel k) {
  switch (k) {
    case DecodeKernel::kTiled:
      return "tiled";
    case DecodeKernel::kTensorCore:
      return "tensor-core";
  }
  return "?";
}

const char* PrefillKernelName(PrefillKernel k) {
  return k == PrefillKernel::kTensorCore ? "tensor-core" : "tiled";
}

int MaxAttentionItemTokens(int num_q_heads, int num_kv_heads) {
  if (num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0) return 0;
  const int group = num_q_heads / num_kv_heads;
  return group > 64 ? 0 : 64 / group;
}

int MaxAttentionItemTokens(int num_q_heads, int num_kv_heads, DType dtype, int head_dim,
                           PrefillKernel prefill_kernel) {
  const int narrow = MaxAttentionItemTokens(num_q_heads, num_kv_heads);
  if (narrow < 1 || dtype != DType::kBF16 || head_dim != 128 ||
      prefill_kernel != PrefillKernel::kTensorCore) {
    return narrow;
  }
  return internal::kMmaPrefillWideRows / (num_q_heads / num_kv_heads);
}

int PlanDecodeSplitChunk(absl::Span<const int32_t> context_lens, int num_kv_heads, int block_slots,
                         int min_chunk) {
  min_chunk = std::max(1, min_chunk);
  int64_t total = 0;
  int max_ctx = 1;
  for (int32_t c : context_lens) {
    total += std::max(1, c);
    max_ctx = std::max(max_ctx, static_cast<int>(c));
  }
  const int64_t heads = std::max(1, num_kv_heads);
  const int64_t slots = std::max(1, block_slots);
  // Even chunks (16-key multiples, the kernels' tile), never below min_chunk.
  auto even_chunk = [&](int64_t splits) {
    const int64_t even = ((max_ctx + splits - 1) / splits + 15) / 16 * 16;
    return static_cast<int>(std::max<int64_t>(min_chunk, even));
  };
  const int64_t want = std::max<int64_t>(min_chunk, (total * heads + slots - 1) / slots);
  const int64_t max_blocks = slots / heads;  // per kv head
  for (int64_t splits = (max_ctx + want - 1) / want; splits > 1; --splits) {
    const int chunk = even_chunk(splits);
    int64_t blocks = 0;
    for (int32_t c : context_lens) {
      blocks += (std::max(1, static_cast<int>(c)) + chunk - 1) / chunk;
      if (blocks > max_blocks) break;  // host time: stop counting once past the slots
    }
    if (blocks <= max_blocks) return chunk;
  }
  return std::max(max_ctx, min_chunk);
}

size_t PagedAttentionWorkspaceBytes(int num_tokens, int num_q_heads, int head_dim, int num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<size_t>(num_tokens) * num_q_heads * num_splits *
         (static_cast<size_t>(head_dim) + 2) * sizeof(float);
}

void BuildAttentionItems(absl::Span<const int32_t> seq_start, int max_tokens_per_item,
                         std::vector<AttentionItem>* items) {
  items->clear();
  const int per = std::max(1, max_tokens_per_item);
  for (size_t s = 0; s + 1 < seq_start.size(); ++s) {
    for (int32_t t = seq_start[s]; t < seq_start[s + 1]; t += per) {
      AttentionItem it;
      it.seq = static_cast<int32_t>(s);
      it.token_begin = t;
      it.num_tokens = std::min<int32_t>(per, seq_start[s + 1] - t);
      items->push_back(it);
    }
  }
}

absl::Status PagedAttention(const PagedAttentionArgs& a, DType dtype, cudaStream_t stream) {
  if (a.num_kv_heads <= 0 || a.num_q_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: q heads %d not a multiple of kv heads %d", a.num_q_heads, a.num_kv_heads));
  }
  // The tensor-core kernels take only 16-byte aligned launches; the others
  // run the tiled kernel, whose item limit then applies.
  const bool aligned = internal::MmaAttentionAligned(a);
  const int max_tokens = MaxAttentionItemTokens(a.num_q_heads, a.num_kv_heads, dtype, a.head_dim,
                                                aligned ? a.prefill_kernel : PrefillKernel::kTiled);
  if (a.max_item_tokens < 1 || a.max_item_tokens > max_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: max_item_tokens %d outside [1, %d]", a.max_item_tokens, max_tokens));
  }
  if (a.num_items < 0 || a.num_tokens < 0 || a.block_size <= 0 || a.block_table_stride <= 0 ||
      a.q_row_stride < static_cast<int64_t>(a.num_q_heads) * a.head_dim || a.cache_slots < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: bad shape items=%d tokens=%d block_size=%d table_stride=%d "
        "q_row_stride=%d cache_slots=%d",
        a.num_items, a.num_tokens, a.block_size, a.block_table_stride, a.q_row_stride,
        a.cache_slots));
  }
  if (a.num_splits < 1 || a.num_splits > 65535 ||
      (a.num_splits > 1 && a.split_chunk_dev == nullptr && a.split_chunk <= 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: bad split num_splits=%d split_chunk=%d", a.num_splits, a.split_chunk));
  }
  if (a.num_splits > 1 &&
      (a.workspace == nullptr ||
       a.workspace_bytes <
           PagedAttentionWorkspaceBytes(a.num_tokens, a.num_q_heads, a.head_dim, a.num_splits))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: split-K needs %d workspace bytes, got %d",
        PagedAttentionWorkspaceBytes(a.num_tokens, a.num_q_heads, a.head_dim, a.num_splits),
        a.workspace_bytes));
  }
  if (a.num_items == 0 || a.num_tokens == 0) return absl::OkStatus();
  if (a.num_kv_heads > 65535) return absl::InvalidArgumentError("PagedAttention: too many heads");

  const bool decode = a.max_item_tokens == 1;
  const bool tensor_core = dtype == DType::kBF16 &&
                           (decode ? a.decode_kernel == DecodeKernel::kTensorCore
                                   : a.prefill_kernel == PrefillKernel::kTensorCore) &&
                           aligned;
  absl::Status st =
      tensor_core             ? internal::LaunchMmaAttentionBF16(a, stream)
      : dtype == DType::kF32  ? internal::LaunchPagedAttentionF32(a, stream)
      : dtype == DType::kBF16 ? internal::LaunchPagedAttentionBF16(a, stream)
                              : absl::InvalidArgumentError(absl::StrCat(
                                    "PagedAttention: unsupported dtype ", DTypeName(dtype)));
  if (!st.ok() || a.num_splits <= 1) return st;

  const float* part = static_cast<const float*>(a.workspace);
  const float2* ml = reinterpret_cast<const float2*>(
      part + static_cast<int64_t>(a.num_tokens) * a.num_q_heads * a.num_splits * a.head_dim);
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_q_heads));
  if (dtype == DType::kF32) {
    CUDA_RETURN_IF_ERROR(internal::LaunchDependent(
        MergeSplitsKernel<float>, grid, dim3(a.head_dim), 0, stream, part, ml, a.positions,
        static_cast<float*>(a.out), a.num_q_heads, a.head_dim, a.num_splits, a.split_chunk,
        a.split_chunk_dev));
  } else {
    CUDA_RETURN_IF_ERROR(internal::LaunchDependent(
        MergeSplitsKernel<internal::bf16>, grid, dim3(a.head_dim), 0, stream, part, ml,
        a.positions, static_cast<internal::bf16*>(a.out), a.num_q_heads, a.head_dim,
        a.num_splits, a.split_chunk, a.split_chunk_dev));
  }
  return absl::OkStatus();
}

}  // namespace symtp::kernels

// Dispatch of the tensor-core attention kernels (bf16; internal/mma_common.cuh):
// the decode kernel (mma_decode_bf16.cu) or the prefill kernel
// (mma_prefill_bf16.cu).
#include "kernels/ops/internal/mma_common.cuh"

namespace symtp::kernels::internal {

bool MmaAttentionAligned(const PagedAttentionArgs& a) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned16(a.q) && aligned16(a.k_cache) && aligned16(a.v_cache) && a.q_row_stride % 8 == 0;
}

absl::Status LaunchMmaAttentionBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (!MmaAttentionAligned(a)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention (tensor-core): q, k_cache and v_cache must be 16-byte aligned and "
        "q_row_stride a multiple of 8 elements (q=%p k=%p v=%p q_row_stride=%d)",
        a.q, a.k_cache, a.v_cache, a.q_row_stride));
  }
  // Up to 8 query rows per item and kv head (decode with groups <= 8): the
  // decode kernel, whose products have no padding rows; the rest (prefill,
  // chunked prefill, larger groups) the prefill kernel.
  if (a.max_item_tokens * (a.num_q_heads / a.num_kv_heads) <= kMmaDecodeRows) {
    return LaunchMmaDecodeBF16(a, stream);
  }
  return LaunchMmaPrefillBF16(a, stream);
}

}  // namespace symtp::kernels::internal

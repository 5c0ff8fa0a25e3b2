// The tensor-core paged-attention kernel (bf16; internal/mma_attention_kernel.cuh).
#include <cstdlib>

#include "kernels/ops/internal/mma_attention_kernel.cuh"

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
  // decode kernel, whose products have no padding rows.
  if (a.max_item_tokens * (a.num_q_heads / a.num_kv_heads) <= kMmaDecodeRows) {
    return LaunchMmaDecodeBF16(a, stream);
  }
  // EXPERIMENT (removed before the result is committed): SYMTP_MMA_PREFILL_OLD=1
  // keeps MmaAttentionKernel for the side-by-side timing.
  static const bool old_prefill = [] {
    const char* e = std::getenv("SYMTP_MMA_PREFILL_OLD");
    return e != nullptr && e[0] == '1';
  }();
  if (!old_prefill) return LaunchMmaPrefillBF16(a, stream);
  switch (a.head_dim) {
    case 32:
      return LaunchMmaAttentionT<32>(a, stream);
    case 64:
      return LaunchMmaAttentionT<64>(a, stream);
    case 128:
      return LaunchMmaAttentionT<128>(a, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", a.head_dim));
  }
}

}  // namespace symtp::kernels::internal

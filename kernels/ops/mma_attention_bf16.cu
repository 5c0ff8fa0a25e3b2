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
  const bool two_halves = a.max_item_tokens * (a.num_q_heads / a.num_kv_heads) > 8;
  // EXPERIMENT (removed before commit of the result): SYMTP_MMA_DECODE_OLD=1
  // keeps the one-half MmaAttentionKernel for the side-by-side timing.
  static const bool old_decode = [] {
    const char* e = std::getenv("SYMTP_MMA_DECODE_OLD");
    return e != nullptr && e[0] == '1';
  }();
  if (!two_halves && !old_decode) return LaunchMmaDecodeBF16(a, stream);
  switch (a.head_dim) {
    case 32:
      return two_halves ? LaunchMmaAttentionT<32, true>(a, stream)
                        : LaunchMmaAttentionT<32, false>(a, stream);
    case 64:
      return two_halves ? LaunchMmaAttentionT<64, true>(a, stream)
                        : LaunchMmaAttentionT<64, false>(a, stream);
    case 128:
      return two_halves ? LaunchMmaAttentionT<128, true>(a, stream)
                        : LaunchMmaAttentionT<128, false>(a, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", a.head_dim));
  }
}

}  // namespace symtp::kernels::internal

// The tensor-core decode kernel (bf16; internal/mma_decode_kernel.cuh).
#include "kernels/ops/internal/mma_decode_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchMmaDecodeBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (!MmaAttentionAligned(a)) {
    return absl::InvalidArgumentError(
        "PagedAttention (tensor-core decode): q, k_cache and v_cache must be 16-byte aligned and "
        "q_row_stride a multiple of 8 elements");
  }
  if (a.max_item_tokens * (a.num_q_heads / a.num_kv_heads) > kMmaDecodeRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention (tensor-core decode): at most %d query rows per item and kv head "
        "(max_item_tokens %d x group %d)",
        kMmaDecodeRows, a.max_item_tokens, a.num_q_heads / a.num_kv_heads));
  }
  switch (a.head_dim) {
    case 32:
      return LaunchMmaDecodeT<32>(a, stream);
    case 64:
      return LaunchMmaDecodeT<64>(a, stream);
    case 128:
      return LaunchMmaDecodeT<128>(a, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", a.head_dim));
  }
}

}  // namespace symtp::kernels::internal

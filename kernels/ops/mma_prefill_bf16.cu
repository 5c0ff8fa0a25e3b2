// The tensor-core prefill kernel (bf16; internal/mma_prefill_kernel.cuh).
#include "kernels/ops/internal/mma_prefill_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchMmaPrefillBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (!MmaAttentionAligned(a)) {
    return absl::InvalidArgumentError(
        "PagedAttention (tensor-core prefill): q, k_cache and v_cache must be 16-byte aligned "
        "and q_row_stride a multiple of 8 elements");
  }
  switch (a.head_dim) {
    case 32:
      return LaunchMmaPrefillT<32>(a, stream);
    case 64:
      return LaunchMmaPrefillT<64>(a, stream);
    case 128:
      return LaunchMmaPrefillT<128>(a, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", a.head_dim));
  }
}

}  // namespace symtp::kernels::internal

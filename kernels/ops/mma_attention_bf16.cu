// The tensor-core paged-attention kernel (bf16; internal/mma_attention_kernel.cuh).
#include "kernels/ops/internal/mma_attention_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchMmaAttentionBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  // 16-byte loads of Q rows and of K/V rows (cp.async).
  const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (misaligned(a.q) || misaligned(a.k_cache) || misaligned(a.v_cache) || a.q_row_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention (tensor-core): q, k_cache and v_cache must be 16-byte aligned and "
        "q_row_stride a multiple of 8 elements (q=%p k=%p v=%p q_row_stride=%d)",
        a.q, a.k_cache, a.v_cache, a.q_row_stride));
  }
  const bool two_halves = a.max_item_tokens * (a.num_q_heads / a.num_kv_heads) > 8;
  int warps = a.tensor_core_warps;
  if (warps != 0 && warps != 4 && warps != 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention (tensor-core): tensor_core_warps %d (0, 4 or 8)", warps));
  }
  if (two_halves) {
    warps = 4;  // prefill rows: only the 4-warp kernel is built for them
  } else if (warps == 0) {
    int dev = 0, sms = 0;
    CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t blocks = static_cast<int64_t>(a.num_items) * a.num_kv_heads * a.num_splits;
    warps = blocks <= sms ? 8 : 4;
  }
  switch (a.head_dim) {
    case 32:
      return two_halves    ? LaunchMmaAttentionT<32, true, 4>(a, stream)
             : warps == 8 ? LaunchMmaAttentionT<32, false, 8>(a, stream)
                          : LaunchMmaAttentionT<32, false, 4>(a, stream);
    case 64:
      return two_halves    ? LaunchMmaAttentionT<64, true, 4>(a, stream)
             : warps == 8 ? LaunchMmaAttentionT<64, false, 8>(a, stream)
                          : LaunchMmaAttentionT<64, false, 4>(a, stream);
    case 128:
      return two_halves    ? LaunchMmaAttentionT<128, true, 4>(a, stream)
             : warps == 8 ? LaunchMmaAttentionT<128, false, 8>(a, stream)
                          : LaunchMmaAttentionT<128, false, 4>(a, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", a.head_dim));
  }
}

}  // namespace symtp::kernels::internal

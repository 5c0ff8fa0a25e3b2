// The tensor-core decode kernel (bf16; internal/mma_decode_kernel.cuh).
#include "kernels/ops/internal/mma_decode_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchMmaDecodeBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.max_item_tokens * (a.num_q_heads / a.num_kv_heads) > kMmaDecodeRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention (tensor-core decode): at most %d query rows per item and kv head "
        "(max_item_tokens %d x group %d)",
        kMmaDecodeRows, a.max_item_tokens, a.num_q_heads / a.num_kv_heads));
  }
  return DispatchMmaHeadDim(
      a.head_dim, [&](auto d) { return LaunchMmaDecodeT<decltype(d)::value>(a, stream); });
}

}  // namespace symtp::kernels::internal

namespace symtp::kernels {

int TensorCoreDecodeBlocksPerSm(int head_dim) {
  int blocks = 0;
  const absl::Status st = internal::DispatchMmaHeadDim(head_dim, [&](auto d) -> absl::Status {
    constexpr int D = decltype(d)::value;
    constexpr size_t kSmem = internal::MmaDecodeLayout<D>::kSmemBytes;
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(internal::MmaDecodeKernel<D, false>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(kSmem)));
    CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, internal::MmaDecodeKernel<D, false>, internal::kMmaAttnThreads, kSmem));
    return absl::OkStatus();
  });
  return st.ok() ? blocks : 0;
}

int DecodePlanBlocksPerSm(int head_dim, int block_size) {
  if (internal::MmaDecodeTmaShape(head_dim, block_size)) return 1;
  return TensorCoreDecodeBlocksPerSm(head_dim);
}

}  // namespace symtp::kernels

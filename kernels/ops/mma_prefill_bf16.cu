// The tensor-core prefill kernel (bf16; internal/mma_prefill_kernel.cuh).
#include "kernels/ops/internal/mma_prefill_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchMmaPrefillBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  return DispatchMmaHeadDim(
      a.head_dim, [&](auto d) { return LaunchMmaPrefillT<decltype(d)::value>(a, stream); });
}

}  // namespace symtp::kernels::internal

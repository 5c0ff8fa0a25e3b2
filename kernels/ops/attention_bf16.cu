// bf16 instantiations of the paged-attention kernel (fp32 arithmetic).
#include "kernels/ops/internal/attention_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchPagedAttentionBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  return LaunchPagedAttentionDispatch<bf16>(a, stream);
}

}  // namespace symtp::kernels::internal

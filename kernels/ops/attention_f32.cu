// fp32 instantiations of the paged-attention kernel.
#include "kernels/ops/internal/attention_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchPagedAttentionF32(const PagedAttentionArgs& a, cudaStream_t stream) {
  return LaunchPagedAttentionDispatch<float>(a, stream);
}

}  // namespace symtp::kernels::internal

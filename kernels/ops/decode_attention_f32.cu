// fp32 instantiations of the warp-streamed decode attention kernel.
#include "kernels/ops/internal/decode_attention_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchWarpDecodeF32(const PagedAttentionArgs& a, cudaStream_t stream) {
  return LaunchWarpDecodeDispatch<float>(a, stream);
}

}  // namespace symtp::kernels::internal

// bf16 instantiations of the warp-streamed decode attention kernel (fp32 math).
#include "kernels/ops/internal/decode_attention_kernel.cuh"

namespace symtp::kernels::internal {

absl::Status LaunchWarpDecodeBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  return LaunchWarpDecodeDispatch<bf16>(a, stream);
}

}  // namespace symtp::kernels::internal

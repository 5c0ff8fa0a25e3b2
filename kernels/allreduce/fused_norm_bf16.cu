// Fused all-reduce + residual + RMSNorm kernels for __nv_bfloat16 (see fused_norm_kernels.cuh).
#include "kernels/allreduce/fused_norm_kernels.cuh"

namespace symtp::kernels::allreduce_internal {

cudaError_t LaunchFusedNormBF16(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                               cudaStream_t stream) {
  return LaunchFusedForSize<__nv_bfloat16>(protocol, a, f, stream);
}

}  // namespace symtp::kernels::allreduce_internal

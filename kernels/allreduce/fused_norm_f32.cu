// Fused all-reduce + residual + RMSNorm kernels for float (see fused_norm_kernels.cuh).
#include "kernels/allreduce/fused_norm_kernels.cuh"

namespace symtp::kernels::allreduce_internal {

cudaError_t LaunchFusedNormF32(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                               cudaStream_t stream) {
  return LaunchFusedForSize<float>(protocol, a, f, stream);
}

}  // namespace symtp::kernels::allreduce_internal

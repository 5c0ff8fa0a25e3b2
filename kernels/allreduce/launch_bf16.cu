// Custom all-reduce kernels (every protocol) for __nv_bfloat16 (see custom_allreduce_kernels.cuh).
#include "kernels/allreduce/custom_allreduce_kernels.cuh"

namespace symtp::kernels::allreduce_internal {

cudaError_t LaunchAllReduceBF16(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                                cudaStream_t stream) {
  return LaunchForSize<__nv_bfloat16>(protocol, a, data, count, stream);
}

}  // namespace symtp::kernels::allreduce_internal

// Custom all-reduce kernels (every protocol) for __half (see custom_allreduce_kernels.cuh).
#include "kernels/allreduce/custom_allreduce_kernels.cuh"

namespace symtp::kernels::allreduce_internal {

cudaError_t LaunchAllReduceF16(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                               cudaStream_t stream) {
  return LaunchForSize<__half>(protocol, a, data, count, stream);
}

}  // namespace symtp::kernels::allreduce_internal

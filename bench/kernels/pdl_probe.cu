#include <cuda_bf16.h>

#include "bench/kernels/pdl_probe.h"
#include "common/cuda_check.h"

namespace symtp::bench {
namespace {

__device__ __forceinline__ unsigned long long Now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__global__ void SlowPatternFillKernel(__nv_bfloat16* a, int64_t n, int salt, int64_t delay_ns) {
  if (threadIdx.x == 0) {
    const unsigned long long until = Now() + static_cast<unsigned long long>(delay_ns);
    while (Now() < until) {
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    a[i] = __float2bfloat16_rn(static_cast<float>((7 * i + salt) % 17 - 8) / 8.f);
  }
}

}  // namespace

absl::Status LaunchSlowPatternFill(void* a, int64_t n, int salt, int64_t delay_ns,
                                   cudaStream_t stream) {
  SlowPatternFillKernel<<<1, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(a), n, salt, delay_ns);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace symtp::bench

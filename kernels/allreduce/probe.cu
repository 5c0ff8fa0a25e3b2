// P2P write-and-verify probe of the custom all-reduce, and the copy exchange's
// one-thread step-epoch kernel (custom_allreduce_launch.h).
#include <cuda_runtime.h>

#include "kernels/allreduce/custom_allreduce_device.h"
#include "kernels/allreduce/custom_allreduce_launch.h"

namespace symtp::kernels::allreduce_internal {
namespace {

__device__ __forceinline__ uint32_t Pattern(uint32_t src, uint32_t dst, uint32_t i,
                                            uint32_t nonce) {
  uint32_t x = nonce ^ (src * 0x9E3779B9u) ^ (dst * 0x85EBCA6Bu) ^ (i * 0xC2B2AE35u);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Block p writes this rank's pattern into peer p's staging.
__global__ void ProbeWriteKernel(DeviceArgs a, uint32_t words, uint32_t nonce) {
  const int p = blockIdx.x;
  if (p == a.rank || p >= a.size) return;
  uint32_t* dst = reinterpret_cast<uint32_t*>(a.base[p] + a.stage_offset) +
                  static_cast<size_t>(a.rank) * words;
  for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) {
    dst[i] = Pattern(a.rank, p, i, nonce);
  }
  __threadfence_system();
}

// Block s checks what peer s wrote here, and (through the mapping) what this
// rank wrote at s.
__global__ void ProbeVerifyKernel(DeviceArgs a, uint32_t words, uint32_t nonce, int* counts) {
  const int s = blockIdx.x;
  if (s == a.rank || s >= a.size) return;
  const volatile uint32_t* in = reinterpret_cast<const uint32_t*>(a.base[a.rank] + a.stage_offset) +
                                static_cast<size_t>(s) * words;
  const volatile uint32_t* out = reinterpret_cast<const uint32_t*>(a.base[s] + a.stage_offset) +
                                 static_cast<size_t>(a.rank) * words;
  int in_bad = 0, out_bad = 0;
  for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) {
    in_bad += in[i] != Pattern(s, a.rank, i, nonce);
    out_bad += out[i] != Pattern(a.rank, s, i, nonce);
  }
  if (in_bad) atomicAdd(&counts[s], in_bad);
  if (out_bad) atomicAdd(&counts[kMaxRanks + s], out_bad);
}

}  // namespace

cudaError_t LaunchProbeWrite(const DeviceArgs& a, uint32_t words, uint32_t nonce,
                             cudaStream_t stream) {
  ProbeWriteKernel<<<a.size, 256, 0, stream>>>(a, words, nonce);
  return cudaGetLastError();
}

namespace {
__global__ void CopyBeginStepKernel(DeviceArgs a) {
  ++*reinterpret_cast<uint32_t*>(a.base[a.rank] + kCopyEpochOffset);
}
}  // namespace

cudaError_t LaunchCopyBeginStep(const DeviceArgs& a, cudaStream_t stream) {
  CopyBeginStepKernel<<<1, 1, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchProbeVerify(const DeviceArgs& a, uint32_t words, uint32_t nonce, int* counts,
                              cudaStream_t stream) {
  ProbeVerifyKernel<<<a.size, 256, 0, stream>>>(a, words, nonce, counts);
  return cudaGetLastError();
}

}  // namespace symtp::kernels::allreduce_internal

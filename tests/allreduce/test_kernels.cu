#include "tests/allreduce/test_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tests/testing/allreduce/reference.h"

namespace symtp::kernels::testing {
namespace {

__global__ void GenerateKernel(void* dst, size_t count, DType dtype, uint64_t seed_base, int rank,
                               const unsigned long long* counter) {
  const uint64_t seed = seed_base + *counter;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const float f = __uint_as_float(RandomF32Bits(seed, rank, i));
    if (dtype == DType::kF32) {
      static_cast<float*>(dst)[i] = f;
    } else if (dtype == DType::kBF16) {
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(f);
    } else {
      static_cast<__half*>(dst)[i] = __float2half_rn(f);
    }
  }
}

__global__ void HashKernel(const void* src, size_t count, DType dtype,
                           const unsigned long long* counter, unsigned long long* hashes) {
  unsigned long long sum = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t bits = dtype == DType::kF32 ? static_cast<const uint32_t*>(src)[i]
                                               : static_cast<const uint16_t*>(src)[i];
    sum += ElementHash(i, bits);
  }
  for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
  if ((threadIdx.x & 31) == 0 && sum != 0) atomicAdd(&hashes[*counter], sum);
}

__global__ void AdvanceKernel(unsigned long long* counter) { ++*counter; }

int Blocks(size_t count) {
  size_t b = (count + 255) / 256;
  return static_cast<int>(b < 1 ? 1 : b > 264 ? 264 : b);
}

}  // namespace

cudaError_t LaunchGenerate(void* dst, size_t count, DType dtype, uint64_t seed_base, int rank,
                           const unsigned long long* counter, cudaStream_t stream) {
  GenerateKernel<<<Blocks(count), 256, 0, stream>>>(dst, count, dtype, seed_base, rank, counter);
  return cudaGetLastError();
}

cudaError_t LaunchHash(const void* src, size_t count, DType dtype,
                       const unsigned long long* counter, unsigned long long* hashes,
                       cudaStream_t stream) {
  HashKernel<<<Blocks(count), 256, 0, stream>>>(src, count, dtype, counter, hashes);
  return cudaGetLastError();
}

cudaError_t LaunchAdvance(unsigned long long* counter, cudaStream_t stream) {
  AdvanceKernel<<<1, 1, 0, stream>>>(counter);
  return cudaGetLastError();
}

}  // namespace symtp::kernels::testing

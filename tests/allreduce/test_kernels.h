// Device helpers of allreduce_test: generate RandomInput on the GPU from a
// device-resident counter (so CUDA-graph replays get new inputs), hash results
// into a per-replay slot, advance the counter.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/comm.h"

namespace symtp::kernels::testing {

// dst[i] = dtype(RandomF32Bits(seed_base + *counter, rank, i)).
cudaError_t LaunchGenerate(void* dst, size_t count, DType dtype, uint64_t seed_base, int rank,
                           const unsigned long long* counter, cudaStream_t stream);
// hashes[*counter] += sum_i ElementHash(i, bits(src[i])).
cudaError_t LaunchHash(const void* src, size_t count, DType dtype,
                       const unsigned long long* counter, unsigned long long* hashes,
                       cudaStream_t stream);
// ++*counter.
cudaError_t LaunchAdvance(unsigned long long* counter, cudaStream_t stream);

}  // namespace symtp::kernels::testing

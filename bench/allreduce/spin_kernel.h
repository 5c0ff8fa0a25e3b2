// allreduce_bench's skew section: one thread that holds its stream for `ns`
// nanoseconds (%globaltimer), so that a rank reaches its next all-reduce late.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace symtp::kernels {

cudaError_t LaunchSpin(uint64_t ns, cudaStream_t stream);

}  // namespace symtp::kernels

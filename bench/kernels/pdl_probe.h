// The slow producer of kernels_bench's PDL section: a one-block kernel that
// waits, then writes a known bf16 pattern, so that a consumer launched early
// (programmatic dependent launch) without waiting for it reads the old data.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace symtp::bench {

// After spinning delay_ns on the GPU clock, writes a[i] = bf16(((7 i + salt)
// % 17 - 8) / 8) for i < n with one block of 256 threads (slow on purpose).
absl::Status LaunchSlowPatternFill(void* a, int64_t n, int salt, int64_t delay_ns,
                                   cudaStream_t stream);

}  // namespace symtp::bench

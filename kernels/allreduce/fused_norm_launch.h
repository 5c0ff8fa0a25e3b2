// Host-side seam of the fused all-reduce + residual + RMSNorm kernels
// (fused_norm_kernels.cuh): their arguments and per-dtype launchers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/allreduce/custom_allreduce_device.h"
#include "kernels/allreduce/custom_allreduce_launch.h"
#include "kernels/comm.h"

namespace symtp::kernels::allreduce_internal {

struct FusedNormArgs {
  const void* data;    // [rows, hidden] this rank's partial sums (read only)
  void* residual;      // [rows, hidden] residual stream, updated in place
  const void* weight;  // [hidden] RMSNorm weight
  void* out;           // [rows, hidden] normalized activations
  int64_t rows;
  int hidden;
  float eps;
  bool pushed;  // LL only: the producer sent `data` to every rank (LLPush)
  // kCopy only: the exchange's op (0 or 1), flag, and the chunk's first row
  // in the op's receive slots.
  int copy_op = 0;
  int copy_flag = 0;
  int64_t copy_row0 = 0;
};

// 16-byte units of a row the fused kernels can hold (two per thread).
inline constexpr int kFusedMaxUnits = 2048;

cudaError_t LaunchFusedNorm(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                            DType dtype, cudaStream_t stream);
cudaError_t LaunchFusedNormF32(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                               cudaStream_t stream);
cudaError_t LaunchFusedNormBF16(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                                cudaStream_t stream);

}  // namespace symtp::kernels::allreduce_internal

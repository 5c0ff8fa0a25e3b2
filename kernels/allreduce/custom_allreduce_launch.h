// Host-callable launchers of the custom all-reduce kernels (defined in the
// .cu files of this folder). Internal to kernels/allreduce.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/allreduce/custom_allreduce_device.h"

namespace symtp::kernels::allreduce_internal {

// kCopy: the copy exchange's receive side (the fused residual + RMSNorm over
// chunks the peers' copy engines delivered); no plain all-reduce form.
enum class Protocol { kStaged, kLL, kLL128, kTwoShot, kCopy };

// All-reduce (sum, in place) of `count` elements at `data` with the given
// protocol, one-shot or two-shot; a.size must be 2, 4 or 8. Only enqueues.
cudaError_t LaunchAllReduce(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                            DType dtype, cudaStream_t stream);

// Per-dtype halves of LaunchAllReduce (one .cu file each, to keep compile units
// small).
cudaError_t LaunchAllReduceF32(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                               cudaStream_t stream);
cudaError_t LaunchAllReduceBF16(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                                cudaStream_t stream);
cudaError_t LaunchAllReduceF16(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                               cudaStream_t stream);

// Copy exchange: advances this rank's step epoch (one thread).
cudaError_t LaunchCopyBeginStep(const DeviceArgs& a, cudaStream_t stream);

// P2P probe. Write: rank `a.rank` writes `words` pattern words into every
// peer's staging (parity 0) at word offset rank * words. Verify: counts, per
// peer s, mismatches in the own staging region written by s (`in_bad[s]`) and,
// reading through the IPC mapping, in the region this rank wrote at s
// (`out_bad[s]`). `counts` is device memory of 2 * kMaxRanks ints, zeroed.
cudaError_t LaunchProbeWrite(const DeviceArgs& a, uint32_t words, uint32_t nonce,
                             cudaStream_t stream);
cudaError_t LaunchProbeVerify(const DeviceArgs& a, uint32_t words, uint32_t nonce, int* counts,
                              cudaStream_t stream);

}  // namespace symtp::kernels::allreduce_internal

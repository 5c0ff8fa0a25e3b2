// The device-side communication seam of a tensor-parallel group: one object
// per rank, used by the model's row-parallel layers and the LM head.
// Implementations: NcclComm (kernels/nccl/), the custom P2P all-reduce
// with NCCL fallback (kernels/allreduce/). Every call only enqueues work on
// `stream` (asynchronous, capturable in a CUDA graph where the implementation
// says so); errors in enqueueing come back as a Status, errors that surface
// later (a dead peer) through Poll().
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace symtp::kernels {

// common/dtype.h's type under the name the kernels and the CUDA model use.
using ::symtp::DType;
using ::symtp::DTypeName;
using ::symtp::DTypeSize;

// The residual add and RMSNorm that follow a row-parallel all-reduce, per row
// r of a [rows, hidden] sum:
//   residual[r] = T(residual[r] + sum[r]);
//   out[r] = T(residual[r] * rsqrt(mean(residual[r]^2) + eps) * weight)
struct ResidualNorm {
  void* residual;
  const void* weight;
  void* out;
  int64_t rows;
  int hidden;
  float eps;
};

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In-place sum over all ranks of `count` elements at `data`.
  virtual absl::Status AllReduceSum(void* data, size_t count, DType dtype,
                                    cudaStream_t stream) = 0;
  // Whether AllReduceResidualNorm runs this shape (as one kernel).
  virtual bool FusesResidualNorm(const ResidualNorm& norm, DType dtype) const {
    (void)norm, (void)dtype;
    return false;
  }
  // Sums `data` ([norm.rows, norm.hidden]) over all ranks and applies `norm`
  // to the sum; `data` itself is left unspecified. Only where
  // FusesResidualNorm says so.
  virtual absl::Status AllReduceResidualNorm(void* data, const ResidualNorm& norm, DType dtype,
                                             cudaStream_t stream) {
    (void)data, (void)norm, (void)dtype, (void)stream;
    return absl::UnimplementedError("this communicator has no fused all-reduce + RMSNorm");
  }
  // recv[r * count + i] = rank r's send[i].
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                                 cudaStream_t stream) = 0;
  virtual absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                                 cudaStream_t stream) = 0;
  // Non-blocking health check: an asynchronous error (peer died, timeout) as a
  // Status; OK while healthy.
  virtual absl::Status Poll() = 0;
  // Tears the communicator down so that no enqueued collective can hang.
  virtual void Abort() = 0;
};

}  // namespace symtp::kernels

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
  // The kernel that wrote the partial sums sent them to every rank itself,
  // through the LLPush that ProducerPush gave for this shape.
  bool pushed = false;
};

// Where a producer kernel (the GEMV of a row-parallel layer) sends its output
// to every rank, its own included, as the custom all-reduce's LL lines
// ({lo, e, hi, e}, 16 bytes carrying 8 data bytes; custom_allreduce_kernels.
// cuh), so the fused all-reduce + RMSNorm after it only receives, and starts
// without waiting for the producer to complete: the producer must not read
// the call's residual or output, which the fused kernel may already write.
// Line L of this rank in epoch e lands on rank p at dst[p] + (((e & 1) * size
// + rank) * lines + L) * 16; the call's epoch is epoch[0] + 1, read after the
// producer's grid-dependency wait (the counters change only in the
// all-reduce kernels before it).
// Flags of the copy exchange (DeviceComm::CopySend): one per (layer, op,
// chunk) of a step, so a step may use at most this many.
inline constexpr int kCopyExchangeFlags = 2048;

struct LLPush {
  static constexpr int kMaxRanks = 8;
  char* dst[kMaxRanks] = {};
  const uint32_t* epoch = nullptr;
  size_t lines = 0;
  int rank = 0;
  int size = 0;
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
  // Whether the kernel producing AllReduceResidualNorm's `data` for this
  // shape may send it itself (then *push says where, and the call is made
  // with norm.pushed): the custom all-reduce's LL protocol, bf16.
  virtual bool ProducerPush(const ResidualNorm& norm, DType dtype, LLPush* push) const {
    (void)norm, (void)dtype, (void)push;
    return false;
  }
  // Copy exchange of a large row-parallel output in row chunks, sent by the
  // copy engines beside the next chunk's GEMM and summed by the residual +
  // RMSNorm kernel (the custom all-reduce's; contract in custom_allreduce.h):
  // capacity per op in bytes, 0 where this communicator has none.
  virtual size_t CopyExchangeBytes() const { return 0; }
  virtual absl::Status CopyBeginStep(cudaStream_t stream) {
    (void)stream;
    return absl::UnimplementedError("this communicator has no copy exchange");
  }
  virtual absl::Status CopySend(const void* data, size_t offset_bytes, size_t bytes, int op,
                                int flag, cudaStream_t stream) {
    (void)data, (void)offset_bytes, (void)bytes, (void)op, (void)flag, (void)stream;
    return absl::UnimplementedError("this communicator has no copy exchange");
  }
  virtual absl::Status CopyReceiveResidualNorm(const void* data, int64_t row0, int op, int flag,
                                               const ResidualNorm& norm, DType dtype,
                                               cudaStream_t stream) {
    (void)data, (void)row0, (void)op, (void)flag, (void)norm, (void)dtype, (void)stream;
    return absl::UnimplementedError("this communicator has no copy exchange");
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

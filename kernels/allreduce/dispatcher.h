// AllReduceDispatcher: the DeviceComm a tensor-parallel rank uses. All-reduces
// of up to crossover_bytes() go to the custom all-reduce
// (custom_allreduce.h), larger ones and every AllGather/Broadcast to the
// fallback communicator (NcclComm).
//
//   SYMTP_ASSIGN_OR_RETURN(auto nccl, NcclComm::Create(id, rank, size, device, deadline));
//   SYMTP_ASSIGN_OR_RETURN(auto comm, AllReduceDispatcher::Create(
//       rank, size, device, std::move(nccl), &exchange, deadline));
//   comm->AllReduceSum(ptr, count, DType::kBF16, stream);   // custom or NCCL by size
//
// Start-up (collective over `exchange`, all ranks reach the same decisions):
//  - builds the custom path (IPC buffers + P2P write-and-verify probe); when
//    that fails on any rank (no P2P, probe mismatch, TP not 2/4/8) every rank
//    logs why and uses the fallback alone;
//  - unless the crossover is pinned (Options::calibrate = false), times both
//    paths on sizes from 8 KiB to max_custom_bytes and takes the largest size up
//    to which custom is faster at every measured size (the minimum over ranks,
//    so all ranks dispatch alike). Calibration also warms NCCL's connections.
//    It times eager launches: NcclComm's host path (~55 us per eager call, see
//    nccl_comm.h) makes NCCL lose every calibrated size, so the crossover lands
//    at max_custom_bytes. On H200 x2 (TP 2) graph-replay timing agrees: custom
//    is faster up to 4 MiB (bench/allreduce/results/).
//
// Dispatch is a pure function of (count, dtype), identical on every rank.
// Ordering: the custom path has one instance, so this object's all-reduces
// must be issued in one order and run in that order on the GPU (one stream,
// or streams chained by events); see CustomAllReduce.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "kernels/allreduce/custom_allreduce.h"
#include "kernels/allreduce/peer_exchange.h"
#include "kernels/comm.h"

namespace symtp::kernels {

class AllReduceDispatcher : public DeviceComm {
 public:
  struct Options {
    // Build the custom path at all.
    bool enable_custom = true;
    // Largest message the custom path accepts (its staging capacity; scratch
    // per rank is about 2 x (size - 1) x this plus the LL and LL128 regions).
    size_t max_custom_bytes = 1 << 20;
    // Time both paths at start-up to choose the crossover; when false the
    // crossover is pinned to `crossover_bytes`.
    bool calibrate = true;
    // Custom for bytes <= crossover (capped at max_custom_bytes).
    size_t crossover_bytes = 1 << 20;
    // The all-reduce + residual + RMSNorm runs fused up to this size, and as
    // the all-reduce then AddRmsNorm above it. Graph-timed on H200 x2 (TP 2,
    // hidden 4096 bf16, LL128) the fused kernel wins at every size to 4 MiB
    // since its blocks take row pairs past 128 rows (2 MiB: 10.3-10.4 against
    // 11.7 us for the two kernels; 4 MiB: 20.5-20.7 against 21.2-21.6;
    // bench/results/h200x2/fused_row_pairs).
    size_t max_fused_bytes = 4 << 20;
    // ... and at most this size where the fused kernel would run STAGED (the
    // custom all-reduce without LL128): there it lost at 2 and 4 MiB (13.18
    // against 12.65 us, 22.98 against 20.65; bench/results/h200x2/allreduce_push).
    size_t max_fused_staged_bytes = 1 << 20;
    CustomAllReduce::Options custom;
  };
  enum class Path { kCustom, kFallback };

  // `fallback` must be a communicator of the same group (same rank and size).
  static absl::StatusOr<std::unique_ptr<AllReduceDispatcher>> Create(
      int rank, int size, int device, std::unique_ptr<DeviceComm> fallback,
      PeerExchange* exchange, Deadline deadline);
  static absl::StatusOr<std::unique_ptr<AllReduceDispatcher>> Create(
      int rank, int size, int device, std::unique_ptr<DeviceComm> fallback,
      PeerExchange* exchange, Deadline deadline, const Options& options);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(void* data, size_t count, DType dtype, cudaStream_t stream) override;
  // Fused on the custom path when the message goes there, is at most
  // max_fused_bytes (max_fused_staged_bytes where the fused kernel would run
  // STAGED) and the shape fits (CustomAllReduce::FusesResidualNorm);
  // otherwise not (the caller runs the all-reduce and AddRmsNorm).
  bool FusesResidualNorm(const ResidualNorm& norm, DType dtype) const override;
  bool ProducerPush(const ResidualNorm& norm, DType dtype, LLPush* push) const override;
  absl::Status AllReduceResidualNorm(void* data, const ResidualNorm& norm, DType dtype,
                                     cudaStream_t stream) override;
  // The custom path's copy exchange (none without the custom path).
  size_t CopyExchangeBytes() const override { return custom_ ? custom_->copy_bytes() : 0; }
  absl::Status CopyBeginStep(cudaStream_t stream) override;
  absl::Status CopySend(const void* data, size_t offset_bytes, size_t bytes, int op, int flag,
                        cudaStream_t stream) override;
  absl::Status CopyReceiveResidualNorm(const void* data, int64_t row0, int op, int flag,
                                       const ResidualNorm& norm, DType dtype,
                                       cudaStream_t stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                         cudaStream_t stream) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         cudaStream_t stream) override;
  // First error of either path.
  absl::Status Poll() override;
  // Aborts both paths.
  void Abort() override;

  Path PathFor(size_t count, DType dtype) const;
  bool custom_enabled() const { return custom_ != nullptr; }
  // Why the custom path is off ("" when on).
  const std::string& custom_disabled_reason() const { return custom_disabled_reason_; }
  size_t crossover_bytes() const { return crossover_bytes_; }
  bool crossover_calibrated() const { return calibrated_; }
  // Device memory of the custom path on this rank (0 when off).
  size_t scratch_bytes() const { return custom_ ? custom_->scratch_bytes() : 0; }
  // One line: path, crossover and how it was chosen, scratch.
  std::string Describe() const;

  CustomAllReduce* custom() { return custom_.get(); }
  DeviceComm* fallback() { return fallback_.get(); }

 private:
  AllReduceDispatcher() = default;
  absl::Status Calibrate(PeerExchange* exchange, Deadline deadline, size_t max_bytes);

  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  std::unique_ptr<DeviceComm> fallback_;
  std::unique_ptr<CustomAllReduce> custom_;
  std::string custom_disabled_reason_;
  size_t crossover_bytes_ = 0;
  size_t max_fused_bytes_ = 0;
  size_t max_fused_staged_bytes_ = 0;
  bool calibrated_ = false;
  std::string calibration_table_;
};

}  // namespace symtp::kernels

#include "kernels/allreduce/dispatcher.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/histogram.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace symtp::kernels {
namespace {

constexpr size_t kCalibrateMinBytes = 8 * 1024;
constexpr int kCalibrateWarmup = 5;
constexpr int kCalibrateReps = 5;
constexpr int kCalibrateBatch = 20;

struct CalibrationVerdict {
  int32_t ok;
  int32_t code;
  uint64_t crossover;
  char message[240];
};

}  // namespace

absl::StatusOr<std::unique_ptr<AllReduceDispatcher>> AllReduceDispatcher::Create(
    int rank, int size, int device, std::unique_ptr<DeviceComm> fallback, PeerExchange* exchange,
    Deadline deadline) {
  return Create(rank, size, device, std::move(fallback), exchange, deadline, Options());
}

absl::StatusOr<std::unique_ptr<AllReduceDispatcher>> AllReduceDispatcher::Create(
    int rank, int size, int device, std::unique_ptr<DeviceComm> fallback, PeerExchange* exchange,
    Deadline deadline, const Options& options) {
  if (fallback == nullptr) {
    return absl::InvalidArgumentError("AllReduceDispatcher: no fallback communicator");
  }
  if (fallback->rank() != rank || fallback->size() != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllReduceDispatcher: fallback is rank ", fallback->rank(), "/", fallback->size(),
        ", expected ", rank, "/", size));
  }
  std::unique_ptr<AllReduceDispatcher> d(new AllReduceDispatcher());
  d->rank_ = rank;
  d->size_ = size;
  d->device_ = device;
  d->fallback_ = std::move(fallback);
  d->max_fused_bytes_ = options.max_fused_bytes;
  d->max_fused_staged_bytes_ = options.max_fused_staged_bytes;

  if (!options.enable_custom) {
    d->custom_disabled_reason_ = "disabled by option";
  } else if (size == 1) {
    d->custom_disabled_reason_ = "TP 1 needs no all-reduce kernel";
  } else if (exchange == nullptr) {
    d->custom_disabled_reason_ = "no PeerExchange to set it up";
  } else {
    auto custom = CustomAllReduce::Create(rank, size, device, options.max_custom_bytes, exchange,
                                          deadline, options.custom);
    if (custom.ok()) {
      d->custom_ = std::move(*custom);
    } else {
      d->custom_disabled_reason_ = custom.status().ToString();
      if (custom.status().code() == absl::StatusCode::kDeadlineExceeded) {
        // A peer did not take part: the group is broken, not just slow P2P.
        return custom.status();
      }
    }
  }
  if (d->custom_ == nullptr) {
    // Logged on every rank: the reason may be local to one (its probe failed).
    SYMTP_LOG(WARN, "allreduce") << "rank " << rank << ": custom all-reduce off, every "
                                 << "all-reduce goes to the fallback: "
                                 << d->custom_disabled_reason_;
    d->crossover_bytes_ = 0;
  } else if (options.calibrate) {
    SYMTP_RETURN_IF_ERROR_CTX(d->Calibrate(exchange, deadline, d->custom_->max_bytes()),
                              "calibrating the all-reduce crossover");
    d->calibrated_ = true;
  } else {
    d->crossover_bytes_ = std::min(options.crossover_bytes, d->custom_->max_bytes());
  }
  SYMTP_LOG(INFO, "allreduce") << d->Describe();
  return d;
}

absl::Status AllReduceDispatcher::Calibrate(PeerExchange* exchange, Deadline deadline,
                                            size_t max_bytes) {
  size_t local_crossover = 0;
  std::string table;
  absl::Status local = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::Create(max_bytes));
    SYMTP_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create(true));
    SYMTP_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create(true));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buf.get(), 0, max_bytes, stream.get()));
    bool custom_still_wins = true;
    for (size_t bytes = kCalibrateMinBytes; bytes <= max_bytes; bytes *= 2) {
      const size_t count = bytes / 2;
      float us[2] = {0, 0};
      for (int path = 0; path < 2; ++path) {
        auto run = [&]() -> absl::Status {
          return path == 0 ? custom_->AllReduceSum(buf.get(), count, DType::kBF16, stream.get())
                           : fallback_->AllReduceSum(buf.get(), count, DType::kBF16,
                                                     stream.get());
        };
        for (int i = 0; i < kCalibrateWarmup; ++i) SYMTP_RETURN_IF_ERROR(run());
        std::vector<double> per_iter;
        for (int rep = 0; rep < kCalibrateReps; ++rep) {
          CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream.get()));
          for (int i = 0; i < kCalibrateBatch; ++i) SYMTP_RETURN_IF_ERROR(run());
          CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream.get()));
          SYMTP_RETURN_IF_ERROR(cuda::SyncStream(stream.get(), deadline, "all-reduce calibration"));
          float ms = 0;
          CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
          per_iter.push_back(ms * 1000.0 / kCalibrateBatch);
        }
        us[path] = static_cast<float>(Median(std::move(per_iter)));
      }
      absl::StrAppendFormat(&table, " %zuK:%.1f/%.1fus", bytes / 1024, us[0], us[1]);
      custom_still_wins = custom_still_wins && us[0] < us[1];
      if (custom_still_wins) local_crossover = bytes;
    }
    SYMTP_RETURN_IF_ERROR(custom_->Poll());
    return fallback_->Poll();
  }();
  CalibrationVerdict mine{};
  mine.ok = local.ok();
  mine.code = static_cast<int32_t>(local.code());
  mine.crossover = local_crossover;
  strncpy(mine.message, std::string(local.message()).c_str(), sizeof(mine.message) - 1);
  std::vector<CalibrationVerdict> all(size_);
  SYMTP_RETURN_IF_ERROR(exchange->AllGather(&mine, sizeof(mine), all.data(), deadline));
  size_t crossover = max_bytes;
  for (int r = 0; r < size_; ++r) {
    if (!all[r].ok) {
      all[r].message[sizeof(all[r].message) - 1] = '\0';
      return absl::Status(static_cast<absl::StatusCode>(all[r].code),
                          absl::StrCat("rank ", r, ": ", all[r].message));
    }
    crossover = std::min<size_t>(crossover, all[r].crossover);
  }
  crossover_bytes_ = crossover;
  calibration_table_ = absl::StrCat("custom/fallback bf16 on rank ", rank_, ":", table);
  return absl::OkStatus();
}

std::string AllReduceDispatcher::Describe() const {
  if (custom_ == nullptr) {
    return absl::StrCat("all-reduce dispatch TP ", size_, " rank ", rank_,
                        ": fallback for every size (custom off: ", custom_disabled_reason_, ")");
  }
  return absl::StrFormat(
      "all-reduce dispatch TP %d rank %d: custom for <= %zu B (%s; LL protocol <= %zu B, "
      "LL128 <= %zu B, fused LL <= %zu B, two-shot %s), fallback above; custom scratch %.2f "
      "MiB per rank%s%s",
      size_, rank_, crossover_bytes_, calibrated_ ? "calibrated" : "pinned",
      custom_->ll_max_bytes(), custom_->ll128_max_bytes(), custom_->fused_ll_max_bytes(),
      custom_->TwoShotLimitName(),
      custom_->scratch_bytes() / 1048576.0,
      calibration_table_.empty() ? "" : "; ", calibration_table_);
}

AllReduceDispatcher::Path AllReduceDispatcher::PathFor(size_t count, DType dtype) const {
  const size_t bytes = count * DTypeSize(dtype);
  return custom_ != nullptr && bytes <= crossover_bytes_ ? Path::kCustom : Path::kFallback;
}

absl::Status AllReduceDispatcher::AllReduceSum(void* data, size_t count, DType dtype,
                                               cudaStream_t stream) {
  if (PathFor(count, dtype) == Path::kCustom) {
    return custom_->AllReduceSum(data, count, dtype, stream);
  }
  return fallback_->AllReduceSum(data, count, dtype, stream);
}

bool AllReduceDispatcher::FusesResidualNorm(const ResidualNorm& norm, DType dtype) const {
  const size_t count = static_cast<size_t>(std::max<int64_t>(norm.rows, 0)) * norm.hidden;
  const size_t bytes = count * DTypeSize(dtype);
  return PathFor(count, dtype) == Path::kCustom && bytes <= max_fused_bytes_ &&
         (bytes <= max_fused_staged_bytes_ ||
          custom_->FusedProtocolFor(bytes) != CustomAllReduce::Protocol::kStaged) &&
         custom_->FusesResidualNorm(norm, dtype);
}

bool AllReduceDispatcher::ProducerPush(const ResidualNorm& norm, DType dtype,
                                       LLPush* push) const {
  return FusesResidualNorm(norm, dtype) && custom_->ProducerPush(norm, dtype, push);
}

absl::Status AllReduceDispatcher::AllReduceResidualNorm(void* data, const ResidualNorm& norm,
                                                        DType dtype, cudaStream_t stream) {
  if (!FusesResidualNorm(norm, dtype)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fused all-reduce + RMSNorm asked for a shape that is not fused (rows=", norm.rows,
        " hidden=", norm.hidden, ", ", DTypeName(dtype), ")"));
  }
  return custom_->AllReduceResidualNorm(data, norm, dtype, stream);
}

absl::Status AllReduceDispatcher::CopyBeginStep(cudaStream_t stream) {
  if (!custom_) return DeviceComm::CopyBeginStep(stream);
  return custom_->CopyBeginStep(stream);
}

absl::Status AllReduceDispatcher::CopySend(const void* data, size_t offset_bytes, size_t bytes,
                                           int op, int flag, cudaStream_t stream) {
  if (!custom_) return DeviceComm::CopySend(data, offset_bytes, bytes, op, flag, stream);
  return custom_->CopySend(data, offset_bytes, bytes, op, flag, stream);
}

absl::Status AllReduceDispatcher::CopyReceiveResidualNorm(const void* data, int64_t row0, int op,
                                                          int flag, const ResidualNorm& norm,
                                                          DType dtype, cudaStream_t stream) {
  if (!custom_) {
    return DeviceComm::CopyReceiveResidualNorm(data, row0, op, flag, norm, dtype, stream);
  }
  return custom_->CopyReceiveResidualNorm(data, row0, op, flag, norm, dtype, stream);
}

absl::Status AllReduceDispatcher::AllGather(const void* send, void* recv, size_t count,
                                            DType dtype, cudaStream_t stream) {
  return fallback_->AllGather(send, recv, count, dtype, stream);
}

absl::Status AllReduceDispatcher::Broadcast(void* data, size_t count, DType dtype, int root,
                                            cudaStream_t stream) {
  return fallback_->Broadcast(data, count, dtype, root, stream);
}

absl::Status AllReduceDispatcher::Poll() {
  if (custom_ != nullptr) SYMTP_RETURN_IF_ERROR(custom_->Poll());
  return fallback_->Poll();
}

void AllReduceDispatcher::Abort() {
  if (custom_ != nullptr) custom_->Abort();
  fallback_->Abort();
}

}  // namespace symtp::kernels

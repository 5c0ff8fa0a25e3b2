#include "kernels/nccl/nccl_comm.h"

#include <sched.h>
#include <time.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace symtp::kernels {
namespace {

void SleepUs(int64_t us) {
  timespec ts{static_cast<time_t>(us / 1'000'000), static_cast<long>((us % 1'000'000) * 1000)};
  nanosleep(&ts, nullptr);
}

// Polls `state()` (ncclCommGetAsyncError) until it leaves ncclInProgress or
// the deadline passes. Spins briefly, then backs off to short sleeps.
template <typename StateFn>
ncclResult_t PollUntilSettled(StateFn state_fn, Deadline deadline, bool* timed_out) {
  *timed_out = false;
  for (int i = 0;; ++i) {
    ncclResult_t state = state_fn();
    if (state != ncclInProgress) return state;
    if (deadline.Expired()) {
      *timed_out = true;
      return ncclInProgress;
    }
    if (i < 100) {
      sched_yield();
    } else {
      SleepUs(i < 1000 ? 10 : 200);
    }
  }
}

ncclResult_t AsyncState(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}

// Releases a healthy non-blocking communicator with nothing in flight:
// finalize (polled) then destroy; abort when the finalize fails or lingers.
void ReleaseNonBlocking(ncclComm_t comm, int rank) {
  ncclResult_t r = ncclCommFinalize(comm);
  bool timed_out = false;
  if (r == ncclSuccess || r == ncclInProgress) {
    r = PollUntilSettled([comm] { return AsyncState(comm); },
                         Deadline::AfterMs(NcclComm::kFinalizeTimeoutMs), &timed_out);
  }
  if (!timed_out && r == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess) return;
  SYMTP_LOG(WARN, "nccl") << "rank " << rank << ": releasing the set-up communicator "
                          << (timed_out ? "timed out" : "failed") << "; aborting it";
  ncclCommAbort(comm);
}

}  // namespace

ncclDataType_t NcclComm::ToNccl(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
  }
  return ncclFloat32;
}

absl::StatusOr<ncclUniqueId> NcclComm::NewUniqueId() {
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return id;
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(const ncclUniqueId& id, int rank,
                                                           int size, int device,
                                                           Deadline deadline) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("NcclComm: rank ", rank, " of size ", size));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclErrorToStatus(r, absl::StrCat("ncclCommInitRankConfig(rank ", rank, "/", size,
                                             ", device ", device, ")"),
                             __FILE__, __LINE__);
  }
  bool timed_out = false;
  r = PollUntilSettled([comm] { return AsyncState(comm); }, deadline, &timed_out);
  if (timed_out || r != ncclSuccess) {
    std::string last = ncclGetLastError(comm);
    ncclCommAbort(comm);
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrCat("NcclComm::Create rank ", rank, "/", size, " on device ", device,
                       ": communicator not ready before the deadline (a peer never joined?); "
                       "aborted"));
    }
    return NcclErrorToStatus(r, absl::StrCat("ncclCommInitRankConfig(rank ", rank, "/", size,
                                             ", device ", device, ") async: ", last),
                             __FILE__, __LINE__);
  }
  // The blocking communicator the collectives use: a split of the
  // non-blocking one. The split runs as the parent's asynchronous job, and
  // ncclCommSplit answers ncclSuccess while that job may still be running, so
  // the parent is polled whatever the call answered; the child handle is
  // stored by that job when it completes (NCCL 2.28).
  ncclConfig_t child_config = NCCL_CONFIG_INITIALIZER;
  child_config.blocking = 1;
  ncclComm_t child = nullptr;
  r = ncclCommSplit(comm, /*color=*/0, /*key=*/rank, &child, &child_config);
  if (r == ncclSuccess || r == ncclInProgress) {
    r = PollUntilSettled([comm] { return AsyncState(comm); }, deadline, &timed_out);
  }
  child = __atomic_load_n(&child, __ATOMIC_ACQUIRE);
  if (timed_out || r != ncclSuccess || child == nullptr) {
    std::string last = ncclGetLastError(comm);
    if (child != nullptr) ncclCommAbort(child);
    ncclCommAbort(comm);  // also ends a split still in progress
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrCat("NcclComm::Create rank ", rank, "/", size, " on device ", device,
                       ": the blocking split was not done before the deadline (a peer died?); "
                       "aborted"));
    }
    if (r == ncclSuccess) {
      return absl::InternalError(absl::StrCat("NcclComm::Create rank ", rank, "/", size,
                                              ": ncclCommSplit settled without a communicator"));
    }
    return NcclErrorToStatus(r, absl::StrCat("ncclCommSplit(rank ", rank, "/", size, "): ", last),
                             __FILE__, __LINE__);
  }
  ReleaseNonBlocking(comm, rank);
  auto out = std::unique_ptr<NcclComm>(new NcclComm(child, rank, size, device));
  // Connect now, while every peer has just been seen: a blocking call waits
  // on its peers only while it connects an algorithm on its first use.
  SYMTP_RETURN_IF_ERROR(out->WarmUp(deadline));
  SYMTP_LOG(DEBUG, "nccl") << "communicator ready: rank " << rank << "/" << size << " device "
                           << device;
  return out;
}

ncclResult_t NcclComm::State() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.load(std::memory_order_acquire)) return ncclInvalidUsage;
  return AsyncState(comm_);
}

NcclComm::~NcclComm() {
  // ncclCommFinalize on a blocking communicator waits for every collective in
  // flight, which a dead peer never completes; ncclCommAbort frees everything
  // without waiting. Owners synchronize their streams before teardown, so on
  // a healthy shutdown nothing is in flight and the two are equivalent.
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.exchange(true, std::memory_order_acq_rel) || comm_ == nullptr) return;
  ncclResult_t r = ncclCommAbort(comm_);
  if (r != ncclSuccess) {
    SYMTP_LOG(WARN, "nccl") << "ncclCommAbort at teardown on rank " << rank_ << ": "
                            << ncclGetErrorString(r);
  }
  comm_ = nullptr;
}

absl::Status NcclComm::WarmUp(Deadline deadline) {
  constexpr size_t kCount = 256;
  SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf,
                         cuda::DeviceBuffer::Create((size_ + 1) * kCount * sizeof(float)));
  float* const data = static_cast<float*>(buf.get());
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, (size_ + 1) * kCount * sizeof(float), stream.get()));
  SYMTP_RETURN_IF_ERROR(AllReduceSum(data, kCount, DType::kF32, stream.get()));
  SYMTP_RETURN_IF_ERROR(AllGather(data, data + kCount, kCount, DType::kF32, stream.get()));
  SYMTP_RETURN_IF_ERROR(Broadcast(data, kCount, DType::kF32, 0, stream.get()));
  return cuda::SyncStream(stream.get(), deadline, "NcclComm warm-up");
}

absl::Status NcclComm::CheckUsable(const char* what) const {
  if (aborted_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("NcclComm::", what, " on rank ", rank_, ": communicator was aborted"));
  }
  return absl::OkStatus();
}

absl::Status NcclComm::WaitSettled(const char* what, Deadline deadline) {
  bool timed_out = false;
  ncclResult_t r = PollUntilSettled([this] { return State(); }, deadline, &timed_out);
  if (aborted_.load(std::memory_order_acquire)) return CheckUsable(what);
  if (timed_out) {
    Abort();
    return absl::DeadlineExceededError(absl::StrCat(
        "NcclComm::", what, " on rank ", rank_, ": enqueue still in progress after ",
        kEnqueueTimeoutMs, " ms; communicator aborted"));
  }
  if (r != ncclSuccess) {
    return NcclErrorToStatus(r, absl::StrCat("NcclComm::", what, " async: ",
                                             ncclGetLastError(nullptr)),
                             __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

#define SYMTP_NCCL_ENQUEUE_(what, call)                                                    \
  do {                                                                                    \
    ncclResult_t symtp_r_;                                                                \
    {                                                                                     \
      std::lock_guard<std::mutex> lock(mu_);                                              \
      SYMTP_RETURN_IF_ERROR(CheckUsable(what));                                           \
      symtp_r_ = (call);                                                                  \
    }                                                                                     \
    if (symtp_r_ == ncclInProgress) {                                                     \
      SYMTP_RETURN_IF_ERROR(WaitSettled(what, Deadline::AfterMs(kEnqueueTimeoutMs)));     \
    } else if (symtp_r_ != ncclSuccess) {                                                 \
      return NcclErrorToStatus(symtp_r_, absl::StrCat(#call, " rank ", rank_, ": ",       \
                                                      ncclGetLastError(nullptr)),         \
                               __FILE__, __LINE__);                                       \
    }                                                                                     \
  } while (0)

absl::Status NcclComm::AllReduceSum(void* data, size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  SYMTP_NCCL_ENQUEUE_("AllReduceSum", ncclAllReduce(data, data, count, ToNccl(dtype), ncclSum,
                                                    comm_, stream));
  return absl::OkStatus();
}

absl::Status NcclComm::AllGather(const void* send, void* recv, size_t count, DType dtype,
                                 cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  SYMTP_NCCL_ENQUEUE_("AllGather",
                      ncclAllGather(send, recv, count, ToNccl(dtype), comm_, stream));
  return absl::OkStatus();
}

absl::Status NcclComm::Broadcast(void* data, size_t count, DType dtype, int root,
                                 cudaStream_t stream) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclComm::Broadcast: root ", root, " not in [0, ", size_, ")"));
  }
  if (count == 0) return absl::OkStatus();
  SYMTP_NCCL_ENQUEUE_("Broadcast",
                      ncclBroadcast(data, data, count, ToNccl(dtype), root, comm_, stream));
  return absl::OkStatus();
}

#undef SYMTP_NCCL_ENQUEUE_

absl::Status NcclComm::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  SYMTP_RETURN_IF_ERROR(CheckUsable("Poll"));
  ncclResult_t state = ncclSuccess;
  NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  return NcclErrorToStatus(state, absl::StrCat("NCCL communicator rank ", rank_, "/", size_,
                                               " asynchronous error: ", ncclGetLastError(comm_)),
                           __FILE__, __LINE__);
}

void NcclComm::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  if (comm_ != nullptr) {
    ncclResult_t r = ncclCommAbort(comm_);
    if (r != ncclSuccess && r != ncclInProgress) {
      SYMTP_LOG(WARN, "nccl") << "ncclCommAbort on rank " << rank_ << ": "
                              << ncclGetErrorString(r);
    }
  }
  SYMTP_LOG(INFO, "nccl") << "communicator aborted on rank " << rank_;
}

ncclComm_t NcclComm::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_.load(std::memory_order_acquire) ? nullptr : comm_;
}

}  // namespace symtp::kernels

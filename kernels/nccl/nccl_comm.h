// NcclComm: one NCCL communicator (one rank of it) as a DeviceComm.
//
//   SYMTP_ASSIGN_OR_RETURN(ncclUniqueId id, NcclComm::NewUniqueId());   // on one rank
//   ... ship `id` to every rank (PeerExchange, shared memory) ...
//   SYMTP_ASSIGN_OR_RETURN(auto comm, NcclComm::Create(id, rank, size, device,
//                                                       Deadline::AfterMs(60'000)));
//   SYMTP_RETURN_IF_ERROR(comm->AllReduceSum(ptr, count, DType::kBF16, stream));
//   ... a watchdog calls comm->Poll() and comm->Abort() on error ...
//
// Set-up is bounded, calls are cheap. The communicator is first created
// non-blocking (ncclConfig_t::blocking = 0) and polled (ncclCommGetAsyncError)
// until ready or a deadline passes, so a peer that never joins is an error,
// not a hang. Collectives then run on a blocking child of it
// (ncclCommSplit, polled the same way) and the non-blocking parent is
// released: NCCL launches every group end of a non-blocking communicator on a
// fresh helper thread, which cost 62-88 us of host time per eager call on
// H200 x2 (NCCL 2.28.3) against 6.5-12 us on a blocking one
// (bench/results/h200x2/nccl_enqueue/). A blocking call waits on its peers
// only while NCCL connects an algorithm on its first use: Create runs each
// collective kind once, while every peer has just been seen. An
// asynchronous NCCL error (a peer died, a network error) surfaces through
// Poll(); Abort() (ncclCommAbort) then releases every enqueued collective.
//
// Threading: one owning thread issues collectives (NCCL requires every rank to
// issue them in the same order). Poll() and Abort() may be called from another
// thread (a watchdog) at any time; Abort() is idempotent. A mutex held around
// each single NCCL call (never across a poll) keeps Abort() from freeing the
// communicator under a concurrent call; an Abort() during a first-use connect
// waits for that call.
//
// CUDA graphs: collectives are capturable. NCCL connects lazily on the first
// use of an algorithm/protocol, so run each collective kind once eagerly (on
// the sizes you will capture) before beginning a capture.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "kernels/comm.h"

namespace symtp::kernels {

class NcclComm : public DeviceComm {
 public:
  // How long a call answering ncclInProgress is polled before the
  // communicator is aborted (none does on the blocking communicator).
  static constexpr int64_t kEnqueueTimeoutMs = 60'000;
  // How long the set-up communicator's release waits for its finalize.
  static constexpr int64_t kFinalizeTimeoutMs = 10'000;

  // A fresh id for one communicator; call on one rank and distribute it.
  // Does not initialise CUDA.
  static absl::StatusOr<ncclUniqueId> NewUniqueId();

  // Non-blocking init (ncclCommInitRankConfig with blocking = 0) on `device`
  // (made current on the calling thread) and its blocking split, each polled
  // until done or `deadline`; on timeout what was built is aborted and
  // DeadlineExceeded returned (a peer that never joined, a wrong id).
  static absl::StatusOr<std::unique_ptr<NcclComm>> Create(const ncclUniqueId& id, int rank,
                                                           int size, int device,
                                                           Deadline deadline);

  // ncclCommAbort: never waits for a peer (synchronize the streams first for
  // a clean end).
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }

  // DeviceComm. Enqueue on `stream` (fp32/bf16/fp16). After Abort() they
  // return FailedPrecondition.
  absl::Status AllReduceSum(void* data, size_t count, DType dtype, cudaStream_t stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                         cudaStream_t stream) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         cudaStream_t stream) override;
  // ncclCommGetAsyncError: OK while healthy (or while an operation is still
  // being set up), the error otherwise; FailedPrecondition after Abort().
  absl::Status Poll() override;
  // ncclCommAbort, at most once.
  void Abort() override;

  // The raw communicator (for group calls and other collectives); nullptr
  // after Abort().
  ncclComm_t get() const;

  static ncclDataType_t ToNccl(DType t);

 private:
  NcclComm(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}

  // After a call that returned ncclInProgress: poll until the communicator
  // settles. Aborts and returns DeadlineExceeded past `deadline`.
  absl::Status WaitSettled(const char* what, Deadline deadline);
  absl::Status CheckUsable(const char* what) const;
  // One small all-reduce, all-gather and broadcast, synchronized by
  // `deadline`: NCCL connects the ring on first use.
  absl::Status WarmUp(Deadline deadline);
  // ncclCommGetAsyncError under mu_ (ncclInvalidUsage once aborted).
  ncclResult_t State();

  // Guards every NCCL call on comm_ against a concurrent Abort() (which frees
  // it). Held per call, never across a wait.
  mutable std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace symtp::kernels

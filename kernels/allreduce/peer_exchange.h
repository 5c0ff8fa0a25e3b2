// PeerExchange: the host-side byte exchange among the ranks of one
// tensor-parallel group, used at set-up time only (NCCL unique ids, CUDA IPC
// handles, probe verdicts, calibration results). Never on the step's path.
//
// Implementations: testing::ShmPeerExchange (tests/testing/allreduce/, for
// processes forked by one parent in tests and benchmarks) and the worker's
// implementation over the job's shared-memory segment.
//
// Contract for implementers:
//  - Every rank calls the same sequence of AllGather/Barrier with the same
//    `bytes` (collective semantics, like MPI).
//  - AllGather writes rank r's `mine` to all[r * bytes .. (r + 1) * bytes) on
//    every rank, and `mine` / `all` may be reused as soon as it returns.
//  - Both return DeadlineExceeded naming the ranks that did not arrive when the
//    deadline passes, and an error naming the peer when a peer is known dead
//    or failed. They never block past the deadline.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "common/clock.h"

namespace symtp::kernels {

class PeerExchange {
 public:
  virtual ~PeerExchange() = default;
  // all[r * bytes, (r + 1) * bytes) = rank r's `mine`; `all` holds size * bytes.
  virtual absl::Status AllGather(const void* mine, size_t bytes, void* all, Deadline deadline) = 0;
  virtual absl::Status Barrier(Deadline deadline) = 0;
};

}  // namespace symtp::kernels

// Multi-process harness for GPU collective tests and benchmarks: one process
// per rank, forked from a parent that never touches CUDA.
//
//   RunOptions opt;
//   opt.size = 2;
//   opt.timeout_ms = 60'000;
//   SYMTP_ASSIGN_OR_RETURN(RunResult res, RunRanks(opt, [](int rank, int size,
//                                                            PeerExchange& ex) {
//     ... cudaSetDevice(rank); build comms with `ex`; run; return a Status ...
//   }));
//   if (!res.ok()) std::cerr << res.Summary();
//
// Rules the harness enforces:
//  - The parent forks every child BEFORE any CUDA call of its own (CUDA is not
//    fork-safe): use CountGpusInChild() in the parent instead of
//    cudaGetDeviceCount(), which probes in a short-lived child.
//  - Children exchange bytes through an anonymous MAP_SHARED mapping made
//    before the fork (ShmPeerExchange): AllGather and Barrier are bounded by
//    their deadlines and fail fast, naming the peer, when a peer failed or died.
//  - Each child ends with _exit(): 0 when the body returned OK, 1 otherwise,
//    with the body's Status message kept in the shared mapping for the parent.
//    Children die with the parent (PR_SET_PDEATHSIG), so a killed test leaves
//    no orphans.
//  - The parent waits at most `timeout_ms`, SIGKILLs what is left, reaps every
//    child and reports each one's outcome; after the first failure the others
//    get `grace_after_failure_ms` to finish, then are killed.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "kernels/allreduce/peer_exchange.h"

namespace symtp::kernels::testing {

inline constexpr int kMaxRanks = 16;

// Shared state of one group of forked ranks (lives in the MAP_SHARED mapping).
struct ShmExchangeState;

// PeerExchange over an anonymous shared mapping made by the parent before the
// fork. Copyable view (a pointer into the mapping and a rank).
class ShmPeerExchange : public PeerExchange {
 public:
  ShmPeerExchange(ShmExchangeState* state, int rank) : state_(state), rank_(rank) {}
  int rank() const { return rank_; }
  int size() const;
  // `bytes` must not exceed RunOptions::exchange_bytes_per_rank.
  absl::Status AllGather(const void* mine, size_t bytes, void* all, Deadline deadline) override;
  absl::Status Barrier(Deadline deadline) override;
  // Marks this rank failed (first failure wins) so that peers waiting in
  // Barrier/AllGather return Aborted naming it.
  void MarkFailed(const std::string& message);

 private:
  ShmExchangeState* state_;
  int rank_;
  uint64_t seq_ = 0;  // barriers passed by this rank
};

struct RunOptions {
  int size = 2;
  int64_t timeout_ms = 120'000;
  size_t exchange_bytes_per_rank = 64 * 1024;
  int64_t grace_after_failure_ms = 5'000;
};

struct RankOutcome {
  enum class Kind { kOk, kError, kCrashed, kTimedOut, kKilledAfterPeerFailure };
  int rank = 0;
  pid_t pid = 0;
  Kind kind = Kind::kOk;
  int exit_code = 0;  // when the child exited
  int signal = 0;     // when a signal ended it
  std::string message;
};

struct RunResult {
  std::vector<RankOutcome> ranks;
  bool ok() const;
  // One line per rank: "rank 1 (pid 1234): error: <message>".
  std::string Summary() const;
};

using RankBody = std::function<absl::Status(int rank, int size, PeerExchange& exchange)>;

// Forks opt.size children running `body`; see the file comment. Returns an
// error only when the harness itself failed (mmap, fork); the children's
// outcomes are in RunResult.
absl::StatusOr<RunResult> RunRanks(const RunOptions& opt, const RankBody& body);

// Number of visible CUDA devices, counted in a forked child so that the caller
// stays CUDA-free (and may still fork ranks afterwards). Cached after the first
// call. 0 with `why_none` set when there is no driver or no device.
int CountGpusInChild(std::string* why_none = nullptr);

}  // namespace symtp::kernels::testing

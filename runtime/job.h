// The job: one shared-memory segment per run, created by the launcher, holding
// everything the scheduler and the workers share:
//
//   region "control"        ControlBlock: per-process heartbeat/state slots, the
//                           job-wide abort word, NCCL unique id and a byte
//                           exchange area (CUDA IPC handles) for the workers
//   region "diff"           SPMC ring: scheduler -> all workers (step diffs)
//   region "result.<r>"     SPSC ring per rank: worker r -> scheduler
//   region "hostcomm"       CPU backend's all-reduce / all-gather scratch
//
// Every process attaches by name (--job), finds its regions, and starts a
// heartbeat thread. The launcher watches heartbeats and pids and tears the job
// down when any process dies or stops answering.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"

namespace symtp::runtime {

inline constexpr int kMaxRanks = 8;
inline constexpr int kMaxProcs = kMaxRanks + 1;  // slot 0: scheduler, 1..N: worker ranks
inline constexpr uint64_t kControlMagic = 0x53594D54504A4F42ull;  // "SYMTPJOB"
inline constexpr uint32_t kControlVersion = 3;  // 2: ProcSlot::kv_blocks; 3: launcher_pid
inline constexpr size_t kExchangeBytesPerRank = 4096;

enum class ProcRole : int32_t { kScheduler = 0, kWorker = 1 };

enum class ProcPhase : int32_t {
  kNotStarted = 0,
  kStarting = 1,
  kReady = 2,
  kRunning = 3,
  kDone = 4,
  kFailed = 5,
};

// A process-shared generation-counted barrier (runtime/shm_barrier.h).
struct alignas(64) BarrierWord {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
};

// One per process, on its own cache line.
struct alignas(64) ProcSlot {
  std::atomic<int32_t> pid;
  std::atomic<int32_t> phase;       // ProcPhase
  std::atomic<int64_t> beat_ns;     // CLOCK_MONOTONIC, refreshed by the heartbeat thread
  std::atomic<int64_t> step;        // last step the process finished (progress)
  std::atomic<int32_t> kv_blocks;   // workers: KV blocks allocated (0 until reported)
  char error[192];                  // last error message when phase == kFailed
};

struct alignas(64) ControlBlock {
  uint64_t magic;
  uint32_t version;
  int32_t tp;
  std::atomic<int32_t> abort_code;  // 0 = running; non-zero = tear down
  char abort_reason[256];
  ProcSlot procs[kMaxProcs];
  // Byte exchange among the workers (NCCL unique id, CUDA IPC handles,
  // probes): an all-gather between two barriers.
  BarrierWord exchange_barrier;
  uint8_t exchange[kMaxRanks][kExchangeBytesPerRank];
  // Membership: a process of the job is a child of this pid whose pid the
  // launcher recorded in its slot (AttachJob checks both before the process
  // touches anything shared, so a stranger's failure never aborts the job).
  std::atomic<int32_t> launcher_pid;
};
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Slot index of a process: 0 for the scheduler, 1 + rank for workers.
inline int ProcIndex(ProcRole role, int rank) { return role == ProcRole::kScheduler ? 0 : 1 + rank; }
std::string ProcName(int proc_index);  // "scheduler", "worker rank 2"

// Requests every process of the job to stop; the first reason wins.
void RequestAbort(ControlBlock* cb, int code, absl::string_view reason);
// OK, or Aborted with the recorded reason.
absl::Status CheckAbort(const ControlBlock* cb);

// Refreshes ProcSlot::beat_ns every `period` on a background thread until
// destroyed. A SIGSTOPped process stops beating; a dead one too.
class HeartbeatThread {
 public:
  HeartbeatThread(ProcSlot* slot, int64_t period_ns);
  ~HeartbeatThread();
  HeartbeatThread(const HeartbeatThread&) = delete;
  HeartbeatThread& operator=(const HeartbeatThread&) = delete;

 private:
  ProcSlot* slot_;
  int64_t period_ns_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace symtp::runtime

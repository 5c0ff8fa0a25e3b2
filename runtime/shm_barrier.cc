#include "runtime/shm_barrier.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ipc/futex.h"
#include "ipc/liveness.h"

namespace symtp::runtime {

absl::Status CheckPeers(const ControlBlock* cb, int tp) {
  if (absl::Status s = CheckAbort(cb); !s.ok()) return s;
  for (int i = 0; i < tp + 1; ++i) {
    const ProcSlot& p = cb->procs[i];
    pid_t pid = p.pid.load(std::memory_order_acquire);
    auto phase = static_cast<ProcPhase>(p.phase.load(std::memory_order_acquire));
    if (phase == ProcPhase::kFailed) {
      return absl::UnavailableError(absl::StrCat(ProcName(i), " (pid ", pid, ") failed: ",
                                                 std::string(p.error, strnlen(p.error, sizeof(p.error)))));
    }
    if (pid <= 0 || phase == ProcPhase::kDone) continue;
    ipc::ProcState st = ipc::ProbeProcess(pid);
    if (st == ipc::ProcState::kDead || st == ipc::ProcState::kZombie) {
      return absl::UnavailableError(
          absl::StrCat(ProcName(i), " (pid ", pid, ") is ", ipc::ProcStateName(st)));
    }
  }
  return absl::OkStatus();
}

absl::Status BarrierWait(BarrierWord* b, uint32_t n, const ControlBlock* cb, int tp,
                         Deadline deadline, absl::string_view what) {
  const uint32_t gen = b->generation.load(std::memory_order_acquire);
  if (b->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
    b->arrived.store(0, std::memory_order_relaxed);
    b->generation.fetch_add(1, std::memory_order_acq_rel);
    ipc::FutexWakeAll(&b->generation);
    return absl::OkStatus();
  }
  for (int i = 0;; ++i) {
    if (b->generation.load(std::memory_order_acquire) != gen) return absl::OkStatus();
    if (i < 2000) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (i < 2200) {
      sched_yield();
      continue;
    }
    if (deadline.Expired()) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: barrier not reached by all %u processes before the deadline", what, n));
    }
    if (absl::Status s = CheckPeers(cb, tp); !s.ok()) {
      return absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
    }
    // A wake, a changed word, a timeout or an error: all mean "re-check".
    ipc::FutexWait(&b->generation, gen, std::min<int64_t>(deadline.RemainingNs() + 1, 2'000'000))
        .IgnoreError();
  }
}

}  // namespace symtp::runtime

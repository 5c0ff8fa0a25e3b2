// A process-shared, generation-counted barrier placed in shared memory, and a
// bounded wait primitive (spin -> yield -> futex sleep) used by the runtime's
// collectives. Every wait has a deadline; each sleep slice re-checks the job's
// abort word and the liveness of the participating processes, so a dead or
// stopped peer turns into an error naming it instead of a hang.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "common/clock.h"
#include "runtime/job.h"

namespace symtp::runtime {

// Checks run while waiting: abort word, then every worker's pid/phase.
// Returns the first problem found as a Status naming the process.
absl::Status CheckPeers(const ControlBlock* cb, int tp);

// Blocks until all `n` participants arrived or the deadline passes.
absl::Status BarrierWait(BarrierWord* b, uint32_t n, const ControlBlock* cb, int tp,
                         Deadline deadline, absl::string_view what);

}  // namespace symtp::runtime

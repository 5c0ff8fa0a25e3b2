// What the job's flags size, derived the same way in every process: the
// model, the longest sequence, the KV cache and the scheduler's limits.
#pragma once

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "models/config.h"
#include "runtime/layout.h"
#include "runtime/options.h"
#include "scheduler/scheduler.h"

namespace symtp::runtime {

// The --model preset with --model-overrides, validated for --tp.
absl::StatusOr<model::ModelConfig> ResolveModel(const JobOptions& opts);
// The longest sequence (prompt + output) the workload can produce.
int JobMaxSeqLen(const JobOptions& opts, const model::ModelConfig& cfg);
// The scheduler's limits from the flags (v1 scheduler process and v0's rank 0).
sched::SchedulerConfig JobSchedulerConfig(const JobOptions& opts, const model::ModelConfig& cfg);

// KV blocks every process derives from the same flags (--num-kv-blocks, or
// enough for the workload).
int NumKvBlocks(const JobOptions& opts, const model::ModelConfig& cfg);
// Whether each worker sizes its own KV cache (--kv-cache-mib,
// --kv-cache-fraction) and reports it, the scheduler taking the smallest.
bool KvBlocksFromWorkers(const JobOptions& opts);
// Blocks that fit in `bytes` on `rank`: K and V of every layer for the
// rank's kv heads, `elem_bytes` per element; at least 0.
int KvBlocksForBytes(const model::ModelConfig& cfg, int rank, int tp, size_t elem_bytes,
                     double bytes);
// Waits until every worker has reported its KV cache in its ProcSlot (a
// worker does once its backend is built: the job's "every worker ready"),
// until `deadline`; a worker that fails first, or an abort, ends the wait with
// its error. Returns the block count the scheduler plans with: NumKvBlocks,
// or, when the workers size their caches, the smallest count they report.
absl::StatusOr<int> AgreedKvBlocks(const JobOptions& opts, const model::ModelConfig& cfg,
                                   JobHandle* job, Deadline deadline);

}  // namespace symtp::runtime

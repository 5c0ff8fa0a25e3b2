// The process bodies the launcher starts. Each returns the process exit code;
// on failure it first records the error in its control-block slot and asks the
// job to abort, so the launcher can name it.
#pragma once

#include "runtime/options.h"

namespace symtp::runtime {

// v1: plans steps, publishes diffs, collects every rank's results, checks
// digests, writes summary.json and tokens.jsonl.
int RunSchedulerProcess(const JobOptions& opts, const ProcArgs& proc);
// v1: applies diffs, runs the model, samples, returns tokens + digest.
// v0: rank 0 also schedules inline and broadcasts the padded batch.
int RunWorkerProcess(const JobOptions& opts, const ProcArgs& proc);

}  // namespace symtp::runtime

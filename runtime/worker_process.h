// A worker process: one tensor-parallel rank, identical code on every rank.
// v1: applies each step's diff to its cached request state, runs the model,
// samples and returns its tokens with a digest of its state. v0: rank 0 also
// schedules inline and broadcasts the padded batch (runtime/v0.h).
#pragma once

#include "runtime/options.h"

namespace symtp::runtime {

// Returns the process exit code (runtime/layout.h's RunJobProcess; 2 for a
// --rank outside [0, --tp)).
int RunWorkerProcess(const JobOptions& opts, const ProcArgs& proc);

}  // namespace symtp::runtime

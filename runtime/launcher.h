// The launcher: like torchrun for one node. Creates the job's shared-memory
// segment, spawns the scheduler and one worker per rank (the same executable,
// re-executed with --role flags), watches them, and tears the whole job down
// when any of them dies, stops answering (stale heartbeat) or fails — within
// about a second — or when the launcher gets SIGINT/SIGTERM. Children get
// PR_SET_PDEATHSIG so that they never outlive it, and the segment is removed
// on every exit path: by the launcher, or, when the launcher is killed, by
// its segment guard (launcher.cc), a helper that unlinks the name when the
// launcher's end closes a pipe.
#pragma once

#include <string>

#include "runtime/options.h"

namespace symtp::runtime {

// Returns the process exit code: 0 on success, 1 when the job failed, 2 for
// bad configuration found before any process started, 128+signal when
// interrupted.
int RunLauncher(JobOptions opts, const std::string& self_exe);

}  // namespace symtp::runtime

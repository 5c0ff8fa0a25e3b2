// Sizing and formatting of the job segment (see runtime/job.h), and the
// attach side that every child process uses.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "ipc/ring.h"
#include "ipc/shm_segment.h"
#include "models/config.h"
#include "runtime/job.h"
#include "runtime/options.h"

namespace symtp::runtime {

// Region names inside the job segment.
inline constexpr char kRegionControl[] = "control";
inline constexpr char kRegionDiff[] = "diff";
inline constexpr char kRegionHostComm[] = "hostcomm";
std::string ResultRegionName(int rank);  // "result.<rank>"

struct JobLayout {
  model::ModelConfig model;
  size_t control_bytes = 0;
  uint64_t diff_ring_capacity = 0;
  uint64_t result_ring_capacity = 0;
  size_t hostcomm_floats = 0;
  size_t total_bytes = 0;
};

// Resolves the model preset + overrides, validates it for the TP degree and
// sizes every region. InvalidArgument for an unknown preset or a bad shape.
absl::StatusOr<JobLayout> PlanJobLayout(const JobOptions& opts);

// Picks cpu/cuda for --backend=auto and checks that --backend=cuda has at
// least --tp visible GPUs. Sets opts->resolved_backend.
absl::Status ResolveBackend(JobOptions* opts);

// Creator side: carves and formats every region.
absl::StatusOr<ControlBlock*> FormatJobSegment(ipc::ShmSegment* seg, const JobLayout& layout,
                                               const JobOptions& opts);

// Child side: everything a process of the job needs.
struct JobHandle {
  std::optional<ipc::ShmSegment> segment;
  ControlBlock* control = nullptr;
  std::optional<ipc::SpmcRing> diff_ring;
  std::vector<ipc::SpmcRing> result_rings;  // one per rank
  void* hostcomm = nullptr;
  size_t hostcomm_bytes = 0;
  ProcSlot* self = nullptr;
  int proc_index = -1;

  // Marks this process failed with `status` and requests the job's abort.
  void Fail(const absl::Status& status);
  void SetPhase(ProcPhase p);
};
absl::StatusOr<std::unique_ptr<JobHandle>> AttachJob(const std::string& name, int proc_index,
                                                     int tp);

// The frame of every child process: attaches to job `proc.job` as
// `proc_index`, beats its heartbeat, marks itself ready and runs `body`.
// Returns the exit code: 0; 1 when `body` failed (the error is recorded in
// the process's slot and the job asked to abort); 3 when it stopped because
// of another process's failure.
int RunJobProcess(const ProcArgs& proc, int tp, int proc_index,
                  absl::FunctionRef<absl::Status(JobHandle*)> body);

}  // namespace symtp::runtime

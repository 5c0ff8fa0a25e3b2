#include "runtime/layout.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "runtime/job_sizing.h"
#include "runtime/shm_host_comm.h"
#if defined(SYMTP_HAVE_CUDA)
#include "common/cuda_raii.h"
#endif

namespace symtp::runtime {

std::string ResultRegionName(int rank) { return absl::StrCat("result.", rank); }

namespace {

uint64_t NextPow2(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

size_t Align(size_t x) { return (x + 4095) & ~size_t{4095}; }

// The workload against the model: no prompt, output or steady context
// longer than a sequence can be (a prompt leaves room for one output token;
// a prompt plus its output beyond max_seq_len ends at max_seq_len), and a
// --num-kv-blocks that holds the longest sequence.
absl::Status CheckWorkloadFitsModel(const JobOptions& o, const model::ModelConfig& m) {
  const int limit = m.max_seq_len - 1;
  auto check = [&](const char* flag, const LengthDist& d) -> absl::Status {
    if (d.Max() <= limit) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "--%s %s asks for %s%g tokens; the model's max_seq_len %d allows at most %d", flag,
        AbslUnparseFlag(d), d.kind == LengthKind::kNormal || d.kind == LengthKind::kLognormal ? "a median of " : "", d.Max(),
        m.max_seq_len, limit));
  };
  if (o.steady_batch > 0) {
    if (o.steady_context > limit) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--steady-context %d is longer than the model's max_seq_len %d allows (at most %d)",
          o.steady_context, m.max_seq_len, limit));
    }
  } else {
    SYMTP_RETURN_IF_ERROR(check("prompt-len", o.prompt_len));
    SYMTP_RETURN_IF_ERROR(check("output-len", o.output_len));
  }
  const int64_t longest = JobMaxSeqLen(o, m);
  const int64_t need = (longest + m.block_size - 1) / m.block_size;
  if (o.num_kv_blocks > 0 && o.num_kv_blocks < need) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--num-kv-blocks %d cannot hold one sequence of this workload (%d tokens: %d blocks "
        "of %d)",
        o.num_kv_blocks, longest, need, m.block_size));
  }
  // The CPU workers size --kv-cache-mib in fp32 (CreateCpuBackend): the same
  // count here, so a budget below one sequence fails before any process.
  if (o.num_kv_blocks <= 0 && o.kv_cache_mib > 0 &&
      (o.backend == BackendKind::kCpu || o.resolved_backend == BackendKind::kCpu)) {
    int blocks = INT32_MAX;
    for (int r = 0; r < o.tp; ++r) {
      blocks = std::min(blocks, KvBlocksForBytes(m, r, o.tp, sizeof(float), o.kv_cache_mib * 1048576.0));
    }
    if (blocks < need) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--kv-cache-mib %g (%d blocks of %d on the smallest rank) cannot hold one sequence of "
          "this workload (%d tokens: %d blocks)",
          o.kv_cache_mib, blocks, m.block_size, longest, need));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobLayout> PlanJobLayout(const JobOptions& opts) {
  JobLayout l;
  SYMTP_ASSIGN_OR_RETURN(l.model, ResolveModel(opts));
  SYMTP_RETURN_IF_ERROR(CheckWorkloadFitsModel(opts, l.model));
  const int max_seq = l.model.max_seq_len;
  const int max_prompt = std::min(
      max_seq, std::max(opts.prompt_len.Longest(max_seq), opts.steady_batch > 0 ? opts.steady_context : 0));
  // The largest diff admits max_batch new requests with whole prompts.
  uint64_t diff_bytes = static_cast<uint64_t>(opts.max_batch) * (static_cast<uint64_t>(max_prompt) * 4 +
                                                                  static_cast<uint64_t>(max_seq / 16 + 16) * 4 + 128);
  l.diff_ring_capacity = NextPow2(std::max<uint64_t>(4ull << 20, 4 * diff_bytes + (64 << 10)));
  l.result_ring_capacity = NextPow2(std::max<uint64_t>(1ull << 20, 8ull * opts.max_batch * 16 + (64 << 10)));
  const size_t hidden = l.model.hidden;
  const size_t vocab_local = l.model.vocab / opts.tp;
  l.hostcomm_floats = std::max({static_cast<size_t>(opts.max_batched_tokens) * hidden,
                                static_cast<size_t>(opts.max_batch) * vocab_local, size_t{1} << 16});
  if (opts.mode == Mode::kV0) {
    // The padded batch: [B, S] token ids, positions and slot mapping,
    // [B, S/16] block tables, [B] lengths and [B, 3] step metadata (int32).
    const size_t b = opts.steady_batch > 0 ? opts.steady_batch : opts.max_batch;
    l.hostcomm_floats = std::max(l.hostcomm_floats,
                                 b * (3 * static_cast<size_t>(max_seq) + max_seq / 16 + 4) + 64);
  }
  l.control_bytes = Align(sizeof(ControlBlock));
  l.total_bytes = 4096 /*segment header*/ + 4096 * 8 /*slack per region*/ + l.control_bytes +
                  Align(ipc::SpmcRing::RequiredBytes({static_cast<uint32_t>(opts.tp), l.diff_ring_capacity})) +
                  static_cast<size_t>(opts.tp) *
                      Align(ipc::SpmcRing::RequiredBytes({1, l.result_ring_capacity})) +
                  (opts.backend == BackendKind::kCuda && opts.mode == Mode::kV1
                       ? Align(ShmHostComm::RequiredBytes(opts.tp, 1 << 16))
                       : Align(ShmHostComm::RequiredBytes(opts.tp, l.hostcomm_floats)));
  l.total_bytes += 4096 * 64;
  return l;
}

absl::Status ResolveBackend(JobOptions* opts) {
  int gpus = 0;
  std::string why = "symtp was built without CUDA";
#if defined(SYMTP_HAVE_CUDA)
  gpus = cuda::VisibleDeviceCount(&why);
#endif
  if (opts->backend == BackendKind::kCpu || (opts->backend == BackendKind::kAuto && gpus == 0)) {
    opts->resolved_backend = BackendKind::kCpu;
    return ValidateJobOptions(*opts);  // e.g. GPU-only flags
  }
  if (gpus < opts->tp) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tp ", opts->tp, " needs ", opts->tp, " GPUs but ", gpus, " visible",
        gpus == 0 ? absl::StrCat(" (", why, ")") : std::string(), "; use --backend=cpu"));
  }
  opts->resolved_backend = BackendKind::kCuda;
#if defined(SYMTP_HAVE_CUDA)
  std::string peers;
  if (cuda::AllPeersReachable(opts->tp, &peers)) {
    SYMTP_LOG(INFO, "launch") << "backend cuda, tp " << opts->tp << ": " << peers;
  } else {
    SYMTP_LOG(WARN, "launch") << "backend cuda, tp " << opts->tp << ": " << peers
                              << "; the custom all-reduce needs peer access and will fall back "
                                 "to NCCL (which routes through host memory where it must)";
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<ControlBlock*> FormatJobSegment(ipc::ShmSegment* seg, const JobLayout& layout,
                                               const JobOptions& opts) {
  SYMTP_ASSIGN_OR_RETURN(void* ctl, seg->Allocate(kRegionControl, layout.control_bytes));
  auto* cb = new (ctl) ControlBlock();
  cb->tp = opts.tp;
  cb->launcher_pid.store(getpid(), std::memory_order_relaxed);
  cb->version = kControlVersion;
  cb->magic = kControlMagic;

  ipc::RingConfig diff_cfg{static_cast<uint32_t>(opts.tp), layout.diff_ring_capacity};
  size_t diff_bytes = ipc::SpmcRing::RequiredBytes(diff_cfg);
  SYMTP_ASSIGN_OR_RETURN(void* diff, seg->Allocate(kRegionDiff, diff_bytes));
  SYMTP_RETURN_IF_ERROR_CTX(ipc::SpmcRing::Format(diff, diff_bytes, diff_cfg).status(), "diff ring");
  for (int r = 0; r < opts.tp; ++r) {
    ipc::RingConfig rc{1, layout.result_ring_capacity};
    size_t rb = ipc::SpmcRing::RequiredBytes(rc);
    SYMTP_ASSIGN_OR_RETURN(void* mem, seg->Allocate(ResultRegionName(r), rb));
    SYMTP_RETURN_IF_ERROR_CTX(ipc::SpmcRing::Format(mem, rb, rc).status(), ResultRegionName(r));
  }
  size_t floats = opts.resolved_backend == BackendKind::kCuda && opts.mode == Mode::kV1 ? (1 << 16) : layout.hostcomm_floats;
  size_t hb = ShmHostComm::RequiredBytes(opts.tp, floats);
  SYMTP_ASSIGN_OR_RETURN(void* hc, seg->Allocate(kRegionHostComm, hb));
  SYMTP_RETURN_IF_ERROR(ShmHostComm::Format(hc, hb, opts.tp, floats));
  return cb;
}

namespace {

// Only a process the launcher started joins the job: its parent is the
// launcher, and the launcher recorded its pid in the slot (right after fork;
// waited for, bounded, as this process may get here first).
absl::Status CheckMembership(const std::string& name, const ControlBlock* cb, int proc_index) {
  const pid_t launcher = cb->launcher_pid.load(std::memory_order_acquire);
  const pid_t parent = getppid();
  if (parent != launcher) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "job %s: this process (pid %d, parent %d) was not started by the job's launcher (pid "
        "%d); only `symtp launch` starts its processes",
        name, getpid(), parent, launcher));
  }
  const Deadline deadline = Deadline::AfterMs(2000);
  for (;;) {
    const pid_t holder = cb->procs[proc_index].pid.load(std::memory_order_acquire);
    if (holder == getpid()) return absl::OkStatus();
    if (deadline.Expired()) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "job %s: the launcher did not record this process (pid %d) as %s (the slot holds pid %d)",
          name, getpid(), ProcName(proc_index), holder));
    }
    usleep(1000);
  }
}

}  // namespace

void JobHandle::SetPhase(ProcPhase p) {
  self->phase.store(static_cast<int32_t>(p), std::memory_order_release);
}

void JobHandle::Fail(const absl::Status& status) {
  std::string msg(status.message());
  size_t n = std::min(msg.size(), sizeof(self->error) - 1);
  std::memcpy(self->error, msg.data(), n);
  self->error[n] = '\0';
  SetPhase(ProcPhase::kFailed);
  RequestAbort(control, 1, absl::StrCat(ProcName(proc_index), ": ", msg));
}

absl::StatusOr<std::unique_ptr<JobHandle>> AttachJob(const std::string& name, int proc_index,
                                                     int tp) {
  auto h = std::make_unique<JobHandle>();
  SYMTP_ASSIGN_OR_RETURN(ipc::ShmSegment seg, ipc::ShmSegment::Attach(name));
  h->segment.emplace(std::move(seg));
  SYMTP_ASSIGN_OR_RETURN(auto ctl, h->segment->Find(kRegionControl));
  h->control = static_cast<ControlBlock*>(ctl.first);
  if (ctl.second < sizeof(ControlBlock) || h->control->magic != kControlMagic ||
      h->control->version != kControlVersion || h->control->tp != tp) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", name, ": control block does not match this build or --tp"));
  }
  SYMTP_RETURN_IF_ERROR(CheckMembership(name, h->control, proc_index));
  SYMTP_ASSIGN_OR_RETURN(auto diff, h->segment->Find(kRegionDiff));
  SYMTP_ASSIGN_OR_RETURN(ipc::SpmcRing dr, ipc::SpmcRing::Attach(diff.first, diff.second));
  h->diff_ring.emplace(dr);
  for (int r = 0; r < tp; ++r) {
    SYMTP_ASSIGN_OR_RETURN(auto res, h->segment->Find(ResultRegionName(r)));
    SYMTP_ASSIGN_OR_RETURN(ipc::SpmcRing ring, ipc::SpmcRing::Attach(res.first, res.second));
    h->result_rings.push_back(ring);
  }
  SYMTP_ASSIGN_OR_RETURN(auto hc, h->segment->Find(kRegionHostComm));
  h->hostcomm = hc.first;
  h->hostcomm_bytes = hc.second;
  h->proc_index = proc_index;
  h->self = &h->control->procs[proc_index];
  return h;
}

int RunJobProcess(const ProcArgs& proc, int tp, int proc_index,
                  absl::FunctionRef<absl::Status(JobHandle*)> body) {
  constexpr int64_t kHeartbeatPeriodNs = 50'000'000;
  absl::StatusOr<std::unique_ptr<JobHandle>> job = AttachJob(proc.job, proc_index, tp);
  if (!job.ok()) {
    std::fprintf(stderr, "symtp %s: %s\n", ProcName(proc_index).c_str(), job.status().ToString().c_str());
    return 1;
  }
  (*job)->self->pid.store(getpid(), std::memory_order_release);
  HeartbeatThread heartbeat((*job)->self, kHeartbeatPeriodNs);
  (*job)->SetPhase(ProcPhase::kReady);
  absl::Status s = body(job->get());
  if (!s.ok()) {
    // An abort requested by someone else is not this process's failure.
    if (absl::IsAborted(s) || !CheckAbort((*job)->control).ok()) {
      SYMTP_LOG(WARN, "proc") << ProcName(proc_index) << " stopping: " << s.message();
      return 3;
    }
    SYMTP_LOG(ERROR, "proc") << ProcName(proc_index) << ": " << s;
    (*job)->Fail(s);
    return 1;
  }
  (*job)->SetPhase(ProcPhase::kDone);
  return 0;
}

}  // namespace symtp::runtime

#include "runtime/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "ipc/liveness.h"
#include "ipc/shm_segment.h"
#include "runtime/job.h"
#include "runtime/layout.h"

namespace symtp::runtime {

namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

struct Child {
  int proc_index;
  pid_t pid = -1;
  bool exited = false;
  int wait_status = 0;
};

std::string DescribeExit(int st) {
  if (WIFEXITED(st)) return absl::StrCat("exited with code ", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return absl::StrCat("was killed by signal ", WTERMSIG(st), " (", strsignal(WTERMSIG(st)), ")");
  return "ended";
}

absl::StatusOr<pid_t> Spawn(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return ::symtp::ErrnoToStatus(errno, "fork", __FILE__, __LINE__);
  if (pid == 0) {
    // Child: die with the launcher; own process group so terminal signals go
    // to the launcher only, which then shuts the job down in order.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// The segment guard: a helper forked (no exec) before the segment exists,
// holding the read end of a pipe whose write end only the launcher holds.
// However the launcher ends - SIGKILL included - the kernel closes the write
// end, the guard's read() returns, and the guard unlinks the segment's name
// (a no-op when the launcher already removed it). The job's processes die
// with the launcher (PR_SET_PDEATHSIG), so the segment cannot outlive the
// job; its mappings go with its last process. The guard has its own process
// group and ignores terminal signals, so a signal to the launcher's group
// does not take it first. Between fork and _exit it makes only
// async-signal-safe calls (the launcher may have threads, e.g. CUDA's).
struct SegmentGuard {
  pid_t pid = -1;
  int write_fd = -1;
};

absl::StatusOr<SegmentGuard> StartSegmentGuard(const std::string& segment_name) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ::symtp::ErrnoToStatus(errno, "pipe2", __FILE__, __LINE__);
  const std::string path = "/" + segment_name;  // built before fork: no allocation in the child
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return ::symtp::ErrnoToStatus(e, "fork (segment guard)", __FILE__, __LINE__);
  }
  if (pid == 0) {
    setpgid(0, 0);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) sigaction(sig, &ign, nullptr);
    // Hold nothing of the launcher's but the pipe (a captured stdout must
    // see EOF when the launcher ends, not when the guard does).
    for (int fd = 0; fd < 1024; ++fd) {
      if (fd != fds[0]) ::close(fd);
    }
    char c;
    for (;;) {
      const ssize_t n = ::read(fds[0], &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    ::shm_unlink(path.c_str());
    _exit(0);
  }
  ::close(fds[0]);
  return SegmentGuard{pid, fds[1]};
}

// Normal end of the launcher: the segment is removed; let the guard go.
void StopSegmentGuard(SegmentGuard& g) {
  if (g.write_fd >= 0) ::close(g.write_fd);
  g.write_fd = -1;
  if (g.pid <= 0) return;
  const int64_t until = MonotonicNs() + 1'000'000'000;
  int st;
  while (waitpid(g.pid, &st, WNOHANG) == 0 && MonotonicNs() < until) usleep(1000);
  g.pid = -1;
}

// Creates `dir` (and its parents) and proves that a file can be created in
// it: the outputs are written there, through a temporary file and a rename,
// only after the whole workload ran.
absl::Status CheckWritableDir(const std::filesystem::path& dir, absl::string_view flag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat(flag, ": creating ", dir.string(), ": ", ec.message()));
  const std::string probe = (dir / absl::StrCat(".symtp-write-probe.", getpid())).string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": cannot write in ", dir.string(), ": ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

absl::Status CheckOutputs(const JobOptions& opts) {
  if (!opts.out_dir.empty()) SYMTP_RETURN_IF_ERROR(CheckWritableDir(opts.out_dir, "--out"));
  if (!opts.trace_file.empty()) {
    const std::filesystem::path trace(opts.trace_file);
    if (std::filesystem::is_directory(trace)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--trace ", opts.trace_file, " is a directory; give a file name"));
    }
    SYMTP_RETURN_IF_ERROR(CheckWritableDir(
        trace.has_parent_path() ? trace.parent_path() : std::filesystem::path("."), "--trace"));
  }
  return absl::OkStatus();
}

}  // namespace

int RunLauncher(JobOptions opts, const std::string& self_exe) {
  // ---- Resolve and check everything we can before any process starts.
  absl::StatusOr<JobLayout> layout = PlanJobLayout(opts);
  absl::Status checked = layout.status();
  if (checked.ok()) checked = ResolveBackend(&opts);
  if (checked.ok()) checked = CheckOutputs(opts);
  if (!checked.ok()) {
    std::fprintf(stderr, "symtp: %s\n", std::string(checked.message()).c_str());
    return 2;
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const std::string job_name = ipc::ShmSegment::NewJobName();
  absl::StatusOr<SegmentGuard> guard = StartSegmentGuard(job_name);
  if (!guard.ok()) {
    std::fprintf(stderr, "symtp: starting the segment guard: %s\n", guard.status().ToString().c_str());
    return 1;
  }
  auto seg = ipc::ShmSegment::Create(job_name, layout->total_bytes);
  if (!seg.ok()) {
    StopSegmentGuard(*guard);
    std::fprintf(stderr, "symtp: creating the job segment: %s\n", seg.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<ControlBlock*> cb_or = FormatJobSegment(&*seg, *layout, opts);
  if (!cb_or.ok()) {
    (void)seg->Remove();
    StopSegmentGuard(*guard);
    std::fprintf(stderr, "symtp: formatting the job segment: %s\n", cb_or.status().ToString().c_str());
    return 1;
  }
  ControlBlock* cb = *cb_or;

  SYMTP_LOG(INFO, "launch") << "job " << seg->name() << ": mode " << Name(opts.mode) << ", backend "
                            << Name(opts.resolved_backend) << ", tp " << opts.tp << ", model "
                            << opts.model << (opts.model_overrides.empty() ? "" : " (")
                            << opts.model_overrides << (opts.model_overrides.empty() ? "" : ")");

  // ---- Spawn: scheduler (v1 only) then the workers.
  std::vector<std::string> common = ToArgs(opts);
  common.push_back(absl::StrCat("--job=", seg->name()));
  std::vector<Child> children;
  auto spawn = [&](int proc_index, std::vector<std::string> args) -> bool {
    args.insert(args.end(), common.begin(), common.end());
    absl::StatusOr<pid_t> pid = Spawn(self_exe, args);
    if (!pid.ok()) {
      std::fprintf(stderr, "symtp: starting %s: %s\n", ProcName(proc_index).c_str(),
                   pid.status().ToString().c_str());
      return false;
    }
    cb->procs[proc_index].pid.store(*pid, std::memory_order_release);
    cb->procs[proc_index].phase.store(static_cast<int32_t>(ProcPhase::kStarting),
                                      std::memory_order_release);
    cb->procs[proc_index].beat_ns.store(MonotonicNs(), std::memory_order_release);
    children.push_back(Child{proc_index, *pid});
    return true;
  };
  bool ok = true;
  if (opts.mode == Mode::kV1) ok = spawn(0, {"scheduler"});
  for (int r = 0; ok && r < opts.tp; ++r) {
    std::vector<std::string> args = {"worker", absl::StrCat("--rank=", r)};
    if (opts.resolved_backend == BackendKind::kCuda) {
      args.push_back(absl::StrCat("--device=", r));
      SYMTP_LOG(INFO, "launch") << "worker rank " << r << " -> GPU " << r
                                << " (CUDA_VISIBLE_DEVICES="
                                << env::CudaVisibleDevices().value_or("<unset>") << ")";
    }
    ok = spawn(1 + r, std::move(args));
  }

  // ---- Watch.
  std::string failure;
  int exit_code = 0;
  if (!ok) {
    failure = "could not start every process";
    exit_code = 1;
  }
  const int64_t hang_ns = opts.hang_timeout_ms * 1'000'000;
  constexpr int64_t kStartGraceNs = 30'000'000'000;
  int64_t all_done_deadline = 0;
  bool signaled = false;
  auto reap = [&] {
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
      for (Child& c : children) {
        if (c.pid != pid) continue;
        c.exited = true;
        c.wait_status = st;
        bool clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        // Exit code 3: stopped because another process failed (not a cause).
        bool consequence = WIFEXITED(st) && WEXITSTATUS(st) == 3;
        // A death by signal is the likelier root cause than a peer's error
        // exit about it, so it wins within one sweep.
        if (!clean && !consequence && (failure.empty() || (WIFSIGNALED(st) && !signaled))) {
          const ProcSlot& slot = cb->procs[c.proc_index];
          std::string err(slot.error, strnlen(slot.error, sizeof(slot.error)));
          failure = absl::StrCat(ProcName(c.proc_index), " (pid ", pid, ") ", DescribeExit(st),
                                 err.empty() ? "" : ": ", err);
          signaled = WIFSIGNALED(st);
          exit_code = 1;
        }
      }
    }
  };
  while (failure.empty()) {
    if (int sig = g_signal.load(); sig != 0) {
      failure = absl::StrCat("interrupted by signal ", sig, " (", strsignal(sig), ")");
      exit_code = 128 + sig;
      break;
    }
    // Reap. An error exit may be a peer reporting a death: look once more
    // for the process that died by a signal, the root cause.
    reap();
    if (!failure.empty() && !signaled) {
      usleep(20000);
      reap();
    }
    if (!failure.empty()) break;
    bool all_exited = true;
    for (const Child& c : children) all_exited &= c.exited;
    if (all_exited) break;
    // A process that reported failure or requested an abort. A peer that
    // noticed a death first may have raised it: reap again so that the root
    // cause (the process that died) is what gets reported.
    if (absl::Status s = CheckAbort(cb); !s.ok()) {
      // A killed multi-threaded process shows as a zombie before waitpid can
      // collect it (its other threads are still exiting): wait for that,
      // bounded, so the dead process is named rather than the peer that
      // noticed it.
      int64_t until = MonotonicNs() + 500'000'000;
      for (;;) {
        reap();
        bool dying = false;
        for (const Child& c : children) {
          if (c.exited) continue;
          ipc::ProcState ps = ipc::ProbeProcess(c.pid);
          dying |= ps == ipc::ProcState::kZombie || ps == ipc::ProcState::kDead;
        }
        if (signaled || !dying || MonotonicNs() > until) break;
        usleep(5000);
      }
      if (failure.empty()) failure = std::string(s.message());
      else failure = absl::StrCat(failure, " (", s.message(), ")");
      exit_code = 1;
      break;
    }
    // Heartbeats: a stopped or wedged process stops beating.
    int64_t now = MonotonicNs();
    for (const Child& c : children) {
      if (c.exited) continue;
      const ProcSlot& slot = cb->procs[c.proc_index];
      int64_t age = now - slot.beat_ns.load(std::memory_order_acquire);
      if (age > hang_ns) {
        ipc::ProcState ps = ipc::ProbeProcess(c.pid);
        // A process still starting (exec, loading its libraries, attaching)
        // has no heartbeat thread yet, and on a loaded machine that can take
        // longer than the hang timeout: while it is runnable it gets
        // kStartGraceNs. A stopped one fails like any other.
        const bool starting =
            slot.phase.load(std::memory_order_acquire) ==
                static_cast<int32_t>(ProcPhase::kStarting) &&
            ps == ipc::ProcState::kAlive && age <= std::max(hang_ns, kStartGraceNs);
        if (starting) continue;
        failure = absl::StrFormat("%s (pid %d) stopped answering: no heartbeat for %.2f s (process %s)",
                                  ProcName(c.proc_index), c.pid, age / 1e9, ipc::ProcStateName(ps));
        exit_code = 1;
        break;
      }
    }
    if (!failure.empty()) break;
    // The scheduler finished: the workers must follow promptly.
    if (opts.mode == Mode::kV1 && children[0].exited && all_done_deadline == 0) {
      all_done_deadline = now + std::max<int64_t>(hang_ns, 5'000'000'000);
    }
    if (all_done_deadline != 0 && now > all_done_deadline) {
      failure = "workers did not exit after the scheduler finished";
      exit_code = 1;
      break;
    }
    usleep(5000);
  }

  // ---- Tear down: ask politely through the abort word, then kill.
  if (!failure.empty()) {
    RequestAbort(cb, exit_code, failure);
    std::fprintf(stderr, "symtp: job failed: %s; stopping all processes\n", failure.c_str());
    int64_t grace_end = MonotonicNs() + 300'000'000;
    for (;;) {
      bool all = true;
      for (Child& c : children) {
        if (c.exited) continue;
        int st;
        if (waitpid(c.pid, &st, WNOHANG) == c.pid) {
          c.exited = true;
          c.wait_status = st;
        } else {
          all = false;
        }
      }
      if (all || MonotonicNs() > grace_end) break;
      usleep(5000);
    }
    for (Child& c : children) {
      if (!c.exited) kill(c.pid, SIGKILL);  // also ends SIGSTOPped processes
    }
    for (Child& c : children) {
      if (!c.exited) {
        waitpid(c.pid, &c.wait_status, 0);
        c.exited = true;
      }
    }
  }
  absl::Status rm = seg->Remove();
  if (!rm.ok()) SYMTP_LOG(WARN, "launch") << "removing " << seg->name() << ": " << rm;
  StopSegmentGuard(*guard);
  if (exit_code == 0) SYMTP_LOG(INFO, "launch") << "job finished";
  return exit_code;
}

}  // namespace symtp::runtime

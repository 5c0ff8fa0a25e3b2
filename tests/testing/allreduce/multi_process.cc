#include "tests/testing/allreduce/multi_process.h"

#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cuda_raii.h"
#include "common/status_macros.h"

namespace symtp::kernels::testing {

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);

struct alignas(64) PaddedCounter {
  std::atomic<uint64_t> value{0};
};

struct ShmExchangeState {
  int size = 0;
  size_t slot_bytes = 0;
  std::atomic<int32_t> failed_rank{-1};
  PaddedCounter arrive[kMaxRanks];     // barriers passed, per rank
  char message[kMaxRanks][1024] = {};  // each child's final status message
  char failure[1024] = {};             // message of failed_rank
  // Followed by size * slot_bytes of AllGather slots.
  char* slots() { return reinterpret_cast<char*>(this + 1); }
};

namespace {

void SleepUs(int64_t us) {
  timespec ts{static_cast<time_t>(us / 1'000'000), static_cast<long>((us % 1'000'000) * 1000)};
  nanosleep(&ts, nullptr);
}

void CopyMessage(char* dst, size_t cap, const std::string& msg) {
  size_t n = std::min(cap - 1, msg.size());
  memcpy(dst, msg.data(), n);
  dst[n] = '\0';
}

size_t MappingBytes(int size, size_t slot_bytes) {
  size_t bytes = sizeof(ShmExchangeState) + static_cast<size_t>(size) * slot_bytes;
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

int ShmPeerExchange::size() const { return state_->size; }

void ShmPeerExchange::MarkFailed(const std::string& message) {
  int32_t expected = -1;
  if (state_->failed_rank.compare_exchange_strong(expected, rank_, std::memory_order_acq_rel)) {
    CopyMessage(state_->failure, sizeof(state_->failure), message);
  }
}

absl::Status ShmPeerExchange::Barrier(Deadline deadline) {
  const uint64_t target = ++seq_;
  state_->arrive[rank_].value.store(target, std::memory_order_release);
  for (int i = 0;; ++i) {
    bool all = true;
    for (int r = 0; r < state_->size; ++r) {
      if (state_->arrive[r].value.load(std::memory_order_acquire) < target) {
        all = false;
        break;
      }
    }
    if (all) return absl::OkStatus();
    int32_t failed = state_->failed_rank.load(std::memory_order_acquire);
    if (failed >= 0 && failed != rank_) {
      return absl::AbortedError(absl::StrCat("barrier on rank ", rank_, ": peer rank ", failed,
                                             " failed: ", state_->failure));
    }
    if (deadline.Expired()) {
      std::vector<int> missing;
      for (int r = 0; r < state_->size; ++r) {
        if (state_->arrive[r].value.load(std::memory_order_acquire) < target) missing.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "barrier #", target, " on rank ", rank_, ": rank(s) ", absl::StrJoin(missing, ","),
          " did not arrive before the deadline"));
    }
    if (i < 2000) {
      // spin
    } else if (i < 4000) {
      sched_yield();
    } else {
      SleepUs(50);
    }
  }
}

absl::Status ShmPeerExchange::AllGather(const void* mine, size_t bytes, void* all,
                                        Deadline deadline) {
  if (bytes > state_->slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("ShmPeerExchange::AllGather: ", bytes,
                                                   " bytes > slot of ", state_->slot_bytes));
  }
  memcpy(state_->slots() + static_cast<size_t>(rank_) * state_->slot_bytes, mine, bytes);
  SYMTP_RETURN_IF_ERROR_CTX(Barrier(deadline), "AllGather (publish)");
  for (int r = 0; r < state_->size; ++r) {
    memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes,
           state_->slots() + static_cast<size_t>(r) * state_->slot_bytes, bytes);
  }
  // Nobody may overwrite its slot (next AllGather) before everyone has read.
  SYMTP_RETURN_IF_ERROR_CTX(Barrier(deadline), "AllGather (release)");
  return absl::OkStatus();
}

bool RunResult::ok() const {
  for (const RankOutcome& o : ranks) {
    if (o.kind != RankOutcome::Kind::kOk) return false;
  }
  return !ranks.empty();
}

std::string RunResult::Summary() const {
  std::string out;
  for (const RankOutcome& o : ranks) {
    const char* kind = "ok";
    switch (o.kind) {
      case RankOutcome::Kind::kOk: kind = "ok"; break;
      case RankOutcome::Kind::kError: kind = "error"; break;
      case RankOutcome::Kind::kCrashed: kind = "crashed"; break;
      case RankOutcome::Kind::kTimedOut: kind = "timed out (killed)"; break;
      case RankOutcome::Kind::kKilledAfterPeerFailure: kind = "killed after a peer failed"; break;
    }
    absl::StrAppend(&out, "rank ", o.rank, " (pid ", o.pid, "): ", kind);
    if (o.kind == RankOutcome::Kind::kError) absl::StrAppend(&out, " (exit ", o.exit_code, ")");
    if (o.signal != 0) absl::StrAppend(&out, " (signal ", o.signal, ")");
    if (!o.message.empty()) absl::StrAppend(&out, ": ", o.message);
    out.push_back('\n');
  }
  return out;
}

absl::StatusOr<RunResult> RunRanks(const RunOptions& opt, const RankBody& body) {
  if (opt.size < 1 || opt.size > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("RunRanks: size ", opt.size));
  }
  const size_t map_bytes = MappingBytes(opt.size, opt.exchange_bytes_per_rank);
  void* mem = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return ErrnoToStatus(errno, "mmap(exchange)", __FILE__, __LINE__);
  auto* state = new (mem) ShmExchangeState();
  state->size = opt.size;
  state->slot_bytes = opt.exchange_bytes_per_rank;

  fflush(nullptr);  // children must not re-flush the parent's buffered output
  const pid_t parent = getpid();
  std::vector<pid_t> pids(opt.size, 0);
  for (int r = 0; r < opt.size; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      int err = errno;
      for (int k = 0; k < r; ++k) kill(pids[k], SIGKILL);
      for (int k = 0; k < r; ++k) waitpid(pids[k], nullptr, 0);
      munmap(mem, map_bytes);
      return ErrnoToStatus(err, "fork()", __FILE__, __LINE__);
    }
    if (pid == 0) {
      // Child: die with the parent; never return into the caller's code.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(3);
      ShmPeerExchange ex(state, r);
      absl::Status st = body(r, opt.size, ex);
      if (!st.ok()) {
        std::string msg = st.ToString();
        CopyMessage(state->message[r], sizeof(state->message[r]), msg);
        ex.MarkFailed(msg);
        fprintf(stderr, "[rank %d] FAILED: %s\n", r, msg.c_str());
      }
      fflush(nullptr);
      _exit(st.ok() ? 0 : 1);
    }
    pids[r] = pid;
  }

  RunResult result;
  result.ranks.resize(opt.size);
  std::vector<bool> done(opt.size, false);
  int remaining = opt.size;
  const Deadline deadline = Deadline::AfterMs(opt.timeout_ms);
  int64_t kill_at_ns = deadline.at_ns();
  bool timed_out = false;
  for (int r = 0; r < opt.size; ++r) {
    result.ranks[r].rank = r;
    result.ranks[r].pid = pids[r];
  }
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < opt.size; ++r) {
      if (done[r]) continue;
      int wstatus = 0;
      pid_t got = waitpid(pids[r], &wstatus, WNOHANG);
      if (got == 0) continue;
      progressed = true;
      done[r] = true;
      --remaining;
      RankOutcome& o = result.ranks[r];
      bool failed = false;
      if (got < 0) {
        o.kind = RankOutcome::Kind::kCrashed;
        o.message = absl::StrCat("waitpid: ", strerror(errno));
        failed = true;
      } else if (WIFEXITED(wstatus)) {
        o.exit_code = WEXITSTATUS(wstatus);
        o.kind = o.exit_code == 0 ? RankOutcome::Kind::kOk : RankOutcome::Kind::kError;
        o.message = state->message[r];
        failed = o.exit_code != 0;
      } else if (WIFSIGNALED(wstatus)) {
        o.signal = WTERMSIG(wstatus);
        o.kind = timed_out ? RankOutcome::Kind::kTimedOut : RankOutcome::Kind::kCrashed;
        o.message = state->message[r];
        failed = true;
        if (!timed_out) {
          // Tell the peers waiting in the exchange.
          int32_t expected = -1;
          if (state->failed_rank.compare_exchange_strong(expected, r)) {
            CopyMessage(state->failure, sizeof(state->failure),
                        absl::StrCat("rank ", r, " died with signal ", o.signal));
          }
        }
      }
      if (failed) {
        kill_at_ns = std::min(kill_at_ns, MonotonicNs() + opt.grace_after_failure_ms * 1'000'000);
      }
    }
    if (remaining == 0) break;
    if (MonotonicNs() >= kill_at_ns) {
      timed_out = true;
      const bool by_deadline = deadline.Expired();
      for (int r = 0; r < opt.size; ++r) {
        if (done[r]) continue;
        kill(pids[r], SIGKILL);
        int wstatus = 0;
        waitpid(pids[r], &wstatus, 0);
        done[r] = true;
        --remaining;
        RankOutcome& o = result.ranks[r];
        o.kind = by_deadline ? RankOutcome::Kind::kTimedOut
                             : RankOutcome::Kind::kKilledAfterPeerFailure;
        o.signal = SIGKILL;
        o.message = by_deadline ? absl::StrCat("still running after ", opt.timeout_ms, " ms")
                                : "still running after a peer failed";
      }
      break;
    }
    if (!progressed) SleepUs(2000);
  }
  munmap(mem, map_bytes);
  return result;
}

int CountGpusInChild(std::string* why_none) {
  static std::mutex mu;
  static bool cached = false;
  static int count = 0;
  static std::string why;
  std::lock_guard<std::mutex> lock(mu);
  if (!cached) {
    struct Probe {
      int count;
      char why[512];
    };
    void* mem = mmap(nullptr, sizeof(Probe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    if (mem == MAP_FAILED) {
      why = "mmap failed";
    } else {
      auto* probe = new (mem) Probe{0, {}};
      fflush(nullptr);
      const pid_t parent = getpid();
      pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(3);
        std::string w;
        probe->count = symtp::cuda::VisibleDeviceCount(&w);
        CopyMessage(probe->why, sizeof(probe->why), w);
        _exit(0);
      }
      if (pid < 0) {
        why = "fork failed";
      } else {
        Deadline deadline = Deadline::AfterMs(60'000);
        int wstatus = 0;
        pid_t got = 0;
        while ((got = waitpid(pid, &wstatus, WNOHANG)) == 0 && !deadline.Expired()) SleepUs(2000);
        if (got == 0) {
          kill(pid, SIGKILL);
          waitpid(pid, &wstatus, 0);
          why = "GPU probe child timed out";
        } else if (got > 0 && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
          count = probe->count;
          why = probe->why;
        } else {
          why = "GPU probe child failed";
        }
      }
      munmap(mem, sizeof(Probe));
    }
    cached = true;
  }
  if (why_none != nullptr) *why_none = why;
  return count;
}

}  // namespace symtp::kernels::testing

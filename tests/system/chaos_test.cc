// Chaos: jobs at TP = 2 and 4 on the CPU backend, one process of each -
// the launcher, the scheduler or a worker - killed (SIGKILL, or SIGSTOP for
// the scheduler and the workers) at a random moment from start-up on. Every
// trial must end within 2 s (a stopped process: the hang timeout + 1 s) with
// a non-zero exit, leaving no process and no shared-memory segment.
// Label "chaos": ctest -L chaos.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "tests/testing/procfs.h"
#include "tests/testing/unique_name.h"

namespace symtp {
namespace {

namespace fs = std::filesystem;

using testing::ChildrenMatching;
using testing::ReadFile;
using testing::ShmWithPrefix;

using testing::JobProcesses;

pid_t StartJob(int tp, const std::string& prefix, const std::string& err_path) {
  const std::vector<std::string> args = {
      "launch", "--backend=cpu", absl::StrCat("--tp=", tp), "--model=tiny", "--steady-batch=4",
      "--steady-context=32", "--steady-steps=100000", "--progress=false", "--hang-timeout-ms=500"};
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    dup2(fd, 1);
    setenv("SYMTP_SHM_PREFIX", prefix.c_str(), 1);
    std::vector<char*> argv = {const_cast<char*>(SYMTP_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(SYMTP_BIN, argv.data());
    _exit(127);
  }
  return pid;
}

struct Trial {
  int tp;
  std::string target;  // launcher | scheduler | worker
  int sig;
  int delay_ms;
  double teardown_s = -1;
  int exit_status = 0;
  std::string left;
};

TEST(ChaosTest, TwentyRandomKillsEndWithinTwoSecondsLeavingNothing) {
  const uint32_t seed = static_cast<uint32_t>(MonotonicNs());
  std::mt19937 rng(seed);
  std::vector<Trial> trials;
  const char* targets[] = {"launcher", "scheduler", "worker"};
  for (int i = 0; i < 20; ++i) {
    Trial t;
    t.tp = i % 2 == 0 ? 2 : 4;
    t.target = targets[i % 3];
    t.sig = t.target != "launcher" && rng() % 5 == 0 ? SIGSTOP : SIGKILL;
    t.delay_ms = static_cast<int>(rng() % 700);  // start-up is the first ~300 ms
    trials.push_back(t);
  }
  for (Trial& t : trials) {
    const std::string prefix = testing::UniqueName("symtpchaos");
    const std::string err_path = (fs::temp_directory_path() / (prefix + ".stderr")).string();
    const pid_t launcher = StartJob(t.tp, prefix, err_path);
    ASSERT_GT(launcher, 0);
    usleep(t.delay_ms * 1000);
    pid_t victim = launcher;
    if (t.target != "launcher") {
      // The first moment the process exists from the delay on.
      const std::string needle = t.target == "worker" ? " worker " : " scheduler ";
      const Deadline d = Deadline::AfterMs(10'000);
      std::vector<pid_t> found;
      while ((found = ChildrenMatching(launcher, needle)).empty() && !d.Expired()) usleep(1000);
      ASSERT_FALSE(found.empty()) << t.target << " never appeared: " << ReadFile(err_path);
      victim = found[rng() % found.size()];
    }
    ASSERT_EQ(kill(victim, t.sig), 0);
    const int64_t t0 = MonotonicNs();
    bool reaped = false;
    for (;;) {
      if (!reaped && waitpid(launcher, &t.exit_status, WNOHANG) == launcher) reaped = true;
      if (reaped && JobProcesses(prefix).empty() && ShmWithPrefix(prefix).empty()) {
        t.teardown_s = (MonotonicNs() - t0) / 1e9;
        break;
      }
      if ((MonotonicNs() - t0) / 1e9 > 10) break;
      usleep(2000);
    }
    if (t.teardown_s < 0) {
      for (pid_t p : JobProcesses(prefix)) {
        absl::StrAppend(&t.left, " pid ", p, " (", std::string(1, testing::ProcState(p)), ")");
        kill(p, SIGCONT);
        kill(p, SIGKILL);
      }
      for (const std::string& s : ShmWithPrefix(prefix)) {
        absl::StrAppend(&t.left, " ", s);
        ::unlink(s.c_str());
      }
      if (!reaped) waitpid(launcher, &t.exit_status, 0);
    }
    const double limit = t.sig == SIGSTOP ? 0.5 + 1.0 : 2.0;
    EXPECT_GE(t.teardown_s, 0) << t.target << " sig " << t.sig << " after " << t.delay_ms
                               << " ms: left" << t.left << "\n" << ReadFile(err_path);
    EXPECT_LT(t.teardown_s, limit) << t.target << " sig " << t.sig << " after " << t.delay_ms << " ms";
    EXPECT_FALSE(WIFEXITED(t.exit_status) && WEXITSTATUS(t.exit_status) == 0)
        << t.target << " after " << t.delay_ms << " ms: exit 0";
    std::printf("chaos tp=%d %-9s %-7s at %3d ms: %s, all gone in %.3f s%s\n", t.tp,
                t.target.c_str(), t.sig == SIGKILL ? "SIGKILL" : "SIGSTOP", t.delay_ms,
                WIFEXITED(t.exit_status) ? absl::StrCat("exit ", WEXITSTATUS(t.exit_status)).c_str()
                                         : absl::StrCat("signal ", WTERMSIG(t.exit_status)).c_str(),
                t.teardown_s, t.left.c_str());
    ::unlink(err_path.c_str());
  }
  std::vector<double> times;
  for (const Trial& t : trials) {
    if (t.teardown_s >= 0) times.push_back(t.teardown_s);
  }
  std::sort(times.begin(), times.end());
  if (!times.empty()) {
    std::printf("chaos: seed %u, %zu/%zu trials clean, teardown median %.3f s, max %.3f s\n", seed,
                times.size(), trials.size(), times[times.size() / 2], times.back());
  }
}

}  // namespace
}  // namespace symtp

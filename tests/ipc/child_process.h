// Child processes for the multi-process ipc tests.
//
// ChildProcess::Spawn(body) forks; the child runs body() and _exit()s with its
// return value, so it never returns into GoogleTest (and runs no atexit
// handlers or static destructors of the parent's state). The child asks the
// kernel to SIGKILL it when the test process dies (PR_SET_PDEATHSIG), so a test
// killed by its CTest timeout leaves no orphans. Destroying a ChildProcess that
// has not been reaped SIGCONTs, SIGKILLs and reaps it.
//
// Children must not use gtest assertions; they report through their exit code
// and shared memory.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace symtp::ipc::testing {

inline std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")");
  }
  return absl::StrCat("wait status ", status);
}

// The kernel's view of a live process's signals, for a test that waited for
// one to kill it: its state and its pending, blocked and caught masks, and the
// same per thread (a sanitizer runtime may add threads and block signals in
// them).
inline std::string DescribeSignalState(pid_t pid) {
  auto fields = [](const std::string& path) {
    std::string out;
    FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return absl::StrCat(path, ": ", strerror(errno));
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      std::string l(line);
      if (!l.empty() && l.back() == '\n') l.pop_back();
      for (char& ch : l) ch = ch == '\t' ? ' ' : ch;
      for (const char* key : {"State:", "SigPnd:", "ShdPnd:", "SigBlk:", "SigCgt:"}) {
        if (l.rfind(key, 0) == 0) absl::StrAppend(&out, out.empty() ? "" : " ", l);
      }
    }
    std::fclose(f);
    return out;
  };
  std::string out = fields(absl::StrCat("/proc/", pid, "/status"));
  const std::string task_dir = absl::StrCat("/proc/", pid, "/task");
  if (DIR* d = ::opendir(task_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      absl::StrAppend(&out, "; thread ", e->d_name, ": ",
                      fields(absl::StrCat(task_dir, "/", e->d_name, "/status")));
    }
    ::closedir(d);
  }
  return out;
}

// Blocks until a signal kills the process. Sleeps in short naps rather than
// pause(): ThreadSanitizer delivers signals to handlers at its own interception
// points, and a signal that arrives just before pause() would leave the child
// blocked with the handler never run.
[[noreturn]] inline void SleepForever() {
  while (true) ::usleep(10'000);
}

class ChildProcess {
 public:
  static absl::StatusOr<ChildProcess> Spawn(std::function<int()> body) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(97);  // the parent died before prctl
      int rc = 98;
      try {
        rc = body();
      } catch (...) {
        rc = 99;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    return ChildProcess(pid);
  }

  ChildProcess(ChildProcess&& o) noexcept : pid_(std::exchange(o.pid_, -1)), status_(o.status_) {}
  ChildProcess& operator=(ChildProcess&& o) noexcept {
    if (this != &o) {
      KillAndReap();
      pid_ = std::exchange(o.pid_, -1);
      status_ = o.status_;
    }
    return *this;
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { KillAndReap(); }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  int status() const { return status_; }

  bool Signal(int sig) const { return pid_ > 0 && ::kill(pid_, sig) == 0; }

  // Waits for the child to exit until `deadline`; returns its wait status.
  // DeadlineExceeded (the child keeps running) if it does not exit in time.
  absl::StatusOr<int> Wait(Deadline deadline) {
    if (pid_ <= 0) return status_;
    while (true) {
      absl::StatusOr<bool> done = TryReap();
      if (!done.ok()) return done.status();
      if (*done) return status_;
      if (deadline.Expired()) {
        return absl::DeadlineExceededError(
            absl::StrCat("child ", pid_, " still running (", DescribeSignalState(pid_), ")"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Non-blocking: true once the child has exited (and is reaped).
  absl::StatusOr<bool> TryReap() {
    if (pid_ <= 0) return true;
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) return false;
      return absl::InternalError(absl::StrCat("waitpid(", pid_, "): ", strerror(errno)));
    }
    status_ = st;
    pid_ = -1;
    return true;
  }

  // Stops the child for good: SIGCONT (a stopped child must run to die
  // promptly), SIGKILL, reap.
  void KillAndReap() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    status_ = st;
    pid_ = -1;
  }

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  int status_ = 0;
};

// A one-shot "I am ready" signal from a child to the parent over a pipe.
// Create it before forking.
class ReadyPipe {
 public:
  ReadyPipe() {
    if (::pipe2(fds_, O_CLOEXEC) != 0) fds_[0] = fds_[1] = -1;
  }
  ~ReadyPipe() {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  ReadyPipe(const ReadyPipe&) = delete;
  ReadyPipe& operator=(const ReadyPipe&) = delete;

  bool ok() const { return fds_[0] >= 0; }

  // Child side.
  void Notify(char c = 'r') const {
    ssize_t n = ::write(fds_[1], &c, 1);
    (void)n;
  }

  // Parent side: waits for one byte (one Notify()) until the deadline.
  absl::Status Wait(Deadline deadline) const {
    while (true) {
      pollfd p{fds_[0], POLLIN, 0};
      int timeout_ms = static_cast<int>(deadline.RemainingNs() / 1'000'000) + 1;
      int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
      if (r == 0) {
        if (deadline.Expired()) return absl::DeadlineExceededError("child never became ready");
        continue;
      }
      char c;
      ssize_t n = ::read(fds_[0], &c, 1);
      if (n == 1) return absl::OkStatus();
      if (n < 0 && errno == EINTR) continue;
      return absl::InternalError("ready pipe closed");
    }
  }

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace symtp::ipc::testing

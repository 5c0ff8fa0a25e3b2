// Runs a function in a child process that sees a private, small tmpfs on
// /dev/shm (a user + mount namespace: no privileges needed where the kernel
// allows unprivileged user namespaces). For tests of a full /dev/shm.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace symtp::testing {

// Exit code of the child when the namespace or the mount cannot be made.
inline constexpr int kNoPrivateTmpfs = 77;

namespace internal {
inline bool WriteProcFile(const char* path, const std::string& text) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}
}  // namespace internal

// Forks; the child unshares a user and mount namespace, mounts a tmpfs of
// `size` (mount's syntax: "4k", "8m") on /dev/shm and returns body()'s value
// as its exit code (kNoPrivateTmpfs, with the reason on stderr, when it
// cannot set that up). Returns the child's wait status; *why gets the
// reason for kNoPrivateTmpfs. Call from a single-threaded process (the
// child must be to unshare a user namespace; fork makes it so).
inline int RunWithPrivateDevShm(const std::string& size, const std::function<int()>& body,
                                std::string* why) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return -1;
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    auto fail = [&](const char* what) {
      std::string msg = std::string(what) + ": " + std::strerror(errno);
      (void)!::write(pipefd[1], msg.data(), msg.size());
      _exit(kNoPrivateTmpfs);
    };
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) fail("unshare(CLONE_NEWUSER|CLONE_NEWNS)");
    if (!internal::WriteProcFile("/proc/self/setgroups", "deny")) fail("writing setgroups");
    if (!internal::WriteProcFile("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1")) {
      fail("writing uid_map");
    }
    if (!internal::WriteProcFile("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
      fail("writing gid_map");
    }
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail("mount --make-rprivate /");
    const std::string opts = "size=" + size + ",mode=1777";
    if (::mount("none", "/dev/shm", "tmpfs", 0, opts.c_str()) != 0) fail("mount tmpfs on /dev/shm");
    ::close(pipefd[1]);
    _exit(body());
  }
  ::close(pipefd[1]);
  char buf[256];
  ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
  ::close(pipefd[0]);
  if (why != nullptr && n > 0) why->assign(buf, n);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

}  // namespace symtp::testing

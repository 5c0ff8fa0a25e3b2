// Reading /proc and /dev/shm in process tests: a whole file, a job's leftover
// segments and processes, the children of a process by command line.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace symtp::testing {

// The file's contents ("" if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// /dev/shm entries whose name starts with `prefix` (leftover segments).
inline std::vector<std::string> ShmWithPrefix(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

// Direct children of `parent` whose command line contains `needle`
// (" worker ", " scheduler ").
inline std::vector<pid_t> ChildrenMatching(pid_t parent, const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    int pid;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    const auto rp = stat.rfind(')');
    if (rp == std::string::npos || rp + 2 >= stat.size()) continue;
    std::vector<std::string> f = absl::StrSplit(stat.substr(rp + 2), ' ');
    int ppid;
    if (f.size() < 2 || !absl::SimpleAtoi(f[1], &ppid) || ppid != parent) continue;
    std::string cmd = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos) out.push_back(pid);
  }
  return out;
}

// The state letter of /proc/<pid>/stat ('\0' when the process is gone).
inline char ProcState(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const auto rp = stat.rfind(')');
  return rp == std::string::npos || rp + 2 >= stat.size() ? '\0' : stat[rp + 2];
}

// Live (not zombie) processes other than this one whose environment carries
// SYMTP_SHM_PREFIX=`prefix`: every process of a test's job (launcher, guard,
// scheduler, workers), wherever they were reparented.
inline std::vector<pid_t> JobProcesses(const std::string& prefix) {
  std::vector<pid_t> out;
  const std::string needle = "SYMTP_SHM_PREFIX=" + prefix;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    int pid;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid) || pid == getpid()) continue;
    const std::string env = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    bool match = false;
    for (absl::string_view v : absl::StrSplit(env, '\0')) match |= v == needle;
    const char st = ProcState(pid);
    if (match && st != '\0' && st != 'Z' && st != 'X') out.push_back(pid);
  }
  return out;
}

}  // namespace symtp::testing

// symtp_shm: inspect and clean symtp shared-memory segments in /dev/shm.
//
//   symtp_shm list  [--prefix P]          name, creator pid, alive/dead, size, age
//   symtp_shm clean [--prefix P] [--all]  remove segments whose creator is dead
//                                         (--all: every segment under the prefix)
//
// The prefix defaults to $SYMTP_SHM_PREFIX (or "symtp") followed by "_".
// Exit codes: 0 success, 1 an operation failed, 2 usage error.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/env.h"
#include "ipc/shm_segment.h"

ABSL_FLAG(std::string, prefix, symtp::env::ShmPrefix() + "_",
          "name prefix ($SYMTP_SHM_PREFIX or 'symtp', plus '_')");
ABSL_FLAG(bool, all, false, "clean: every segment under the prefix");

namespace {

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: symtp_shm list  [--prefix P]\n"
               "       symtp_shm clean [--prefix P] [--all]\n"
               "\n"
               "  list   every segment under the prefix: name, creator pid, creator state,\n"
               "         size and age\n"
               "  clean  remove the segments whose creator is dead; with --all, every\n"
               "         segment under the prefix (including live jobs' and unreadable ones)\n"
               "\n"
               "  --prefix P  name prefix (default: $SYMTP_SHM_PREFIX or 'symtp', plus '_')\n"
               "exit codes: 0 ok, 1 an operation failed, 2 usage error\n");
}

std::string HumanBytes(size_t b) {
  if (b >= (size_t{1} << 30)) return absl::StrFormat("%.1f GiB", b / double(size_t{1} << 30));
  if (b >= (size_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(size_t{1} << 20));
  if (b >= (size_t{1} << 10)) return absl::StrFormat("%.1f KiB", b / double(size_t{1} << 10));
  return absl::StrFormat("%u B", b);
}

std::string HumanAge(int64_t created_unix_ns) {
  if (created_unix_ns <= 0) return "?";
  double s = (symtp::WallClockNs() - created_unix_ns) / 1e9;
  if (s < 0) s = 0;
  if (s < 120) return absl::StrFormat("%.0fs", s);
  if (s < 7200) return absl::StrFormat("%.0fm", s / 60);
  if (s < 172800) return absl::StrFormat("%.1fh", s / 3600);
  return absl::StrFormat("%.1fd", s / 86400);
}

int Failed(const absl::Status& s) {
  std::fprintf(stderr, "symtp_shm: %s\n", s.ToString().c_str());
  return kFailed;
}

int List(const std::string& prefix) {
  auto infos = symtp::ipc::ListSegments(prefix);
  if (!infos.ok()) return Failed(infos.status());
  std::printf("%-44s %8s %-8s %10s %6s\n", "NAME", "PID", "CREATOR", "SIZE", "AGE");
  for (const auto& s : *infos) {
    std::string state = s.header_valid ? symtp::ipc::ProcStateName(s.creator_state) : "unknown";
    std::printf("%-44s %8d %-8s %10s %6s%s%s\n", s.name.c_str(), static_cast<int>(s.creator_pid),
                state.c_str(), HumanBytes(s.bytes).c_str(), HumanAge(s.created_unix_ns).c_str(),
                s.problem.empty() ? "" : "  ", s.problem.c_str());
  }
  if (infos->empty()) std::printf("(no segments under '%s')\n", prefix.c_str());
  return kOk;
}

int Clean(const std::string& prefix, bool all) {
  if (!all) {
    auto removed = symtp::ipc::RemoveStaleSegments(prefix);
    if (!removed.ok()) return Failed(removed.status());
    for (const auto& n : *removed) std::printf("removed %s\n", n.c_str());
    std::printf("%zu stale segment(s) removed\n", removed->size());
    return kOk;
  }
  auto infos = symtp::ipc::ListSegments(prefix);
  if (!infos.ok()) return Failed(infos.status());
  int rc = kOk;
  size_t n = 0;
  for (const auto& s : *infos) {
    absl::Status st = symtp::ipc::RemoveSegmentByName(s.name);
    if (st.ok() || st.code() == absl::StatusCode::kNotFound) {
      if (st.ok()) ++n;
      std::printf("removed %s%s\n", s.name.c_str(),
                  s.creator_alive ? " (its creator was still alive)" : "");
    } else {
      rc = Failed(st);
    }
  }
  std::printf("%zu segment(s) removed\n", n);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string first = argc < 2 ? "" : argv[1];
  if (first == "-h" || first == "--help" || first == "help") {
    Usage(stdout);
    return kOk;
  }
  // absl exits with 1 on a flag it does not know; here that is a usage error.
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--") && !absl::FindCommandLineFlag(a.substr(0, a.find('=')))) {
      std::fprintf(stderr, "symtp_shm: unexpected argument '%s'\n", argv[i]);
      Usage(stderr);
      return kUsage;
    }
  }
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  if (prefix.empty() || prefix.find('/') != std::string::npos) {
    std::fprintf(stderr, "symtp_shm: invalid prefix '%s'\n", prefix.c_str());
    return kUsage;
  }
  const std::string cmd = args.size() == 2 ? args[1] : "";  // the one positional argument
  if (cmd == "list" && !absl::GetFlag(FLAGS_all)) return List(prefix);
  if (cmd == "clean") return Clean(prefix, absl::GetFlag(FLAGS_all));
  std::fprintf(stderr, "symtp_shm: expected 'list' or 'clean' and flags, got '%s'\n",
               absl::StrJoin(argv + 1, argv + argc, " ").c_str());
  Usage(stderr);
  return kUsage;
}

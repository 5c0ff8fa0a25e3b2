// symtp: one executable, three roles.
//   symtp launch [flags]     start a job (what tools/launch.sh runs)
//   symtp scheduler [flags]  (spawned by the launcher) the v1 scheduler process
//   symtp worker [flags]     (spawned by the launcher) one tensor-parallel rank
//   symtp --version          the commit, build type, CUDA and NCCL versions
// main() is the only place that decides how the process ends.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "runtime/launcher.h"
#include "runtime/options.h"
#include "runtime/scheduler_process.h"
#include "runtime/worker_process.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "--version" || args[0] == "version")) {
    std::printf("%s", symtp::VersionText().c_str());
    return 0;
  }
  std::string role = "launch";
  if (!args.empty() && args[0].rfind("--", 0) != 0) {
    role = args[0];
    args.erase(args.begin());
  }
  if (role != "launch" && role != "scheduler" && role != "worker") {
    std::fprintf(stderr, "symtp: unknown role '%s' (launch, scheduler, worker)\n", role.c_str());
    return 2;
  }
  symtp::runtime::JobOptions opts;
  symtp::runtime::ProcArgs proc;
  absl::Status s = symtp::runtime::ParseArgs(args, &opts, &proc);
  if (absl::IsNotFound(s)) {  // --help
    std::printf("usage: symtp [launch|scheduler|worker] [flags]\n%s", std::string(s.message()).c_str());
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "symtp: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (role == "launch") {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
      std::fprintf(stderr, "symtp: cannot resolve /proc/self/exe\n");
      return 1;
    }
    exe[n] = '\0';
    return symtp::runtime::RunLauncher(opts, exe);
  }
  if (proc.job.empty()) {
    std::fprintf(stderr, "symtp: %s needs --job (it is started by `symtp launch`)\n", role.c_str());
    return 2;
  }
  if (role == "scheduler") return symtp::runtime::RunSchedulerProcess(opts, proc);
  return symtp::runtime::RunWorkerProcess(opts, proc);
}

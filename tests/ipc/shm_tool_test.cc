// Runs the symtp_shm CLI (tools/shmctl) against segments made by the test.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "ipc/shm_segment.h"
#include "tests/ipc/ipc_test_util.h"

namespace symtp::ipc {
namespace {

using ::symtp::ipc::testing::IpcTest;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

struct ToolResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

ToolResult RunTool(const std::string& args) {
  ToolResult r;
  std::string cmd = std::string(SYMTP_SHM_TOOL) + " " + args + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) r.output.append(buf, n);
  int st = ::pclose(f);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

bool ShmExists(const std::string& name) {
  struct stat st;
  return ::stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

using ShmToolTest = IpcTest;

TEST_F(ShmToolTest, ListShowsCreatorStateAndCleanRemovesOnlyStale) {
  const std::string live = SegName("live");
  const std::string stale = SegName("stale");
  ASSERT_OK_AND_ASSIGN(ShmSegment mine, ShmSegment::Create(live, 1 << 20));
  testing::ChildProcess* child = Spawn([stale] {
    auto seg = ShmSegment::Create(stale, 4096);
    if (!seg.ok()) return 1;
    ::_exit(0);  // leaves the segment behind
  });
  ASSERT_NE(child, nullptr);
  ASSERT_OK(child->Wait(Deadline::AfterMs(10'000)));

  ToolResult list = RunTool("list --prefix " + prefix_);
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_THAT(list.output,
              AllOf(HasSubstr(live), HasSubstr(stale), HasSubstr("alive"), HasSubstr("dead"),
                    HasSubstr(std::to_string(::getpid())), HasSubstr("1.0 MiB")));

  ToolResult clean = RunTool("clean --prefix " + prefix_);
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
  EXPECT_THAT(clean.output, AllOf(HasSubstr("removed " + stale), Not(HasSubstr(live))));
  EXPECT_FALSE(ShmExists(stale));
  EXPECT_TRUE(ShmExists(live));

  ToolResult all = RunTool("clean --all --prefix=" + prefix_);
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_THAT(all.output, HasSubstr("removed " + live + " (its creator was still alive)"));
  EXPECT_FALSE(ShmExists(live));
  EXPECT_OK(mine.Remove());  // already gone: idempotent
}

TEST_F(ShmToolTest, UsageErrorsExitWithTwo) {
  EXPECT_EQ(RunTool("").exit_code, 2);
  EXPECT_EQ(RunTool("frobnicate").exit_code, 2);
  EXPECT_EQ(RunTool("list --bogus").exit_code, 2);
  EXPECT_EQ(RunTool("list --all").exit_code, 2);  // --all belongs to clean
  EXPECT_EQ(RunTool("list --prefix a/b").exit_code, 2);
  EXPECT_EQ(RunTool("--help").exit_code, 0);
}

}  // namespace
}  // namespace symtp::ipc

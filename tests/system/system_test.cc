// End-to-end tests of the v1 control plane: the launcher, the scheduler and
// TP worker processes on the CPU backend, checked against a single-process
// reference; and the fault paths (a worker killed or stopped mid-run,
// SIGINT to the launcher, bad flags).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "models/batch.h"
#include "models/config.h"
#include "models/cpu_model.h"
#include "models/sampling.h"
#include "tests/testing/private_tmpfs.h"
#include "tests/testing/procfs.h"
#include "tests/testing/unique_name.h"

namespace symtp {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

struct Proc {
  pid_t pid = -1;
  std::string err_path;
};

// Starts `symtp args...` with stderr to a file and a unique shm prefix.
Proc Start(const std::vector<std::string>& args, const std::string& prefix) {
  Proc p;
  p.err_path = fs::temp_directory_path() / (prefix + ".stderr");
  p.pid = fork();
  if (p.pid == 0) {
    int fd = ::open(p.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    dup2(fd, 1);
    setenv("SYMTP_SHM_PREFIX", prefix.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(SYMTP_BIN));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(SYMTP_BIN, argv.data());
    _exit(127);
  }
  return p;
}

// Waits up to `timeout_ms`; kills and fails on timeout. Returns the wait status.
int Wait(const Proc& p, int64_t timeout_ms) {
  Deadline d = Deadline::AfterMs(timeout_ms);
  int st = 0;
  while (waitpid(p.pid, &st, WNOHANG) == 0) {
    if (d.Expired()) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &st, 0);
      ADD_FAILURE() << "symtp did not finish within " << timeout_ms << " ms";
      return -1;
    }
    usleep(2000);
  }
  return st;
}

using testing::ChildrenMatching;
using testing::ReadFile;
using testing::ShmWithPrefix;

bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  auto rp = stat.rfind(')');
  return rp != std::string::npos && stat[rp + 2] != 'Z';
}

// id -> tokens from a tokens.jsonl / prompts.jsonl file.
std::map<uint64_t, std::vector<int32_t>> ReadTokenFile(const std::string& path) {
  std::map<uint64_t, std::vector<int32_t>> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    auto id_pos = line.find("\"id\":");
    auto tok_pos = line.find("\"tokens\":[");
    if (id_pos == std::string::npos || tok_pos == std::string::npos) continue;
    uint64_t id = std::stoull(line.substr(id_pos + 5));
    std::string list = line.substr(tok_pos + 10, line.find(']', tok_pos) - tok_pos - 10);
    std::vector<int32_t> toks;
    for (absl::string_view t : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      int v;
      if (absl::SimpleAtoi(t, &v)) toks.push_back(v);
    }
    out[id] = toks;
  }
  return out;
}
std::map<uint64_t, std::vector<int32_t>> ReadTokens(const std::string& dir) {
  return ReadTokenFile(dir + "/tokens.jsonl");
}

class SystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = testing::UniqueName("symtpst");
    out_ = fs::temp_directory_path() / prefix_;
  }
  void TearDown() override {
    for (const auto& s : ShmWithPrefix(prefix_)) ::unlink(s.c_str());
    std::error_code ec;
    fs::remove_all(out_, ec);
  }
  std::string Out(const std::string& sub) { return (out_ / sub).string(); }
  std::string prefix_;
  fs::path out_;
};

// The workload flags shared by the token-equality runs.
std::vector<std::string> Workload(const std::string& out, int tp, const std::string& extra = "") {
  std::vector<std::string> a = {"launch", "--backend=cpu", absl::StrCat("--tp=", tp),
                                "--model=tiny", "--num-requests=10", "--prompt-len=uniform:3:40",
                                "--output-len=uniform:2:24", "--max-batch=4",
                                "--max-batched-tokens=64", "--prefill-chunk=16",
                                "--progress=false", absl::StrCat("--out=", out)};
  for (absl::string_view e : absl::StrSplit(extra, ' ', absl::SkipEmpty())) a.emplace_back(e);
  return a;
}

TEST_F(SystemTest, TensorParallelTokensMatchTp1Greedy) {
  std::map<int, std::map<uint64_t, std::vector<int32_t>>> tokens;
  for (int tp : {1, 2, 4, 8}) {
    Proc p = Start(Workload(Out(absl::StrCat("tp", tp)), tp), prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(p.err_path);
    tokens[tp] = ReadTokens(Out(absl::StrCat("tp", tp)));
    ASSERT_EQ(tokens[tp].size(), 10u);
  }
  for (const auto& [id, t] : tokens[1]) EXPECT_FALSE(t.empty()) << "request " << id;
  EXPECT_EQ(tokens[2], tokens[1]);
  EXPECT_EQ(tokens[4], tokens[1]);
  EXPECT_EQ(tokens[8], tokens[1]);  // tiny's 2 kv heads replicated over 8 ranks
  EXPECT_TRUE(ShmWithPrefix(prefix_).empty());
}

TEST_F(SystemTest, TensorParallelTokensMatchTp1Sampled) {
  const std::string s = "--temperature=0.9 --top-k=40 --top-p=0.95 --seed=7";
  std::map<int, std::map<uint64_t, std::vector<int32_t>>> tokens;
  for (int tp : {1, 2, 4, 8}) {
    Proc p = Start(Workload(Out(absl::StrCat("tp", tp)), tp, s), prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(p.err_path);
    tokens[tp] = ReadTokens(Out(absl::StrCat("tp", tp)));
  }
  ASSERT_EQ(tokens[1].size(), 10u);
  EXPECT_EQ(tokens[2], tokens[1]);
  EXPECT_EQ(tokens[4], tokens[1]);
  EXPECT_EQ(tokens[8], tokens[1]);
}

// Pipelined workers (step t+1 launched before step t's tokens are known)
// under KV pressure (preemption by recompute), end-of-sequence stops and
// sampling, at several planning depths: the tokens of the one-step-at-a-time
// single-rank run. The summary proves preemptions and EOS stops happened.
TEST_F(SystemTest, PipelinedWorkersUnderPreemptionAndEosMatchUnpipelinedTp1) {
  const std::string w =
      "--num-requests=24 --max-batch=12 --num-kv-blocks=16 --temperature=0.8 --seed=11 "
      "--eos-id=5";
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"ref", "--pipeline=false --max-inflight=1"},
      {"tp2_d2", "--max-inflight=2"},
      {"tp4_d3", "--max-inflight=3"},
      {"tp2_d1", "--max-inflight=1"}};
  for (const auto& [name, flags] : runs) {
    const int tp = name == "ref" ? 1 : name[2] - '0';
    Proc p = Start(Workload(Out(name), tp, absl::StrCat(w, " ", flags)), prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << name << ": " << ReadFile(p.err_path);
  }
  const auto ref = ReadTokens(Out("ref"));
  ASSERT_EQ(ref.size(), 24u);
  for (const auto& [name, flags] : runs) EXPECT_EQ(ReadTokens(Out(name)), ref) << name;
  const std::string summary = ReadFile(Out("tp2_d2") + "/summary.json");
  EXPECT_THAT(summary, ::testing::Not(::testing::HasSubstr("\"preemptions\":0")));
}

// Workers size their KV caches from --kv-cache-mib and report them; the
// scheduler plans with the smallest report. tiny at TP=2 keeps 8 KiB per
// block on a rank (2 layers x K,V x 16 positions x 1 kv head x 32 x fp32),
// so 0.0625 MiB is 8 blocks: the same tokens as --num-kv-blocks=8, under
// preemption; a budget below one sequence is a clear error, in v1 and v0.
TEST_F(SystemTest, WorkerSizedKvCacheMatchesTheSameBlockCountGivenByFlag) {
  const std::string w = "--num-requests=24 --max-batch=12 --temperature=0.8 --seed=11";
  for (const char* run : {"mib", "blocks"}) {
    const std::string sizing = std::string(run) == "mib" ? "--kv-cache-mib=0.0625" : "--num-kv-blocks=8";
    Proc p = Start(Workload(Out(run), 2, absl::StrCat(w, " ", sizing)), prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << run << ": " << ReadFile(p.err_path);
    if (std::string(run) == "mib") {
      EXPECT_THAT(ReadFile(p.err_path),
                  ::testing::HasSubstr("KV cache: 8 blocks (the smallest the workers allocated)"));
    }
  }
  const auto want = ReadTokens(Out("blocks"));
  ASSERT_EQ(want.size(), 24u);
  EXPECT_EQ(ReadTokens(Out("mib")), want);
  EXPECT_THAT(ReadFile(Out("mib") + "/summary.json"),
              ::testing::Not(::testing::HasSubstr("\"preemptions\":0")));

  for (const char* mode : {"v1", "v0"}) {
    Proc p = Start(Workload(Out(absl::StrCat("tiny_", mode)), 2,
                            absl::StrCat("--kv-cache-mib=0.01 --mode=", mode)),
                   prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st)) << mode;
    EXPECT_NE(WEXITSTATUS(st), 0) << mode;
    EXPECT_THAT(ReadFile(p.err_path), ::testing::HasSubstr("cannot hold one sequence")) << mode;
  }
  EXPECT_TRUE(ShmWithPrefix(prefix_).empty());
}

// Every job ends with a results block on stdout (v1: the scheduler, v0:
// rank 0), writes one requests.jsonl line per request and a summary.json with
// the build's commit and the flags as an object.
TEST_F(SystemTest, JobPrintsAResultsBlockAndWritesPerRequestTimes) {
  for (const char* mode : {"v1", "v0"}) {
    Proc p = Start(Workload(Out(mode), 2, absl::StrCat("--mode=", mode)), prefix_);
    int st = Wait(p, 60'000);
    const std::string out = ReadFile(p.err_path);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
    EXPECT_THAT(out, HasSubstr("Successful requests:                     10 of 10\n")) << mode;
    EXPECT_THAT(out, HasSubstr("Mean TTFT (ms):")) << mode;
    EXPECT_THAT(out, HasSubstr("Output token throughput (tok/s):")) << mode;
    EXPECT_THAT(out, HasSubstr("Start-up, not measured (s):")) << mode;
    EXPECT_THAT(out, HasSubstr("n/a (cpu backend)")) << mode;
    // Log lines name files relative to the source root.
    EXPECT_THAT(out, HasSubstr(" runtime/launcher.cc:")) << mode;
    EXPECT_THAT(out, Not(HasSubstr("/runtime/launcher.cc:"))) << mode;

    std::ifstream f(Out(mode) + "/requests.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(f, line)) {
      ++lines;
      EXPECT_THAT(line, ::testing::MatchesRegex(
                            "\\{\"id\":[0-9]+,\"arrival_s\":[0-9.]+,\"first_token_s\":[0-9.]+,"
                            "\"finish_s\":[0-9.]+,\"input_tokens\":[0-9]+,\"output_tokens\":[0-9]+\\}"))
          << mode;
    }
    EXPECT_EQ(lines, 10) << mode;
    const std::string summary = ReadFile(Out(mode) + "/summary.json");
    EXPECT_THAT(summary, HasSubstr("\"commit\": \"")) << mode;
    EXPECT_THAT(summary, HasSubstr(absl::StrCat("\"mode\": \"", mode, "\""))) << mode;
    EXPECT_THAT(summary, HasSubstr("\"flags\": {\"allreduce\":\"auto\"")) << mode;
    EXPECT_THAT(summary, HasSubstr("\"device_forward_us\": null")) << mode;
  }
}

// An open-loop request's arrival is its Poisson time, whenever the scheduler's
// loop gets to admit it, so TTFT counts the wait: v1 (whose loop waits on a
// step's results) and v0 (whose rank 0 runs the whole step) record the same
// arrivals for the same seed, in order, with arrivals during steps at the
// rate used here.
TEST_F(SystemTest, OpenLoopArrivalsAreThePoissonTimesInBothModes) {
  // v1 planning late (as by default; no lead, so that the CPU backend's
  // short steps leave time to wait) and at once: the same arrivals and
  // tokens; only the first held steps back (paced_steps).
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"v1", "--mode=v1 --late-publish=false"}, {"v0", "--mode=v0"},
      {"v1_late", "--mode=v1 --publish-lead-us=0"}};
  std::map<std::string, std::vector<std::string>> arrivals;
  for (const auto& [mode, flags] : runs) {
    const std::string out = Out(absl::StrCat("poisson_", mode));
    // Arrivals over the whole run, between and during short decode steps.
    std::vector<std::string> args = {"launch", "--backend=cpu", "--tp=2", "--model=tiny",
                                     "--num-requests=30", "--arrival-rate=30",
                                     "--prompt-len=uniform:8:32", "--output-len=uniform:8:16",
                                     "--max-batch=8", "--seed=5", "--progress=false",
                                     absl::StrCat("--out=", out)};
    for (absl::string_view f : absl::StrSplit(flags, ' ')) args.emplace_back(f);
    Proc p = Start(args, prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(p.err_path);
    std::ifstream f(out + "/requests.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      const size_t at = line.find("\"arrival_s\":");
      ASSERT_NE(at, std::string::npos) << line;
      arrivals[mode].push_back(line.substr(at + 12, line.find(',', at) - at - 12));
    }
    ASSERT_EQ(arrivals[mode].size(), 30u) << mode;
    for (size_t i = 1; i < arrivals[mode].size(); ++i) {
      double a = 0, b = 0;
      ASSERT_TRUE(absl::SimpleAtod(arrivals[mode][i - 1], &a) && absl::SimpleAtod(arrivals[mode][i], &b));
      EXPECT_LE(a, b) << mode << " request " << i;
    }
  }
  EXPECT_EQ(arrivals["v1"], arrivals["v0"]);
  EXPECT_EQ(arrivals["v1_late"], arrivals["v1"]);
  EXPECT_EQ(ReadTokens(Out("poisson_v1_late")), ReadTokens(Out("poisson_v1")));
  EXPECT_THAT(ReadFile(Out("poisson_v1") + "/summary.json"), ::testing::HasSubstr("\"paced_steps\":0"));
  EXPECT_THAT(ReadFile(Out("poisson_v1_late") + "/summary.json"),
              ::testing::Not(::testing::HasSubstr("\"paced_steps\":0")));
}

// Steady decode holds the batch for the steps asked for, also where the
// decodes of the prompts already prefilled take a large share of the token
// budget (here up to 31 of 64 tokens a step) and so slow the prefill.
TEST_F(SystemTest, SteadyDecodeMeasuresTheStepsAskedForWhenDecodesShareTheBudget) {
  for (const char* mode : {"v1", "v0"}) {
    const std::string out = Out(absl::StrCat("steady_", mode));
    Proc p = Start({"launch", "--backend=cpu", "--tp=1", "--model=tiny", "--steady-batch=32",
                    "--max-batch=32", "--steady-context=64", "--steady-steps=20",
                    "--warmup-steps=2", "--max-batched-tokens=64", "--prefill-chunk=64",
                    absl::StrCat("--mode=", mode), "--progress=false",
                    absl::StrCat("--out=", out)},
                   prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(p.err_path);
    const std::string summary = ReadFile(out + "/summary.json");
    int measured = -1;
    const size_t at = summary.find("\"measured\": ");
    ASSERT_NE(at, std::string::npos) << summary;
    ASSERT_TRUE(absl::SimpleAtoi(
        summary.substr(at + 12, summary.find_first_of(",\n}", at + 12) - at - 12), &measured))
        << summary;
    EXPECT_GE(measured, 20) << mode;
  }
}

TEST_F(SystemTest, VersionNamesTheCommitAndTheBuild) {
  Proc p = Start({"--version"}, prefix_);
  int st = Wait(p, 10'000);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const std::string out = ReadFile(p.err_path);
  EXPECT_THAT(out, ::testing::ContainsRegex("commit: [0-9a-f]{7,}|commit: unknown"));
  EXPECT_THAT(out, HasSubstr("build type: "));
  EXPECT_THAT(out, ::testing::ContainsRegex("CUDA: ([0-9]+\\.[0-9]+|none)"));
  EXPECT_THAT(out, ::testing::ContainsRegex("NCCL: ([0-9]+\\.[0-9]+|none)"));
}

TEST_F(SystemTest, V0ModeProducesTheSameTokensAsV1) {
  for (const char* mode : {"v1", "v0"}) {
    Proc p = Start(Workload(Out(mode), 2, absl::StrCat("--mode=", mode, " --temperature=0.7 --seed=3")), prefix_);
    int st = Wait(p, 60'000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(p.err_path);
  }
  auto v1 = ReadTokens(Out("v1"));
  ASSERT_EQ(v1.size(), 10u);
  EXPECT_EQ(ReadTokens(Out("v0")), v1);
}

TEST_F(SystemTest, MatchesSingleProcessReference) {
  // The reference is a plain prefill + decode loop over one CpuModel at TP=1,
  // fed the prompts the runner logged in prompts.jsonl.
  Proc p = Start({"launch", "--backend=cpu", "--tp=2", "--model=tiny", "--num-requests=3",
                  "--prompt-len=12", "--output-len=10", "--max-batch=1", "--progress=false",
                  absl::StrCat("--out=", Out("run"))},
                 prefix_);
  int st = Wait(p, 60'000);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(p.err_path);
  auto got = ReadTokens(Out("run"));
  std::map<uint64_t, std::vector<int32_t>> prompts = ReadTokenFile(Out("run") + "/prompts.jsonl");
  ASSERT_EQ(prompts.size(), 3u);

  auto cfg = model::PresetConfig("tiny");
  ASSERT_TRUE(cfg.ok());
  for (const auto& [id, prompt] : prompts) {
    auto m = model::CpuModel::Create(*cfg, 0, 1, 8, nullptr);
    ASSERT_TRUE(m.ok()) << m.status();
    std::vector<int32_t> seq = prompt, out;
    std::vector<float> logits;
    int computed = 0;
    while (out.size() < 10) {
      model::BatchInput in;
      in.seq_start = {0};
      for (int p = computed; p < static_cast<int>(seq.size()); ++p) {
        in.tokens.push_back(seq[p]);
        in.positions.push_back(p);
        in.slot_mapping.push_back(p);  // blocks 0..7 in order
      }
      in.seq_start.push_back(static_cast<int32_t>(in.tokens.size()));
      in.context_len = {static_cast<int32_t>(seq.size())};
      in.max_blocks_per_seq = 8;
      in.block_tables = {0, 1, 2, 3, 4, 5, 6, 7};
      in.sample_index = {static_cast<int32_t>(in.tokens.size()) - 1};
      ASSERT_TRUE(m->Forward(in, &logits).ok());
      computed = static_cast<int>(seq.size());
      int32_t t = model::SampleToken(logits, model::SamplingParams{}, seq.size());
      out.push_back(t);
      seq.push_back(t);
    }
    EXPECT_EQ(got[id], out) << "request " << id;
  }
}

// The launcher's worker processes once `n` of them run (or what is there
// after 20 s).
std::vector<pid_t> WaitForWorkers(pid_t launcher, size_t n) {
  std::vector<pid_t> workers;
  Deadline d = Deadline::AfterMs(20'000);
  while (workers.size() < n && !d.Expired()) {
    usleep(20'000);
    workers = ChildrenMatching(launcher, " worker ");
  }
  return workers;
}

TEST_F(SystemTest, KilledWorkerEndsTheJobNamingIt) {
  Proc p = Start({"launch", "--backend=cpu", "--tp=2", "--model=tiny", "--steady-batch=4",
                  "--steady-context=32", "--steady-steps=100000", "--progress=false"},
                 prefix_);
  std::vector<pid_t> workers = WaitForWorkers(p.pid, 2);
  ASSERT_EQ(workers.size(), 2u) << ReadFile(p.err_path);
  std::vector<pid_t> all = ChildrenMatching(p.pid, "symtp");
  usleep(300'000);  // let it run a few steps
  ASSERT_EQ(kill(workers[1], SIGKILL), 0);
  int64_t t0 = MonotonicNs();
  int st = Wait(p, 10'000);
  double secs = (MonotonicNs() - t0) / 1e9;
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_LT(secs, 1.5);
  std::string err = ReadFile(p.err_path);
  EXPECT_THAT(err, HasSubstr("worker rank"));
  EXPECT_THAT(err, HasSubstr("killed by signal 9"));
  for (pid_t c : all) EXPECT_FALSE(Alive(c)) << "orphan pid " << c;
  EXPECT_TRUE(ShmWithPrefix(prefix_).empty());
}

TEST_F(SystemTest, StoppedWorkerEndsTheJobAfterTheHangTimeout) {
  Proc p = Start({"launch", "--backend=cpu", "--tp=2", "--model=tiny", "--steady-batch=4",
                  "--steady-context=32", "--steady-steps=100000", "--progress=false",
                  "--hang-timeout-ms=500"},
                 prefix_);
  std::vector<pid_t> workers = WaitForWorkers(p.pid, 2);
  ASSERT_EQ(workers.size(), 2u) << ReadFile(p.err_path);
  std::vector<pid_t> all = ChildrenMatching(p.pid, "symtp");
  usleep(300'000);
  ASSERT_EQ(kill(workers[0], SIGSTOP), 0);
  int64_t t0 = MonotonicNs();
  int st = Wait(p, 10'000);
  double secs = (MonotonicNs() - t0) / 1e9;
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_LT(secs, 0.5 + 1.0);  // within 1 s of the deadline
  std::string err = ReadFile(p.err_path);
  EXPECT_THAT(err, HasSubstr("stopped answering"));
  EXPECT_THAT(err, HasSubstr("stopped"));
  for (pid_t c : all) EXPECT_FALSE(Alive(c)) << "orphan pid " << c;
  EXPECT_TRUE(ShmWithPrefix(prefix_).empty());
}

TEST_F(SystemTest, SigintShutsDownCleanly) {
  Proc p = Start({"launch", "--backend=cpu", "--tp=2", "--model=tiny", "--steady-batch=4",
                  "--steady-context=32", "--steady-steps=100000", "--progress=false"},
                 prefix_);
  std::vector<pid_t> workers = WaitForWorkers(p.pid, 2);
  ASSERT_EQ(workers.size(), 2u);
  std::vector<pid_t> all = ChildrenMatching(p.pid, "symtp");
  kill(p.pid, SIGINT);
  int st = Wait(p, 5'000);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGINT);
  EXPECT_THAT(ReadFile(p.err_path), HasSubstr("interrupted"));
  for (pid_t c : all) EXPECT_FALSE(Alive(c)) << "orphan pid " << c;
  EXPECT_TRUE(ShmWithPrefix(prefix_).empty());
}

TEST_F(SystemTest, BadFlagsAreOneLineAndExitCode2) {
  // Each case's arguments and what its one line must say.
  for (const auto& [args, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"launch", "--tp=3"}, "--tp"},
           {{"launch", "--model=nope"}, "nope"},
           {{"launch", "--frobnicate=1"}, "frobnicate"},
           {{"launch", "--backend=cuda", "--tp=8", "--model=tiny"}, "GPU"}}) {
    Proc p = Start(args, prefix_);
    int st = Wait(p, 20'000);
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 2) << args[1];
    std::string err = ReadFile(p.err_path);
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_THAT(err, HasSubstr("symtp: "));
    EXPECT_THAT(err, HasSubstr(why)) << args[1];
  }
  EXPECT_TRUE(ShmWithPrefix(prefix_).empty());
}

}  // namespace
}  // namespace symtp

namespace symtp {
namespace {

// Issue 27's hostile values through the real binary: exit 2, one line, fast,
// nothing started (no segment).
TEST_F(SystemTest, HostileFlagsExit2QuicklyWithOneLineBeforeAnyProcess) {
  const std::string unwritable = Out("ro");
  fs::create_directories(unwritable);
  fs::permissions(unwritable, fs::perms::owner_read | fs::perms::owner_exec);
  const bool can_probe_perms = ::access(unwritable.c_str(), W_OK) != 0;  // false as root
  std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"launch", "--backend=cpu", "--temperature", "nan"}, "--temperature"},
      {{"launch", "--backend=cpu", "--top-p", "nan"}, "--top-p"},
      {{"launch", "--backend=cpu", "--arrival-rate", "nan"}, "--arrival-rate"},
      {{"launch", "--backend=cpu", "--kv-cache-mib", "nan"}, "--kv-cache-mib"},
      {{"launch", "--backend=cpu", "--prompt-len", "inf"}, "--prompt-len"},
      {{"launch", "--backend=cpu", "--prompt-len", "nan"}, "--prompt-len"},
      {{"launch", "--backend=cpu", "--prompt-len", "1e30"}, "--prompt-len"},
      {{"launch", "--backend=cpu", "--output-len", "inf"}, "--output-len"},
      {{"launch", "--backend=cpu", "--prompt-len", "3e9"}, "--prompt-len"},
      {{"launch", "--backend=cpu", "--prompt-len", "normal:nan:1"}, "--prompt-len"},
      {{"launch", "--backend=cpu", "--prompt-len", "lognormal:1000:0"}, "--prompt-len"},
      {{"launch", "--backend=cpu", "--prompt-len", "5000"}, "max_seq_len"},
      {{"launch", "--backend=cpu", "--output-len", "5000"}, "max_seq_len"},
      {{"launch", "--backend=cpu", "--steady-batch=2", "--steady-context=4096"}, "max_seq_len"},
      {{"launch", "--backend=cpu", "--tp", "2.5"}, "--tp"},
      {{"launch", "--backend=cpu", "--num-requests", "1.5"}, "--num-requests"},
      {{"launch", "--backend=cpu", "--tp", " 2"}, "whitespace"},
      {{"bogus"}, "unknown role"},
      {{"bogus", "--job=x"}, "unknown role"},
      {{"launch", "--backend=cpu", "--out", "/proc/symtp-no/such"}, "--out"},
      {{"launch", "--backend=cpu", "--trace", "/proc/symtp-no/t.json"}, "--trace"},
      {{"launch", "--backend=cpu", "--trace", out_.string()}, "--trace"},
  };
  if (can_probe_perms) {
    cases.push_back({{"launch", "--backend=cpu", "--out", unwritable + "/run"}, "--out"});
    cases.push_back({{"launch", "--backend=cpu", "--out", unwritable}, "--out"});
  }
  for (const auto& [args, why] : cases) {
    const std::string what = absl::StrJoin(args, " ");
    const int64_t t0 = MonotonicNs();
    Proc p = Start(args, prefix_);
    int st = Wait(p, 20'000);
    const double secs = (MonotonicNs() - t0) / 1e9;
    ASSERT_TRUE(WIFEXITED(st)) << what;
    EXPECT_EQ(WEXITSTATUS(st), 2) << what;
    std::string err = ReadFile(p.err_path);
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << what << ": " << err;
    EXPECT_THAT(err, HasSubstr(why)) << what;
    // About 10 ms unloaded; a loaded 2-core machine has taken over 2 s. What
    // matters (nothing started) is the exit code, the one line and no segment.
    EXPECT_LT(secs, 10.0) << what;
    EXPECT_TRUE(ShmWithPrefix(prefix_).empty()) << what;
  }
  fs::permissions(unwritable, fs::perms::owner_all);
}

// Outputs are written through a temporary file and a rename: after a run
// the files are complete and no temporary is left beside them.
TEST_F(SystemTest, OutputsAreWrittenWholeWithNoTemporaryLeft) {
  const std::string trace = Out("traces/run.json");
  std::vector<std::string> args = Workload(Out("run"), 2);
  args.push_back(absl::StrCat("--trace=", trace));
  Proc p = Start(args, prefix_);
  int st = Wait(p, 60'000);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ReadFile(p.err_path);
  EXPECT_EQ(ReadTokens(Out("run")).size(), 10u);
  std::string t = ReadFile(trace);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back() == '\n' ? t[t.size() - 2] : t.back(), '}');
  // Each step's events name its shape: the first step admits --max-batch
  // (4) of Workload()'s requests.
  EXPECT_THAT(t, HasSubstr(R"("args":{"step":0,"seqs":4,"tokens":)")) << t.substr(0, 2000);
  for (const std::string& dir : {Out("run"), Out("traces")}) {
    for (const auto& e : fs::directory_iterator(dir)) {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
      EXPECT_EQ(e.path().filename().string().find("probe"), std::string::npos) << e.path();
    }
  }
}

}  // namespace
}  // namespace symtp

namespace symtp {
namespace {

using testing::JobProcesses;

// Polls until no process and no segment of the job is left; returns the
// seconds it took, or -1 after `limit_s`.
double WaitUntilNothingLeft(const std::string& prefix, double limit_s) {
  const int64_t t0 = MonotonicNs();
  for (;;) {
    const double secs = (MonotonicNs() - t0) / 1e9;
    if (JobProcesses(prefix).empty() && ShmWithPrefix(prefix).empty()) return secs;
    if (secs > limit_s) return -1;
    usleep(5'000);
  }
}

std::vector<std::string> SteadyJob(int tp) {
  return {"launch", "--backend=cpu", absl::StrCat("--tp=", tp), "--model=tiny",
          "--steady-batch=4", "--steady-context=32", "--steady-steps=100000", "--progress=false"};
}

// SIGKILL of the launcher at moments from its start-up to mid-run: its
// processes die with it and the segment guard unlinks the segment.
TEST_F(SystemTest, KilledLauncherLeavesNoProcessAndNoSegment) {
  std::mt19937 rng(static_cast<uint32_t>(MonotonicNs()));
  for (int delay_ms : {0, 2, 5, 10, 20, 40, 80, 150, 300, 600}) {
    const int jitter = static_cast<int>(rng() % 5);
    Proc p = Start(SteadyJob(2), prefix_);
    usleep((delay_ms + jitter) * 1000);
    ASSERT_EQ(kill(p.pid, SIGKILL), 0);
    int st = Wait(p, 5'000);
    ASSERT_TRUE(WIFSIGNALED(st)) << delay_ms;
    const double secs = WaitUntilNothingLeft(prefix_, 2.0);
    EXPECT_GE(secs, 0) << "after " << delay_ms << " ms: processes "
                       << absl::StrJoin(JobProcesses(prefix_), ",") << ", segments "
                       << absl::StrJoin(ShmWithPrefix(prefix_), ",");
  }
}

// A process started by hand against a live job's name is turned away before
// it touches the job, and the job keeps running.
TEST_F(SystemTest, StrangerThatFailsToAttachLeavesTheJobRunning) {
  Proc job = Start(SteadyJob(2), prefix_);
  ASSERT_EQ(WaitForWorkers(job.pid, 2).size(), 2u) << ReadFile(job.err_path);
  std::vector<std::string> segs = ShmWithPrefix(prefix_);
  ASSERT_EQ(segs.size(), 1u);
  const std::string name = fs::path(segs[0]).filename().string();
  for (const std::vector<std::string>& role :
       {std::vector<std::string>{"worker", "--rank=0"}, std::vector<std::string>{"worker", "--rank=1"},
        std::vector<std::string>{"scheduler"}}) {
    std::vector<std::string> args = role;
    for (const char* a : {"--backend=cpu", "--tp=2", "--model=tiny", "--steady-batch=4",
                          "--steady-context=32", "--progress=false"}) {
      args.push_back(a);
    }
    args.push_back("--resolved-backend=cpu");
    args.push_back("--job=" + name);
    Proc stranger = Start(args, prefix_ + "_stranger");
    int st = Wait(stranger, 10'000);
    ASSERT_TRUE(WIFEXITED(st)) << role[0];
    EXPECT_NE(WEXITSTATUS(st), 0) << role[0];
    EXPECT_THAT(ReadFile(stranger.err_path), HasSubstr("not started by the job's launcher"));
  }
  usleep(300'000);
  EXPECT_TRUE(Alive(job.pid)) << ReadFile(job.err_path);
  EXPECT_THAT(ReadFile(job.err_path), ::testing::Not(HasSubstr("job failed")));
  kill(job.pid, SIGINT);
  int st = Wait(job, 5'000);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGINT);  // interrupted, not failed
  EXPECT_GE(WaitUntilNothingLeft(prefix_, 2.0), 0);
}

// /dev/shm too small for the job (a private tmpfs of 4 KiB .. 8 MiB): one
// clear error before any process starts, never SIGBUS.
TEST_F(SystemTest, SmallDevShmIsOneClearErrorNotSigbus) {
  for (const char* size : {"4k", "12k", "1m", "8m"}) {
    std::string why;
    const std::string err_path = Out(absl::StrCat("shm_", size, ".stderr"));
    fs::create_directories(out_);
    int st = testing::RunWithPrivateDevShm(
        size,
        [&]() -> int {
          // Default batch limits: a segment of about 10 MiB at TP=2.
          Proc p = Start({"launch", "--backend=cpu", "--tp=2", "--model=tiny",
                          "--num-requests=2", "--progress=false"},
                         prefix_);
          int s = Wait(p, 20'000);
          fs::copy_file(p.err_path, err_path, fs::copy_options::overwrite_existing);
          if (!WIFEXITED(s)) return 100 + (WIFSIGNALED(s) ? WTERMSIG(s) : 0);
          return WEXITSTATUS(s);
        },
        &why);
    if (WIFEXITED(st) && WEXITSTATUS(st) == testing::kNoPrivateTmpfs) {
      GTEST_SKIP() << "cannot set up a private tmpfs on /dev/shm here (user namespaces off, or "
                      "a multithreaded process such as a TSan build): "
                   << why;
    }
    ASSERT_TRUE(WIFEXITED(st)) << size;
    EXPECT_EQ(WEXITSTATUS(st), 1) << size << " (100 + n: the launcher died of signal n)";
    const std::string err = ReadFile(err_path);
    EXPECT_THAT(err, HasSubstr("RESOURCE_EXHAUSTED")) << size;
    EXPECT_THAT(err, HasSubstr("/dev/shm")) << size;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_THAT(err, ::testing::Not(HasSubstr("worker"))) << "no process started";
  }
}

}  // namespace
}  // namespace symtp

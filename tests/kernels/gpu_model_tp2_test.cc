// TP = 2 across two processes, as deployed: the parent spawns this binary
// twice (fresh processes: CUDA does not survive fork), one rank per GPU,
// joined by an NcclComm whose id travels through a file named after the
// parent's pid. Each rank runs prefill + greedy decode with device sampling
// and CUDA graphs, and writes its logits and tokens;
// the parent checks that both ranks agree bitwise and match the CPU
// reference at TP = 1 (fp32). Then each rank runs the same steps with mixed
// greedy / top-k / top-p device sampling and no logits copy, once sampling
// from the shards' candidates and once from the gathered logits: the tokens
// must be the same.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "kernels/nccl/nccl_comm.h"
#include "models/cpu_model.h"
#include "models/cuda/gpu_model.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/model_harness.h"

extern char** environ;

namespace symtp::kernels {
namespace {

using model::GpuModel;
using testing::SimBatch;

constexpr int kSteps = 8;  // 1 prefill + 7 decode
constexpr int kBlocks = 128;
const std::vector<int> kPrompts = {7, 40, 19};

std::string PathFor(pid_t parent, const std::string& what) {
  return "/tmp/symtp_kernels_tp2_" + std::to_string(parent) + "." + what;
}

model::ModelConfig TinyCfg() { return *model::PresetConfig("tiny"); }

void RunRank(int rank) {
  const pid_t parent = getppid();
  std::ifstream idf(PathFor(parent, "id"), std::ios::binary);
  if (!idf) GTEST_SKIP() << "only run as a child of GpuModelTp2Test";
  ncclUniqueId id;
  idf.read(reinterpret_cast<char*>(&id), sizeof(id));
  ASSERT_TRUE(idf.good());
  ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
  auto comm = NcclComm::Create(id, rank, 2, rank, Deadline::AfterMs(60'000));
  ASSERT_OK(comm);
  auto stream = cuda::Stream::Create();
  ASSERT_OK(stream);
  const auto cfg = TinyCfg();
  model::GpuModelOptions o;
  o.dtype = DType::kF32;
  o.num_kv_blocks = kBlocks;
  o.max_batch_tokens = 128;
  o.max_seqs = 8;
  o.cuda_graphs = true;
  auto m = GpuModel::Create(cfg, rank, 2, rank, o, comm->get());
  ASSERT_OK(m);
  SimBatch sim(cfg, kBlocks, 21);
  for (int p : kPrompts) sim.AddSequence(p, cfg.vocab);
  std::ofstream lo(PathFor(parent, "logits" + std::to_string(rank)), std::ios::binary);
  std::ofstream to(PathFor(parent, "tokens" + std::to_string(rank)));
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> rows;
    auto batch = sim.NextStep(64, &rows);
    ASSERT_OK(batch);
    model::StepOptions so;
    so.sampling.assign(batch->sample_index.size(), model::SamplingParams{});
    ASSERT_OK(m->Forward(*batch, stream->get(), so));
    ASSERT_OK(m->WaitForStep(Deadline::AfterMs(60'000)));
    const auto l = m->host_logits();
    lo.write(reinterpret_cast<const char*>(l.data()), l.size() * sizeof(float));
    const auto t = m->host_tokens();
    std::vector<int32_t> toks(t.begin(), t.end());
    for (int32_t x : toks) to << x << " ";
    to << "\n";
    sim.Commit(rows, toks);
  }
  // Mixed sampling without the logits copy: sharded vs gathered logits.
  std::ofstream so_out(PathFor(parent, "sampled" + std::to_string(rank)));
  for (bool sharded : {true, false}) {
    model::GpuModelOptions o2 = o;
    o2.host_logits = false;
    o2.sharded_sampling = sharded;
    auto m2 = GpuModel::Create(cfg, rank, 2, rank, o2, comm->get());
    ASSERT_OK(m2);
    SimBatch sim2(cfg, kBlocks, 22);
    for (int p : kPrompts) sim2.AddSequence(p, cfg.vocab);
    int64_t sampled_steps = 0;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<int> rows;
      auto batch = sim2.NextStep(64, &rows);
      ASSERT_OK(batch);
      model::StepOptions so;
      so.copy_logits = false;
      so.sampling.resize(batch->sample_index.size());
      for (size_t i = 0; i < so.sampling.size(); ++i) {
        model::SamplingParams& sp = so.sampling[i];
        sp.temperature = i % 3 == 0 ? 0.f : 1.1f;  // greedy, top-k, top-k + top-p
        sp.top_k = i % 3 == 0 ? 0 : 3 + static_cast<int>(i);
        sp.top_p = i % 3 == 2 ? 0.8f : 1.f;
        sp.seed = 77 + i;
      }
      sampled_steps += so.sampling.empty() ? 0 : 1;
      ASSERT_OK(m2->Forward(*batch, stream->get(), so));
      ASSERT_OK(m2->WaitForStep(Deadline::AfterMs(60'000)));
      const auto t = m2->host_tokens();
      std::vector<int32_t> toks(t.begin(), t.end());
      for (int32_t x : toks) so_out << x << " ";
      so_out << "\n";
      sim2.Commit(rows, toks);
    }
    so_out << "--\n";
    EXPECT_EQ(m2->graph_stats().capture_failures, 0);
    EXPECT_GT(sampled_steps, 0);
    EXPECT_EQ(m2->graph_stats().sharded_sampling_steps, sharded ? sampled_steps : 0);
  }
  ASSERT_OK(comm.value()->Poll());
  std::printf("[ rank %d ] graph replays %lld captures %lld failures %lld\n", rank,
              static_cast<long long>(m->graph_stats().replays),
              static_cast<long long>(m->graph_stats().captures),
              static_cast<long long>(m->graph_stats().capture_failures));
  EXPECT_EQ(m->graph_stats().capture_failures, 0);
}

TEST(GpuModelTp2Child, DISABLED_Rank0) { RunRank(0); }
TEST(GpuModelTp2Child, DISABLED_Rank1) { RunRank(1); }

class GpuModelTp2Test : public testing::GpuTest {};

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST_F(GpuModelTp2Test, TwoProcessesAgreeAndMatchCpuTp1) {
  std::string why;
  if (cuda::VisibleDeviceCount(&why) < 2) GTEST_SKIP() << "needs 2 GPUs";
  const pid_t self = getpid();
  auto id = NcclComm::NewUniqueId();
  ASSERT_OK(id);
  {
    std::ofstream f(PathFor(self, "id"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(&id.value()), sizeof(ncclUniqueId));
    ASSERT_TRUE(f.good());
  }
  pid_t kids[2] = {-1, -1};
  for (int r = 0; r < 2; ++r) {
    std::string filter = "--gtest_filter=GpuModelTp2Child.DISABLED_Rank" + std::to_string(r);
    std::string also = "--gtest_also_run_disabled_tests";
    std::string exe = "/proc/self/exe";
    char* argv[] = {exe.data(), filter.data(), also.data(), nullptr};
    ASSERT_EQ(posix_spawn(&kids[r], "/proc/self/exe", nullptr, nullptr, argv, environ), 0);
  }
  // Wait for both with a deadline; a hang kills both.
  int status[2] = {-1, -1};
  bool done[2] = {false, false};
  const Deadline deadline = Deadline::AfterMs(240'000);
  while (!(done[0] && done[1]) && !deadline.Expired()) {
    for (int r = 0; r < 2; ++r) {
      if (!done[r] && waitpid(kids[r], &status[r], WNOHANG) == kids[r]) done[r] = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < 2; ++r) {
    if (!done[r]) {
      kill(kids[r], SIGKILL);
      waitpid(kids[r], &status[r], 0);
      ADD_FAILURE() << "rank " << r << " timed out";
    }
  }
  std::remove(PathFor(self, "id").c_str());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << "rank " << r << " failed (status " << status[r] << ")";
  }
  const std::vector<char> l0 = ReadAll(PathFor(self, "logits0")),
                          l1 = ReadAll(PathFor(self, "logits1"));
  const std::vector<char> t0 = ReadAll(PathFor(self, "tokens0")),
                          t1 = ReadAll(PathFor(self, "tokens1"));
  const std::vector<char> s0 = ReadAll(PathFor(self, "sampled0")),
                          s1 = ReadAll(PathFor(self, "sampled1"));
  for (const char* w : {"logits0", "logits1", "tokens0", "tokens1", "sampled0", "sampled1"})
    std::remove(PathFor(self, w).c_str());
  EXPECT_TRUE(s0 == s1) << "ranks' sampled tokens differ";
  {
    const std::string all(s0.begin(), s0.end());
    const size_t cut = all.find("--\n");
    ASSERT_NE(cut, std::string::npos) << all;
    const std::string sharded = all.substr(0, cut), full = all.substr(cut + 3);
    EXPECT_FALSE(sharded.empty());
    EXPECT_EQ(sharded + "--\n", full) << "tokens from the shards' candidates vs gathered logits";
  }
  ASSERT_FALSE(l0.empty());
  EXPECT_TRUE(l0 == l1) << "ranks' logits differ";
  EXPECT_TRUE(t0 == t1) << "ranks' tokens differ";

  // CPU reference, TP = 1, same steps (greedy on its own logits).
  const auto cfg = TinyCfg();
  auto cpu = model::CpuModel::Create(cfg, 0, 1, kBlocks, nullptr);
  ASSERT_OK(cpu);
  SimBatch sim(cfg, kBlocks, 21);
  for (int p : kPrompts) sim.AddSequence(p, cfg.vocab);
  std::vector<float> all_want;
  std::string want_tokens;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> rows;
    auto batch = sim.NextStep(64, &rows);
    ASSERT_OK(batch);
    std::vector<float> want;
    ASSERT_OK(cpu->Forward(*batch, &want));
    all_want.insert(all_want.end(), want.begin(), want.end());
    std::vector<int32_t> next(batch->sample_index.size());
    for (size_t i = 0; i < next.size(); ++i) {
      next[i] = model::ArgMax(absl::MakeConstSpan(want.data() + i * cfg.vocab, cfg.vocab));
      want_tokens += std::to_string(next[i]) + " ";
    }
    want_tokens += "\n";
    sim.Commit(rows, next);
  }
  EXPECT_EQ(std::string(t0.begin(), t0.end()), want_tokens) << "TP=2 greedy tokens vs CPU TP=1";
  ASSERT_EQ(l0.size(), all_want.size() * sizeof(float));
  std::vector<float> got(all_want.size());
  std::memcpy(got.data(), l0.data(), l0.size());
  testing::CheckClose(got, testing::ToDouble(all_want), 1e-4, "TP=2 logits vs CPU TP=1");
}

}  // namespace
}  // namespace symtp::kernels

// Device sampling vs model::SampleToken (the CPU reference) on the same
// logits: greedy, top-k, top-p, plain temperature, ties, NaN and -inf, over
// vocabularies on both sides of the exact path's cap.
#include "kernels/ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "models/sampling.h"
#include "tests/kernels/gpu_test_util.h"

namespace symtp::kernels {
namespace {

class SamplingTest : public testing::GpuTest {
 protected:
  // Samples every row of `logits` [rows, V] with params[r] on the device and
  // on the CPU; expects the same tokens.
  void Compare(const std::vector<float>& logits, int V,
               const std::vector<model::SamplingParams>& ps, const std::vector<uint64_t>& positions,
               const std::string& what) {
    const int rows = static_cast<int>(ps.size());
    std::vector<DeviceSamplingParams> dp(rows);
    for (int r = 0; r < rows; ++r) {
      dp[r].temperature = ps[r].temperature;
      dp[r].top_k = ps[r].top_k;
      dp[r].top_p = ps[r].top_p;
      dp[r].seed = ps[r].seed;
      dp[r].position = positions[r];
    }
    cuda::DeviceBuffer d_l = testing::UploadRaw(logits), d_p = testing::UploadRaw(dp);
    std::vector<int32_t> poison(rows, -7);
    cuda::DeviceBuffer d_t = testing::UploadRaw(poison);
    ASSERT_OK(SampleTokens(d_l.as<float>(), rows, V, d_p.as<DeviceSamplingParams>(),
                           d_t.as<int32_t>(), stream()));
    Sync();
    const std::vector<int32_t> got = testing::DownloadRaw<int32_t>(d_t.get(), rows);
    int bad = 0;
    for (int r = 0; r < rows; ++r) {
      const int32_t want = model::SampleToken(
          absl::MakeConstSpan(logits.data() + static_cast<size_t>(r) * V, V), ps[r], positions[r]);
      if (got[r] != want && bad++ < 8) {
        ADD_FAILURE() << what << " row " << r << ": device " << got[r] << ", cpu " << want
                      << " (T=" << ps[r].temperature << " k=" << ps[r].top_k << " p=" << ps[r].top_p
                      << ")";
      }
    }
    EXPECT_EQ(bad, 0) << what;
  }

  static std::vector<model::SamplingParams> ParamGrid(int rows, uint64_t seed) {
    const float temps[] = {0.f, 0.7f, 1.0f, 1.5f, 0.05f};
    const int ks[] = {0, 1, 5, 40, 1000, 3000};
    const float tps[] = {1.f, 0.9f, 0.5f, 0.99f};
    std::vector<model::SamplingParams> ps(rows);
    for (int r = 0; r < rows; ++r) {
      ps[r].temperature = temps[r % 5];
      ps[r].top_k = ks[(r / 5) % 6];
      ps[r].top_p = tps[(r / 30) % 4];
      ps[r].seed = seed + static_cast<uint64_t>(r) * 7919;
    }
    return ps;
  }
};

TEST_F(SamplingTest, RandomLogitsAcrossVocabSizes) {
  for (int V : {512, 2048, 5000, 16384}) {
    SCOPED_TRACE(V);
    const int rows = 120;
    std::vector<float> logits = testing::RandomFloats(static_cast<size_t>(rows) * V, V, -4.f, 4.f);
    std::vector<uint64_t> pos(rows);
    for (int r = 0; r < rows; ++r) pos[r] = 17 + 3 * r;
    Compare(logits, V, ParamGrid(rows, 99 + V), pos, "random V=" + std::to_string(V));
  }
}

// Few rows over a large vocabulary: each row's maximum is found by a
// cluster of 2-8 blocks (SampleTokens' split), so the winner, its ties to
// the lowest id and NaN / -inf must come out the same across slices.
TEST_F(SamplingTest, FewRowsSplitAcrossBlocks) {
  for (int V : {32000, 32003, 128256}) {
    for (int rows : {1, 5, 33, 40, 70}) {
      SCOPED_TRACE(::testing::Message() << "V=" << V << " rows=" << rows);
      std::mt19937_64 rng(V + rows);
      std::uniform_int_distribution<int> q(-40, 40);
      std::vector<float> logits(static_cast<size_t>(rows) * V);
      for (auto& x : logits) x = 0.1f * static_cast<float>(q(rng));  // ties everywhere
      for (int r = 0; r < rows; ++r) {
        float* row = logits.data() + static_cast<size_t>(r) * V;
        // The row's maximum twice, in different slices (the lower id wins),
        // and NaN / +-0 / -inf around the slice boundaries.
        const int a = (r * 7919) % V, b = (a + V / 2 + r) % V;
        row[a] = row[b] = 9.5f;
        row[V / 8] = std::numeric_limits<float>::quiet_NaN();
        row[V / 4 - 1] = -std::numeric_limits<float>::infinity();
        row[V / 2] = -0.0f;
        if (r % 3 == 0) row[V - 1] = 10.f;  // the last element wins
      }
      std::vector<uint64_t> pos(rows);
      for (int r = 0; r < rows; ++r) pos[r] = 100 + r;
      std::vector<model::SamplingParams> ps = ParamGrid(rows, 11);
      Compare(logits, V, ps, pos, "split");
      for (auto& p : ps) p.temperature = 0.f;
      Compare(logits, V, ps, pos, "split greedy");
    }
  }
}

TEST_F(SamplingTest, TiesNanAndInfinity) {
  const int V = 3000, rows = 120;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> q(-8, 8);
  std::vector<float> logits(static_cast<size_t>(rows) * V);
  for (auto& x : logits) x = 0.25f * static_cast<float>(q(rng));  // many exact ties
  for (int r = 0; r < rows; ++r) {
    float* row = logits.data() + static_cast<size_t>(r) * V;
    row[(r * 37) % V] = std::numeric_limits<float>::quiet_NaN();
    row[(r * 53 + 1) % V] = -std::numeric_limits<float>::infinity();
    row[(r * 71 + 2) % V] = -0.0f;
  }
  std::vector<uint64_t> pos(rows);
  for (int r = 0; r < rows; ++r) pos[r] = 1000 + r;
  Compare(logits, V, ParamGrid(rows, 7), pos, "ties");
}

TEST_F(SamplingTest, DegenerateRows) {
  const int V = 600;
  std::vector<float> logits(static_cast<size_t>(4) * V, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < V; ++i) logits[V + i] = std::numeric_limits<float>::quiet_NaN();  // all NaN
  for (int i = 0; i < V; ++i) logits[2 * V + i] = 1.f;                                  // all equal
  for (int i = 0; i < V; ++i) logits[3 * V + i] = i == 123 ? 50.f : -50.f;              // one-hot
  std::vector<model::SamplingParams> ps(4);
  for (auto& p : ps) {
    p.temperature = 0.8f;
    p.top_p = 0.7f;
    p.seed = 3;
  }
  Compare(logits, V, ps, {1, 2, 3, 4}, "degenerate");
  for (auto& p : ps) p.temperature = 0.f;
  Compare(logits, V, ps, {1, 2, 3, 4}, "degenerate greedy");
}

// Vocabulary-parallel sampling: every shard's candidates, gathered shard by
// shard as the all-gather lays them out, give the token SampleTokens draws
// from the whole row (and the CPU reference), for greedy and top-k rows.
TEST_F(SamplingTest, ShardCandidatesMatchFullRow) {
  for (int tp : {2, 4, 8}) {
    for (int V : {4096, 128256}) {
      SCOPED_TRACE(::testing::Message() << "tp=" << tp << " V=" << V);
      const int rows = 45, VL = V / tp;
      std::mt19937_64 rng(V + tp);
      std::uniform_int_distribution<int> q(-30, 30);
      std::vector<float> logits(static_cast<size_t>(rows) * V);
      for (auto& x : logits) x = 0.1f * static_cast<float>(q(rng));  // ties across shards
      for (int r = 0; r < rows; ++r) {
        float* row = logits.data() + static_cast<size_t>(r) * V;
        const int a = (r * 7919) % V, b = (a + VL + r) % V;  // the maximum in two shards
        row[a] = row[b] = 5.5f;
        row[(r * 37) % V] = std::numeric_limits<float>::quiet_NaN();
        row[(r * 53 + 1) % V] = -std::numeric_limits<float>::infinity();
        row[(r * 71 + 2) % V] = -0.0f;
      }
      const int ks[] = {0, 1, 7, 40, 300, 2048};
      const float temps[] = {0.f, 0.8f, 1.3f};
      const float tps[] = {1.f, 0.9f, 0.3f};
      std::vector<DeviceSamplingParams> dp(rows);
      int kmax = 1;
      for (int r = 0; r < rows; ++r) {
        dp[r].temperature = temps[r % 3];
        dp[r].top_k = ks[(r / 3) % 6];
        dp[r].top_p = tps[(r / 18) % 3];
        if (dp[r].temperature > 0.f && dp[r].top_k == 0) dp[r].top_k = 2;
        dp[r].seed = 1234 + r;
        dp[r].position = 7 + r;
        if (dp[r].temperature > 0.f) kmax = std::max(kmax, dp[r].top_k);
      }
      if (kmax > VL) continue;  // the runtime sends such steps down the full path
      for (const auto& p : dp) ASSERT_TRUE(ShardedSamplingTakes(p, V, kmax));
      cuda::DeviceBuffer d_p = testing::UploadRaw(dp);
      std::vector<uint64_t> gathered_init(static_cast<size_t>(tp) * rows * kmax, ~0ull);
      cuda::DeviceBuffer d_all = testing::UploadRaw(gathered_init);
      for (int sh = 0; sh < tp; ++sh) {
        std::vector<float> part(static_cast<size_t>(rows) * VL);
        for (int r = 0; r < rows; ++r) {
          std::copy_n(logits.data() + static_cast<size_t>(r) * V + static_cast<size_t>(sh) * VL,
                      VL, part.data() + static_cast<size_t>(r) * VL);
        }
        cuda::DeviceBuffer d_part = testing::UploadRaw(part);
        ASSERT_OK(SelectShardCandidates(
            d_part.as<float>(), rows, VL, sh * VL, d_p.as<DeviceSamplingParams>(), kmax,
            d_all.as<uint64_t>() + static_cast<size_t>(sh) * rows * kmax, stream()));
        Sync();
      }
      std::vector<int32_t> poison(rows, -7);
      cuda::DeviceBuffer d_sharded = testing::UploadRaw(poison), d_full = testing::UploadRaw(poison);
      ASSERT_OK(SampleFromCandidates(d_all.as<uint64_t>(), tp, rows, kmax, V,
                                     d_p.as<DeviceSamplingParams>(), d_sharded.as<int32_t>(),
                                     stream()));
      cuda::DeviceBuffer d_l = testing::UploadRaw(logits);
      ASSERT_OK(SampleTokens(d_l.as<float>(), rows, V, d_p.as<DeviceSamplingParams>(),
                             d_full.as<int32_t>(), stream()));
      Sync();
      const std::vector<int32_t> got = testing::DownloadRaw<int32_t>(d_sharded.get(), rows);
      const std::vector<int32_t> want = testing::DownloadRaw<int32_t>(d_full.get(), rows);
      int bad = 0;
      for (int r = 0; r < rows; ++r) {
        model::SamplingParams sp;
        sp.temperature = dp[r].temperature;
        sp.top_k = dp[r].top_k;
        sp.top_p = dp[r].top_p;
        sp.seed = dp[r].seed;
        const int32_t cpu = model::SampleToken(
            absl::MakeConstSpan(logits.data() + static_cast<size_t>(r) * V, V), sp,
            dp[r].position);
        if ((got[r] != want[r] || got[r] != cpu) && bad++ < 8) {
          ADD_FAILURE() << "row " << r << ": sharded " << got[r] << ", full " << want[r]
                        << ", cpu " << cpu << " (T=" << dp[r].temperature << " k=" << dp[r].top_k
                        << " p=" << dp[r].top_p << ")";
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(ShardedSamplingTakes, OnlyRowsWhoseTopCandidatesSuffice) {
  DeviceSamplingParams p;
  p.temperature = 0.f;
  EXPECT_TRUE(ShardedSamplingTakes(p, 1000, 1));  // greedy
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(ShardedSamplingTakes(p, 1000, 1));  // NaN: greedy, as SampleTokens reads it
  p.temperature = 0.7f;
  p.top_k = 0;
  EXPECT_FALSE(ShardedSamplingTakes(p, 1000, 2048));  // the whole vocabulary
  p.top_k = 64;
  EXPECT_TRUE(ShardedSamplingTakes(p, 1000, 64));
  EXPECT_FALSE(ShardedSamplingTakes(p, 1000, 32));  // over the slots
  EXPECT_FALSE(ShardedSamplingTakes(p, 64, 64));    // top_k >= vocab: no top-k at all
  p.top_k = kSampleExactCap + 1;
  EXPECT_FALSE(ShardedSamplingTakes(p, 1 << 20, 1 << 20));
}

}  // namespace
}  // namespace symtp::kernels

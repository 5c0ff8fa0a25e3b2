#include "models/weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/config.h"
#include "models/sharding.h"
#include "tests/testing/status_matchers.h"

namespace symtp::model {
namespace {

using ::symtp::testing::StatusIs;
using ::testing::HasSubstr;

TEST(WeightsTest, HashFunctionsMatchPublishedVectors) {
  // SplitMix64 (Vigna) from state 0: outputs are mix(0), mix(golden), ...
  EXPECT_EQ(Mix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(Mix64(0x9E3779B97F4A7C15ull), 0x6e789e6aa1b965f4ull);
  // FNV-1a 64 test vectors.
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(TensorKey(1234, "embed"), Mix64(1234 ^ Fnv1a64("embed")));
  EXPECT_NE(TensorKey(1234, "layers.0.wq"), TensorKey(1234, "layers.1.wq"));
  EXPECT_NE(TensorKey(1234, "layers.0.wq"), TensorKey(1235, "layers.0.wq"));
}

TEST(WeightsTest, ValuesFollowTheFormula) {
  EXPECT_EQ(LinearScale(256), static_cast<float>(std::sqrt(3.0 / 256)));
  EXPECT_EQ(LinearScale(14336), static_cast<float>(std::sqrt(3.0 / 14336)));
  const uint64_t key = TensorKey(7, "layers.0.w_up");
  const float scale = LinearScale(4096);
  for (uint64_t i : {0ull, 1ull, 2ull, 1000ull, 123456789ull, ~0ull}) {
    const uint64_t h = Mix64(key + i);
    const double u = static_cast<double>(h >> 40) / 16777216.0;
    const double s = 2.0 * u - 1.0;
    EXPECT_EQ(static_cast<double>(SyntheticUniform(key, i)), s);
    EXPECT_EQ(SyntheticWeight(key, i, WeightKind::kEmbedding, 123.f), static_cast<float>(s));
    EXPECT_EQ(SyntheticWeight(key, i, WeightKind::kLinear, scale), static_cast<float>(s) * scale);
    EXPECT_EQ(SyntheticWeight(key, i, WeightKind::kNorm, 0.f),
              static_cast<float>(s * 0.125 + 1.0));  // exact product, one rounding
  }
}

TEST(WeightsTest, DeterministicInRangeAndSaneMoments) {
  const float scale = LinearScale(256);
  const uint64_t key = TensorKey(1234, "layers.1.wo");
  const int n = 1 << 16;
  double sum = 0, sum2 = 0;
  float lo = 1e9f, hi = -1e9f;
  for (int i = 0; i < n; ++i) {
    const float w = SyntheticWeight(key, i, WeightKind::kLinear, scale);
    ASSERT_EQ(w, SyntheticWeight(key, i, WeightKind::kLinear, scale));
    lo = std::min(lo, w);
    hi = std::max(hi, w);
    sum += w;
    sum2 += static_cast<double>(w) * w;
  }
  EXPECT_GE(lo, -scale);
  EXPECT_LT(hi, scale);
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_LT(std::abs(mean), 0.02 * scale);                  // sigma of the mean ~0.0023*scale
  EXPECT_NEAR(var, scale * scale / 3.0, 0.03 * scale * scale / 3.0);  // var of U(-a, a) = a^2/3
  EXPECT_GT(hi - lo, 1.9f * scale);
  for (int i = 0; i < 4096; ++i) {
    const float nw = SyntheticWeight(key, i, WeightKind::kNorm, 0.f);
    EXPECT_GE(nw, 0.875f);
    EXPECT_LT(nw, 1.125f);
    const float e = SyntheticWeight(key, i, WeightKind::kEmbedding, 0.f);
    EXPECT_GE(e, -1.f);
    EXPECT_LT(e, 1.f);
  }
}

// The global (TP=1) tensor, computed straight from the weight function.
struct Global {
  int64_t rows, cols;
  std::vector<float> w;
  float at(int64_t r, int64_t c) const { return w[r * cols + c]; }
};

Global GlobalTensor(const ModelConfig& c, const std::string& name) {
  const int64_t H = c.hidden, D = c.head_dim, NH = c.heads, NKV = c.kv_heads, F = c.ffn,
                V = c.vocab;
  int64_t rows = 1, cols = H, fan_in = 0;
  WeightKind kind = WeightKind::kLinear;
  auto ends = [&](const char* s) {
    const std::string suf(s);
    return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
  };
  if (name == "embed") {
    rows = V, kind = WeightKind::kEmbedding;
  } else if (name == "lm_head") {
    rows = V, fan_in = H;
  } else if (ends("norm")) {
    kind = WeightKind::kNorm;
  } else if (ends(".wq")) {
    rows = NH * D, fan_in = H;
  } else if (ends(".wk") || ends(".wv")) {
    rows = NKV * D, fan_in = H;
  } else if (ends(".wo")) {
    rows = H, cols = NH * D, fan_in = NH * D;
  } else if (ends(".w_gate") || ends(".w_up")) {
    rows = F, fan_in = H;
  } else if (ends(".w_down")) {
    rows = H, cols = F, fan_in = F;
  } else {
    ADD_FAILURE() << name;
  }
  Global g{rows, cols, std::vector<float>(rows * cols)};
  const uint64_t key = Mix64(c.seed ^ Fnv1a64(name));
  const float scale = kind == WeightKind::kLinear ? LinearScale(static_cast<int>(fan_in)) : 1.f;
  for (int64_t i = 0; i < rows * cols; ++i) g.w[i] = SyntheticWeight(key, i, kind, scale);
  return g;
}

// Expected [row range] x [col range] of rank r of N, written from MODEL.md.
void ExpectedSlice(const ModelConfig& c, const std::string& name, int r, int n, int64_t* rb,
                   int64_t* re, int64_t* cb, int64_t* ce, const Global& g) {
  const int64_t D = c.head_dim;
  *rb = 0, *re = g.rows, *cb = 0, *ce = g.cols;
  auto ends = [&](const char* s) {
    const std::string suf(s);
    return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
  };
  const int64_t qh = c.heads / n;
  if (ends(".wq")) {
    *rb = r * qh * D, *re = (r + 1) * qh * D;
  } else if (ends(".wk") || ends(".wv")) {
    if (c.kv_heads >= n) {
      const int64_t k = c.kv_heads / n;
      *rb = r * k * D, *re = (r + 1) * k * D;
    } else {
      const int64_t head = r / (n / c.kv_heads);
      *rb = head * D, *re = (head + 1) * D;
    }
  } else if (ends(".wo")) {
    *cb = r * qh * D, *ce = (r + 1) * qh * D;
  } else if (ends(".w_gate") || ends(".w_up")) {
    *rb = r * (c.ffn / n), *re = (r + 1) * (c.ffn / n);
  } else if (ends(".w_down")) {
    *cb = r * (c.ffn / n), *ce = (r + 1) * (c.ffn / n);
  } else if (name == "lm_head") {
    *rb = r * (c.vocab / n), *re = (r + 1) * (c.vocab / n);
  }
}

TEST(ShardingTest, LayoutFollowsModelMd) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig("tiny"));  // NH 8, NKV 2
  ASSERT_OK_AND_ASSIGN(ShardLayout l, MakeShardLayout(c, 1, 2));
  EXPECT_EQ(l.q_heads_local, 4);
  EXPECT_EQ(l.q_head_begin, 4);
  EXPECT_EQ(l.kv_heads_local, 1);
  EXPECT_EQ(l.kv_head_begin, 1);
  EXPECT_EQ(l.ffn_local, 256);
  EXPECT_EQ(l.ffn_begin, 256);
  EXPECT_EQ(l.vocab_local, 256);
  EXPECT_EQ(l.vocab_begin, 256);
  for (int r = 0; r < 8; ++r) {
    ASSERT_OK_AND_ASSIGN(ShardLayout l8, MakeShardLayout(c, r, 8));
    EXPECT_EQ(l8.kv_heads_local, 1);
    EXPECT_EQ(l8.kv_head_begin, r / 4);  // replicated on 4 ranks
    EXPECT_EQ(l8.q_head_begin, r);
    // GQA: q head h uses kv head h / (NH/NKV) = h / 4.
    EXPECT_EQ(LocalKvHeadForQHead(c, l8, 0) + l8.kv_head_begin, r / 4);
  }
  ASSERT_OK_AND_ASSIGN(ShardLayout l1, MakeShardLayout(c, 0, 1));
  for (int h = 0; h < 8; ++h) EXPECT_EQ(LocalKvHeadForQHead(c, l1, h), h / 4);
  EXPECT_THAT(MakeShardLayout(c, 2, 2), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tp_rank")));
  EXPECT_THAT(MakeShardLayout(c, -1, 2), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(MakeShardLayout(c, 0, 3), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(ShardingTest, UnknownTensorNames) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig("tiny"));
  ASSERT_OK_AND_ASSIGN(ShardLayout l, MakeShardLayout(c, 0, 1));
  for (const char* bad : {"", "layers.2.wq", "layers.-1.wq", "layers.01.wq", "layers.0.wx",
                          "layers.0", "layers.0.wq.x", "head", "layers.a.wq"}) {
    EXPECT_THAT(GetShardSpec(c, l, bad), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_))
        << bad;
    EXPECT_TRUE(ShardWeights(c, l, bad).empty()) << bad;
  }
  EXPECT_EQ(TensorNames(c).size(), 3u + 9u * c.layers);
}

// Every shard of TP=N equals its MODEL.md slice of the TP=1 tensor, for every
// tensor (column / row / vocab parallel, replicated, kv replication at TP 8 > NKV 2).
TEST(ShardingTest, ShardsAreSlicesOfTheGlobalTensor) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, MakeConfig("tiny", "layers=1,seed=99"));
  for (const std::string& name : TensorNames(c)) {
    SCOPED_TRACE(name);
    const Global g = GlobalTensor(c, name);
    ASSERT_OK_AND_ASSIGN(ShardLayout l1, MakeShardLayout(c, 0, 1));
    EXPECT_EQ(ShardWeights(c, l1, name), g.w);
    for (int n : {2, 4, 8}) {
      std::vector<std::vector<float>> shards;
      for (int r = 0; r < n; ++r) {
        ASSERT_OK_AND_ASSIGN(ShardLayout l, MakeShardLayout(c, r, n));
        const std::vector<float> shard = ShardWeights(c, l, name);
        int64_t rb, re, cb, ce;
        ExpectedSlice(c, name, r, n, &rb, &re, &cb, &ce, g);
        ASSERT_EQ(static_cast<int64_t>(shard.size()), (re - rb) * (ce - cb)) << "n=" << n << " r=" << r;
        bool same = true;
        for (int64_t i = rb; i < re && same; ++i) {
          for (int64_t j = cb; j < ce; ++j) {
            if (shard[(i - rb) * (ce - cb) + (j - cb)] != g.at(i, j)) {
              same = false;
              ADD_FAILURE() << "n=" << n << " r=" << r << " element (" << i << "," << j << ")";
              break;
            }
          }
        }
        shards.push_back(shard);
      }
      const bool kv = name.find(".wk") != std::string::npos || name.find(".wv") != std::string::npos;
      if (kv && n > c.kv_heads) {
        // Replicated on N/NKV consecutive ranks.
        for (int r = 0; r < n; ++r) EXPECT_EQ(shards[r], shards[r / (n / c.kv_heads) * (n / c.kv_heads)]);
        EXPECT_NE(shards[0], shards[n - 1]);
      }
    }
  }
}

TEST(ShardingTest, ShardSpecMapsToGlobalFlatIndex) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig("tiny"));
  ASSERT_OK_AND_ASSIGN(ShardLayout l, MakeShardLayout(c, 3, 4));
  ASSERT_OK_AND_ASSIGN(ShardSpec s, GetShardSpec(c, l, "layers.1.w_down"));
  EXPECT_EQ(s.global_rows, 256);
  EXPECT_EQ(s.global_cols, 512);
  EXPECT_EQ(s.row_begin, 0);
  EXPECT_EQ(s.rows, 256);
  EXPECT_EQ(s.col_begin, 384);
  EXPECT_EQ(s.cols, 128);
  EXPECT_EQ(s.scale, LinearScale(512));
  EXPECT_EQ(s.key, TensorKey(c.seed, "layers.1.w_down"));
  std::vector<float> buf(s.size());
  ASSERT_OK(MaterializeShard(s, absl::MakeSpan(buf)));
  EXPECT_EQ(buf[5 * 128 + 7], SyntheticWeight(s.key, 5 * 512 + 384 + 7, WeightKind::kLinear, s.scale));
  std::vector<float> small(3);
  EXPECT_THAT(MaterializeShard(s, absl::MakeSpan(small)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

}  // namespace
}  // namespace symtp::model

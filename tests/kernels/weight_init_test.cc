// Device synthetic weights vs model::SyntheticWeight: bit-exact in fp32, the
// round-to-nearest-even of those bits in bf16.
#include "kernels/ops/weight_init.h"

#include <cstring>

#include "models/config.h"
#include "models/sharding.h"
#include "models/weights.h"
#include "tests/kernels/gpu_test_util.h"

namespace symtp::kernels {
namespace {

using testing::DevArray;
using testing::FloatToBf16Bits;

class WeightInitTest : public testing::GpuTest {};

SyntheticBlock FromSpec(const model::ShardSpec& s) {
  SyntheticBlock b;
  b.key = s.key;
  b.kind = static_cast<SyntheticKind>(static_cast<int>(s.kind));
  b.scale = s.scale;
  b.global_cols = s.global_cols;
  b.row_begin = s.row_begin;
  b.rows = s.rows;
  b.col_begin = s.col_begin;
  b.cols = s.cols;
  return b;
}

void CheckSpec(const model::ShardSpec& spec, cudaStream_t stream) {
  SCOPED_TRACE(spec.name);
  const size_t n = static_cast<size_t>(spec.size());
  std::vector<float> want(n);
  ASSERT_OK(model::MaterializeShard(spec, absl::MakeSpan(want)));
  for (DType dt : {DType::kF32, DType::kBF16}) {
    DevArray d(n, dt);
    ASSERT_OK(InitSyntheticWeight(d.get(), dt, FromSpec(spec), stream));
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    size_t bad = 0;
    if (dt == DType::kF32) {
      std::vector<uint32_t> got = testing::DownloadRaw<uint32_t>(d.get(), n);
      for (size_t i = 0; i < n; ++i) {
        uint32_t w;
        std::memcpy(&w, &want[i], 4);
        if (got[i] != w && bad++ < 5) ADD_FAILURE() << "fp32 element " << i << " differs";
      }
    } else {
      std::vector<uint16_t> got = testing::DownloadRaw<uint16_t>(d.get(), n);
      for (size_t i = 0; i < n; ++i) {
        if (got[i] != FloatToBf16Bits(want[i]) && bad++ < 5) {
          ADD_FAILURE() << "bf16 element " << i << " differs";
        }
      }
    }
    EXPECT_EQ(bad, 0u) << DTypeName(dt);
  }
}

TEST_F(WeightInitTest, TinyEveryTensorOfEveryRankMatchesCpu) {
  auto cfg = model::PresetConfig("tiny");
  ASSERT_OK(cfg);
  for (int tp : {1, 2, 4}) {
    for (int r = 0; r < tp; ++r) {
      auto layout = model::MakeShardLayout(*cfg, r, tp);
      ASSERT_OK(layout);
      for (const std::string& name : model::TensorNames(*cfg)) {
        auto spec = model::GetShardSpec(*cfg, *layout, name);
        ASSERT_OK(spec);
        CheckSpec(*spec, stream());
      }
    }
  }
}

TEST_F(WeightInitTest, Llama70bShapeLargeIndicesMatchCpu) {
  // 64-bit global indices past 2^32: a slice of rank 3/4's lm_head and w_down.
  auto cfg = model::PresetConfig("llama-70b-shape");
  ASSERT_OK(cfg);
  auto layout = model::MakeShardLayout(*cfg, 3, 4);
  ASSERT_OK(layout);
  for (const char* name : {"lm_head", "layers.79.w_down", "layers.79.wo", "embed", "final_norm"}) {
    auto spec = model::GetShardSpec(*cfg, *layout, name);
    ASSERT_OK(spec);
    model::ShardSpec s = *spec;
    // Keep the last 3 rows (largest indices) of the shard.
    s.row_begin += std::max<int64_t>(0, s.rows - 3);
    s.rows = std::min<int64_t>(s.rows, 3);
    CheckSpec(s, stream());
  }
}

TEST_F(WeightInitTest, StridedDestinationLeavesGapsUntouched) {
  SyntheticBlock b;
  b.key = model::TensorKey(7, "x");
  b.kind = SyntheticKind::kLinear;
  b.scale = model::LinearScale(96);
  b.global_cols = 96;
  b.row_begin = 5;
  b.rows = 4;
  b.col_begin = 32;
  b.cols = 40;
  b.dst_ld = 50;
  DevArray d(static_cast<size_t>(b.rows * b.dst_ld), DType::kF32);
  ASSERT_OK(InitSyntheticWeight(d.get(), DType::kF32, b, stream()));
  Sync();
  std::vector<float> got = d.Download();
  for (int64_t r = 0; r < b.rows; ++r) {
    for (int64_t c = 0; c < b.dst_ld; ++c) {
      const float g = got[r * b.dst_ld + c];
      if (c < b.cols) {
        const uint64_t idx = static_cast<uint64_t>((b.row_begin + r) * 96 + b.col_begin + c);
        EXPECT_EQ(g, model::SyntheticWeight(b.key, idx, model::WeightKind::kLinear, b.scale));
      } else {
        EXPECT_TRUE(std::isnan(g)) << "gap element written at " << r << "," << c;
      }
    }
  }
}

// w[r, c] * gamma[c] rounded once to the dtype (the product of two fp32
// or bf16 values is exact in double), then gamma all ones.
TEST_F(WeightInitTest, FoldNormWeightScalesColumnsAndLeavesUnitWeights) {
  const int64_t rows = 37, cols = 1000;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    std::vector<float> w = testing::RandomFloats(static_cast<size_t>(rows * cols), 5, -2.f, 2.f);
    std::vector<float> g = testing::RandomFloats(static_cast<size_t>(cols), 6, 0.5f, 1.5f);
    testing::RoundTo(&w, dt);
    testing::RoundTo(&g, dt);
    DevArray dw(w.size(), dt), dg(g.size(), dt);
    dw.Upload(w);
    dg.Upload(g);
    ASSERT_OK(FoldNormWeight(dw.get(), rows, cols, dg.get(), dt, stream()));
    ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    const std::vector<float> got = dw.Download();
    size_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float want = w[r * cols + c] * g[c];
        if (dt == DType::kBF16) want = testing::RoundBf16(want);
        if (got[r * cols + c] != want && bad++ < 5) {
          ADD_FAILURE() << "element " << r << "," << c << ": " << got[r * cols + c] << " vs "
                        << want;
        }
      }
    }
    EXPECT_EQ(bad, 0u);
    for (float v : dg.Download()) ASSERT_EQ(v, 1.f);
  }
  EXPECT_FALSE(FoldNormWeight(nullptr, rows, cols, nullptr, DType::kBF16, stream()).ok());
}

TEST_F(WeightInitTest, RejectsBadBlock) {
  SyntheticBlock b;
  b.global_cols = 10;
  b.rows = 2;
  b.cols = 8;
  b.col_begin = 4;  // 4 + 8 > 10
  DevArray d(64, DType::kF32);
  EXPECT_THAT(InitSyntheticWeight(d.get(), DType::kF32, b, stream()),
              symtp::testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  b.col_begin = 0;
  EXPECT_THAT(InitSyntheticWeight(d.get(), DType::kF16, b, stream()),
              symtp::testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

}  // namespace
}  // namespace symtp::kernels

// Embedding, add+RMSNorm, RoPE, KV write, SiLU-mul, gathers: each against a
// small double-precision CPU reference on random inputs, outputs poisoned.
#include "kernels/ops/layer_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "tests/kernels/gpu_test_util.h"

namespace symtp::kernels {
namespace {

using testing::CheckClose;
using testing::DevArray;
using testing::RandomFloats;
using testing::RoundTo;

double Tol(DType dt) { return dt == DType::kF32 ? 1e-5 : 1e-2; }

class LayerOpsTest : public testing::GpuTest, public ::testing::WithParamInterface<DType> {};

TEST_P(LayerOpsTest, EmbeddingLookup) {
  const DType dt = GetParam();
  const int V = 1000, H = 264, T = 9;
  std::vector<float> table = RandomFloats(static_cast<size_t>(V) * H, 1);
  RoundTo(&table, dt);
  std::vector<int32_t> tokens = {0, 999, 17, 17, 500, -3, 1000, 42, 1};
  DevArray d_table(table.size(), dt), d_out(static_cast<size_t>(T) * H, dt);
  d_table.Upload(table);
  cuda::DeviceBuffer d_tok = testing::UploadRaw(tokens);
  ASSERT_OK(
      EmbeddingLookup(d_tok.as<int32_t>(), d_table.get(), d_out.get(), T, H, V, dt, stream()));
  Sync();
  std::vector<float> got = d_out.Download();
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < H; ++i) {
      const bool in = tokens[t] >= 0 && tokens[t] < V;
      const float want = in ? table[static_cast<size_t>(tokens[t]) * H + i] : 0.f;
      ASSERT_EQ(got[static_cast<size_t>(t) * H + i], want) << "token row " << t << " col " << i;
    }
  }
}

TEST_P(LayerOpsTest, AddRmsNormWithAndWithoutDelta) {
  const DType dt = GetParam();
  // 16-byte rows (in registers, 1-4 chunks per thread) and others (4099).
  for (int H : {4096, 320, 8192, 12288, 4099}) {
    SCOPED_TRACE(H);
    const int T = 7;
    const float eps = 1e-5f;
    std::vector<float> res = RandomFloats(static_cast<size_t>(T) * H, 2, -2.f, 2.f);
    std::vector<float> del = RandomFloats(static_cast<size_t>(T) * H, 3);
    std::vector<float> w = RandomFloats(H, 4, 0.5f, 1.5f);
    RoundTo(&res, dt);
    RoundTo(&del, dt);
    RoundTo(&w, dt);
    for (bool with_delta : {false, true}) {
      DevArray d_res(res.size(), dt), d_del(del.size(), dt), d_w(w.size(), dt),
          d_out(res.size(), dt);
      d_res.Upload(res);
      d_del.Upload(del);
      d_w.Upload(w);
      ASSERT_OK(AddRmsNorm(d_res.get(), with_delta ? d_del.get() : nullptr, d_w.get(), d_out.get(),
                           T, H, eps, dt, stream()));
      Sync();
      std::vector<float> new_res = d_res.Download();
      std::vector<double> want(res.size());
      for (int t = 0; t < T; ++t) {
        std::vector<float> x(H);
        for (int i = 0; i < H; ++i) {
          const size_t k = static_cast<size_t>(t) * H + i;
          x[i] = with_delta ? res[k] + del[k] : res[k];
          if (dt == DType::kBF16) x[i] = testing::RoundBf16(x[i]);
          ASSERT_EQ(new_res[k], x[i]) << "residual " << t << "," << i;
        }
        double ss = 0;
        for (float v : x) ss += static_cast<double>(v) * v;
        const double inv = 1.0 / std::sqrt(ss / H + eps);
        for (int i = 0; i < H; ++i) want[static_cast<size_t>(t) * H + i] = x[i] * inv * w[i];
      }
      CheckClose(d_out.Download(), want, Tol(dt), with_delta ? "norm(x+d)" : "norm(x)");
    }
  }
}

TEST_P(LayerOpsTest, RopeRotatesHeadsAtTheirPositions) {
  const DType dt = GetParam();
  const int max_pos = 4096;
  const float theta = 10000.f;
  for (int D : {32, 64, 128}) {
    SCOPED_TRACE(D);
    const int heads = 3, T = 6;
    const int64_t stride = heads * D + 24;  // extra columns must stay untouched
    std::vector<int32_t> pos = {0, 1, 4095, -1, 777, 2048};
    std::vector<float> x = RandomFloats(static_cast<size_t>(T) * stride, 5 + D);
    RoundTo(&x, dt);
    auto table = cuda::DeviceBuffer::Create(sizeof(double2) * max_pos * (D / 2));
    ASSERT_OK(table);
    ASSERT_OK(BuildRopeTable(table->as<double2>(), max_pos, D, theta, stream()));
    DevArray d_x(x.size(), dt);
    d_x.Upload(x);
    cuda::DeviceBuffer d_pos = testing::UploadRaw(pos);
    ASSERT_OK(ApplyRope(d_x.get(), stride, heads, D, d_pos.as<int32_t>(), T, table->as<double2>(),
                        max_pos, dt, stream()));
    Sync();
    std::vector<double> want(x.begin(), x.end());
    const int half = D / 2;
    for (int t = 0; t < T; ++t) {
      if (pos[t] < 0) continue;
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const double f = std::pow(static_cast<double>(theta), -2.0 * i / D);
          const double a = static_cast<double>(pos[t]) * f;
          const size_t k = static_cast<size_t>(t) * stride + static_cast<size_t>(h) * D + i;
          const double x0 = x[k], x1 = x[k + half];
          want[k] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
          want[k + half] = static_cast<float>(x1 * std::cos(a) + x0 * std::sin(a));
        }
      }
    }
    std::vector<float> got = d_x.Download();
    CheckClose(got, want, dt == DType::kF32 ? 1e-6 : 1e-2, "rope");
    for (int t = 0; t < T; ++t) {  // untouched tail columns and padding row
      for (int64_t c = heads * D; c < stride; ++c) {
        ASSERT_EQ(got[t * stride + c], x[t * stride + c]);
      }
    }
  }
}

TEST_P(LayerOpsTest, KvWriteToSlotsSkipsNegative) {
  const DType dt = GetParam();
  const int nkv = 2, D = 64, B = 16, blocks = 8, T = 10;
  const int64_t stride = 3 * nkv * D + 8;  // k at 0, v at nkv*D, junk after
  std::vector<float> rowsv = RandomFloats(static_cast<size_t>(T) * stride, 6);
  RoundTo(&rowsv, dt);
  std::vector<int32_t> slots = {5, 127, 0, -1, 64, 33, 16, 15, -1, 100};
  DevArray d_rows(rowsv.size(), dt), kc(static_cast<size_t>(blocks) * B * nkv * D, dt),
      vc(static_cast<size_t>(blocks) * B * nkv * D, dt);
  d_rows.Upload(rowsv);
  cuda::DeviceBuffer d_slots = testing::UploadRaw(slots);
  const size_t es = DTypeSize(dt);
  ASSERT_OK(WriteKvCache(d_rows.get(), static_cast<char*>(d_rows.get()) + nkv * D * es, stride,
                         d_slots.as<int32_t>(), kc.get(), vc.get(), T, nkv, D, dt, stream()));
  Sync();
  std::vector<float> k = kc.Download(), v = vc.Download();
  std::vector<bool> written(static_cast<size_t>(blocks) * B, false);
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    for (int i = 0; i < nkv * D; ++i) {
      ASSERT_EQ(k[static_cast<size_t>(slots[t]) * nkv * D + i], rowsv[t * stride + i]);
      ASSERT_EQ(v[static_cast<size_t>(slots[t]) * nkv * D + i], rowsv[t * stride + nkv * D + i]);
    }
  }
  for (int s = 0; s < blocks * B; ++s) {
    if (!written[s]) {
      ASSERT_TRUE(std::isnan(k[static_cast<size_t>(s) * nkv * D])) << "slot " << s;
      ASSERT_TRUE(std::isnan(v[static_cast<size_t>(s) * nkv * D + nkv * D - 1])) << "slot " << s;
    }
  }
}

// The fused kernel against ApplyRope then WriteKvCache on a copy: packed
// qkv rows, padding rows (no position, no slot), a row with a slot but a
// position past the table (k cached unrotated), head_dim 64 and 128, and a
// row stride that is not a multiple of 16 bytes (the scalar copies).
TEST_P(LayerOpsTest, RopeWriteKvMatchesTheTwoCalls) {
  const DType dt = GetParam();
  const int max_pos = 2048, nq = 4, nkv = 2, B = 16, blocks = 6, T = 7;
  auto table = cuda::DeviceBuffer::Create(sizeof(double2) * max_pos * 64);
  ASSERT_OK(table);
  for (int D : {64, 128}) {
    for (int64_t extra : {0, 3}) {
      SCOPED_TRACE(::testing::Message() << "D=" << D << " extra=" << extra);
      ASSERT_OK(BuildRopeTable(table->as<double2>(), max_pos, D, 10000.f, stream()));
      const int64_t stride = (nq + 2 * nkv) * D + extra;
      std::vector<float> x = RandomFloats(static_cast<size_t>(T) * stride, 40 + D + extra);
      RoundTo(&x, dt);
      const std::vector<int32_t> pos = {5, -1, 2047, 3000, 0, 1000, 17};
      const std::vector<int32_t> slots = {3, -1, 95, 40, 0, -1, 17};
      const size_t cache = static_cast<size_t>(blocks) * B * nkv * D;
      DevArray a(x.size(), dt), b(x.size(), dt), ka(cache, dt), va(cache, dt), kb(cache, dt),
          vb(cache, dt);
      a.Upload(x);
      b.Upload(x);
      cuda::DeviceBuffer d_pos = testing::UploadRaw(pos), d_slots = testing::UploadRaw(slots);
      const size_t es = DTypeSize(dt);
      ASSERT_OK(ApplyRope(a.get(), stride, nq + nkv, D, d_pos.as<int32_t>(), T,
                          table->as<double2>(), max_pos, dt, stream()));
      ASSERT_OK(WriteKvCache(static_cast<char*>(a.get()) + nq * D * es,
                             static_cast<char*>(a.get()) + (nq + nkv) * D * es, stride,
                             d_slots.as<int32_t>(), ka.get(), va.get(), T, nkv, D, dt, stream()));
      ASSERT_OK(ApplyRopeWriteKv(b.get(), stride, nq, nkv, D, d_pos.as<int32_t>(),
                                 d_slots.as<int32_t>(), T, table->as<double2>(), max_pos, kb.get(),
                                 vb.get(), dt, stream()));
      Sync();
      auto same = [](const std::vector<float>& u, const std::vector<float>& v, const char* what) {
        ASSERT_EQ(u.size(), v.size());
        for (size_t i = 0; i < u.size(); ++i) {
          if (std::isnan(u[i]) && std::isnan(v[i])) continue;  // unwritten (poisoned) slots
          ASSERT_EQ(u[i], v[i]) << what << " element " << i;
        }
      };
      const std::vector<float> ra = a.Download(), rb = b.Download();
      same(ra, rb, "rows");
      same(ka.Download(), kb.Download(), "k cache");
      same(va.Download(), vb.Download(), "v cache");
      // Rotation happened where it should (the two paths could agree on nothing).
      ASSERT_NE(rb[0 * stride + 1], x[0 * stride + 1]);
      ASSERT_EQ(rb[1 * stride + 1], x[1 * stride + 1]);
      ASSERT_EQ(rb[3 * stride + 1], x[3 * stride + 1]);
      const std::vector<float> kc = kb.Download();
      ASSERT_EQ(kc[static_cast<size_t>(40) * nkv * D], x[3 * stride + nq * D]);  // unrotated k
      ASSERT_TRUE(std::isnan(kc[static_cast<size_t>(1) * nkv * D]));             // untouched slot
    }
  }
}

TEST_P(LayerOpsTest, SiluMul) {
  const DType dt = GetParam();
  for (int F : {1000, 1001}) {  // 16-byte chunks, and not
    SCOPED_TRACE(F);
    const int T = 5;
    std::vector<float> gu = RandomFloats(static_cast<size_t>(T) * 2 * F, 7, -6.f, 6.f);
    RoundTo(&gu, dt);
    DevArray d_gu(gu.size(), dt), d_out(static_cast<size_t>(T) * F, dt);
    d_gu.Upload(gu);
    ASSERT_OK(SiluMul(d_gu.get(), d_out.get(), T, F, dt, stream()));
    Sync();
    std::vector<double> want(static_cast<size_t>(T) * F);
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < F; ++i) {
        const double g = gu[static_cast<size_t>(t) * 2 * F + i];
        const double u = gu[static_cast<size_t>(t) * 2 * F + F + i];
        want[static_cast<size_t>(t) * F + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    CheckClose(d_out.Download(), want, Tol(dt), "silu*up");
  }
}

// Row r's deferred-norm factor 1 / sqrt(mean(x[r]^2) + eps), in double.
std::vector<double> RowFactors(const std::vector<float>& x, int rows, int hidden, float eps) {
  std::vector<double> f(rows);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < hidden; ++i) {
      const double v = x[static_cast<size_t>(r) * hidden + i];
      ss += v * v;
    }
    f[r] = 1.0 / std::sqrt(ss / hidden + eps);
  }
  return f;
}

// With a deferred norm, q, k and v of each row are scaled by the row's
// factor of the residual stream (random, rows of 16-byte chunks or not)
// before the rotation and the cache writes: against a double reference.
TEST_P(LayerOpsTest, RopeWriteKvAppliesTheDeferredNorm) {
  const DType dt = GetParam();
  const int max_pos = 2048, B = 16, blocks = 6, T = 7;
  const float eps = 1e-5f;
  auto table = cuda::DeviceBuffer::Create(sizeof(double2) * max_pos * 64);
  ASSERT_OK(table);
  // Heads (q, kv), head dim and norm width: one pass over the heads; two
  // passes (80 heads to rotate, 64 a pass at head dim 128); more 16-byte
  // units of V than the block's 512 threads (40 x 64 fp32 values).
  struct Shape {
    int nq, nkv, D, H;
  };
  for (const Shape& sh : {Shape{4, 2, 128, 4096}, Shape{4, 2, 128, 1001}, Shape{72, 8, 128, 512},
                          Shape{8, 40, 64, 333}}) {
    const int nq = sh.nq, nkv = sh.nkv, D = sh.D, H = sh.H;
    SCOPED_TRACE(::testing::Message() << "nq=" << nq << " nkv=" << nkv << " D=" << D << " H=" << H);
    ASSERT_OK(BuildRopeTable(table->as<double2>(), max_pos, D, 10000.f, stream()));
    const int64_t stride = (nq + 2 * nkv) * D;
    std::vector<float> qkv = RandomFloats(static_cast<size_t>(T) * stride, 60 + H, -4.f, 4.f);
    std::vector<float> x = RandomFloats(static_cast<size_t>(T) * H, 61 + H, -3.f, 3.f);
    RoundTo(&qkv, dt);
    RoundTo(&x, dt);
    const std::vector<int32_t> pos = {5, -1, 2047, 3000, 0, 1000, 17};
    const std::vector<int32_t> slots = {3, -1, 95, 40, 0, -1, 17};
    const size_t cache = static_cast<size_t>(blocks) * B * nkv * D;
    DevArray d_qkv(qkv.size(), dt), d_x(x.size(), dt), kc(cache, dt), vc(cache, dt);
    d_qkv.Upload(qkv);
    d_x.Upload(x);
    cuda::DeviceBuffer d_pos = testing::UploadRaw(pos), d_slots = testing::UploadRaw(slots);
    ASSERT_OK(ApplyRopeWriteKv(d_qkv.get(), stride, nq, nkv, D, d_pos.as<int32_t>(),
                               d_slots.as<int32_t>(), T, table->as<double2>(), max_pos, kc.get(),
                               vc.get(), dt, stream(), DeferredNorm{d_x.get(), H, eps}));
    Sync();
    const std::vector<double> f = RowFactors(x, T, H, eps);
    std::vector<double> want(qkv.begin(), qkv.end());
    std::vector<double> want_k(cache, 0.0), want_v(cache, 0.0);
    std::vector<bool> written(cache, false);
    const int half = D / 2;
    for (int t = 0; t < T; ++t) {
      const size_t row = static_cast<size_t>(t) * stride;
      const bool rotate = pos[t] >= 0 && pos[t] < max_pos;
      for (int h = 0; h < nq + nkv && rotate; ++h) {
        for (int i = 0; i < half; ++i) {
          const double a = static_cast<double>(pos[t]) * std::pow(10000.0, -2.0 * i / D);
          const size_t k = row + static_cast<size_t>(h) * D + i;
          const double x0 = qkv[k] * f[t], x1 = qkv[k + half] * f[t];
          want[k] = x0 * std::cos(a) - x1 * std::sin(a);
          want[k + half] = x1 * std::cos(a) + x0 * std::sin(a);
        }
      }
      if (slots[t] < 0) continue;
      for (int i = 0; i < nkv * D; ++i) {
        const size_t c = static_cast<size_t>(slots[t]) * nkv * D + i;
        const size_t k = row + static_cast<size_t>(nq) * D + i;
        want_k[c] = rotate ? want[k] : qkv[k] * f[t];
        want_v[c] = qkv[k + static_cast<size_t>(nkv) * D] * f[t];
        written[c] = true;
      }
    }
    const double tol = dt == DType::kF32 ? 1e-5 : 1e-2;
    std::vector<float> got = d_qkv.Download();
    // The q and k heads of the rows that rotate, and the untouched rows.
    std::vector<float> got_rows, got_k, got_v;
    std::vector<double> want_rows, wk, wv;
    for (int t = 0; t < T; ++t) {
      const bool rotate = pos[t] >= 0 && pos[t] < max_pos;
      for (int64_t c = 0; c < (nq + nkv) * D; ++c) {
        const size_t k = static_cast<size_t>(t) * stride + c;
        if (!rotate) {
          ASSERT_EQ(got[k], qkv[k]) << "row " << t << " column " << c;
          continue;
        }
        got_rows.push_back(got[k]);
        want_rows.push_back(want[k]);
      }
    }
    const std::vector<float> k_all = kc.Download(), v_all = vc.Download();
    for (size_t c = 0; c < cache; ++c) {
      if (!written[c]) {
        ASSERT_TRUE(std::isnan(k_all[c]) && std::isnan(v_all[c])) << "slot element " << c;
        continue;
      }
      got_k.push_back(k_all[c]);
      got_v.push_back(v_all[c]);
      wk.push_back(want_k[c]);
      wv.push_back(want_v[c]);
    }
    CheckClose(got_rows, want_rows, tol, "rotated, scaled q and k");
    CheckClose(got_k, wk, tol, "k cache");
    CheckClose(got_v, wv, tol, "v cache");
  }
}

// SiLU-and-multiply with a deferred norm: gate and up scaled by the row's
// factor, for few rows (several blocks a row) and many (one block a row).
TEST_P(LayerOpsTest, SiluMulAppliesTheDeferredNorm) {
  const DType dt = GetParam();
  const float eps = 1e-5f;
  for (int T : {5, 300}) {
    for (int F : {1000, 1001}) {
      for (int H : {512, 333}) {
        SCOPED_TRACE(::testing::Message() << "T=" << T << " F=" << F << " H=" << H);
        std::vector<float> gu = RandomFloats(static_cast<size_t>(T) * 2 * F, 70 + F, -6.f, 6.f);
        std::vector<float> x = RandomFloats(static_cast<size_t>(T) * H, 71 + H, -2.f, 2.f);
        RoundTo(&gu, dt);
        RoundTo(&x, dt);
        DevArray d_gu(gu.size(), dt), d_x(x.size(), dt), d_out(static_cast<size_t>(T) * F, dt);
        d_gu.Upload(gu);
        d_x.Upload(x);
        ASSERT_OK(SiluMul(d_gu.get(), d_out.get(), T, F, dt, stream(),
                          DeferredNorm{d_x.get(), H, eps}));
        Sync();
        const std::vector<double> f = RowFactors(x, T, H, eps);
        std::vector<double> want(static_cast<size_t>(T) * F);
        for (int t = 0; t < T; ++t) {
          for (int i = 0; i < F; ++i) {
            const double g = gu[static_cast<size_t>(t) * 2 * F + i] * f[t];
            const double u = gu[static_cast<size_t>(t) * 2 * F + F + i] * f[t];
            want[static_cast<size_t>(t) * F + i] = g / (1.0 + std::exp(-g)) * u;
          }
        }
        CheckClose(d_out.Download(), want, Tol(dt), "silu(g s) * (u s)");
      }
    }
  }
}

TEST_P(LayerOpsTest, GatherRows) {
  const DType dt = GetParam();
  for (int C : {100, 96}) {  // 96: 16-byte chunks for both types
    SCOPED_TRACE(C);
    const int R = 12, ld = 104, N = 5;
    std::vector<float> src = RandomFloats(static_cast<size_t>(R) * ld, 8);
    RoundTo(&src, dt);
    std::vector<int32_t> idx = {11, 0, 0, 7, 3};
    DevArray d_src(src.size(), dt), d_dst(static_cast<size_t>(N) * C, dt);
    d_src.Upload(src);
    cuda::DeviceBuffer d_idx = testing::UploadRaw(idx);
    ASSERT_OK(GatherRows(d_src.get(), ld, d_idx.as<int32_t>(), d_dst.get(), C, N, C, dt, stream()));
    Sync();
    std::vector<float> got = d_dst.Download();
    for (int i = 0; i < N; ++i) {
      for (int c = 0; c < C; ++c) ASSERT_EQ(got[i * C + c], src[idx[i] * ld + c]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, LayerOpsTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(i.param == DType::kF32 ? "F32" : "BF16");
                         });

class SmallOpsTest : public testing::GpuTest {};

TEST_F(SmallOpsTest, AssembleVocabShards) {
  const int tp = 3, rows = 4, vl = 50;
  std::vector<float> g = RandomFloats(static_cast<size_t>(tp) * rows * vl, 9);
  DevArray d_g(g.size(), DType::kF32), d_out(g.size(), DType::kF32);
  d_g.Upload(g);
  ASSERT_OK(AssembleVocabShards(d_g.as<float>(), d_out.as<float>(), rows, vl, tp, stream()));
  Sync();
  std::vector<float> got = d_out.Download();
  for (int r = 0; r < tp; ++r) {
    for (int i = 0; i < rows; ++i) {
      for (int c = 0; c < vl; ++c) {
        ASSERT_EQ(got[static_cast<size_t>(i) * tp * vl + r * vl + c], g[(r * rows + i) * vl + c]);
      }
    }
  }
}

TEST_F(SmallOpsTest, ForwardSampledTokens) {
  std::vector<int32_t> tokens = {10, 11, 12, 13, 14};
  std::vector<int32_t> prev = {100, 101, 102};
  std::vector<int32_t> map = {-1, 2, 0, -1, 1};
  cuda::DeviceBuffer d_t = testing::UploadRaw(tokens), d_p = testing::UploadRaw(prev),
                     d_m = testing::UploadRaw(map);
  ASSERT_OK(
      ForwardSampledTokens(d_t.as<int32_t>(), d_p.as<int32_t>(), d_m.as<int32_t>(), 5, stream()));
  Sync();
  EXPECT_EQ(testing::DownloadRaw<int32_t>(d_t.get(), 5),
            (std::vector<int32_t>{10, 102, 100, 13, 101}));
}

TEST_F(SmallOpsTest, RejectsBadShapes) {
  using symtp::testing::StatusIs;
  EXPECT_THAT(
      AddRmsNorm(nullptr, nullptr, nullptr, nullptr, 1, 20000, 1e-5f, DType::kF32, stream()),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(ApplyRope(nullptr, 10, 1, 31, nullptr, 1, nullptr, 16, DType::kF32, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(SiluMul(nullptr, nullptr, 1, 4, DType::kF16, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("dtype")));
}

}  // namespace
}  // namespace symtp::kernels

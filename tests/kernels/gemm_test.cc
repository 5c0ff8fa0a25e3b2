// The GEMMs against a double reference: cuBLASLt's wrapper (fp32 is true
// fp32, no TF32; bf16 -> bf16 and bf16 -> fp32, contiguous and strided) and
// Gemv, the project's weight-streaming kernel for decode's fewest rows.
#include "kernels/ops/gemm.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "common/status_macros.h"
#include "kernels/ops/layer_ops.h"
#include "tests/kernels/gpu_test_util.h"

namespace symtp::kernels {
namespace {

using symtp::testing::StatusIs;
using testing::DevArray;

// C[i, j] = sum_k A[i, k] W[j, k] in double, row-major M x N.
std::vector<double> ReferenceGemm(const std::vector<float>& a, int64_t lda,
                                  const std::vector<float>& w, int64_t ldw, int64_t M, int64_t N,
                                  int64_t K) {
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(a[i * lda + k]) * w[j * ldw + k];
      c[i * N + j] = s;
    }
  }
  return c;
}

// The arguments of C[M, N] = A · Wᵀ over device arrays with row strides.
GemmArgs StridedArgs(const DevArray& a, const DevArray& w, DevArray& c, int64_t M, int64_t N,
                     int64_t K, int64_t lda, int64_t ldw, int64_t ldc, DType in, DType out) {
  GemmArgs g = ContiguousGemmArgs(a.get(), w.get(), c.get(), M, N, K, in, nullptr, 0);
  g.lda = lda;
  g.ldw = ldw;
  g.ldc = ldc;
  g.out_dtype = out;
  return g;
}

class GemmTest : public testing::GpuTest {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    if (IsSkipped()) return;
    auto h = CublasLtHandle::Create();
    ASSERT_OK(h);
    handle_ = std::move(*h);
    auto ws = cuda::DeviceBuffer::Create(kGemmWorkspaceBytes);
    ASSERT_OK(ws);
    ws_ = std::move(*ws);
    testing::FinishHostCopies();
  }

  void Check(int64_t M, int64_t N, int64_t K, DType in, DType out, int64_t pad) {
    CheckStrided(M, N, K, K + pad, K + pad, N + pad, in, out);
  }

  void CheckStrided(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldw, int64_t ldc,
                    DType in, DType out) {
    SCOPED_TRACE(::testing::Message()
                 << "M=" << M << " N=" << N << " K=" << K << " " << DTypeName(in) << "->"
                 << DTypeName(out) << " lda/ldw/ldc=" << lda << "/" << ldw << "/" << ldc);
    std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * lda), M * 31 + K);
    std::vector<float> w = testing::RandomFloats(static_cast<size_t>(N * ldw), N * 17 + K);
    testing::RoundTo(&a, in);
    testing::RoundTo(&w, in);
    DevArray da(a.size(), in), dw(w.size(), in), dc(static_cast<size_t>(M * ldc), out);
    da.Upload(a);
    dw.Upload(w);
    GemmArgs g = StridedArgs(da, dw, dc, M, N, K, lda, ldw, ldc, in, out);
    g.workspace = ws_.get();
    g.workspace_bytes = ws_.bytes();
    ASSERT_OK(Gemm(handle_, g, stream()));
    Sync();
    const std::vector<float> c = dc.Download();
    const std::vector<double> want = ReferenceGemm(a, lda, w, ldw, M, N, K);
    std::vector<float> got;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) got.push_back(c[i * ldc + j]);
      for (int64_t j = N; j < ldc; ++j) {
        ASSERT_TRUE(std::isnan(c[i * ldc + j])) << "padding column written";
      }
    }
    const double tol = out == DType::kBF16 ? 1e-2 : in == DType::kBF16 ? 1e-4 : 1e-5;
    testing::CheckClose(got, want, tol, "gemm");
  }

  CublasLtHandle handle_;
  cuda::DeviceBuffer ws_;
};

TEST_F(GemmTest, Fp32IsTrueFp32) {
  for (int64_t M : {1, 7, 64, 300}) Check(M, 384, 256, DType::kF32, DType::kF32, 0);
  Check(33, 200, 1000, DType::kF32, DType::kF32, 8);
}

TEST_F(GemmTest, Bf16ToBf16) {
  for (int64_t M : {1, 8, 128, 257}) Check(M, 512, 512, DType::kBF16, DType::kBF16, 0);
  Check(19, 264, 136, DType::kBF16, DType::kBF16, 8);
}

TEST_F(GemmTest, Bf16ToFp32Logits) {
  for (int64_t M : {1, 5, 64}) Check(M, 1000, 256, DType::kBF16, DType::kF32, 0);
}

// accumulate: C = A · Wᵀ + C, the random C read back from where the
// product goes (bf16 and fp32 out, with and without the workspace).
TEST_F(GemmTest, AccumulateAddsTheProductToC) {
  for (DType out : {DType::kBF16, DType::kF32}) {
    for (int64_t M : {8, 300}) {
      const int64_t N = 512, K = 256;
      SCOPED_TRACE(::testing::Message() << "M=" << M << " " << DTypeName(out));
      std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * K), 91 + M);
      std::vector<float> w = testing::RandomFloats(static_cast<size_t>(N * K), 92);
      std::vector<float> c0 = testing::RandomFloats(static_cast<size_t>(M * N), 93, -8.f, 8.f);
      testing::RoundTo(&a, DType::kBF16);
      testing::RoundTo(&w, DType::kBF16);
      testing::RoundTo(&c0, out);
      DevArray da(a.size(), DType::kBF16), dw(w.size(), DType::kBF16), dc(c0.size(), out);
      da.Upload(a);
      dw.Upload(w);
      dc.Upload(c0);
      GemmArgs g = StridedArgs(da, dw, dc, M, N, K, K, K, N, DType::kBF16, out);
      g.accumulate = true;
      if (M > 128) {
        g.workspace = ws_.get();
        g.workspace_bytes = ws_.bytes();
      }
      ASSERT_OK(Gemm(handle_, g, stream()));
      Sync();
      std::vector<double> want = ReferenceGemm(a, K, w, K, M, N, K);
      for (size_t i = 0; i < want.size(); ++i) want[i] += c0[i];
      testing::CheckClose(dc.Download(), want, out == DType::kBF16 ? 1e-2 : 1e-4, "A W^T + C");
    }
  }
}

TEST_F(GemmTest, PlansAreCachedAndZeroRowsIsNoop) {
  Check(16, 128, 128, DType::kBF16, DType::kBF16, 0);
  const size_t n = handle_.cached_plans();
  Check(16, 128, 128, DType::kBF16, DType::kBF16, 0);
  EXPECT_EQ(handle_.cached_plans(), n);
  EXPECT_OK(Gemm(handle_, nullptr, nullptr, nullptr, 0, 128, 128, DType::kBF16, ws_.get(),
                 ws_.bytes(), stream()));
}

TEST_F(GemmTest, RejectsBadArguments) {
  using symtp::testing::StatusIs;
  GemmArgs g;
  g.m = 4;
  g.n = 4;
  g.k = 8;
  g.lda = 4;  // < k
  EXPECT_THAT(Gemm(handle_, g, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("shape")));
  g.lda = 0;
  g.in_dtype = DType::kF32;
  g.out_dtype = DType::kBF16;
  EXPECT_THAT(Gemm(handle_, g, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("dtype")));
  g.in_dtype = g.out_dtype = DType::kBF16;
  g.a_rms_eps = 1e-5f;  // the GEMV's alone
  EXPECT_THAT(Gemm(handle_, g, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("a_rms_eps")));
  g.a_rms_eps = -1.f;
  g.in_dtype = DType::kF32;
  CublasLtHandle empty;
  EXPECT_THAT(Gemm(empty, g, stream()),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

// Gemv against the double reference: every M it takes, each of its thread
// shapes (K up to 2048, 4096, 8192, 16384, with units left over), N below and
// above the grid, strided operands, both output dtypes; run twice, bitwise
// the same.
class GemvTest : public testing::GpuTest {
 protected:
  void Check(int64_t M, int64_t N, int64_t K, DType out, int64_t pad) {
    SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K << " -> "
                                      << DTypeName(out) << " pad=" << pad);
    const int64_t lda = K + pad, ldw = K + pad, ldc = N + pad;
    std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * lda), M * 7 + K);
    std::vector<float> w = testing::RandomFloats(static_cast<size_t>(N * ldw), N * 13 + K);
    testing::RoundTo(&a, DType::kBF16);
    testing::RoundTo(&w, DType::kBF16);
    DevArray da(a.size(), DType::kBF16), dw(w.size(), DType::kBF16),
        dc(static_cast<size_t>(M * ldc), out);
    da.Upload(a);
    dw.Upload(w);
    const GemmArgs g = StridedArgs(da, dw, dc, M, N, K, lda, ldw, ldc, DType::kBF16, out);
    ASSERT_TRUE(GemvSupports(g));
    ASSERT_OK(Gemv(g, stream()));
    Sync();
    auto columns = [&](const std::vector<float>& cc) {
      std::vector<float> v;
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) v.push_back(cc[i * ldc + j]);
        for (int64_t j = N; j < ldc; ++j) {
          EXPECT_TRUE(std::isnan(cc[i * ldc + j])) << "padding column written";
        }
      }
      return v;
    };
    const std::vector<float> got = columns(dc.Download());
    testing::CheckClose(got, ReferenceGemm(a, lda, w, ldw, M, N, K),
                        out == DType::kBF16 ? 1e-2 : 1e-4, "gemv");
    ASSERT_OK(Gemv(g, stream()));
    Sync();
    EXPECT_EQ(columns(dc.Download()), got) << "not deterministic";
  }
};

TEST_F(GemvTest, MatchesReference) {
  for (int64_t M : {1, 2, 3, 4}) Check(M, 300, 4096, DType::kBF16, 0);
  Check(1, 1, 64, DType::kBF16, 0);        // one row, one block
  Check(2, 37, 2048, DType::kBF16, 8);     // fewer rows than the grid, strided
  Check(3, 1000, 3000, DType::kBF16, 16);  // units left over in the last pass
  Check(2, 1000, 3000, DType::kBF16, 8);   // 1-2 rows: 512 threads, units left over
  Check(4, 96, 7168, DType::kBF16, 0);     // 512 threads, two units each
  Check(3, 130, 1024, DType::kBF16, 8);    // 256 threads, one unit each
  Check(1, 64, 14336, DType::kBF16, 8);    // four units each
  Check(2, 200, 7176, DType::kBF16, 8);    // 1-2 rows from 4096 to 8192, units left over
  Check(2, 70, 16384, DType::kBF16, 0);    // the longest rows
  Check(2, 20000, 256, DType::kBF16, 0);   // many rows per block: several flushes
}

TEST_F(GemvTest, Fp32Logits) {
  for (int64_t M : {1, 4}) {
    for (int64_t K : {512, 4096}) Check(M, 1008, K, DType::kF32, 0);
  }
}

// Gemv with A's row factors (a_rms_eps) and with + C (accumulate), alone and
// together: C = f_i (A W^T) + C0 with f_i = 1 / sqrt(mean(A[i]^2) + eps),
// against the double reference, over each thread shape.
TEST_F(GemvTest, RowFactorsAndAccumulate) {
  const float eps = 1e-5f;
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 300, 4096},
                                {2, 1000, 2048},
                                {1, 500, 3000},
                                {2, 200, 7176},
                                {3, 130, 3000},
                                {4, 96, 7168},
                                {2, 64, 14336}}) {
    for (const auto& [scale, acc] : {std::pair{true, false}, {false, true}, {true, true}}) {
      SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K
                                        << " scale=" << scale << " accumulate=" << acc);
      std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * K), M * 5 + K, -3, 3);
      std::vector<float> w = testing::RandomFloats(static_cast<size_t>(N * K), N * 11 + K);
      std::vector<float> c0 = testing::RandomFloats(static_cast<size_t>(M * N), 17, -8.f, 8.f);
      testing::RoundTo(&a, DType::kBF16);
      testing::RoundTo(&w, DType::kBF16);
      testing::RoundTo(&c0, DType::kBF16);
      DevArray da(a.size(), DType::kBF16), dw(w.size(), DType::kBF16), dc(c0.size(), DType::kBF16);
      da.Upload(a);
      dw.Upload(w);
      dc.Upload(c0);
      GemmArgs g =
          ContiguousGemmArgs(da.get(), dw.get(), dc.get(), M, N, K, DType::kBF16, nullptr, 0);
      if (scale) g.a_rms_eps = eps;
      g.accumulate = acc;
      ASSERT_TRUE(GemvSupports(g));
      ASSERT_OK(Gemv(g, stream()));
      Sync();
      std::vector<double> want = ReferenceGemm(a, K, w, K, M, N, K);
      for (int64_t i = 0; i < M; ++i) {
        double ss = 0;
        for (int64_t k = 0; k < K; ++k) ss += static_cast<double>(a[i * K + k]) * a[i * K + k];
        const double f = scale ? 1.0 / std::sqrt(ss / K + eps) : 1.0;
        for (int64_t j = 0; j < N; ++j) {
          want[i * N + j] = f * want[i * N + j] + (acc ? c0[i * N + j] : 0.0);
        }
      }
      testing::CheckClose(dc.Download(), want, 1e-2, "f A W^T (+ C)");
    }
  }
}

// GemvSwiGlu is bitwise Gemv into [m, 2 F] then SiluMul: every M, each K
// form, units left over, F below and above the grid, a strided C.
TEST_F(GemvTest, SwiGluEqualsGemvThenSiluMul) {
  for (const auto& [M, F, K, pad, eps] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, float>{1, 7168, 4096, 0, -1.f},
        {2, 300, 2048, 8, -1.f},
        {3, 1000, 3000, 0, -1.f},
        {4, 96, 7168, 16, -1.f},
        {4, 5000, 1024, 0, -1.f},
        {1, 7168, 4096, 0, 1e-5f},  // with A's row factors (a_rms_eps) in both
        {2, 300, 3000, 8, 1e-5f},
        {3, 1000, 3000, 8, 1e-5f},
        {4, 96, 7168, 0, 1e-5f}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << M << " F=" << F << " K=" << K << " pad=" << pad
                                      << " a_rms_eps=" << eps);
    std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * K), M * 3 + K);
    std::vector<float> w = testing::RandomFloats(static_cast<size_t>(2 * F * K), F * 7 + K);
    DevArray da(a.size(), DType::kBF16), dw(w.size(), DType::kBF16), dgu(M * 2 * F, DType::kBF16),
        dref(M * F, DType::kBF16), dc(M * (F + pad), DType::kBF16);
    da.Upload(a);
    dw.Upload(w);
    GemmArgs gs =
        ContiguousGemmArgs(da.get(), dw.get(), dgu.get(), M, 2 * F, K, DType::kBF16, nullptr, 0);
    gs.a_rms_eps = eps;
    ASSERT_OK(Gemv(gs, stream()));
    ASSERT_OK(SiluMul(dgu.get(), dref.get(), M, F, DType::kBF16, stream()));
    GemmArgs g =
        ContiguousGemmArgs(da.get(), dw.get(), dc.get(), M, 2 * F, K, DType::kBF16, nullptr, 0);
    g.ldc = F + pad;
    g.a_rms_eps = eps;
    ASSERT_TRUE(GemvSwiGluSupports(g));
    ASSERT_OK(GemvSwiGlu(g, stream()));
    Sync();
    const std::vector<float> want = dref.Download(), all = dc.Download();
    std::vector<float> got;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < F; ++j) got.push_back(all[i * (F + pad) + j]);
      for (int64_t j = F; j < F + pad; ++j) {
        EXPECT_TRUE(std::isnan(all[i * (F + pad) + j])) << "padding column written";
      }
    }
    EXPECT_EQ(got, want);
    double rms = 0;
    for (float v : want) rms += static_cast<double>(v) * v;
    EXPECT_GT(rms, 0.0) << "an all-zero activation would prove nothing";
  }
  GemmArgs odd;
  DevArray buf(1 << 16, DType::kBF16);
  odd.a = odd.w = odd.c = buf.get();
  odd.m = 2;
  odd.n = 63;  // gate and up rows must pair up
  odd.k = 64;
  EXPECT_FALSE(GemvSwiGluSupports(odd));
  EXPECT_THAT(GemvSwiGlu(odd, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("GemvSwiGlu")));
  odd.n = 64;
  EXPECT_TRUE(GemvSwiGluSupports(odd));
  odd.accumulate = true;  // C is the activation, not a sum to add to
  EXPECT_FALSE(GemvSwiGluSupports(odd));
}

// GemvPush on one GPU, its "peers" two local buffers: C is bitwise Gemv's
// (the thread shape never depends on the epilogue), and each 16-byte unit of
// C went to both slots of this rank, as two LL lines {lo, epoch, hi, epoch}
// with the call's epoch (the one read + 1), in that epoch's half; every form
// of K, 1-4 rows.
TEST_F(GemvTest, PushStoresGemvsBitsAndSendsThemAsLines) {
  constexpr int64_t N = 1024;
  constexpr int kSize = 2, kRank = 1;
  constexpr uint32_t kEpoch = 6;  // the call sends epoch 7: odd half
  for (const int64_t K : {1024, 4096, 7168, 14336}) {
    for (int64_t M = 1; M <= (K > 8192 ? 2 : 4); ++M) {
      SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K);
      std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * K), M + K);
      std::vector<float> w = testing::RandomFloats(static_cast<size_t>(N * K), 3 * K + 1);
      DevArray da(a.size(), DType::kBF16), dw(w.size(), DType::kBF16), dc1(M * N, DType::kBF16),
          dc2(M * N, DType::kBF16), depoch(1, DType::kF32);
      da.Upload(a);
      dw.Upload(w);
      ASSERT_EQ(cudaMemcpy(depoch.get(), &kEpoch, 4, cudaMemcpyHostToDevice), cudaSuccess);
      const size_t lines = static_cast<size_t>(M * N / 4);
      const size_t words = 2 * kSize * lines * 4;  // both epoch halves, 16-byte lines
      DevArray slot0(words, DType::kF32), slot1(words, DType::kF32);
      const GemmArgs g1 = ContiguousGemmArgs(da.get(), dw.get(), dc1.get(), M, N, K,
                                             DType::kBF16, nullptr, 0);
      GemmArgs g2 = g1;
      g2.c = dc2.get();
      LLPush push;
      push.dst[0] = static_cast<char*>(slot0.get());
      push.dst[1] = static_cast<char*>(slot1.get());
      push.epoch = depoch.as<uint32_t>();
      push.lines = lines;
      push.rank = kRank;
      push.size = kSize;
      ASSERT_OK(Gemv(g1, stream()));
      ASSERT_OK(GemvPush(g2, push, stream()));
      Sync();
      std::vector<uint16_t> c1(M * N), c2(M * N);
      ASSERT_EQ(cudaMemcpy(c1.data(), dc1.get(), 2 * c1.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(c2.data(), dc2.get(), 2 * c2.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(c1, c2) << "GemvPush's C is not Gemv's";
      const size_t base = ((kEpoch + 1) % 2 * kSize + kRank) * lines;  // in lines
      for (const DevArray* slot : {&slot0, &slot1}) {
        std::vector<uint32_t> got(words);
        ASSERT_EQ(cudaMemcpy(got.data(), slot->get(), 4 * words, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        size_t bad = 0;
        for (size_t unit = 0; unit < static_cast<size_t>(M * N / 8); ++unit) {
          uint32_t d[4];
          std::memcpy(d, &c1[8 * unit], 16);
          const uint32_t* l = &got[4 * (base + 2 * unit)];
          bad += l[0] != d[0] || l[1] != kEpoch + 1 || l[2] != d[1] || l[3] != kEpoch + 1 ||
                 l[4] != d[2] || l[5] != kEpoch + 1 || l[6] != d[3] || l[7] != kEpoch + 1;
        }
        EXPECT_EQ(bad, 0u) << "units sent wrong";
      }
    }
  }
}

TEST_F(GemvTest, RejectsWhatItDoesNotTake) {
  GemmArgs g;
  DevArray buf(1 << 16, DType::kBF16);
  g.a = g.w = g.c = buf.get();
  g.m = 4;
  g.n = 64;
  g.k = 64;
  EXPECT_TRUE(GemvSupports(g));
  for (auto bad : std::vector<std::function<void(GemmArgs&)>>{
           [](GemmArgs& x) { x.m = kGemvMaxRows + 1; }, [](GemmArgs& x) { x.m = 0; },
           [](GemmArgs& x) { x.k = 60; }, [](GemmArgs& x) { x.k = kGemvMaxK + 8; },
           [](GemmArgs& x) { x.k = 8200; },  // m = 4: at most 8192
           [](GemmArgs& x) { x.in_dtype = x.out_dtype = DType::kF32; },
           [](GemmArgs& x) { x.lda = 68; }, [](GemmArgs& x) { x.ldc = 32; },
           [](GemmArgs& x) { x.w = static_cast<const char*>(x.w) + 2; }}) {
    GemmArgs x = g;
    bad(x);
    EXPECT_FALSE(GemvSupports(x));
    EXPECT_THAT(Gemv(x, stream()),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("Gemv")));
  }
}

}  // namespace
}  // namespace symtp::kernels

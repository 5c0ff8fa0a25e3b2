// cuBLASLt GEMM wrapper: C = A · Wᵀ against a double reference, fp32 (true
// fp32, no TF32), bf16 -> bf16 and bf16 -> fp32, contiguous and strided.
#include "kernels/ops/gemm.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/status_macros.h"
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

  void Check(int64_t M, int64_t N, int64_t K, DType in, DType out, int64_t pad,
             int sm_count_target = 0) {
    CheckStrided(M, N, K, K + pad, K + pad, N + pad, in, out, sm_count_target);
  }

  void CheckStrided(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldw, int64_t ldc,
                    DType in, DType out, int sm_count_target) {
    SCOPED_TRACE(::testing::Message()
                 << "M=" << M << " N=" << N << " K=" << K << " " << DTypeName(in) << "->"
                 << DTypeName(out) << " lda/ldw/ldc=" << lda << "/" << ldw << "/" << ldc
                 << " sm_count_target=" << sm_count_target);
    std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * lda), M * 31 + K);
    std::vector<float> w = testing::RandomFloats(static_cast<size_t>(N * ldw), N * 17 + K);
    testing::RoundTo(&a, in);
    testing::RoundTo(&w, in);
    DevArray da(a.size(), in), dw(w.size(), in), dc(static_cast<size_t>(M * ldc), out);
    da.Upload(a);
    dw.Upload(w);
    GemmArgs g;
    g.a = da.get();
    g.w = dw.get();
    g.c = dc.get();
    g.m = M;
    g.n = N;
    g.k = K;
    g.lda = lda;
    g.ldw = ldw;
    g.ldc = ldc;
    g.in_dtype = in;
    g.out_dtype = out;
    g.workspace = ws_.get();
    g.workspace_bytes = ws_.bytes();
    g.sm_count_target = sm_count_target;
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

TEST_F(GemmTest, PlansAreCachedAndZeroRowsIsNoop) {
  Check(16, 128, 128, DType::kBF16, DType::kBF16, 0);
  const size_t n = handle_.cached_plans();
  Check(16, 128, 128, DType::kBF16, DType::kBF16, 0);
  EXPECT_EQ(handle_.cached_plans(), n);
  EXPECT_OK(Gemm(handle_, nullptr, nullptr, nullptr, 0, 128, 128, DType::kBF16, ws_.get(),
                 ws_.bytes(), stream()));
}

// GemmArgs::sm_count_target (the bucketed all-reduce's GEMMs leave SMs to
// it) plans its own algorithm and still computes the product.
TEST_F(GemmTest, SmCountTargetMatchesReference) {
  for (int sms : {8, 100}) Check(64, 512, 1024, DType::kBF16, DType::kBF16, 0, sms);
  Check(64, 512, 1024, DType::kBF16, DType::kBF16, 0);
  EXPECT_EQ(handle_.cached_plans(), 3u);
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
  CublasLtHandle empty;
  EXPECT_THAT(Gemm(empty, g, stream()),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

}  // namespace
}  // namespace symtp::kernels

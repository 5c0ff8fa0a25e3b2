// cuBLASLt GEMM wrapper: C = A · Wᵀ against a double reference, fp32 (true
// fp32, no TF32), bf16 -> bf16 and bf16 -> fp32, contiguous and strided.
#include "kernels/ops/gemm.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "kernels/ops/gemm_skinny.h"
#include "kernels/ops/gemm_sm90.h"
#include "kernels/ops/gemm_streamk.h"
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
    auto counters = cuda::DeviceBuffer::Create(kCounters * sizeof(unsigned int));
    ASSERT_OK(counters);
    counters_ = std::move(*counters);
    ASSERT_EQ(cudaMemset(counters_.get(), 0, counters_.bytes()), cudaSuccess);
    testing::FinishHostCopies();
  }

  void Check(int64_t M, int64_t N, int64_t K, DType in, DType out, int64_t pad) {
    CheckStrided(M, N, K, K + pad, K + pad, N + pad, in, out);
  }

  // A bf16 product of contiguous operands with the fixture's workspace.
  GemmArgs Args(const void* a, const void* w, void* c, int64_t M, int64_t N, int64_t K) const {
    GemmArgs g;
    g.a = a;
    g.w = w;
    g.c = c;
    g.m = M;
    g.n = N;
    g.k = K;
    g.workspace = ws_.get();
    g.workspace_bytes = ws_.bytes();
    return g;
  }

  // Random bf16-representable A[M, K] and W[N, K], on the host and uploaded.
  struct Operands {
    std::vector<float> a, w;
    DevArray da, dw;
  };
  static Operands RandomBf16Operands(int64_t M, int64_t N, int64_t K, uint64_t seed) {
    Operands o;
    o.a = testing::RandomFloats(M * K, seed);
    o.w = testing::RandomFloats(N * K, seed + 1);
    testing::RoundTo(&o.a, DType::kBF16);
    testing::RoundTo(&o.w, DType::kBF16);
    o.da = DevArray(o.a.size(), DType::kBF16);
    o.dw = DevArray(o.w.size(), DType::kBF16);
    o.da.Upload(o.a);
    o.dw.Upload(o.w);
    return o;
  }

  // With a plan: LaunchSm90Gemm directly, else Gemm() (handle_'s choice).
  void CheckStrided(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldw, int64_t ldc,
                    DType in, DType out, const Sm90GemmPlan* plan = nullptr,
                    const Sm90GemmProbe* probe = nullptr) {
    SCOPED_TRACE(::testing::Message()
                 << "M=" << M << " N=" << N << " K=" << K << " " << DTypeName(in) << "->"
                 << DTypeName(out) << " lda/ldw/ldc=" << lda << "/" << ldw << "/" << ldc
                 << (plan ? " " + plan->ToString() : std::string()));
    std::vector<float> a = testing::RandomFloats(static_cast<size_t>(M * lda), M * 31 + K);
    std::vector<float> w = testing::RandomFloats(static_cast<size_t>(N * ldw), N * 17 + K);
    testing::RoundTo(&a, in);
    testing::RoundTo(&w, in);
    DevArray da(a.size(), in), dw(w.size(), in), dc(static_cast<size_t>(M * ldc), out);
    da.Upload(a);
    dw.Upload(w);
    GemmArgs g = Args(da.get(), dw.get(), dc.get(), M, N, K);
    g.lda = lda;
    g.ldw = ldw;
    g.ldc = ldc;
    g.in_dtype = in;
    g.out_dtype = out;
    if (expect_skinny_) {
      ASSERT_TRUE(SkinnyGemmSupported(g)) << "the weight-streaming kernel";
    }
    if (launch_) {
      ASSERT_OK(launch_(g));
    } else if (plan != nullptr) {
      ASSERT_OK(LaunchSm90Gemm(g, *plan, stream(), counters_.as<unsigned int>(), kCounters, probe));
    } else {
      ASSERT_OK(Gemm(handle_, g, stream()));
    }
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

  // The global split-K's tile counters must be zero again after every launch.
  void ExpectCountersZero() {
    std::vector<unsigned int> h(kCounters);
    ASSERT_EQ(cudaMemcpy(h.data(), counters_.get(), counters_.bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int64_t i = 0; i < kCounters; ++i) ASSERT_EQ(h[i], 0u) << "counter " << i;
  }

  static constexpr int64_t kCounters = 4096;
  bool expect_skinny_ = false;  // CheckStrided asserts that the skinny kernel takes the call
  // Set: CheckStrided launches through it (instead of a plan or Gemm()).
  std::function<absl::Status(const GemmArgs&)> launch_;
  CublasLtHandle handle_;
  cuda::DeviceBuffer ws_;
  cuda::DeviceBuffer counters_;
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

TEST_F(GemmTest, AutotunedPlansMatchTheReference) {
  // Each shape times up to 8 candidates once (they all write C; in CUDA
  // graphs of 10 calls or one eager call each), then the checked call runs
  // the fastest: the result must still be right, and the padding columns
  // untouched by every candidate.
  EXPECT_EQ(handle_.autotune_timing(), GemmAutotuneTiming::kGraph);
  for (const GemmAutotuneTiming timing : {GemmAutotuneTiming::kGraph, GemmAutotuneTiming::kEager}) {
    SCOPED_TRACE(timing == GemmAutotuneTiming::kGraph ? "graph timing" : "eager timing");
    auto h = CublasLtHandle::Create();
    ASSERT_OK(h);
    handle_ = std::move(*h);  // no plans cached
    handle_.set_autotune_candidates(8);
    handle_.set_autotune_timing(timing);
    EXPECT_EQ(handle_.autotune_candidates(), 8);
    EXPECT_EQ(handle_.autotune_timing(), timing);
    Check(256, 1024, 512, DType::kBF16, DType::kBF16, 0);
    Check(19, 264, 136, DType::kBF16, DType::kBF16, 8);
    Check(64, 1000, 256, DType::kBF16, DType::kF32, 0);
    Check(33, 200, 1000, DType::kF32, DType::kF32, 8);
    EXPECT_EQ(handle_.cached_plans(), 4u);
  }
}

TEST_F(GemmTest, AutotuneInsideAStreamCaptureTakesTheHeuristic) {
  // Planning a new shape while a graph is being captured must not run (and
  // so record) the candidates; the replayed graph computes the product.
  handle_.set_autotune_candidates(8);
  const int64_t M = 48, N = 256, K = 128;
  const Operands op = RandomBf16Operands(M, N, K, 5);
  DevArray dc(M * N, DType::kBF16);
  const testing::CapturedGraph graph(stream(), [&] {
    return Gemm(handle_, op.da.get(), op.dw.get(), dc.get(), M, N, K, DType::kBF16, ws_.get(),
                ws_.bytes(), stream());
  });
  ASSERT_TRUE(graph.ok());
  ASSERT_EQ(graph.Launch(stream()), cudaSuccess);
  Sync();
  const std::vector<float> c = dc.Download();
  testing::CheckClose(c, ReferenceGemm(op.a, K, op.w, K, M, N, K), 1e-2,
                      "gemm captured with autotune on");
}

// The sm_90a kernel (gemm_sm90.h): tails in every dimension (M not a
// multiple of the 128/256-row tile, N of 128, K of 64), padded strides, one
// and several M tiles, split counts from the planner.
TEST_F(GemmTest, Sm90KernelMatchesReference) {
  if (!Sm90GemmDeviceSupported()) GTEST_SKIP() << "the sm_90a GEMM needs a compute capability 9.0 GPU";
  handle_.set_kernel_choice(GemmKernelChoice::kSm90);
  EXPECT_EQ(handle_.kernel_choice(), GemmKernelChoice::kSm90);
  const std::tuple<int64_t, int64_t, int64_t, int64_t> shapes[] = {
      {1, 128, 64, 0},   {37, 200, 136, 8},   {128, 384, 512, 0}, {129, 256, 1024, 0},
      {256, 1024, 2048, 0}, {300, 520, 264, 16}, {512, 640, 4096, 0}, {19, 131, 72, 5}};
  for (const auto& [M, N, K, pad] : shapes) {
    // pad 5 leaves strides the kernel cannot take: Gemm() falls back to cuBLASLt.
    CheckStrided(M, N, K, K + pad, K + pad, N + pad, DType::kBF16, DType::kBF16);
  }
  // Outputs it does not take (fp32 logits) go to cuBLASLt.
  Check(64, 1000, 256, DType::kBF16, DType::kF32, 0);
}

TEST_F(GemmTest, Sm90EveryPlanMatchesReference) {
  if (!Sm90GemmDeviceSupported()) GTEST_SKIP() << "the sm_90a GEMM needs a compute capability 9.0 GPU";
  // 16 K steps: every split count 1-8 (uneven shares for 3, 5, 6, 7); tile
  // heights 128 (two M tiles) and 256 (one, partly empty).
  // Both reductions: in a cluster, and through the workspace (cooperative).
  for (int m_sub : {1, 2}) {
    for (int splits = 1; splits <= 8; ++splits) {
      for (bool global : {false, true}) {
        const Sm90GemmPlan plan{m_sub, splits, global};
        CheckStrided(200, 392, 1000, 1000, 1000, 400, DType::kBF16, DType::kBF16, &plan);
      }
    }
  }
  ExpectCountersZero();
}

TEST_F(GemmTest, Sm90IsDeterministicAndCapturable) {
  if (!Sm90GemmDeviceSupported()) GTEST_SKIP() << "the sm_90a GEMM needs a compute capability 9.0 GPU";
  handle_.set_kernel_choice(GemmKernelChoice::kSm90);
  const int64_t M = 256, N = 2048, K = 4096;
  const Operands op = RandomBf16Operands(M, N, K, 11);
  DevArray dc(M * N, DType::kBF16), dc2(M * N, DType::kBF16), dc3(M * N, DType::kBF16);
  const std::vector<double> want = ReferenceGemm(op.a, K, op.w, K, M, N, K);
  // Eager, the planner's pick; then the same call captured and replayed.
  ASSERT_OK(Gemm(handle_, op.da.get(), op.dw.get(), dc.get(), M, N, K, DType::kBF16, ws_.get(),
                 ws_.bytes(), stream()));
  // A global split-K plan captured with its own counters, replayed twice.
  const GemmArgs g = Args(op.da.get(), op.dw.get(), dc3.get(), M, N, K);
  const Sm90GemmPlan global{2, 8, true};  // 8 tiles x 8 splits, one cooperative wave
  const testing::CapturedGraph graph(stream(), [&]() -> absl::Status {
    SYMTP_RETURN_IF_ERROR(Gemm(handle_, op.da.get(), op.dw.get(), dc2.get(), M, N, K, DType::kBF16,
                               ws_.get(), ws_.bytes(), stream()));
    return LaunchSm90Gemm(g, global, stream(), counters_.as<unsigned int>(), kCounters);
  });
  ASSERT_TRUE(graph.ok());
  ASSERT_EQ(graph.Launch(stream()), cudaSuccess);
  Sync();
  const std::vector<float> c3_first = dc3.Download();
  ASSERT_EQ(graph.Launch(stream()), cudaSuccess);
  Sync();
  const std::vector<float> c = dc.Download(), c2 = dc2.Download(), c3 = dc3.Download();
  testing::CheckClose(c, want, 1e-2, "sm90 gemm, planner's pick");
  testing::CheckClose(c3, want, 1e-2, "sm90 gemm, global split-K in a graph");
  // The split-K partials are summed in a fixed order: same bits every run.
  EXPECT_EQ(std::memcmp(c.data(), c2.data(), c.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(c3.data(), c3_first.data(), c3.size() * sizeof(float)), 0);
  ExpectCountersZero();
}

// The weight-streaming kernel (M <= 32): every token-group count, N with a
// partial 64-row tile, K in one slice (direct stores: many tiles, the last
// shape on an H200) and in 2-64 slices (partials summed by the tile's last
// item), strided operands with untouched padding columns.
TEST_F(GemmTest, SkinnyMatchesReference) {
  handle_.set_skinny_max_m(32);
  expect_skinny_ = true;
  struct Shape {
    int64_t m, n, k, pad;
  };
  for (const Shape& s :
       {Shape{1, 64, 512, 0}, Shape{5, 200, 1024, 8}, Shape{8, 130, 4096, 0},
        Shape{13, 1000, 2048, 16}, Shape{16, 64, 14336, 0}, Shape{32, 768, 4096, 0},
        Shape{32, 333, 7168, 8}, Shape{27, 4096, 512, 0}}) {
    CheckStrided(s.m, s.n, s.k, s.k + s.pad, s.k + s.pad, s.n + s.pad, DType::kBF16, DType::kBF16);
  }
  // Past its limits the call goes to cuBLASLt (and is still right).
  expect_skinny_ = false;
  GemmArgs g = Args(ws_.get(), ws_.get(), ws_.get(), 33, 64, 512);
  EXPECT_FALSE(SkinnyGemmSupported(g));
  g.m = 8;
  g.k = 520;
  EXPECT_FALSE(SkinnyGemmSupported(g));
  g.k = 576;  // a multiple of 64 but not of the 128-wide ring stage
  EXPECT_FALSE(SkinnyGemmSupported(g));
  Check(33, 256, 1024, DType::kBF16, DType::kBF16, 0);
  Check(8, 256, 520, DType::kBF16, DType::kBF16, 8);
  Check(8, 256, 576, DType::kBF16, DType::kBF16, 0);
}

// Launch after launch (eager and replayed in a graph) the tile counters come
// back to zero and the partials are summed in the same order: same bits.
TEST_F(GemmTest, SkinnyIsDeterministicAndCapturable) {
  handle_.set_skinny_max_m(32);
  const int64_t M = 32, N = 4096, K = 4096;
  const Operands op = RandomBf16Operands(M, N, K, 21);
  DevArray dc(M * N, DType::kBF16), dc2(M * N, DType::kBF16);
  ASSERT_TRUE(SkinnyGemmSupported(Args(op.da.get(), op.dw.get(), dc.get(), M, N, K)));
  const std::vector<double> want = ReferenceGemm(op.a, K, op.w, K, M, N, K);
  auto gemm = [&](DevArray& out) {
    return Gemm(handle_, op.da.get(), op.dw.get(), out.get(), M, N, K, DType::kBF16, ws_.get(),
                ws_.bytes(), stream());
  };
  for (int i = 0; i < 3; ++i) ASSERT_OK(gemm(dc));
  const testing::CapturedGraph graph(stream(), [&] { return gemm(dc2); });
  ASSERT_TRUE(graph.ok());
  for (int i = 0; i < 3; ++i) ASSERT_EQ(graph.Launch(stream()), cudaSuccess);
  Sync();
  const std::vector<float> c = dc.Download(), c2 = dc2.Download();
  testing::CheckClose(c, want, 1e-2, "skinny gemm, eager");
  EXPECT_EQ(std::memcmp(c.data(), c2.data(), c.size() * sizeof(float)), 0);
}

// One CTA's probe stamps (Probe: Sm90GemmProbe or StreamKGemmProbe): both
// timers written, the SM id in range, and the clock stamps in `order`
// non-decreasing.
template <typename Probe>
void ExpectStampsInOrder(const unsigned long long* x, std::initializer_list<int> order,
                         int num_sms) {
  EXPECT_GT(x[Probe::kGlobalStart], 0u);
  EXPECT_LE(x[Probe::kGlobalStart], x[Probe::kGlobalEnd]);
  EXPECT_GT(x[Probe::kClockStart], 0u);
  const std::vector<int> slots(order);
  for (size_t i = 1; i < slots.size(); ++i) {
    EXPECT_LE(x[slots[i - 1]], x[slots[i]]) << "slot " << slots[i - 1] << " before " << slots[i];
  }
  EXPECT_LT(x[Probe::kSm], static_cast<unsigned long long>(num_sms));
}

// The diagnostics kernels_bench's sm90probe section reads: every CTA leaves a
// timeline in order, the splits of a tile cover K once, and stamping leaves
// the product correct; the load-skipping probes finish (their output is not
// checked: it is wrong by design) and leave the counters zero.
TEST_F(GemmTest, Sm90ProbeStampsEveryCta) {
  if (!Sm90GemmDeviceSupported())
    GTEST_SKIP() << "the sm_90a GEMM needs a compute capability 9.0 GPU";
  using Probe = Sm90GemmProbe;
  const int64_t M = 200, N = 392, K = 1000, k_tiles = 16;
  int num_sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  auto stamps = cuda::DeviceBuffer::Create(64 * Probe::kSlots * 8);
  ASSERT_OK(stamps);
  for (const Sm90GemmPlan& plan :
       {Sm90GemmPlan{1, 1, false}, Sm90GemmPlan{2, 3, false}, Sm90GemmPlan{1, 3, true}}) {
    SCOPED_TRACE(plan.ToString());
    const int64_t tiles = Sm90GemmTiles(M, N, plan), ctas = tiles * plan.splits;
    ASSERT_LE(ctas, 64);
    ASSERT_EQ(cudaMemset(stamps->get(), 0, stamps->bytes()), cudaSuccess);
    testing::FinishHostCopies();
    Probe probe;
    probe.stamps = stamps->as<unsigned long long>();
    CheckStrided(M, N, K, K, K, N + 8, DType::kBF16, DType::kBF16, &plan, &probe);
    std::vector<unsigned long long> st(ctas * Probe::kSlots);
    ASSERT_EQ(cudaMemcpy(st.data(), stamps->get(), st.size() * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::vector<int64_t> steps(tiles, 0);
    for (int64_t b = 0; b < ctas; ++b) {
      const unsigned long long* x = &st[b * Probe::kSlots];
      SCOPED_TRACE(::testing::Message() << "CTA " << b);
      ExpectStampsInOrder<Probe>(
          x,
          {Probe::kClockStart, Probe::kFirstStage, Probe::kKLoopEnd, Probe::kStored,
           Probe::kSplitsIn, Probe::kReduced, Probe::kClockEnd},
          num_sms);
      steps[b / plan.splits] += static_cast<int64_t>(x[Probe::kIters]);  // x = split
    }
    for (int64_t t = 0; t < tiles; ++t) EXPECT_EQ(steps[t], k_tiles) << "tile " << t;
    // The probes that switch loads off run to the end.
    for (const int flags :
         {int{Probe::kSkipA}, int{Probe::kSkipW}, Probe::kSkipA | Probe::kSkipW}) {
      DevArray da(M * K, DType::kBF16), dw(N * K, DType::kBF16), dc(M * N, DType::kBF16);
      da.Upload(testing::RandomFloats(M * K, 5));
      dw.Upload(testing::RandomFloats(N * K, 6));
      const GemmArgs g = Args(da.get(), dw.get(), dc.get(), M, N, K);
      Probe skip;
      skip.flags = flags;
      ASSERT_OK(LaunchSm90Gemm(g, plan, stream(), counters_.as<unsigned int>(), kCounters, &skip));
      Sync();
    }
  }
  ExpectCountersZero();
}

// The stream-K kernel (gemm_streamk.h): both token widths (M <= 128 and
// <= 256, partly empty), tails in N (64- to 512-row tiles) and K (64-wide
// steps), padded strides, one and two consumer warpgroups, single CTAs and
// clusters sharing the token boxes (multicast), and grids from one cluster (every tile complete in
// it) through a few (clusters own complete tiles and start or end inside others) to one per unit
// (an owner adds the partials of K steps - 1 later CTAs).
TEST_F(GemmTest, StreamKMatchesReference) {
  if (!Sm90GemmDeviceSupported())
    GTEST_SKIP() << "the sm_90a GEMM needs a compute capability 9.0 GPU";
  const std::tuple<int64_t, int64_t, int64_t, int64_t> shapes[] = {
      {1, 64, 64, 0},       {37, 200, 136, 8},   {128, 384, 512, 0},  {129, 256, 1024, 0},
      {256, 1024, 2048, 0}, {200, 520, 264, 16}, {256, 3072, 4096, 0}};
  StreamKGemmPlan plan;
  launch_ = [&](const GemmArgs& g) {
    return LaunchStreamKGemm(g, plan, stream(), counters_.as<unsigned int>(), kCounters);
  };
  for (const auto& [M, N, K, pad] : shapes) {
    for (const int wg : {1, 2}) {
      for (const int cluster : {1, 2, 4}) {
        const int64_t units = StreamKGemmUnits(N, K, cluster, wg);
        auto fill = StreamKGemmDefaultCtas(M, N, K, cluster, wg);
        ASSERT_OK(fill);
        for (const int64_t clusters : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{7}, units}) {
          plan = StreamKGemmPlan{cluster, clusters * cluster, wg};
          if (plan.ctas > *fill) continue;  // one per unit only fits small products
          // The CPU reference's time.
          if (clusters != 0 && M * N * K > (int64_t{1} << 30)) continue;
          SCOPED_TRACE(::testing::Message() << plan.ToString() << ", " << units << " units");
          CheckStrided(M, N, K, K + pad, K + pad, N + pad, DType::kBF16, DType::kBF16);
        }
      }
    }
  }
  ExpectCountersZero();
}

TEST_F(GemmTest, StreamKIsDeterministicAndCapturable) {
  if (!Sm90GemmDeviceSupported())
    GTEST_SKIP() << "the sm_90a GEMM needs a compute capability 9.0 GPU";
  const int64_t M = 256, N = 2048, K = 4096;
  const Operands op = RandomBf16Operands(M, N, K, 13);
  DevArray dc(M * N, DType::kBF16), dc2(M * N, DType::kBF16);
  const std::vector<double> want = ReferenceGemm(op.a, K, op.w, K, M, N, K);
  const GemmArgs g = Args(op.da.get(), op.dw.get(), dc.get(), M, N, K);
  GemmArgs g2 = g;
  g2.c = dc2.get();
  for (const int wg : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << wg << " consumer warpgroups");
    const StreamKGemmPlan plan{2, 0, wg};
    ASSERT_OK(LaunchStreamKGemm(g, plan, stream(), counters_.as<unsigned int>(), kCounters));
    Sync();
    const std::vector<float> eager = dc.Download();
    testing::CheckClose(eager, want, 1e-2, "stream-K gemm, eager");
    const testing::CapturedGraph graph(stream(), [&]() -> absl::Status {
      return LaunchStreamKGemm(g2, plan, stream(), counters_.as<unsigned int>(), kCounters);
    });
    ASSERT_TRUE(graph.ok());
    for (int replay = 0; replay < 3; ++replay) {
      ASSERT_EQ(cudaMemsetAsync(dc2.get(), 0xff, M * N * 2, stream()), cudaSuccess);
      ASSERT_EQ(graph.Launch(stream()), cudaSuccess);
      Sync();
      // The partials are summed in CTA order: the same bits every launch.
      const std::vector<float> c2 = dc2.Download();
      EXPECT_EQ(std::memcmp(eager.data(), c2.data(), c2.size() * sizeof(float)), 0)
          << "replay " << replay;
    }
  }
  ExpectCountersZero();
}

TEST_F(GemmTest, StreamKProbeStampsEveryCta) {
  if (!Sm90GemmDeviceSupported())
    GTEST_SKIP() << "the sm_90a GEMM needs a compute capability 9.0 GPU";
  using Probe = StreamKGemmProbe;
  // 10 clusters of 2 CTAs over 5 tiles of 128 W rows (3 of 256 with two
  // warpgroups) x 16 K steps.
  const int64_t M = 200, N = 520, K = 1000, ctas = 20, clusters = 10;
  int num_sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  auto stamps = cuda::DeviceBuffer::Create(ctas * Probe::kSlots * 8);
  ASSERT_OK(stamps);
  for (const int wg : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << wg << " consumer warpgroups");
    const int64_t units = StreamKGemmUnits(N, K, 2, wg);
    ASSERT_EQ(units, wg == 1 ? 80 : 48);
    ASSERT_EQ(cudaMemset(stamps->get(), 0, stamps->bytes()), cudaSuccess);
    testing::FinishHostCopies();
    Probe probe;
    probe.stamps = stamps->as<unsigned long long>();
    launch_ = [&](const GemmArgs& g) {
      return LaunchStreamKGemm(g, StreamKGemmPlan{2, ctas, wg}, stream(),
                               counters_.as<unsigned int>(), kCounters, &probe);
    };
    CheckStrided(M, N, K, K, K, N + 8, DType::kBF16, DType::kBF16);
    std::vector<unsigned long long> st(ctas * Probe::kSlots);
    ASSERT_EQ(cudaMemcpy(st.data(), stamps->get(), st.size() * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    int64_t total = 0, partials = 0;
    for (int64_t b = 0; b < ctas; ++b) {
      const unsigned long long* x = &st[b * Probe::kSlots];
      SCOPED_TRACE(::testing::Message() << "CTA " << b);
      ExpectStampsInOrder<Probe>(x,
                                 {Probe::kClockStart, Probe::kFirstStage, Probe::kLoopEnd,
                                  Probe::kPartialsIn, Probe::kClockEnd},
                                 num_sms);
      // The cluster q = b / 2 of CTA b runs units [q U / G, (q + 1) U / G).
      const int64_t q = b / 2;
      EXPECT_EQ(static_cast<int64_t>(x[Probe::kUnits]),
                (q + 1) * units / clusters - q * units / clusters);
      if (b % 2 == 0) total += static_cast<int64_t>(x[Probe::kUnits]);
      partials += static_cast<int64_t>(x[Probe::kPartialsRead]);
    }
    EXPECT_EQ(total, units);
    // Each CTA whose cluster's range starts inside a tile writes one partial,
    // which the CTA with the same W rows in the tile's owner reads once.
    int64_t inside = 0;
    for (int64_t b = 0; b < ctas; ++b) inside += ((b / 2) * units / clusters) % 16 != 0;
    EXPECT_EQ(partials, inside);
  }
  ExpectCountersZero();
}

TEST_F(GemmTest, StreamKRejectsWhatItCannotRun) {
  using symtp::testing::StatusIs;
  DevArray buf(1 << 16, DType::kBF16);
  GemmArgs g = Args(buf.get(), buf.get(), buf.get(), 257, 64, 64);
  EXPECT_FALSE(StreamKGemmArgsSupported(g));  // more tokens than one tile
  EXPECT_THAT(LaunchStreamKGemm(g, {}, stream(), counters_.as<unsigned int>(), kCounters),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("m <= 256")));
  g.m = 256;
  EXPECT_TRUE(StreamKGemmArgsSupported(g));
  g.k = 12;
  EXPECT_FALSE(StreamKGemmArgsSupported(g));
  g.k = 64;
  if (!Sm90GemmDeviceSupported()) return;
  // 1 tile x 1 step: one unit, so at most one cluster.
  unsigned int* flags = counters_.as<unsigned int>();
  EXPECT_THAT(LaunchStreamKGemm(g, StreamKGemmPlan{1, 2}, stream(), flags, kCounters),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("units")));
  EXPECT_THAT(LaunchStreamKGemm(g, StreamKGemmPlan{2, 3}, stream(), flags, kCounters),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("multiple")));
  EXPECT_THAT(LaunchStreamKGemm(g, StreamKGemmPlan{3, 3}, stream(), flags, kCounters),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("cluster 3")));
  EXPECT_THAT(LaunchStreamKGemm(g, StreamKGemmPlan{1, 1, 3}, stream(), flags, kCounters),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("3 consumer")));
  EXPECT_THAT(LaunchStreamKGemm(g, StreamKGemmPlan{1, 1}, stream(), nullptr, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("flags")));
  g.workspace_bytes = StreamKGemmWorkspaceBytes(g.m, 2) - 16;
  EXPECT_THAT(LaunchStreamKGemm(g, StreamKGemmPlan{2, 2}, stream(), flags, kCounters),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("workspace")));
  // Two warpgroups' partials take twice the bytes.
  g.workspace_bytes = StreamKGemmWorkspaceBytes(g.m, 2);
  EXPECT_EQ(StreamKGemmWorkspaceBytes(g.m, 2, 2), 2 * g.workspace_bytes);
  EXPECT_THAT(LaunchStreamKGemm(g, StreamKGemmPlan{2, 2, 2}, stream(), flags, kCounters),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("workspace")));
}

TEST_F(GemmTest, Sm90RejectsWhatItCannotRun) {
  using symtp::testing::StatusIs;
  DevArray buf(4096, DType::kBF16);
  GemmArgs g;
  g.a = buf.get();
  g.w = buf.get();
  g.c = buf.get();
  g.m = 4;
  g.n = 8;
  g.k = 12;  // not a multiple of 8
  EXPECT_FALSE(Sm90GemmArgsSupported(g));
  EXPECT_THAT(LaunchSm90Gemm(g, Sm90GemmPlan{}, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("multiples of 8")));
  g.k = 16;
  EXPECT_TRUE(Sm90GemmArgsSupported(g));
  g.a = static_cast<char*>(buf.get()) + 2;  // misaligned
  EXPECT_FALSE(Sm90GemmArgsSupported(g));
  g.a = buf.get();
  g.out_dtype = DType::kF32;
  EXPECT_FALSE(Sm90GemmArgsSupported(g));
  g.out_dtype = DType::kBF16;
  EXPECT_THAT(LaunchSm90Gemm(g, Sm90GemmPlan{2, 9}, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("plan")));
  // A global split-K without workspace and counters.
  EXPECT_THAT(LaunchSm90Gemm(g, Sm90GemmPlan{2, 2, true}, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("counters")));
}

// A tuning table made by one handle's autotuning, serialized and parsed back,
// makes a fresh handle run the same algorithms without timing anything: the
// same bits of C, every plan from the table.
TEST_F(GemmTest, TuningTableReplaysAutotunedPicksInAFreshHandle) {
  handle_.set_autotune_candidates(8);
  struct Shape {
    int64_t m, n, k;
    DType in, out;
  };
  const Shape shapes[] = {{256, 1024, 512, DType::kBF16, DType::kBF16},
                          {64, 1000, 256, DType::kBF16, DType::kF32},
                          {33, 200, 1000, DType::kF32, DType::kF32}};
  struct Case {
    std::vector<float> a, w;
    DevArray da, dw, dc;
    std::vector<float> first;
  };
  std::vector<Case> cases;
  auto run = [&](CublasLtHandle& h, Case& c, const Shape& s) -> std::vector<float> {
    GemmArgs g = Args(c.da.get(), c.dw.get(), c.dc.get(), s.m, s.n, s.k);
    g.in_dtype = s.in;
    g.out_dtype = s.out;
    EXPECT_OK(Gemm(h, g, stream()));
    Sync();
    return c.dc.Download();
  };
  for (const Shape& s : shapes) {
    Case c;
    c.a = testing::RandomFloats(s.m * s.k, s.m + 7 * s.k);
    c.w = testing::RandomFloats(s.n * s.k, s.n + 5 * s.k);
    testing::RoundTo(&c.a, s.in);
    testing::RoundTo(&c.w, s.in);
    c.da = DevArray(c.a.size(), s.in);
    c.dw = DevArray(c.w.size(), s.in);
    c.dc = DevArray(s.m * s.n, s.out);
    c.da.Upload(c.a);
    c.dw.Upload(c.w);
    c.first = run(handle_, c, s);
    testing::CheckClose(c.first, ReferenceGemm(c.a, s.k, c.w, s.k, s.m, s.n, s.k),
                        s.out == DType::kBF16  ? 1e-2
                        : s.in == DType::kBF16 ? 1e-4
                                               : 1e-5,
                        "autotuned gemm");
    cases.push_back(std::move(c));
  }
  ASSERT_OK_AND_ASSIGN(const GemmTuningTable made, handle_.ExportPlans());
  ASSERT_EQ(made.size(), 3u);
  EXPECT_EQ(handle_.plans_from_table(), 0u);
  for (const auto& [key, e] : made.entries()) {
    SCOPED_TRACE(DescribeGemmKey(key));
    EXPECT_FALSE(e.description.empty());
    // Margin 0: the pick is the fastest timed, so never slower than the first.
    if (e.pick_us > 0 && e.heuristic_us > 0) {
      EXPECT_LE(e.pick_us, e.heuristic_us);
    }
  }
  ASSERT_OK_AND_ASSIGN(const GemmTuningTable parsed,
                       GemmTuningTable::Parse(made.Serialize(), "serialized"));
  EXPECT_EQ(parsed, made);

  ASSERT_OK_AND_ASSIGN(CublasLtHandle fresh, CublasLtHandle::Create());
  fresh.set_autotune_candidates(8);  // the table wins over autotuning
  ASSERT_OK(fresh.set_tuning_table(std::make_shared<GemmTuningTable>(parsed)));
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const std::vector<float> again = run(fresh, cases[i], shapes[i]);
    ASSERT_EQ(again.size(), cases[i].first.size());
    EXPECT_EQ(std::memcmp(again.data(), cases[i].first.data(), again.size() * sizeof(float)), 0)
        << "C differs from the autotuning handle's with the same algorithm";
  }
  EXPECT_EQ(fresh.plans_from_table(), 3u);
  ASSERT_OK_AND_ASSIGN(const GemmTuningTable again, fresh.ExportPlans());
  ASSERT_EQ(again.size(), made.size());
  for (const auto& [key, e] : made.entries()) {
    const GemmTuningEntry* f = again.Find(key);
    ASSERT_NE(f, nullptr) << DescribeGemmKey(key);
    EXPECT_EQ(f->algo, e.algo) << DescribeGemmKey(key);
  }
}

TEST_F(GemmTest, TuningTableFromElsewhereOrWithAForeignAlgorithmIsAnError) {
  ASSERT_OK_AND_ASSIGN(const GemmTuningIdentity here, CurrentGemmTuningIdentity());
  EXPECT_GT(here.cublaslt_version, 0);
  EXPECT_GT(here.sm_count, 0);
  for (int which = 0; which < 2; ++which) {
    GemmTuningIdentity other = here;
    if (which == 0) other.cublaslt_version += 1;
    if (which == 1) other.device += " (another)";
    EXPECT_THAT(
        handle_.set_tuning_table(std::make_shared<GemmTuningTable>(other)),
        StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("cannot be used on")));
  }
  EXPECT_OK(handle_.set_tuning_table(nullptr));

  // A bf16 algorithm filed under an fp32 product of the same shape.
  const int64_t M = 64, N = 512, K = 256;
  const Operands op = RandomBf16Operands(M, N, K, 11);
  DevArray dc(M * N, DType::kBF16);
  ASSERT_OK(Gemm(handle_, Args(op.da.get(), op.dw.get(), dc.get(), M, N, K), stream()));
  ASSERT_OK_AND_ASSIGN(const GemmTuningTable made, handle_.ExportPlans());
  ASSERT_EQ(made.size(), 1u);
  GemmTuningKey key = made.entries().begin()->first;
  key.in_dtype = key.out_dtype = DType::kF32;
  auto foreign = std::make_shared<GemmTuningTable>(here);
  foreign->Put(key, made.entries().begin()->second);
  ASSERT_OK_AND_ASSIGN(CublasLtHandle fresh, CublasLtHandle::Create());
  ASSERT_OK(fresh.set_tuning_table(foreign));
  DevArray a32(M * K, DType::kF32), w32(N * K, DType::kF32), c32(M * N, DType::kF32);
  a32.Upload(testing::RandomFloats(M * K, 12));
  w32.Upload(testing::RandomFloats(N * K, 13));
  GemmArgs g = Args(a32.get(), w32.get(), c32.get(), M, N, K);
  g.in_dtype = g.out_dtype = DType::kF32;
  EXPECT_THAT(Gemm(fresh, g, stream()),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("not usable")));
  EXPECT_EQ(fresh.cached_plans(), 0u);
  // Shapes the table does not hold are planned as before.
  ASSERT_OK(Gemm(fresh, Args(op.da.get(), op.dw.get(), dc.get(), M, N, K), stream()));
  Sync();
  testing::CheckClose(dc.Download(), ReferenceGemm(op.a, K, op.w, K, M, N, K), 1e-2,
                      "gemm beside a foreign table");
  EXPECT_EQ(fresh.plans_from_table(), 0u);
}

// On this device, auto finds a shipped table exactly when one was made on
// this device and cuBLASLt, and its algorithms plan here.
TEST_F(GemmTest, AutoFindsTheShippedTableIffOneWasMadeHere) {
  ASSERT_OK_AND_ASSIGN(const GemmTuningIdentity here, CurrentGemmTuningIdentity());
  const std::string dir = DefaultGemmTuningDir();
  bool made_here = false;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".txt") continue;
    ASSERT_OK_AND_ASSIGN(const GemmTuningTable t, GemmTuningTable::Load(f.path().string()));
    made_here = made_here || t.identity() == here;
  }
  ASSERT_OK_AND_ASSIGN(std::optional<FoundGemmTuningTable> found, FindGemmTuningTable(dir, here));
  ASSERT_EQ(found.has_value(), made_here) << DescribeIdentity(here);
  if (!found) return;
  EXPECT_OK(found->table.CheckUsableOn(here));
  // Its algorithms run here: each of the table's smaller GEMMs (W up to 32 M
  // elements) against cuBLASLt's heuristic on random operands.
  ASSERT_OK_AND_ASSIGN(CublasLtHandle tuned, CublasLtHandle::Create());
  ASSERT_OK(tuned.set_tuning_table(std::make_shared<GemmTuningTable>(found->table)));
  size_t checked = 0;
  for (const auto& [key, e] : found->table.entries()) {
    if (key.n * key.k > (32 << 20) || key.in_dtype != DType::kBF16 || key.lda != key.k ||
        key.ldw != key.k || key.ldc != key.n || key.workspace_bytes != ws_.bytes()) {
      continue;
    }
    SCOPED_TRACE(DescribeGemmKey(key));
    std::vector<float> a = testing::RandomFloats(key.m * key.k, key.n + 3 * key.k);
    std::vector<float> w = testing::RandomFloats(key.n * key.k, key.m + 5 * key.k);
    testing::RoundTo(&a, DType::kBF16);
    testing::RoundTo(&w, DType::kBF16);
    DevArray da(a.size(), DType::kBF16), dw(w.size(), DType::kBF16);
    DevArray dc(key.m * key.n, key.out_dtype), dh(key.m * key.n, key.out_dtype);
    da.Upload(a);
    dw.Upload(w);
    GemmArgs g = Args(da.get(), dw.get(), dc.get(), key.m, key.n, key.k);
    g.out_dtype = key.out_dtype;
    ASSERT_OK(Gemm(tuned, g, stream()));
    g.c = dh.get();
    ASSERT_OK(Gemm(handle_, g, stream()));
    Sync();
    const std::vector<float> heuristic = dh.Download();
    testing::CheckClose(dc.Download(), std::vector<double>(heuristic.begin(), heuristic.end()),
                        1e-2, "shipped table's algorithm against the heuristic's");
    ++checked;
  }
  EXPECT_GT(checked, 0u);
  EXPECT_EQ(tuned.plans_from_table(), checked);
}

// The file format: round trip, atomic save, and every malformed input a
// clear InvalidArgument (no device needed).
// A table identity for the file-format tests (sm_90).
GemmTuningIdentity TestIdentity(const std::string& device, int sm_count, int64_t cublaslt) {
  GemmTuningIdentity id;
  id.device = device;
  id.sm_count = sm_count;
  id.cc_major = 9;
  id.cc_minor = 0;
  id.cublaslt_version = cublaslt;
  return id;
}

TEST(GemmTuningTableTest, RoundTripsAndRejectsMalformedFiles) {
  const GemmTuningIdentity id = TestIdentity("NVIDIA H200", 132, 130100);
  GemmTuningTable t(id);
  GemmTuningKey k1;
  k1.m = 256;
  k1.n = 4096;
  k1.k = 14336;
  k1.lda = k1.ldw = 14336;
  k1.ldc = 4096;
  k1.workspace_bytes = 32u << 20;
  k1.align_a = k1.align_w = k1.align_c = 256;
  GemmTuningEntry e1;
  for (int i = 0; i < 8; ++i) e1.algo[i] = 0x0123456789abcdefull * (i + 1);
  e1.pick_us = 49.5;
  e1.heuristic_us = 50.25;
  e1.description = "algo 66 tile 21 stages 35 split 1 cluster 2 swizzle 0";
  t.Put(k1, e1);
  GemmTuningKey k2 = k1;
  k2.m = 512;
  k2.in_dtype = DType::kBF16;
  k2.out_dtype = DType::kF32;
  k2.sm_count_target = 100;
  k2.align_c = 16;
  GemmTuningEntry e2 = e1;
  e2.algo[7] = ~0ull;
  e2.pick_us = e2.heuristic_us = 0;
  e2.description.clear();
  t.Put(k2, e2);
  ASSERT_EQ(t.size(), 2u);
  ASSERT_NE(t.Find(k2), nullptr);
  EXPECT_EQ(*t.Find(k2), e2);
  GemmTuningKey k3 = k1;
  k3.ldw = 14344;
  EXPECT_EQ(t.Find(k3), nullptr);

  const std::string text = t.Serialize();
  ASSERT_OK_AND_ASSIGN(const GemmTuningTable back, GemmTuningTable::Parse(text, "text"));
  EXPECT_EQ(back, t);
  EXPECT_OK(back.CheckUsableOn(id));
  GemmTuningIdentity other = id;
  other.cublaslt_version = 130000;
  EXPECT_THAT(back.CheckUsableOn(other), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                  ::testing::HasSubstr("cuBLASLt 130000")));

  const std::string path = ::testing::TempDir() + "/gemm_tuning_test.txt";
  ASSERT_OK(t.Save(path));
  ASSERT_OK_AND_ASSIGN(const GemmTuningTable loaded, GemmTuningTable::Load(path));
  EXPECT_EQ(loaded, t);
  EXPECT_THAT(GemmTuningTable::Load(path + ".missing"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr(".missing")));
  // A directory that does not exist: the error names the file and the cause.
  EXPECT_THAT(t.Save(::testing::TempDir() + "/no_such_dir/t.txt"),
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::AllOf(::testing::HasSubstr("no_such_dir/t.txt.tmp"),
                                        ::testing::HasSubstr("No such file or directory"))));

  // Each malformed variant of the text fails, naming the line.
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  auto with_line = [&](size_t i, const std::string& replacement) {
    std::vector<std::string> l = lines;
    l[i] = replacement;
    return absl::StrJoin(l, "\n");
  };
  std::string gemm_line;
  size_t gemm_index = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StartsWith(lines[i], "gemm ")) {
      gemm_line = lines[i];
      gemm_index = i;
      break;
    }
  }
  ASSERT_FALSE(gemm_line.empty());
  std::vector<std::string> f = absl::StrSplit(gemm_line, ' ');
  auto field = [&](size_t i, const std::string& v) {
    std::vector<std::string> g = f;
    g[i] = v;
    return with_line(gemm_index, absl::StrJoin(g, " "));
  };
  const std::pair<std::string, std::string> bad[] = {
      {"", "no 'symtp-gemm-tuning 1' header"},
      {with_line(0, "symtp-gemm-tuning 2"), "format version 2"},
      {with_line(0, "something else"), "not a symtp GEMM tuning file"},
      {with_line(1, "# no device"), "gemm record before"},
      {with_line(2, "cublaslt x"), "cublaslt <version>"},
      {field(7, "int8"), "unknown dtype"},
      {field(2, "0"), "not a GEMM shape"},
      {field(4, "100"), "not a GEMM shape"},
      {field(10, "48"), "alignment"},
      {field(14, "12345"), "16 hex digits"},
      {field(21, "zzzzzzzzzzzzzzzz"), "16 hex digits"},
      {field(22, "-1"), "pick_us"},
      {with_line(gemm_index, "gemm 1 2 3"), "at least 24 fields"},
      {text + gemm_line + "\n", "a second record for the same GEMM"},
      {text + "conv 1 2 3\n", "unknown record"},
  };
  for (const auto& [input, why] : bad) {
    EXPECT_THAT(
        GemmTuningTable::Parse(input, "bad.txt"),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 ::testing::AllOf(::testing::HasSubstr("bad.txt"), ::testing::HasSubstr(why))))
        << input;
  }
}

// --gemm-tuning-file=auto's lookup: the one table of a folder made for this
// device and cuBLASLt; none, two, a malformed file or no folder each say so.
TEST(GemmTuningTableTest, FindTakesTheTableMadeHere) {
  const GemmTuningIdentity h200 = TestIdentity("NVIDIA H200", 132, 130100);
  const GemmTuningIdentity h100 = TestIdentity("NVIDIA H100 80GB HBM3", 132, 130100);
  GemmTuningKey key;
  key.m = 256;
  key.n = 3072;
  key.k = key.lda = key.ldw = 4096;
  key.ldc = 3072;
  key.align_a = key.align_w = key.align_c = 256;
  GemmTuningEntry e;
  e.algo[0] = 0x42;
  const std::string dir = ::testing::TempDir() + "/gemm_tuning_find";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  GemmTuningTable a(h100), b(h200);
  a.Put(key, e);
  e.algo[0] = 0x43;
  b.Put(key, e);
  ASSERT_OK(a.Save(dir + "/a.txt"));
  ASSERT_OK(b.Save(dir + "/b.txt"));
  {
    std::ofstream notes(dir + "/README.md");  // not a table: not read
    notes << "not a table\n";
  }
  ASSERT_OK_AND_ASSIGN(std::optional<FoundGemmTuningTable> found, FindGemmTuningTable(dir, h200));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, dir + "/b.txt");
  EXPECT_EQ(found->table, b);
  ASSERT_OK_AND_ASSIGN(found, FindGemmTuningTable(dir, h100));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->table, a);
  ASSERT_OK_AND_ASSIGN(found, FindGemmTuningTable(dir, TestIdentity("NVIDIA H200", 132, 130000)));
  EXPECT_FALSE(found.has_value());

  ASSERT_OK(b.Save(dir + "/c.txt"));
  EXPECT_THAT(
      FindGemmTuningTable(dir, h200),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               ::testing::AllOf(::testing::HasSubstr("b.txt"), ::testing::HasSubstr("c.txt"))));
  std::filesystem::remove(dir + "/c.txt");
  {
    std::ofstream bad(dir + "/d.txt");
    bad << "symtp-gemm-tuning 1\ngemm 1 2 3\n";
  }
  EXPECT_THAT(FindGemmTuningTable(dir, h100),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("d.txt")));
  EXPECT_THAT(FindGemmTuningTable(dir + "/missing", h200),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("missing")));
}

// auto's folder: $SYMTP_GEMM_TUNING_DIR when set (a folder it cannot list is
// an error), else the shipped one.
TEST(GemmTuningTableTest, ShippedLookupFollowsTheEnvironment) {
  const GemmTuningIdentity id = TestIdentity("Test GPU", 4, 1);
  GemmTuningKey key;
  key.m = key.n = key.k = key.lda = key.ldw = key.ldc = 64;
  key.align_a = key.align_w = key.align_c = 256;
  GemmTuningTable t(id);
  t.Put(key, GemmTuningEntry{});
  const std::string dir = ::testing::TempDir() + "/gemm_tuning_env";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_OK(t.Save(dir + "/test.txt"));
  const char* before = std::getenv("SYMTP_GEMM_TUNING_DIR");
  const std::string saved = before != nullptr ? before : "";
  ASSERT_EQ(setenv("SYMTP_GEMM_TUNING_DIR", dir.c_str(), 1), 0);
  EXPECT_EQ(DefaultGemmTuningDir(), dir);
  absl::StatusOr<std::optional<FoundGemmTuningTable>> found = FindShippedGemmTuningTable(id);
  ASSERT_OK(found.status());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->table, t);
  ASSERT_EQ(setenv("SYMTP_GEMM_TUNING_DIR", (dir + "/missing").c_str(), 1), 0);
  EXPECT_THAT(FindShippedGemmTuningTable(id),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("missing")));
  ASSERT_EQ(unsetenv("SYMTP_GEMM_TUNING_DIR"), 0);
  EXPECT_NE(DefaultGemmTuningDir(), dir);
  found = FindShippedGemmTuningTable(id);  // the shipped folder: nothing for a test GPU
  ASSERT_OK(found.status());
  EXPECT_FALSE(found->has_value());
  if (before != nullptr) setenv("SYMTP_GEMM_TUNING_DIR", saved.c_str(), 1);
}

// The tables the repository ships (configs/gemm_tuning) parse, each for its
// own device and cuBLASLt, and the lookup finds each one by its identity.
TEST(GemmTuningTableTest, ShippedTablesParseAndEachIsFoundByItsIdentity) {
  const std::string dir = DefaultGemmTuningDir();
  int tables = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".txt") continue;
    ++tables;
    ASSERT_OK_AND_ASSIGN(const GemmTuningTable t, GemmTuningTable::Load(f.path().string()));
    EXPECT_GT(t.size(), 0u) << f.path();
    ASSERT_OK_AND_ASSIGN(std::optional<FoundGemmTuningTable> found,
                         FindGemmTuningTable(dir, t.identity()));
    ASSERT_TRUE(found.has_value()) << f.path();
    EXPECT_EQ(found->path, f.path().string());
  }
  EXPECT_GT(tables, 0) << dir;
}

TEST(Sm90GemmPlanTest, FillsOneWave) {
  // llama-8b wo at M = 256: 64 tiles of 128 rows, two splits (128 CTAs), beat
  // 32 tiles of 256 rows with four (their epilogue costs more; probe runs).
  const Sm90GemmPlan wo = PlanSm90Gemm(256, 4096, 4096, 132);
  EXPECT_EQ(wo.m_sub, 1);
  EXPECT_EQ(wo.splits, 2);
  const Sm90GemmPlan small = PlanSm90Gemm(64, 4096, 4096, 132);
  EXPECT_EQ(small.m_sub, 1);
  EXPECT_EQ(small.splits, 4);
  const Sm90GemmPlan wide = PlanSm90Gemm(256, 128256, 4096, 132);  // many tiles: no split
  EXPECT_EQ(wide.m_sub, 2);
  EXPECT_EQ(wide.splits, 1);
  EXPECT_EQ(PlanSm90Gemm(512, 4096, 4096, 132).m_sub, 2);     // 128-row tiles only to 256
  EXPECT_EQ(PlanSm90Gemm(256, 128, 256, 132).splits, 1);      // 4 K steps: no split
  EXPECT_EQ(PlanSm90Gemm(256, 128, 65536, 132).splits, 8);    // at most a portable cluster
  // With the H200's cluster occupancy (run ab: 66 / 39 / 30 clusters of
  // 2 / 3 / 4): 32 tiles at M = 128 with a 4-way split would take two waves
  // of 30 clusters; 3-way ones fit in one.
  const int h200[9] = {0, 132, 66, 39, 30, 22, 17, 15, 15};
  const Sm90GemmPlan down = PlanSm90Gemm(128, 4096, 14336, 132, h200);
  EXPECT_EQ(down.splits, 3);
  EXPECT_FALSE(down.global_reduce);
  // With a workspace for the partials, 4 splits in one cooperative wave (128 CTAs).
  const Sm90GemmPlan down_global = PlanSm90Gemm(128, 4096, 14336, 132, h200, size_t{32} << 20);
  EXPECT_EQ(down_global.splits, 4);
  EXPECT_TRUE(down_global.global_reduce);
  // 8 MiB of partials do not fit 4 MiB: back to the cluster plan.
  EXPECT_FALSE(PlanSm90Gemm(128, 4096, 14336, 132, h200, size_t{4} << 20).global_reduce);
  // Clusters of 2 fit 66 at once: llama-8b TP=2 qkv (N 3072) and TP=1 wo (N 4096)
  // at M = 256 run 128-row tiles with 2 cluster splits in one wave.
  for (const int64_t n : {3072, 4096}) {
    const Sm90GemmPlan p = PlanSm90Gemm(256, n, 4096, 132, h200, size_t{32} << 20);
    EXPECT_EQ(p.m_sub, 1);
    EXPECT_EQ(p.splits, 2);
    EXPECT_FALSE(p.global_reduce);
  }
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

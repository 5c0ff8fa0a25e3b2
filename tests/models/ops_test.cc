// Each CPU op against an independent naive implementation on random inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "models/cpu_gemm.h"
#include "models/cpu_ops.h"

namespace symtp::model::cpu {
namespace {

// Every kernel variant this machine can run (restores the cap when done).
std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(DetectedIsa())) out.push_back(isa);
  }
  return out;
}
struct IsaCapGuard {
  ~IsaCapGuard() { SetIsaCap(DetectedIsa()); }
};

// Values spread over ~2^-20 .. 2^20, so that double sums round and the
// summation order shows in the result bits.
std::vector<float> RandomWide(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> e(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(u(rng), e(rng));
  return v;
}

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(OpsTest, MatMulMatchesNaiveAndReferenceOrder) {
  IsaCapGuard guard;
  for (Isa isa : SupportedIsas()) {
  ASSERT_TRUE(SetIsaCap(isa));
  SCOPED_TRACE(KernelIsa());
  MatMulScratch scratch;
  for (int T : {1, 2, 3, 4, 5, 7, 9, 33}) {
    for (int K : {1, 3, 4, 5, 17, 64, 130}) {
      for (int N : {1, 3, 4, 8, 9, 33}) {
        SCOPED_TRACE(::testing::Message() << "T=" << T << " K=" << K << " N=" << N);
        const int ldx = K + 3, ldy = N + 2;  // strided rows
        const std::vector<float> x = RandomWide(static_cast<size_t>(T) * ldx, T * 1000 + K);
        const std::vector<float> w = RandomWide(static_cast<size_t>(N) * K, N * 7 + K);
        std::vector<float> y(static_cast<size_t>(T) * ldy, -7.f);
        MatMulTransB(x.data(), ldx, T, K, w.data(), N, y.data(), ldy, &scratch);
        for (int t = 0; t < T; ++t) {
          for (int n = 0; n < N; ++n) {
            double naive = 0;
            for (int k = 0; k < K; ++k) naive += static_cast<double>(x[t * ldx + k]) * w[n * K + k];
            const float got = y[t * ldy + n];
            double mag = 0;
            for (int k = 0; k < K; ++k) mag += std::abs(static_cast<double>(x[t * ldx + k]) * w[n * K + k]);
            ASSERT_NEAR(got, naive, 1e-6 * std::abs(naive) + 1e-12 * mag);
            // Bitwise: the documented lane order, whatever T and blocking.
            ASSERT_EQ(got, static_cast<float>(ReferenceDot(&x[t * ldx], &w[n * K], K)));
          }
          for (int n = N; n < ldy; ++n) ASSERT_EQ(y[t * ldy + n], -7.f) << "wrote past N";
        }
      }
    }
  }
  }
}

// Products of +-1, +-2^30 and +-2^60 cancel and absorb each other, so any
// deviation from the documented lane order / reduction changes the float
// result itself (e.g. 0 vs 2).
std::vector<float> Cancelling(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = ((rng() & 1) ? 1.f : -1.f) * ((rng() % 3 == 0) ? 0x1p30f : 1.f);
  return v;
}

TEST(OpsTest, MatMulFollowsTheDocumentedOrderExactly) {
  IsaCapGuard guard;
  for (Isa isa : SupportedIsas()) {
    ASSERT_TRUE(SetIsaCap(isa));
    SCOPED_TRACE(KernelIsa());
    MatMulScratch scratch;
    int differs_from_sequential = 0;
    for (int T : {1, 3, 4, 6, 9}) {
      for (int K : {4, 7, 8, 13, 24}) {
        const int N = 19;
        const std::vector<float> x = Cancelling(static_cast<size_t>(T) * K, 7 * T + K);
        const std::vector<float> w = Cancelling(static_cast<size_t>(N) * K, 11 * T + K);
        std::vector<float> y(static_cast<size_t>(T) * N);
        MatMulTransB(x.data(), K, T, K, w.data(), N, y.data(), N, &scratch);
        std::vector<double> xd(x.begin(), x.end()), out(N);
        for (int t = 0; t < T; ++t) {
          DotRows(&xd[t * K], K, w.data(), K, N, out.data());
          for (int n = 0; n < N; ++n) {
            const double ref = ReferenceDot(&x[t * K], &w[n * K], K);
            ASSERT_EQ(y[t * N + n], static_cast<float>(ref)) << "T=" << T << " K=" << K << " t=" << t << " n=" << n;
            ASSERT_EQ(out[n], ref) << "T=" << T << " K=" << K << " t=" << t << " n=" << n;
            double seq = 0;
            for (int k = 0; k < K; ++k) seq += static_cast<double>(x[t * K + k]) * w[n * K + k];
            differs_from_sequential += seq != ref;
          }
        }
      }
    }
    EXPECT_GT(differs_from_sequential, 20) << "inputs do not exercise the summation order";
  }
}

TEST(OpsTest, MatMulRowsIndependentOfBatch) {
  // A row's output is bitwise the same alone or among others (batch independence).
  const int K = 96, N = 40, T = 13;
  const std::vector<float> x = RandomWide(static_cast<size_t>(T) * K, 5);
  const std::vector<float> w = RandomWide(static_cast<size_t>(N) * K, 6);
  std::vector<float> all(static_cast<size_t>(T) * N), one(N);
  MatMulScratch s;
  MatMulTransB(x.data(), K, T, K, w.data(), N, all.data(), N, &s);
  for (int t = 0; t < T; ++t) {
    MatMulTransB(&x[t * K], K, 1, K, w.data(), N, one.data(), N, &s);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + t * N)) << t;
  }
}

TEST(OpsTest, DotRowsMatchesReference) {
  IsaCapGuard guard;
  for (Isa isa : SupportedIsas()) {
  ASSERT_TRUE(SetIsaCap(isa));
  SCOPED_TRACE(KernelIsa());
  for (int K : {1, 2, 6, 32, 33, 128}) {
    for (int n : {1, 3, 8, 9, 17}) {
      const int stride = K + 5;
      const std::vector<float> a = RandomWide(K, 11 + K);
      const std::vector<float> rows = RandomWide(static_cast<size_t>(n) * stride, 12 + n);
      std::vector<double> ad(a.begin(), a.end()), out(n);
      DotRows(ad.data(), K, rows.data(), stride, n, out.data());
      std::vector<double> rows_d(rows.begin(), rows.end()), out_d(n);
      DotRows(ad.data(), K, rows_d.data(), stride, n, out_d.data());
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(out[j], ReferenceDot(a.data(), &rows[j * stride], K)) << K << " " << n << " " << j;
        EXPECT_EQ(out_d[j], out[j]) << K << " " << n << " " << j;
      }
    }
  }
  }
}

TEST(OpsTest, RmsNormMatchesNaive) {
  const int T = 5, H = 77;
  const std::vector<float> x = Random(static_cast<size_t>(T) * H, 21, -3.f, 3.f);
  const std::vector<float> w = Random(H, 22, 0.5f, 1.5f);
  std::vector<float> y(x.size());
  RmsNorm(x.data(), w.data(), T, H, 1e-5f, y.data());
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    for (int i = 0; i < H; ++i) ss += static_cast<double>(x[t * H + i]) * x[t * H + i];
    const double r = std::sqrt(ss / H + 1e-5);
    for (int i = 0; i < H; ++i) {
      const double want = x[t * H + i] / r * w[i];
      EXPECT_NEAR(y[t * H + i], want, 1e-6 * std::max(1.0, std::abs(want)));
    }
  }
  // In place.
  std::vector<float> z = x;
  RmsNorm(z.data(), w.data(), T, H, 1e-5f, z.data());
  EXPECT_EQ(z, y);
}

TEST(OpsTest, RopeMatchesFormula) {
  const int D = 32, heads = 3;
  const float theta = 10000.f;
  RopeTable table(D, theta, 5000);
  EXPECT_EQ(table.max_pos(), 5000);
  for (int p : {0, 1, 7, 100, 4095, 4999}) {
    const std::vector<float> x = Random(static_cast<size_t>(heads) * D, 30 + p);
    std::vector<float> y = x;
    ApplyRope(y.data(), heads, table, p);
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < D / 2; ++i) {
        const double f = std::pow(10000.0, -2.0 * i / D);
        const double a = p * f;
        const double x0 = x[h * D + i], x1 = x[h * D + i + D / 2];
        EXPECT_NEAR(y[h * D + i], x0 * std::cos(a) - x1 * std::sin(a), 1e-6) << p << " " << i;
        EXPECT_NEAR(y[h * D + i + D / 2], x1 * std::cos(a) + x0 * std::sin(a), 1e-6) << p << " " << i;
      }
    }
    if (p == 0) {
      EXPECT_EQ(y, x);  // a = 0: identity
    }
  }
}

TEST(OpsTest, SiluMulMatchesNaive) {
  const std::vector<float> g = Random(100, 40, -8.f, 8.f), u = Random(100, 41, -2.f, 2.f);
  std::vector<float> out(100);
  SiluMul(g.data(), u.data(), 100, out.data());
  for (int i = 0; i < 100; ++i) {
    const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], want, 1e-6 * std::max(1.0, std::abs(want)));
  }
}

// Paged attention vs dense attention computed directly from per-position K/V.
TEST(OpsTest, PagedAttentionMatchesDense) {
  const int D = 32, B = 16, kv_heads = 2, q_heads = 4, blocks = 12;
  const std::vector<int> q_to_kv = {0, 0, 1, 1};
  for (int context : {1, 2, 15, 16, 17, 40, 97}) {
    SCOPED_TRACE(context);
    // Dense K/V [context, kv_heads, D] with a spread of magnitudes.
    const std::vector<float> k = Random(static_cast<size_t>(context) * kv_heads * D, 50 + context, -2.f, 2.f);
    const std::vector<float> v = Random(static_cast<size_t>(context) * kv_heads * D, 60 + context);
    const std::vector<float> q = Random(static_cast<size_t>(q_heads) * D, 70 + context, -2.f, 2.f);
    // Scatter into a paged cache through a shuffled block table; fill the rest with garbage.
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(context));
    std::vector<float> kc = Random(static_cast<size_t>(blocks) * B * kv_heads * D, 1, 50.f, 60.f);
    std::vector<float> vc = Random(kc.size(), 2, 50.f, 60.f);
    for (int j = 0; j < context; ++j) {
      const size_t slot = static_cast<size_t>(table[j / B]) * B + j % B;
      std::copy_n(&k[static_cast<size_t>(j) * kv_heads * D], kv_heads * D, &kc[slot * kv_heads * D]);
      std::copy_n(&v[static_cast<size_t>(j) * kv_heads * D], kv_heads * D, &vc[slot * kv_heads * D]);
    }
    std::vector<float> out(static_cast<size_t>(q_heads) * D, -1.f);
    AttentionScratch scratch;
    AttendOne(q.data(), q_heads, q_to_kv.data(), PagedKvView{kc.data(), vc.data(), B, kv_heads, D},
              table.data(), context, out.data(), &scratch);
    {
      // Every kernel variant gives the same bits.
      IsaCapGuard guard;
      for (Isa isa : SupportedIsas()) {
        ASSERT_TRUE(SetIsaCap(isa));
        std::vector<float> again(out.size(), -2.f);
        AttentionScratch fresh;
        AttendOne(q.data(), q_heads, q_to_kv.data(),
                  PagedKvView{kc.data(), vc.data(), B, kv_heads, D}, table.data(), context,
                  again.data(), &fresh);
        EXPECT_EQ(again, out) << KernelIsa();
      }
    }
    for (int h = 0; h < q_heads; ++h) {
      const int g = q_to_kv[h];
      std::vector<double> s(context);
      for (int j = 0; j < context; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(q[h * D + d]) * k[(j * kv_heads + g) * D + d];
        s[j] = dot / std::sqrt(static_cast<double>(D));
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (int d = 0; d < D; ++d) {
        double a = 0;
        for (int j = 0; j < context; ++j) a += s[j] / z * v[(j * kv_heads + g) * D + d];
        EXPECT_NEAR(out[h * D + d], a, 1e-6 * std::max(1.0, std::abs(a))) << h << " " << d;
      }
    }
  }
}

// An odd head_dim remainder (D % 16 != 0) takes the scalar tail of the PV loop.
TEST(OpsTest, PagedAttentionOddHeadDim) {
  const int D = 22, B = 4, kv_heads = 1, context = 9;
  const std::vector<int> q_to_kv = {0};
  const std::vector<int32_t> table = {2, 0, 1};
  const std::vector<float> kc = Random(static_cast<size_t>(3) * B * D, 80);
  const std::vector<float> vc = Random(kc.size(), 81);
  const std::vector<float> q = Random(D, 82);
  std::vector<float> out(D);
  AttentionScratch scratch;
  AttendOne(q.data(), 1, q_to_kv.data(), PagedKvView{kc.data(), vc.data(), B, kv_heads, D},
            table.data(), context, out.data(), &scratch);
  std::vector<double> s(context);
  for (int j = 0; j < context; ++j) {
    const size_t slot = static_cast<size_t>(table[j / B]) * B + j % B;
    double dot = 0;
    for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * kc[slot * D + d];
    s[j] = dot / std::sqrt(static_cast<double>(D));
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double z = 0;
  for (double& e : s) z += (e = std::exp(e - mx));
  for (int d = 0; d < D; ++d) {
    double a = 0;
    for (int j = 0; j < context; ++j) {
      const size_t slot = static_cast<size_t>(table[j / B]) * B + j % B;
      a += s[j] / z * vc[slot * D + d];
    }
    EXPECT_NEAR(out[d], a, 1e-6) << d;
  }
}

}  // namespace
}  // namespace symtp::model::cpu

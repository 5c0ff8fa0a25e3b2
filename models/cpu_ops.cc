#include "models/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "models/cpu_gemm.h"

namespace symtp::model::cpu {

void RmsNorm(const float* x, const float* w, int T, int H, float eps, float* out) {
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<int64_t>(t) * H;
    float* yr = out + static_cast<int64_t>(t) * H;
    double ss[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= H; i += 4) {
      for (int l = 0; l < 4; ++l) ss[l] += static_cast<double>(xr[i + l]) * xr[i + l];
    }
    for (; i < H; ++i) ss[i & 3] += static_cast<double>(xr[i]) * xr[i];
    const double ms = ((ss[0] + ss[1]) + (ss[2] + ss[3])) / H;
    const double inv = 1.0 / std::sqrt(ms + static_cast<double>(eps));
    for (int j = 0; j < H; ++j) {
      yr[j] = static_cast<float>(static_cast<double>(xr[j]) * inv * static_cast<double>(w[j]));
    }
  }
}

RopeTable::RopeTable(int head_dim, float theta, int max_pos) : d_(head_dim), max_pos_(max_pos) {
  const int half = head_dim / 2;
  cos_.resize(static_cast<size_t>(max_pos) * half);
  sin_.resize(static_cast<size_t>(max_pos) * half);
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) {
    f[i] = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
  }
  for (int p = 0; p < max_pos; ++p) {
    for (int i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * f[i];
      cos_[static_cast<size_t>(p) * half + i] = std::cos(a);
      sin_[static_cast<size_t>(p) * half + i] = std::sin(a);
    }
  }
}

void ApplyRope(float* x, int num_heads, const RopeTable& table, int p) {
  const int d = table.head_dim(), half = d / 2;
  const double* c = table.cos(p);
  const double* s = table.sin(p);
  for (int h = 0; h < num_heads; ++h) {
    float* xh = x + static_cast<int64_t>(h) * d;
    for (int i = 0; i < half; ++i) {
      const double a = xh[i], b = xh[i + half];
      xh[i] = static_cast<float>(a * c[i] - b * s[i]);
      xh[i + half] = static_cast<float>(b * c[i] + a * s[i]);
    }
  }
}

void SiluMul(const float* gate, const float* up, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * static_cast<double>(up[i]));
  }
}

namespace {

typedef double v4d __attribute__((vector_size(32)));

#define SYMTP_ALWAYS_INLINE inline __attribute__((always_inline))

// Sum of x[0..n) in a fixed order: lane l sums indices = l (mod 4) in order,
// then (l0 + l1) + (l2 + l3).
SYMTP_ALWAYS_INLINE double Sum4(const double* x, int n) {
  v4d acc = {0, 0, 0, 0};
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    v4d v;
    std::memcpy(&v, x + i, sizeof(v));
    acc += v;
  }
  for (; i < n; ++i) acc[i & 3] += x[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

SYMTP_ALWAYS_INLINE double Max4(const double* x, int n) {
  double m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  }
  for (; i < n; ++i) m[i & 3] = x[i] > m[i & 3] ? x[i] : m[i & 3];
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// This file is compiled with -ffp-contract=off, so the AVX2 instance below
// computes every p * v product and sum exactly like the baseline one.
SYMTP_ALWAYS_INLINE void AttendOneBody(const float* q, int num_q_heads,
                                      const int* q_to_kv, const PagedKvView& kv,
                                      const int32_t* block_table, int context, float* out,
                                      AttentionScratch* s) {
  const int D = kv.head_dim, B = kv.block_size;
  const int64_t slot_stride = static_cast<int64_t>(kv.kv_heads) * D;
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(D));
  const size_t hd = static_cast<size_t>(num_q_heads) * D;
  if (s->q.size() < hd) s->q.resize(hd);
  if (s->acc.size() < hd) s->acc.resize(hd);
  if (s->scores.size() < static_cast<size_t>(num_q_heads) * context) {
    s->scores.resize(static_cast<size_t>(num_q_heads) * context);
  }
  if (s->rows.size() < static_cast<size_t>(B) * D) s->rows.resize(static_cast<size_t>(B) * D);
  if (s->sums.size() < static_cast<size_t>(num_q_heads)) s->sums.resize(num_q_heads);
  s->group.reserve(num_q_heads);
  double* qd = s->q.data();
  double* rows = s->rows.data();
  for (size_t i = 0; i < hd; ++i) qd[i] = q[i];
  const int nblocks = (context + B - 1) / B;
  const int d16 = D - D % 16;
  for (int g = 0; g < kv.kv_heads; ++g) {
    // The q heads reading kv head g: each K and V row is converted once for all of them.
    s->group.clear();
    for (int h = 0; h < num_q_heads; ++h) {
      if (q_to_kv[h] == g) s->group.push_back(h);
    }
    if (s->group.empty()) continue;
    const int64_t head_off = static_cast<int64_t>(g) * D;
    // Scores s_j = dot(q, K_j) / sqrt(D).
    for (int b = 0; b < nblocks; ++b) {
      const int n = std::min(B, context - b * B);
      const float* kb = kv.k + static_cast<int64_t>(block_table[b]) * B * slot_stride + head_off;
      for (int j = 0; j < n; ++j) {
        for (int d = 0; d < D; ++d) rows[j * D + d] = kb[j * slot_stride + d];
      }
      for (int h : s->group) {
        DotRows(qd + static_cast<int64_t>(h) * D, D, rows, D, n,
                s->scores.data() + static_cast<int64_t>(h) * context + static_cast<int64_t>(b) * B);
      }
    }
    // Softmax weights (unnormalized) and their double sum, in position order.
    for (int h : s->group) {
      double* sc = s->scores.data() + static_cast<int64_t>(h) * context;
      for (int j = 0; j < context; ++j) sc[j] *= inv_sqrt_d;
      const double mx = Max4(sc, context);
      for (int j = 0; j < context; ++j) sc[j] -= mx;
      for (int j = 0; j < context; ++j) sc[j] = std::exp(sc[j]);
      s->sums[h] = Sum4(sc, context);
      double* acc = s->acc.data() + static_cast<int64_t>(h) * D;
      for (int d = 0; d < D; ++d) acc[d] = 0.0;
    }
    // acc[d] = sum over positions (in order) of p_j * V[j][d]; vectorized across d only.
    for (int b = 0; b < nblocks; ++b) {
      const int n = std::min(B, context - b * B);
      const float* vb = kv.v + static_cast<int64_t>(block_table[b]) * B * slot_stride + head_off;
      for (int j = 0; j < n; ++j) {
        for (int d = 0; d < D; ++d) rows[j * D + d] = vb[j * slot_stride + d];
      }
      for (int h : s->group) {
        const double* pb = s->scores.data() + static_cast<int64_t>(h) * context +
                           static_cast<int64_t>(b) * B;
        double* acc = s->acc.data() + static_cast<int64_t>(h) * D;
        for (int d0 = 0; d0 < d16; d0 += 16) {
          v4d a0, a1, a2, a3;
          std::memcpy(&a0, acc + d0, sizeof(v4d));
          std::memcpy(&a1, acc + d0 + 4, sizeof(v4d));
          std::memcpy(&a2, acc + d0 + 8, sizeof(v4d));
          std::memcpy(&a3, acc + d0 + 12, sizeof(v4d));
          for (int j = 0; j < n; ++j) {
            const double p = pb[j];
            const v4d pv = {p, p, p, p};
            const double* vr = rows + j * D + d0;
            v4d v0, v1, v2, v3;
            std::memcpy(&v0, vr, sizeof(v4d));
            std::memcpy(&v1, vr + 4, sizeof(v4d));
            std::memcpy(&v2, vr + 8, sizeof(v4d));
            std::memcpy(&v3, vr + 12, sizeof(v4d));
            a0 += pv * v0;
            a1 += pv * v1;
            a2 += pv * v2;
            a3 += pv * v3;
          }
          std::memcpy(acc + d0, &a0, sizeof(v4d));
          std::memcpy(acc + d0 + 4, &a1, sizeof(v4d));
          std::memcpy(acc + d0 + 8, &a2, sizeof(v4d));
          std::memcpy(acc + d0 + 12, &a3, sizeof(v4d));
        }
        for (int d = d16; d < D; ++d) {
          double a = acc[d];
          for (int j = 0; j < n; ++j) a += pb[j] * rows[j * D + d];
          acc[d] = a;
        }
      }
    }
    for (int h : s->group) {
      const double inv_sum = 1.0 / s->sums[h];
      const double* acc = s->acc.data() + static_cast<int64_t>(h) * D;
      float* oh = out + static_cast<int64_t>(h) * D;
      for (int d = 0; d < D; ++d) oh[d] = static_cast<float>(acc[d] * inv_sum);
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SYMTP_X86_DISPATCH 1
__attribute__((target("avx2"))) void AttendOneAvx2(const float* q, int num_q_heads,
                                                   const int* q_to_kv, const PagedKvView& kv,
                                                   const int32_t* block_table, int context,
                                                   float* out, AttentionScratch* s) {
  AttendOneBody(q, num_q_heads, q_to_kv, kv, block_table, context, out, s);
}
#endif

}  // namespace

void AttendOne(const float* q, int num_q_heads, const int* q_to_kv, const PagedKvView& kv,
               const int32_t* block_table, int context, float* out, AttentionScratch* s) {
#ifdef SYMTP_X86_DISPATCH
  if (ActiveIsa() >= Isa::kAvx2) return AttendOneAvx2(q, num_q_heads, q_to_kv, kv, block_table, context, out, s);
#endif
  AttendOneBody(q, num_q_heads, q_to_kv, kv, block_table, context, out, s);
}

}  // namespace symtp::model::cpu

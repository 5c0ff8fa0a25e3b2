// Compiled with -ffp-contract=fast: every product here is float*float in
// double, which is exact, so contracting it into an FMA cannot change a bit.
#include "models/cpu_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SYMTP_X86_DISPATCH 1
#include <immintrin.h>
#endif

namespace symtp::model::cpu {

Isa DetectedIsa() {
  static const Isa isa = [] {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
    return Isa::kBaseline;
  }();
  return isa;
}

namespace {
std::atomic<int> g_isa_cap{static_cast<int>(Isa::kAvx512)};
}  // namespace

Isa ActiveIsa() {
  return static_cast<Isa>(std::min(static_cast<int>(DetectedIsa()), g_isa_cap.load(std::memory_order_relaxed)));
}

bool SetIsaCap(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(DetectedIsa())) return false;
  g_isa_cap.store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

namespace {

typedef double v4d __attribute__((vector_size(32)));

#define SYMTP_ALWAYS_INLINE inline __attribute__((always_inline))

SYMTP_ALWAYS_INLINE void Load4(v4d* dst, const double* p) { std::memcpy(dst, p, sizeof(v4d)); }

SYMTP_ALWAYS_INLINE double Reduce(const v4d& a) { return (a[0] + a[1]) + (a[2] + a[3]); }

// x: MR rows of kp doubles (stride ldx); wp: 4 packed rows of kp doubles.
template <int MR>
SYMTP_ALWAYS_INLINE void Kernel(const double* x, int64_t ldx, const double* wp, int kp,
                                double out[][4]) {
  v4d acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = v4d{0, 0, 0, 0};
  for (int k = 0; k < kp; k += 4) {
    v4d w0, w1, w2, w3;
    Load4(&w0, wp + k);
    Load4(&w1, wp + kp + k);
    Load4(&w2, wp + 2 * kp + k);
    Load4(&w3, wp + 3 * kp + k);
    for (int m = 0; m < MR; ++m) {
      v4d xv;
      Load4(&xv, x + m * ldx + k);
      acc[m][0] += xv * w0;
      acc[m][1] += xv * w1;
      acc[m][2] += xv * w2;
      acc[m][3] += xv * w3;
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) out[m][j] = Reduce(acc[m][j]);
}

SYMTP_ALWAYS_INLINE void StoreBlock(const double out[][4], int rows, int cols, float* y,
                                    int64_t ldy) {
  for (int m = 0; m < rows; ++m)
    for (int j = 0; j < cols; ++j) y[m * ldy + j] = static_cast<float>(out[m][j]);
}

// Rows of x per chunk: keep the converted chunk around 256 KiB (L2).
inline int ChunkRows(int T, int kp) {
  return std::max(8, std::min(T, static_cast<int>((256 * 1024 / 8) / std::max(kp, 1))));
}

// tn rows of x (leading dimension ldx, K columns) as doubles, zero-padded to kp.
SYMTP_ALWAYS_INLINE void ConvertRows(const float* x, int64_t ldx, int tn, int K, int kp,
                                     double* xd) {
  for (int t = 0; t < tn; ++t) {
    const float* src = x + t * ldx;
    double* dst = xd + static_cast<int64_t>(t) * kp;
    for (int k = 0; k < K; ++k) dst[k] = src[k];
    for (int k = K; k < kp; ++k) dst[k] = 0.0;
  }
}

template <int MR>
SYMTP_ALWAYS_INLINE void MatMulBody(const float* x, int64_t ldx, int T, int K, const float* w,
                                    int N, float* y, int64_t ldy, MatMulScratch* s) {
  const int kp = (K + 3) & ~3;
  const int tc = ChunkRows(T, kp);
  if (s->x.size() < static_cast<size_t>(tc) * kp) s->x.resize(static_cast<size_t>(tc) * kp);
  if (s->w.size() < static_cast<size_t>(4) * kp) s->w.resize(static_cast<size_t>(4) * kp);
  double* xd = s->x.data();
  double* wp = s->w.data();
  for (int t0 = 0; t0 < T; t0 += tc) {
    const int tn = std::min(tc, T - t0);
    ConvertRows(x + t0 * ldx, ldx, tn, K, kp, xd);
    for (int n0 = 0; n0 < N; n0 += 4) {
      const int nn = std::min(4, N - n0);
      for (int j = 0; j < 4; ++j) {
        double* dst = wp + j * kp;
        if (j < nn) {
          const float* src = w + static_cast<int64_t>(n0 + j) * K;
          for (int k = 0; k < K; ++k) dst[k] = src[k];
          for (int k = K; k < kp; ++k) dst[k] = 0.0;
        } else {
          for (int k = 0; k < kp; ++k) dst[k] = 0.0;
        }
      }
      double out[MR][4];
      int t = 0;
      for (; t + MR <= tn; t += MR) {
        Kernel<MR>(xd + static_cast<int64_t>(t) * kp, kp, wp, kp, out);
        StoreBlock(out, MR, nn, y + (t0 + t) * ldy + n0, ldy);
      }
      for (; t < tn; ++t) {
        Kernel<1>(xd + static_cast<int64_t>(t) * kp, kp, wp, kp, out);
        StoreBlock(out, 1, nn, y + (t0 + t) * ldy + n0, ldy);
      }
    }
  }
}

// One row at a time, in blocks of R rows sharing the loads of `a`.
template <int R, typename Row>
SYMTP_ALWAYS_INLINE void DotRowsBlock(const double* a, int K, const Row* rows,
                                      int64_t row_stride, double* out) {
  const int k4 = K & ~3;
  v4d acc[R];
  for (int r = 0; r < R; ++r) acc[r] = v4d{0, 0, 0, 0};
  for (int k = 0; k < k4; k += 4) {
    v4d av;
    Load4(&av, a + k);
    for (int r = 0; r < R; ++r) {
      const Row* rr = rows + r * row_stride + k;
      const v4d b = {static_cast<double>(rr[0]), static_cast<double>(rr[1]),
                     static_cast<double>(rr[2]), static_cast<double>(rr[3])};
      acc[r] += av * b;
    }
  }
  for (int k = k4; k < K; ++k) {
    for (int r = 0; r < R; ++r) acc[r][k & 3] += a[k] * static_cast<double>(rows[r * row_stride + k]);
  }
  for (int r = 0; r < R; ++r) out[r] = Reduce(acc[r]);
}

template <typename Row>
SYMTP_ALWAYS_INLINE void DotRowsBody(const double* a, int K, const Row* rows,
                                     int64_t row_stride, int n, double* out) {
  int j = 0;
  for (; j + 4 <= n; j += 4) DotRowsBlock<4>(a, K, rows + j * row_stride, row_stride, out + j);
  for (; j < n; ++j) DotRowsBlock<1>(a, K, rows + j * row_stride, row_stride, out + j);
}

#ifdef SYMTP_X86_DISPATCH
// AVX-512: one zmm holds the 4 lanes of two dot products (two weight rows), the
// input's 4 doubles broadcast to both halves, so each dot keeps exactly the
// lane structure above.
#define SYMTP_AVX512 __attribute__((target("avx512f")))

// Packs rows [n0, n0+8) of w (zero rows past N) as, for each k-step of 4,
// four row pairs of 8 doubles: [r0 k..k+3 | r1 k..k+3] [r2|r3] [r4|r5] [r6|r7].
SYMTP_AVX512 void PackPanel8(const float* w, int N, int K, int kp, int n0, double* wp) {
  for (int p = 0; p < 4; ++p) {
    for (int half = 0; half < 2; ++half) {
      const int n = n0 + 2 * p + half;
      double* dst = wp + p * 8 + half * 4;
      if (n >= N) {
        for (int k = 0; k < kp; k += 4) _mm256_storeu_pd(dst + k * 8, _mm256_setzero_pd());
        continue;
      }
      const float* src = w + static_cast<int64_t>(n) * K;
      int k = 0;
      for (; k + 4 <= K; k += 4) {
        _mm256_storeu_pd(dst + k * 8, _mm256_cvtps_pd(_mm_loadu_ps(src + k)));
      }
      for (; k < kp; k += 4) {
        for (int l = 0; l < 4; ++l) dst[k * 8 + l] = (k + l < K) ? static_cast<double>(src[k + l]) : 0.0;
      }
    }
  }
}

template <int MR>
SYMTP_AVX512 SYMTP_ALWAYS_INLINE void Kernel512(const double* x, int64_t ldx, const double* wp,
                                                int kp, double out[][8]) {
  __m512d acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < 4; ++p) acc[m][p] = _mm512_setzero_pd();
  for (int k = 0; k < kp; k += 4) {
    const double* wk = wp + static_cast<int64_t>(k) * 8;
    const __m512d w0 = _mm512_loadu_pd(wk);
    const __m512d w1 = _mm512_loadu_pd(wk + 8);
    const __m512d w2 = _mm512_loadu_pd(wk + 16);
    const __m512d w3 = _mm512_loadu_pd(wk + 24);
    for (int m = 0; m < MR; ++m) {
      v4d x4;
      Load4(&x4, x + m * ldx + k);
      const __m512d xv = (__m512d)__builtin_shufflevector(x4, x4, 0, 1, 2, 3, 0, 1, 2, 3);
      acc[m][0] = _mm512_fmadd_pd(xv, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_pd(xv, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_pd(xv, w2, acc[m][2]);
      acc[m][3] = _mm512_fmadd_pd(xv, w3, acc[m][3]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int p = 0; p < 4; ++p) {
      alignas(64) double l[8];
      _mm512_store_pd(l, acc[m][p]);
      out[m][2 * p] = (l[0] + l[1]) + (l[2] + l[3]);
      out[m][2 * p + 1] = (l[4] + l[5]) + (l[6] + l[7]);
    }
  }
}

SYMTP_AVX512 void MatMulAvx512(const float* x, int64_t ldx, int T, int K, const float* w, int N,
                               float* y, int64_t ldy, MatMulScratch* s) {
  constexpr int MR = 4;
  const int kp = (K + 3) & ~3;
  const int tc = ChunkRows(T, kp);
  if (s->x.size() < static_cast<size_t>(tc) * kp) s->x.resize(static_cast<size_t>(tc) * kp);
  if (s->w.size() < static_cast<size_t>(8) * kp) s->w.resize(static_cast<size_t>(8) * kp);
  double* xd = s->x.data();
  double* wp = s->w.data();
  for (int t0 = 0; t0 < T; t0 += tc) {
    const int tn = std::min(tc, T - t0);
    ConvertRows(x + t0 * ldx, ldx, tn, K, kp, xd);
    for (int n0 = 0; n0 < N; n0 += 8) {
      const int nn = std::min(8, N - n0);
      PackPanel8(w, N, K, kp, n0, wp);
      double out[MR][8];
      int t = 0;
      for (; t + MR <= tn; t += MR) {
        Kernel512<MR>(xd + static_cast<int64_t>(t) * kp, kp, wp, kp, out);
        for (int m = 0; m < MR; ++m)
          for (int j = 0; j < nn; ++j) y[(t0 + t + m) * ldy + n0 + j] = static_cast<float>(out[m][j]);
      }
      for (; t < tn; ++t) {
        Kernel512<1>(xd + static_cast<int64_t>(t) * kp, kp, wp, kp, out);
        for (int j = 0; j < nn; ++j) y[(t0 + t) * ldy + n0 + j] = static_cast<float>(out[0][j]);
      }
    }
  }
}

// 8 rows at a time: zmm p holds rows (2p, 2p+1), `a` broadcast to both halves.
SYMTP_AVX512 SYMTP_ALWAYS_INLINE __m512d LoadPair(const float* lo, const float* hi) {
  return _mm512_maskz_cvtps_pd(0xFF, _mm256_set_m128(_mm_loadu_ps(hi), _mm_loadu_ps(lo)));
}
SYMTP_AVX512 SYMTP_ALWAYS_INLINE __m512d LoadPair(const double* lo, const double* hi) {
  v4d l, h;
  Load4(&l, lo);
  Load4(&h, hi);
  return (__m512d)__builtin_shufflevector(l, h, 0, 1, 2, 3, 4, 5, 6, 7);
}

template <typename Row>
SYMTP_AVX512 void DotRowsAvx512(const double* a, int K, const Row* rows, int64_t row_stride,
                                int n, double* out) {
  const int k4 = K & ~3;
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const Row* r0 = rows + j * row_stride;
    __m512d acc[4];
    for (int p = 0; p < 4; ++p) acc[p] = _mm512_setzero_pd();
    for (int k = 0; k < k4; k += 4) {
      v4d a4;
      Load4(&a4, a + k);
      const __m512d av = (__m512d)__builtin_shufflevector(a4, a4, 0, 1, 2, 3, 0, 1, 2, 3);
      for (int p = 0; p < 4; ++p) {
        const Row* ra = r0 + (2 * p) * row_stride + k;
        acc[p] = _mm512_fmadd_pd(av, LoadPair(ra, ra + row_stride), acc[p]);
      }
    }
    for (int p = 0; p < 4; ++p) {
      alignas(64) double l[8];
      _mm512_store_pd(l, acc[p]);
      for (int k = k4; k < K; ++k) {
        l[k & 3] += a[k] * static_cast<double>(r0[(2 * p) * row_stride + k]);
        l[4 + (k & 3)] += a[k] * static_cast<double>(r0[(2 * p + 1) * row_stride + k]);
      }
      out[j + 2 * p] = (l[0] + l[1]) + (l[2] + l[3]);
      out[j + 2 * p + 1] = (l[4] + l[5]) + (l[6] + l[7]);
    }
  }
  if (j < n) DotRowsBody(a, K, rows + j * row_stride, row_stride, n - j, out + j);
}

bool HaveAvx512() { return ActiveIsa() >= Isa::kAvx512; }

__attribute__((target("avx2,fma"))) void MatMulAvx2(const float* x, int64_t ldx, int T, int K,
                                                    const float* w, int N, float* y, int64_t ldy,
                                                    MatMulScratch* s) {
  MatMulBody<2>(x, ldx, T, K, w, N, y, ldy, s);
}
template <typename Row>
__attribute__((target("avx2,fma"))) void DotRowsAvx2(const double* a, int K, const Row* rows,
                                                     int64_t row_stride, int n, double* out) {
  DotRowsBody(a, K, rows, row_stride, n, out);
}
bool HaveAvx2() { return ActiveIsa() >= Isa::kAvx2; }
#endif

void MatMulBaseline(const float* x, int64_t ldx, int T, int K, const float* w, int N, float* y,
                    int64_t ldy, MatMulScratch* s) {
  MatMulBody<2>(x, ldx, T, K, w, N, y, ldy, s);
}

template <typename Row>
void DotRowsDispatch(const double* a, int K, const Row* rows, int64_t row_stride, int n,
                     double* out) {
  if (n <= 0) return;
#ifdef SYMTP_X86_DISPATCH
  if (HaveAvx512()) return DotRowsAvx512(a, K, rows, row_stride, n, out);
  if (HaveAvx2()) return DotRowsAvx2(a, K, rows, row_stride, n, out);
#endif
  DotRowsBody(a, K, rows, row_stride, n, out);
}

}  // namespace

void MatMulTransB(const float* x, int64_t ldx, int T, int K, const float* w, int N, float* y,
                  int64_t ldy, MatMulScratch* scratch) {
  if (T <= 0 || N <= 0) return;
  if (T < kMatMulMinPackedRows) {
    // Too few rows to amortize packing the weights: stream them unpacked.
    if (scratch->x.size() < static_cast<size_t>(K)) scratch->x.resize(K);
    if (scratch->out.size() < static_cast<size_t>(N)) scratch->out.resize(N);
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < K; ++k) scratch->x[k] = x[t * ldx + k];
      DotRows(scratch->x.data(), K, w, K, N, scratch->out.data());
      for (int n = 0; n < N; ++n) y[t * ldy + n] = static_cast<float>(scratch->out[n]);
    }
    return;
  }
#ifdef SYMTP_X86_DISPATCH
  if (HaveAvx512()) return MatMulAvx512(x, ldx, T, K, w, N, y, ldy, scratch);
  if (HaveAvx2()) return MatMulAvx2(x, ldx, T, K, w, N, y, ldy, scratch);
#endif
  MatMulBaseline(x, ldx, T, K, w, N, y, ldy, scratch);
}

void DotRows(const double* a, int K, const float* rows, int64_t row_stride, int n, double* out) {
  DotRowsDispatch(a, K, rows, row_stride, n, out);
}

void DotRows(const double* a, int K, const double* rows, int64_t row_stride, int n, double* out) {
  DotRowsDispatch(a, K, rows, row_stride, n, out);
}

double ReferenceDot(const float* a, const float* b, int K) {
  double lane[4] = {0, 0, 0, 0};
  for (int k = 0; k < K; ++k) {
    lane[k % 4] += static_cast<double>(a[k]) * static_cast<double>(b[k]);
  }
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

const char* KernelIsa() {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return "avx512f";
    case Isa::kAvx2:
      return "avx2+fma";
    case Isa::kBaseline:
      break;
  }
  return "baseline";
}

}  // namespace symtp::model::cpu

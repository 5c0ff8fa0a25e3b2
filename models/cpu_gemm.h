// Dense dot-product kernels of the CPU reference model. fp32 inputs, products
// and sums in double (products of two floats are exact in double).
//
// Every dot product of length K has one fixed summation order, whatever the
// batch size, the blocking or the instruction set picked at run time:
//   lane[l] = sum over k = l, l+4, l+8, ... (in increasing k) of a[k] * b[k]
//   dot     = (lane[0] + lane[1]) + (lane[2] + lane[3])
// so a row's result never depends on which other rows are in the same call
// (batch independence is bitwise), and the AVX2 and SSE2 paths agree bitwise.
#pragma once

#include <cstdint>
#include <vector>

namespace symtp::model::cpu {

// Reusable buffers of MatMulTransB (grow only).
struct MatMulScratch {
  std::vector<double> x;  // converted input rows
  std::vector<double> w;  // one packed weight panel
  std::vector<double> out;
};

// Calls with fewer rows stream the weights without packing them.
inline constexpr int kMatMulMinPackedRows = 4;

// y[t * ldy + n] = float(dot(x[t * ldx + 0..K), w[n * K + 0..K))) for t < T, n < N.
// `w` is row-major [N, K] (contiguous). T, N, K >= 0.
void MatMulTransB(const float* x, int64_t ldx, int T, int K, const float* w, int N, float* y,
                  int64_t ldy, MatMulScratch* scratch);

// out[j] = dot(a[0..K), rows[j * row_stride + 0..K)) for j < n, same summation
// order as above (a is already double).
void DotRows(const double* a, int K, const float* rows, int64_t row_stride, int n, double* out);
// Same with rows already in double (exact copies of floats for the exactness argument).
void DotRows(const double* a, int K, const double* rows, int64_t row_stride, int n, double* out);

// The reference semantics in plain scalar code (for tests).
double ReferenceDot(const float* a, const float* b, int K);

// Kernel variants, picked at run time. All of them compute the same bits.
enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
Isa DetectedIsa();  // the best this machine supports
Isa ActiveIsa();    // min(DetectedIsa(), the cap)
// Caps the variant used by every kernel (tests compare the variants; benches).
// Returns false, changing nothing, if this machine lacks `isa`.
bool SetIsaCap(Isa isa);
// Name of ActiveIsa(): "avx512f", "avx2+fma" or "baseline".
const char* KernelIsa();

}  // namespace symtp::model::cpu

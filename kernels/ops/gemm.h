// The GEMM of every linear layer, through cuBLASLt:
//
//   C[M, N] = A[M, K] · W[N, K]ᵀ (+ C)  (all row-major; y = x · Wᵀ of MODEL.md)
//
// A holds activations (M = tokens), W a weight in its [out_features,
// in_features] layout. bf16 inputs accumulate in fp32 (CUBLAS_COMPUTE_32F)
// and write bf16 or fp32; fp32 inputs use true fp32 (no TF32). The workspace
// is caller-owned; the call is capturable in a CUDA graph.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "kernels/comm.h"  // LLPush

namespace symtp::kernels {

// Move-only owner of a cublasLtHandle_t and of the matmul plans (descriptors
// plus the heuristic's algorithm) it has built, cached per shape. Not
// thread-safe: one handle per thread (per model).
class CublasLtHandle {
 public:
  static absl::StatusOr<CublasLtHandle> Create();
  CublasLtHandle();
  ~CublasLtHandle();
  CublasLtHandle(CublasLtHandle&&) noexcept;
  CublasLtHandle& operator=(CublasLtHandle&&) noexcept;
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;

  cublasLtHandle_t get() const;
  // Number of distinct shapes planned so far.
  size_t cached_plans() const;

  struct State;  // implementation detail (gemm.cc)
  State* state() const { return state_.get(); }

 private:
  std::unique_ptr<State> state_;
};

struct GemmArgs {
  const void* a = nullptr;  // [M, K], row stride lda (elements)
  int64_t lda = 0;          // 0: K
  const void* w = nullptr;  // [N, K], row stride ldw
  int64_t ldw = 0;          // 0: K
  void* c = nullptr;        // [M, N], row stride ldc
  int64_t ldc = 0;          // 0: N
  int64_t m = 0, n = 0, k = 0;
  DType in_dtype = DType::kBF16;   // A and W: kF32 or kBF16
  DType out_dtype = DType::kBF16;  // C: in_dtype, or kF32 with bf16 inputs
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // C = A · Wᵀ + C (the sum in fp32, rounded once) instead of C = A · Wᵀ:
  // a residual add in the GEMM's epilogue. C must not overlap A.
  bool accumulate = false;
  // Gemv and GemvSwiGlu only (Gemm rejects it), >= 0: row i of the product
  // is multiplied by A's own RMSNorm factor 1 / sqrt(mean(A[i]^2) + eps)
  // (summed in fp32) before it is rounded: the deferred norm of
  // layer_ops.h's DeferredNorm with x = A, applied by the GEMV, which holds
  // A's rows anyway. < 0: off.
  float a_rms_eps = -1.f;
};

// Enqueues C = A · Wᵀ (+ C with accumulate) on `stream`. m = 0 is a no-op. InvalidArgument for a
// bad shape or dtype combination; cuBLAS errors with their status.
absl::Status Gemm(CublasLtHandle& handle, const GemmArgs& args, cudaStream_t stream);

// The arguments of a product of contiguous operands, `dtype` in and out.
inline GemmArgs ContiguousGemmArgs(const void* a, const void* w, void* c, int64_t m, int64_t n,
                                   int64_t k, DType dtype, void* workspace,
                                   size_t workspace_bytes) {
  GemmArgs g;
  g.a = a;
  g.w = w;
  g.c = c;
  g.m = m;
  g.n = n;
  g.k = k;
  g.in_dtype = g.out_dtype = dtype;
  g.workspace = workspace;
  g.workspace_bytes = workspace_bytes;
  return g;
}

// Convenience for contiguous operands.
inline absl::Status Gemm(CublasLtHandle& handle, const void* a, const void* w, void* c, int64_t m,
                         int64_t n, int64_t k, DType dtype, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  return Gemm(handle, ContiguousGemmArgs(a, w, c, m, n, k, dtype, workspace, workspace_bytes),
              stream);
}

// The project's GEMM for decode's fewest rows (gemv.cu): a stream over the
// weights on every SM, launched with programmatic dependent launch so its
// first weights load while the kernel before it finishes; no workspace,
// deterministic. bf16 A and W, bf16 or fp32 C.
inline constexpr int kGemvMaxRows = 4;
inline constexpr int64_t kGemvMaxK = 16384;

// Whether Gemv takes `args`: bf16 in, bf16 or fp32 out, 1 <= m <=
// kGemvMaxRows, 8 <= k <= kGemvMaxK (8192 when m > 2), k and the A / W
// strides multiples of 8, A and W 16-byte aligned.
bool GemvSupports(const GemmArgs& args);

// Enqueues C = A · Wᵀ on `stream` (the workspace is ignored), with A's row
// factors (a_rms_eps) and + C (accumulate) where asked.
// InvalidArgument when !GemvSupports(args).
absl::Status Gemv(const GemmArgs& args, cudaStream_t stream);

// Gemv that also sends C, once each block has written its part, to every
// rank of `push` (its own slot included) as the custom all-reduce's LL lines
// (comm.h), for a fused all-reduce + RMSNorm called with norm.pushed after
// it, which then needs neither C nor this kernel's completion to reduce.
// bf16 C, contiguous (ldc = n), n a multiple of 8 and C 16-byte aligned; the
// blocks' rows are cut at multiples of 8 so that each 16-byte unit of C has
// one writer. Same bits as Gemv.
absl::Status GemvPush(const GemmArgs& args, const LLPush& push, cudaStream_t stream);

// Gemv of an MLP's gate and up projections with SwiGLU's activation in its
// flush: W is [n, k] with the gate rows first and the up rows after (n = 2
// F), and C, [m, F] with row stride ldc (0: F), gets SiLU(gate) * up from
// the bf16-rounded sums, so no SiluMul kernel runs after it; the same bits as
// Gemv into an [m, n] C then SiluMul (a_rms_eps alike). No accumulate.
bool GemvSwiGluSupports(const GemmArgs& args);
absl::Status GemvSwiGlu(const GemmArgs& args, cudaStream_t stream);

// A workspace size that lets cuBLASLt pick its fast (split-K) kernels.
inline constexpr size_t kGemmWorkspaceBytes = 32u << 20;

}  // namespace symtp::kernels

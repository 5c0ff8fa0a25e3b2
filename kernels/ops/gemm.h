// The GEMM of every linear layer, through cuBLASLt:
//
//   C[M, N] = A[M, K] · W[N, K]ᵀ      (all row-major; y = x · Wᵀ of MODEL.md)
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
#include "kernels/comm.h"
#include "kernels/ops/gemm_tuning.h"

namespace symtp::kernels {

// Which kernel runs a bf16 -> bf16 product (every other dtype combination,
// and calls with sm_count_target, run cuBLASLt).
enum class GemmKernelChoice {
  kCublasLt,  // the default
  // The hand-written sm_90a kernel (gemm_sm90.h) wherever it supports the
  // call. Opt-in: on an H200 it is faster than cuBLASLt's heuristic on only 4
  // of the 80 decode shapes measured, by <= 5% (bench/results/h200-2026-11-23,
  // runs aa-ai).
  kSm90,
};

// How GEMM autotuning times its candidates (CublasLtHandle::set_autotune_timing).
enum class GemmAutotuneTiming {
  kGraph,  // per call of a captured CUDA graph (the default)
  kEager,  // one launch between two events
};

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

  // Algorithm choice for shapes planned from now on: 1 (the default) takes
  // cuBLASLt's first heuristic; N > 1 times up to N of its candidates once,
  // on the call's own operands (3 runs each, the stream synchronized; how:
  // set_autotune_timing), and keeps the fastest. Planning inside a stream capture always takes the
  // first heuristic. The choice depends on timing, so two processes may pick
  // different algorithms for a shape (bf16 bits may then differ between
  // runs, never within one: the plan is cached); a tuning table
  // (set_tuning_table) pins the algorithms instead. Autotuned picks that are
  // each faster per call need not make a decode step faster, and they vary
  // from run to run (bench/results/h200-2026-11-24, runs ah-al): choose
  // tables by timing steps (kernels_bench --sections modelab).
  void set_autotune_candidates(int n);
  int autotune_candidates() const;
  // With autotuning on, also time every tile shape, thread-block cluster
  // shape (up to 4 x 2 / 2 x 4), stages, split-K count (1-4) and CTA swizzle
  // that cuBLASLt accepts for the algorithms of its heuristic list (a study
  // tool for kernels_bench, off by default; on an H200 with cuBLAS 13 that
  // made 4120 candidates and ~20 s per decode shape). The pick is logged
  // (gemm=info).
  void set_autotune_exhaustive(bool on);
  // How autotuning times a candidate: per call of a CUDA graph of 10 (kGraph,
  // the default: as decode steps run them) or one eager call (kEager, which
  // includes the launch). Candidates that cannot be captured are left out
  // under kGraph; on the legacy default stream timing is eager.
  void set_autotune_timing(GemmAutotuneTiming t);
  GemmAutotuneTiming autotune_timing() const;
  // Autotuning keeps a candidate other than the heuristic's first only when
  // it is faster by more than this fraction of the first's time (default 0:
  // any win). Timing noise is ~1-3% per candidate on an H200.
  void set_autotune_margin(double fraction);
  double autotune_margin() const;
  // Algorithms from a tuning table (gemm_tuning.h) for shapes planned from
  // now on: a shape the table holds runs the table's algorithm, neither the
  // heuristic nor autotuning; other shapes are planned as before. The table
  // must have been made with this device and cuBLASLt (FailedPrecondition
  // otherwise); an algorithm that cuBLASLt rejects for its shape makes that
  // Gemm call fail with FailedPrecondition. nullptr: no table.
  absl::Status set_tuning_table(std::shared_ptr<const GemmTuningTable> table);
  // The algorithm of every cuBLASLt plan built so far, with the times
  // autotuning measured (0 where it did not), as a table for this device.
  absl::StatusOr<GemmTuningTable> ExportPlans() const;
  // Plans whose algorithm came from the tuning table.
  size_t plans_from_table() const;
  // Default kCublasLt. The sm_90a kernel needs a compute capability 9.0 device and
  // 16-byte aligned operands with strides in multiples of 8 elements; calls it
  // cannot run fall back to cuBLASLt.
  void set_kernel_choice(GemmKernelChoice c);
  GemmKernelChoice kernel_choice() const;
  // bf16 -> bf16 products with m <= this (at most 32) run the weight-streaming
  // kernel of gemm_skinny.h where it supports the call (0, the default: never;
  // measured slower than cuBLASLt on an H200, see that header).
  void set_skinny_max_m(int64_t m);
  int64_t skinny_max_m() const;

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
  // > 0: ask cuBLASLt to run on at most this many SMs (leaves the rest to a
  // kernel running beside it, e.g. an all-reduce on a side stream).
  int sm_count_target = 0;
};

// Enqueues C = A · Wᵀ on `stream`. m = 0 is a no-op. InvalidArgument for a
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

// A workspace size that lets cuBLASLt pick its fast (split-K) kernels.
inline constexpr size_t kGemmWorkspaceBytes = 32u << 20;

}  // namespace symtp::kernels

#include "kernels/ops/gemm.h"

#include <compare>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/status_macros.h"

namespace symtp::kernels {
namespace {

// Row-major C[M,N] = A[M,K] · W[N,K]ᵀ is column-major Cᵀ[N,M] = W' · A' with
// W' = W viewed column-major [K,N] transposed (op T) and A' = A viewed
// column-major [K,M] (op N): cuBLAS m = N, n = M, k = K.

// What a plan is cached by (every field cuBLASLt's choice can depend on).
struct PlanKey {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldw = 0, ldc = 0;
  DType in_dtype = DType::kBF16, out_dtype = DType::kBF16;
  uint64_t workspace_bytes = 0;
  int align_a = 0, align_w = 0, align_c = 0;  // pointer alignment in bytes (power of two <= 256)
  auto operator<=>(const PlanKey&) const = default;
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, a = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

void DestroyPlan(Plan& p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  if (p.w) cublasLtMatrixLayoutDestroy(p.w);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  p = Plan{};
}

cudaDataType_t CudaType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// Largest power of two (<= 256) dividing the address: what cuBLASLt may
// assume about the pointer.
int AlignmentOf(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

}  // namespace

struct CublasLtHandle::State {
  cublasLtHandle_t handle = nullptr;
  std::map<PlanKey, Plan> plans;
  ~State() {
    for (auto& [key, plan] : plans) DestroyPlan(plan);
    if (handle) cublasLtDestroy(handle);
  }
};

CublasLtHandle::CublasLtHandle() = default;
CublasLtHandle::~CublasLtHandle() = default;
CublasLtHandle::CublasLtHandle(CublasLtHandle&&) noexcept = default;
CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&&) noexcept = default;

absl::StatusOr<CublasLtHandle> CublasLtHandle::Create() {
  CublasLtHandle h;
  h.state_ = std::make_unique<State>();
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h.state_->handle));
  return h;
}

cublasLtHandle_t CublasLtHandle::get() const { return state_ ? state_->handle : nullptr; }
size_t CublasLtHandle::cached_plans() const { return state_ ? state_->plans.size() : 0; }

namespace {

// Descriptors for `key` and cuBLASLt's first heuristic algorithm for them.
absl::StatusOr<Plan> BuildPlan(cublasLtHandle_t h, const PlanKey& key, const GemmArgs& g) {
  const int64_t lda = key.lda, ldw = key.ldw, ldc = key.ldc;
  Plan p;
  auto fail = [&](absl::Status s) {
    DestroyPlan(p);
    return s;
  };
  auto check = [&](cublasStatus_t st, const char* what) -> absl::Status {
    if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
    return ::symtp::CublasErrorToStatus(st, what, __FILE__, __LINE__);
  };
  absl::Status s;
  const cudaDataType_t in = CudaType(g.in_dtype), out = CudaType(g.out_dtype);
  s = check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  if (!s.ok()) return fail(s);
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  s = check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)),
            "set TRANSA");
  if (!s.ok()) return fail(s);
  s = check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)),
            "set TRANSB");
  if (!s.ok()) return fail(s);
  s = check(cublasLtMatrixLayoutCreate(&p.w, in, static_cast<uint64_t>(g.k),
                                       static_cast<uint64_t>(g.n), ldw),
            "layout W");
  if (!s.ok()) return fail(s);
  s = check(cublasLtMatrixLayoutCreate(&p.a, in, static_cast<uint64_t>(g.k),
                                       static_cast<uint64_t>(g.m), lda),
            "layout A");
  if (!s.ok()) return fail(s);
  s = check(cublasLtMatrixLayoutCreate(&p.c, out, static_cast<uint64_t>(g.n),
                                       static_cast<uint64_t>(g.m), ldc),
            "layout C");
  if (!s.ok()) return fail(s);
  cublasLtMatmulPreference_t pref = nullptr;
  s = check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  if (!s.ok()) return fail(s);
  const uint64_t ws = g.workspace_bytes;
  const uint32_t al_w = AlignmentOf(g.w), al_a = AlignmentOf(g.a), al_c = AlignmentOf(g.c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_w,
                                       sizeof(al_w));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a,
                                       sizeof(al_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                       sizeof(al_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                       sizeof(al_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(h, p.op, p.w, p.a, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    return fail(absl::UnimplementedError(absl::StrFormat(
        "cuBLASLt has no algorithm for C[%d,%d] = A[%d,%d]·W[%d,%d]ᵀ (%s -> %s, ld %d/%d/%d): %s",
        g.m, g.n, g.m, g.k, g.n, g.k, DTypeName(g.in_dtype), DTypeName(g.out_dtype), lda, ldw, ldc,
        cublasGetStatusString(hs))));
  }
  p.algo = result.algo;
  return p;
}

}  // namespace

absl::Status Gemm(CublasLtHandle& handle, const GemmArgs& g, cudaStream_t stream) {
  CublasLtHandle::State* st = handle.state();
  if (st == nullptr || st->handle == nullptr) {
    return absl::FailedPreconditionError("Gemm: empty CublasLtHandle");
  }
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k, ldc = g.ldc ? g.ldc : g.n;
  if (g.m < 0 || g.n <= 0 || g.k <= 0 || lda < g.k || ldw < g.k || ldc < g.n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Gemm: bad shape m=%d n=%d k=%d lda=%d ldw=%d ldc=%d", g.m, g.n, g.k, lda, ldw, ldc));
  }
  const bool ok_types =
      (g.in_dtype == DType::kF32 && g.out_dtype == DType::kF32) ||
      (g.in_dtype == DType::kBF16 && (g.out_dtype == DType::kBF16 || g.out_dtype == DType::kF32));
  if (!ok_types) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Gemm: unsupported dtypes %s -> %s", DTypeName(g.in_dtype), DTypeName(g.out_dtype)));
  }
  if (g.a_rms_eps >= 0.f) {
    return absl::InvalidArgumentError("Gemm: a_rms_eps is applied by Gemv only");
  }
  if (g.m == 0) return absl::OkStatus();
  PlanKey key;
  key.m = g.m;
  key.n = g.n;
  key.k = g.k;
  key.lda = lda;
  key.ldw = ldw;
  key.ldc = ldc;
  key.in_dtype = g.in_dtype;
  key.out_dtype = g.out_dtype;
  key.workspace_bytes = g.workspace_bytes;
  key.align_a = AlignmentOf(g.a);
  key.align_w = AlignmentOf(g.w);
  key.align_c = AlignmentOf(g.c);
  auto it = st->plans.find(key);
  if (it == st->plans.end()) {
    SYMTP_ASSIGN_OR_RETURN(Plan plan, BuildPlan(st->handle, key, g));
    it = st->plans.emplace(key, plan).first;
  }
  const Plan& p = it->second;
  // The plan does not depend on beta: the same algorithm reads C when
  // accumulating (C and D share one layout, as an in-place product needs).
  const float alpha = 1.f, beta = g.accumulate ? 1.f : 0.f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(st->handle, p.op, &alpha, g.w, p.w, g.a, p.a, &beta, g.c,
                                        p.c, g.c, p.c, &p.algo, g.workspace, g.workspace_bytes,
                                        stream));
  return absl::OkStatus();
}

}  // namespace symtp::kernels

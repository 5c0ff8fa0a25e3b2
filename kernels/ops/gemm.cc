#include "kernels/ops/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/ops/gemm_skinny.h"
#include "kernels/ops/gemm_sm90.h"

namespace symtp::kernels {
namespace {

// Row-major C[M,N] = A[M,K] · W[N,K]ᵀ is column-major Cᵀ[N,M] = W' · A' with
// W' = W viewed column-major [K,N] transposed (op T) and A' = A viewed
// column-major [K,M] (op N): cuBLAS m = N, n = M, k = K.
static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmTuningEntry::algo),
              "a tuning table stores cublasLtMatmulAlgo_t byte for byte");

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, a = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  double pick_us = 0, heuristic_us = 0;  // autotuning's times (0: not timed)
  bool from_table = false;
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

// Grows `buf` to at least `need` unsigned counters (4096 at the least),
// zeroed on `stream` when (re)allocated; the kernels that use them leave them
// zero after every launch (a handle serves one stream at a time). Returns how
// many counters `buf` holds.
absl::StatusOr<int64_t> EnsureZeroedCounters(cuda::DeviceBuffer& buf, int64_t need,
                                             cudaStream_t stream) {
  if (buf.bytes() < static_cast<size_t>(need) * sizeof(unsigned int)) {
    SYMTP_ASSIGN_OR_RETURN(
        buf, cuda::DeviceBuffer::Create(std::max<int64_t>(need, 4096) * sizeof(unsigned int)));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buf.get(), 0, buf.bytes(), stream));
  }
  return static_cast<int64_t>(buf.bytes() / sizeof(unsigned int));
}

}  // namespace

struct CublasLtHandle::State {
  cublasLtHandle_t handle = nullptr;
  std::map<GemmTuningKey, Plan> plans;
  int autotune = 1;
  double margin = 0;
  std::shared_ptr<const GemmTuningTable> tuning;
  bool exhaustive = false;
  GemmAutotuneTiming timing = GemmAutotuneTiming::kGraph;
  GemmKernelChoice choice = GemmKernelChoice::kCublasLt;
  cuda::DeviceBuffer sm90_counters;  // GemmKernelChoice::kSm90's global split-K
  int64_t skinny_max_m = 0;
  cuda::DeviceBuffer skinny_counters;  // tile counters of the weight-streaming kernel
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
void CublasLtHandle::set_autotune_candidates(int n) {
  if (state_) state_->autotune = std::max(1, std::min(n, 32));
}
int CublasLtHandle::autotune_candidates() const { return state_ ? state_->autotune : 1; }
void CublasLtHandle::set_autotune_exhaustive(bool on) {
  if (state_) state_->exhaustive = on;
}
void CublasLtHandle::set_autotune_timing(GemmAutotuneTiming t) {
  if (state_) state_->timing = t;
}
GemmAutotuneTiming CublasLtHandle::autotune_timing() const {
  return state_ ? state_->timing : GemmAutotuneTiming::kGraph;
}
void CublasLtHandle::set_kernel_choice(GemmKernelChoice c) {
  if (state_) state_->choice = c;
}
void CublasLtHandle::set_skinny_max_m(int64_t m) {
  if (state_) state_->skinny_max_m = std::max<int64_t>(0, std::min<int64_t>(m, kSkinnyMaxM));
}
int64_t CublasLtHandle::skinny_max_m() const { return state_ ? state_->skinny_max_m : 0; }

void CublasLtHandle::set_autotune_margin(double fraction) {
  if (state_) state_->margin = std::max(0.0, std::min(fraction, 0.9));
}
double CublasLtHandle::autotune_margin() const { return state_ ? state_->margin : 0; }

absl::Status CublasLtHandle::set_tuning_table(std::shared_ptr<const GemmTuningTable> table) {
  if (!state_) return absl::FailedPreconditionError("set_tuning_table: empty CublasLtHandle");
  if (table) {
    SYMTP_ASSIGN_OR_RETURN(const GemmTuningIdentity here, CurrentGemmTuningIdentity());
    SYMTP_RETURN_IF_ERROR(table->CheckUsableOn(here));
  }
  state_->tuning = std::move(table);
  return absl::OkStatus();
}

size_t CublasLtHandle::plans_from_table() const {
  size_t n = 0;
  if (state_) {
    for (const auto& [key, plan] : state_->plans) n += plan.from_table ? 1 : 0;
  }
  return n;
}

GemmKernelChoice CublasLtHandle::kernel_choice() const {
  return state_ ? state_->choice : GemmKernelChoice::kCublasLt;
}

namespace {

// Calls per graph when candidates are timed in CUDA graphs.
constexpr int kGraphCalls = 10;

// Copies of W that graph timing cycles through so that, as in a decode step
// (each layer's weights read once), W does not stay in L2 between calls:
// enough to cover three times the L2 (at most kGraphCalls; one when W alone
// is larger than twice the L2). With or without the copies, 16 candidates'
// picks made a 4-layer llama-8b decode step 2-5% slower than the heuristic's
// (bench/results/h200-2026-11-24, runs ac-ae), which is why autotuning stays
// off by default.
struct WeightCopies {
  cuda::DeviceBuffer extra;  // copies - 1 of W, each `bytes` apart
  int copies = 1;
  size_t bytes = 0;
  const void* Get(const void* w, int i) const {
    const int c = i % copies;
    return c == 0 ? w : static_cast<const char*>(extra.get()) + (c - 1) * bytes;
  }
};

// W's copies for g (rows of ldw elements); a failed allocation leaves one
// (the timing is then optimistic for small W, not wrong).
absl::StatusOr<WeightCopies> MakeWeightCopies(const GemmArgs& g, int64_t ldw, cudaStream_t stream) {
  WeightCopies wc;
  int dev = 0, l2 = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const size_t elem = g.in_dtype == DType::kF32 ? 4 : 2;
  wc.bytes = ((static_cast<size_t>(g.n - 1) * ldw + g.k) * elem + 255) / 256 * 256;
  if (wc.bytes == 0 || wc.bytes >= 2 * static_cast<size_t>(l2)) return wc;
  const int want = static_cast<int>(
      std::min<size_t>(kGraphCalls, (3 * static_cast<size_t>(l2) + wc.bytes - 1) / wc.bytes));
  if (want < 2) return wc;
  absl::StatusOr<cuda::DeviceBuffer> extra = cuda::DeviceBuffer::Create((want - 1) * wc.bytes);
  if (!extra.ok()) {
    cudaGetLastError();
    SYMTP_LOG(INFO, "gemm") << "autotune C[" << g.m << "," << g.n << "] K=" << g.k
                            << ": no room for " << want - 1 << " copies of W ("
                            << extra.status().message() << "); timing on one";
    return wc;
  }
  wc.extra = *std::move(extra);
  const size_t used = (static_cast<size_t>(g.n - 1) * ldw + g.k) * elem;
  for (int c = 1; c < want; ++c) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(wc.extra.get()) + (c - 1) * wc.bytes,
                                         g.w, used, cudaMemcpyDeviceToDevice, stream));
  }
  wc.copies = want;
  return wc;
}

// Index of the fastest of `cands` on g's operands: each is run once to warm
// up, then timed 3 times (CUDA events, the stream synchronized) and scored by
// its best run: one eager call each time (kEager), or one replay of a graph
// of kGraphCalls calls cycling through copies of W, per call (kGraph; on the
// legacy default stream, which cannot be captured, eager). A candidate that
// fails to run or to be captured is skipped; an event or graph launch
// failure is an error.
struct Fastest {
  int index = 0;
  float ms = 0, first_ms = 0;  // the pick's and candidate 0's time per call (0: did not run)
};

absl::StatusOr<Fastest> FastestCandidate(cublasLtHandle_t h, const Plan& p, const GemmArgs& g,
                                         int64_t ldw, const cublasLtMatmulHeuristicResult_t* cands,
                                         int n, GemmAutotuneTiming timing, cudaStream_t stream) {
  SYMTP_ASSIGN_OR_RETURN(cuda::Event e0, cuda::Event::Create(/*timing=*/true));
  SYMTP_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create(/*timing=*/true));
  const bool in_graph = timing == GemmAutotuneTiming::kGraph && stream != nullptr &&
                        stream != cudaStreamLegacy && stream != cudaStreamPerThread;
  WeightCopies wc;
  if (in_graph) {
    SYMTP_ASSIGN_OR_RETURN(wc, MakeWeightCopies(g, ldw, stream));
  }
  const float alpha = 1.f, beta = 0.f;
  int best = 0;
  float best_ms = -1.f, first_ms = 0.f;
  for (int i = 0; i < n; ++i) {
    if (cands[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto run = [&](const void* w) {
      return cublasLtMatmul(h, p.op, &alpha, w, p.w, g.a, p.a, &beta, g.c, p.c, g.c, p.c,
                            &cands[i].algo, g.workspace, g.workspace_bytes,
                            stream) == CUBLAS_STATUS_SUCCESS;
    };
    if (!run(g.w)) continue;
    cuda::GraphExec graph;
    if (in_graph) {
      absl::StatusOr<cuda::GraphExec> exec =
          cuda::GraphExec::Capture(stream, [&]() -> absl::Status {
            for (int c = 0; c < kGraphCalls; ++c) {
              if (!run(wc.Get(g.w, c))) {
                return absl::InternalError("cublasLtMatmul failed in capture");
              }
            }
            return absl::OkStatus();
          });
      if (!exec.ok()) continue;  // not capturable: of no use to decode graphs
      graph = *std::move(exec);
      SYMTP_RETURN_IF_ERROR(graph.Launch(stream));  // warm-up (uploads the graph)
    }
    float ms = -1.f;
    for (int rep = 0; rep < 3 && ms != -2.f; ++rep) {
      CUDA_RETURN_IF_ERROR(cudaEventRecord(e0.get(), stream));
      bool ran = true;
      if (in_graph) {
        SYMTP_RETURN_IF_ERROR(graph.Launch(stream));
      } else {
        ran = run(g.w);
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(e1.get(), stream));
      SYMTP_RETURN_IF_ERROR(
          cuda::WaitEvent(e1.get(), Deadline::AfterMs(30'000), "GEMM autotune timing"));
      float t = 0.f;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, e0.get(), e1.get()));
      if (in_graph) t /= kGraphCalls;
      ms = !ran ? -2.f : (ms < 0.f || t < ms) ? t : ms;
    }
    if (i == 0 && ms >= 0.f) first_ms = ms;
    if (ms >= 0.f && (best_ms < 0.f || ms < best_ms)) {
      best_ms = ms;
      best = i;
    }
  }
  return Fastest{best, std::max(best_ms, 0.f), first_ms};
}

// "algo 66 tile 20 stages 0 split 2 cluster 3 swizzle 0" (cuBLASLt's enum
// values), for the logs.
std::string DescribeAlgo(const cublasLtMatmulAlgo_t& algo) {
  int32_t id = -1, split = 1;
  uint32_t tile = 0, stages = 0, swizzle = 0;
  uint16_t cluster = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                       sizeof(stages), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                       sizeof(split), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                       sizeof(cluster), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle,
                                       sizeof(swizzle), &w);
  return absl::StrFormat("algo %d tile %u stages %u split %d cluster %u swizzle %u", id, tile,
                         stages, split, cluster, swizzle);
}

// Sets an algorithm's split-K count, partial sums in fp32 (the compute type)
// in the workspace when split.
bool SetSplitK(cublasLtMatmulAlgo_t* algo, int32_t splits) {
  const uint32_t scheme =
      splits > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
  return cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                              sizeof(splits)) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                              sizeof(scheme)) == CUBLAS_STATUS_SUCCESS;
}

// `from`'s algorithm id, tile and stages on a fresh cublasLtMatmulAlgoInit
// configuration with `cluster`, no split-K and no CTA swizzle.
bool RebuildWithCluster(cublasLtHandle_t h, const GemmArgs& g, const cublasLtMatmulAlgo_t& from,
                        uint16_t cluster, cublasLtMatmulAlgo_t* out) {
  int32_t id = -1;
  uint32_t tile = 0, stages = 0, swizzle = 0;
  size_t w = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&from, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigGetAttribute(&from, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                           &w) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigGetAttribute(&from, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                           sizeof(stages), &w) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  const cudaDataType_t in = CudaType(g.in_dtype), outt = CudaType(g.out_dtype);
  if (cublasLtMatmulAlgoInit(h, CUBLAS_COMPUTE_32F, CUDA_R_32F, in, in, outt, outt, id, out) !=
      CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  return cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                              sizeof(tile)) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                              sizeof(stages)) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                              sizeof(cluster)) == CUBLAS_STATUS_SUCCESS &&
         SetSplitK(out, 1) &&
         cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle,
                                              sizeof(swizzle)) == CUBLAS_STATUS_SUCCESS;
}

// Appends `c` (an algorithm configured for g's plan) to `out` if cuBLASLt
// accepts it for this problem within g's workspace.
void AppendIfAccepted(cublasLtHandle_t h, const Plan& p, const GemmArgs& g,
                      cublasLtMatmulHeuristicResult_t c,
                      std::vector<cublasLtMatmulHeuristicResult_t>& out) {
  if (cublasLtMatmulAlgoCheck(h, p.op, p.w, p.a, p.c, p.c, &c.algo, &c) != CUBLAS_STATUS_SUCCESS ||
      c.workspaceSize > g.workspace_bytes) {
    return;
  }
  c.state = CUBLAS_STATUS_SUCCESS;
  out.push_back(c);
}

// Every configuration cuBLASLt accepts for g's plan among the algorithms of
// the heuristic list: tile x cluster shape (up to 4 x 2 / 2 x 4) x stages (the
// algorithm's list) x split-K (1-4, fp32 partials) x CTA swizzle; at most
// `limit`.
std::vector<cublasLtMatmulHeuristicResult_t> ExhaustiveCandidates(
    cublasLtHandle_t h, const Plan& p, const GemmArgs& g,
    const cublasLtMatmulHeuristicResult_t* heur, int found, size_t limit) {
  std::vector<cublasLtMatmulHeuristicResult_t> out;
  std::vector<int32_t> ids;
  for (int i = 0; i < found; ++i) {
    int32_t id = -1;
    size_t w = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&heur[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id,
                                             sizeof(id), &w) == CUBLAS_STATUS_SUCCESS &&
        std::find(ids.begin(), ids.end(), id) == ids.end()) {
      ids.push_back(id);
    }
  }
  const cudaDataType_t in = CudaType(g.in_dtype), outt = CudaType(g.out_dtype);
  for (const int32_t id : ids) {
    cublasLtMatmulAlgo_t algo;
    if (cublasLtMatmulAlgoInit(h, CUBLAS_COMPUTE_32F, CUDA_R_32F, in, in, outt, outt, id, &algo) !=
        CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    size_t bytes = 0;
    std::vector<uint32_t> tiles;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) ==
            CUBLAS_STATUS_SUCCESS &&
        bytes > 0) {
      tiles.resize(bytes / sizeof(uint32_t));
      cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes,
                                        &bytes);
    }
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    std::vector<uint32_t> stages;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0,
                                          &bytes) == CUBLAS_STATUS_SUCCESS &&
        bytes > 0) {
      stages.resize(bytes / sizeof(uint32_t));
      cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), bytes,
                                        &bytes);
    }
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    int32_t splitk_ok = 0;
    uint32_t swizzle_ok = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok,
                                      sizeof(splitk_ok), &bytes);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swizzle_ok,
                                      sizeof(swizzle_ok), &bytes);
    for (const uint32_t tile : tiles) {
      for (const uint16_t cluster :
           {uint16_t{CUBLASLT_CLUSTER_SHAPE_AUTO}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x1x1},
            uint16_t{CUBLASLT_CLUSTER_SHAPE_2x1x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x2x1},
            uint16_t{CUBLASLT_CLUSTER_SHAPE_4x1x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x4x1},
            uint16_t{CUBLASLT_CLUSTER_SHAPE_2x2x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_4x2x1},
            uint16_t{CUBLASLT_CLUSTER_SHAPE_2x4x1}}) {
        for (const uint32_t stage : stages) {
          for (const int32_t split : {1, 2, 3, 4}) {
            if (split > 1 && splitk_ok == 0) break;
            for (uint32_t swizzle = 0; swizzle <= (swizzle_ok ? 1u : 0u); ++swizzle) {
              cublasLtMatmulHeuristicResult_t c{};
              c.algo = algo;
              cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                   sizeof(tile));
              cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                   &cluster, sizeof(cluster));
              cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage,
                                                   sizeof(stage));
              SetSplitK(&c.algo, split);
              cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                                   &swizzle, sizeof(swizzle));
              AppendIfAccepted(h, p, g, c, out);
              if (out.size() >= limit) return out;
            }
          }
        }
      }
    }
  }
  return out;
}

absl::StatusOr<Plan> BuildPlan(const CublasLtHandle::State& st, const GemmTuningKey& key,
                               const GemmArgs& g, cudaStream_t stream) {
  cublasLtHandle_t h = st.handle;
  const int64_t lda = key.lda, ldw = key.ldw, ldc = key.ldc;
  const int autotune = st.autotune;
  const bool exhaustive = st.exhaustive;
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
  if (g.sm_count_target > 0) {
    const int32_t sms = g.sm_count_target;
    s = check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms,
                                             sizeof(sms)),
              "set SM_COUNT_TARGET");
    if (!s.ok()) return fail(s);
  }
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
  if (const GemmTuningEntry* e = st.tuning ? st.tuning->Find(key) : nullptr) {
    std::memcpy(&p.algo, e->algo.data(), sizeof(p.algo));
    cublasLtMatmulHeuristicResult_t r{};
    const cublasStatus_t cs = cublasLtMatmulAlgoCheck(h, p.op, p.w, p.a, p.c, p.c, &p.algo, &r);
    if (cs != CUBLAS_STATUS_SUCCESS || r.workspaceSize > g.workspace_bytes) {
      return fail(absl::FailedPreconditionError(
          absl::StrFormat("the GEMM tuning table's algorithm for %s (%s) is not usable: %s",
                          DescribeGemmKey(key), e->description,
                          cs != CUBLAS_STATUS_SUCCESS
                              ? std::string(cublasGetStatusString(cs))
                              : absl::StrFormat("needs %d workspace bytes", r.workspaceSize))));
    }
    SYMTP_LOG(INFO, "gemm") << DescribeGemmKey(key) << ": from the tuning table, "
                            << e->description;
    p.from_table = true;
    p.pick_us = e->pick_us;
    p.heuristic_us = e->heuristic_us;
    return p;
  }

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
  // Autotuning runs the candidates, which a stream capture must not record.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (autotune > 1 && cudaStreamIsCapturing(stream, &capturing) != cudaSuccess) {
    capturing = cudaStreamCaptureStatusActive;
  }
  const int want = capturing == cudaStreamCaptureStatusNone ? autotune : 1;
  cublasLtMatmulHeuristicResult_t results[32]{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(h, p.op, p.w, p.a, p.c, p.c, pref, want, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    return fail(absl::UnimplementedError(absl::StrFormat(
        "cuBLASLt has no algorithm for C[%d,%d] = A[%d,%d]·W[%d,%d]ᵀ (%s -> %s, ld %d/%d/%d): %s",
        g.m, g.n, g.m, g.k, g.n, g.k, DTypeName(g.in_dtype), DTypeName(g.out_dtype), lda, ldw, ldc,
        cublasGetStatusString(hs))));
  }
  // Autotuning also tries split-K versions of the first heuristic picks:
  // decode GEMMs with M <= 256 and N of a few thousand make only 24-48 output
  // tiles for 132 SMs, and the heuristic's list rarely splits them. And the
  // same picks with other thread-block cluster shapes: on an H200 (cuBLAS 13)
  // the heuristic's first pick for llama-8b's M = 256 wo / qkv runs 1 x 2
  // clusters, and the exhaustive search's fastest per call in a CUDA graph
  // was the same algorithm, tile and stages without clusters, 8-20% faster
  // (bench/results/h200-2026-11-24, run ab).
  std::vector<cublasLtMatmulHeuristicResult_t> cands(results, results + found);
  if (want > 1) {
    const int base = std::min(found, 4);
    for (int i = 0; i < base; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      int32_t splitk_ok = 0;
      size_t written = 0;
      if (cublasLtMatmulAlgoCapGetAttribute(&results[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT,
                                            &splitk_ok, sizeof(splitk_ok),
                                            &written) != CUBLAS_STATUS_SUCCESS ||
          splitk_ok == 0) {
        continue;
      }
      for (const int32_t splits : {2, 3, 4, 6}) {
        cublasLtMatmulHeuristicResult_t c = results[i];
        if (SetSplitK(&c.algo, splits)) AppendIfAccepted(h, p, g, c, cands);
      }
    }
    for (int i = 0; i < base; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      uint16_t own = 0;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                           &own, sizeof(own), &written);
      for (const uint16_t cluster :
           {uint16_t{CUBLASLT_CLUSTER_SHAPE_1x1x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_2x1x1},
            uint16_t{CUBLASLT_CLUSTER_SHAPE_1x2x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_4x1x1},
            uint16_t{CUBLASLT_CLUSTER_SHAPE_1x4x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_2x2x1}}) {
        if (cluster != own) {
          cublasLtMatmulHeuristicResult_t c = results[i];
          if (cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                   &cluster,
                                                   sizeof(cluster)) == CUBLAS_STATUS_SUCCESS) {
            AppendIfAccepted(h, p, g, c, cands);
          }
        }
        // The pick's algorithm, tile and stages rebuilt from
        // cublasLtMatmulAlgoInit (its other settings at their defaults, which
        // the heuristic's own configuration need not share) with this
        // cluster shape: for llama-8b's M = 256 wo / qkv on an H200 the
        // fastest per call in a graph of everything the exhaustive search
        // tried (bench/results/h200-2026-11-24, run ab).
        cublasLtMatmulHeuristicResult_t c{};
        if (RebuildWithCluster(h, g, results[i].algo, cluster, &c.algo)) {
          AppendIfAccepted(h, p, g, c, cands);
        }
      }
    }
  }
  if (want > 1 && exhaustive) {
    const std::vector<cublasLtMatmulHeuristicResult_t> more =
        ExhaustiveCandidates(h, p, g, results, found, 4096);
    cands.insert(cands.end(), more.begin(), more.end());
  }
  int pick = 0;
  if (cands.size() > 1) {
    absl::StatusOr<Fastest> fastest = FastestCandidate(
        h, p, g, ldw, cands.data(), static_cast<int>(cands.size()), st.timing, stream);
    if (!fastest.ok()) return fail(fastest.status());
    pick = fastest->index;
    p.heuristic_us = 1000.0 * fastest->first_ms;
    p.pick_us = 1000.0 * fastest->ms;
    if (pick != 0 && fastest->first_ms > 0 && fastest->ms > fastest->first_ms * (1 - st.margin)) {
      SYMTP_LOG(DEBUG, "gemm") << "autotune " << DescribeGemmKey(key) << ": #" << pick << " ("
                               << p.pick_us << " us) within the margin of the heuristic's first ("
                               << p.heuristic_us << " us); keeping the first";
      pick = 0;
      p.pick_us = p.heuristic_us;
    }
    SYMTP_LOG(DEBUG, "gemm") << "autotune C[" << g.m << "," << g.n << "] K=" << g.k << ": " << found
                             << " heuristic + " << cands.size() - found
                             << " more candidates, picked #" << pick << " "
                             << DescribeAlgo(cands[pick].algo)
                             << (pick >= found ? " (not the heuristic's)" : "");
    if (exhaustive) {
      SYMTP_LOG(INFO, "gemm") << "exhaustive autotune C[" << g.m << "," << g.n << "] K=" << g.k
                              << ": " << cands.size() << " candidates, picked "
                              << DescribeAlgo(cands[pick].algo)
                              << " (heuristic #0: " << DescribeAlgo(cands[0].algo) << ")";
    }
  }
  p.algo = cands[pick].algo;
  return p;
}

}  // namespace

absl::StatusOr<GemmTuningTable> CublasLtHandle::ExportPlans() const {
  SYMTP_ASSIGN_OR_RETURN(GemmTuningIdentity id, CurrentGemmTuningIdentity());
  GemmTuningTable t(std::move(id));
  if (!state_) return t;
  for (const auto& [key, plan] : state_->plans) {
    GemmTuningEntry e;
    std::memcpy(e.algo.data(), &plan.algo, sizeof(plan.algo));
    // To the nanosecond, as the file stores them (Parse(Serialize()) is exact).
    e.pick_us = std::round(plan.pick_us * 1000) / 1000;
    e.heuristic_us = std::round(plan.heuristic_us * 1000) / 1000;
    e.description = DescribeAlgo(plan.algo);
    t.Put(key, std::move(e));
  }
  return t;
}

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
  if (g.m == 0) return absl::OkStatus();
  if (g.m <= st->skinny_max_m && SkinnyGemmSupported(g)) {
    SYMTP_ASSIGN_OR_RETURN(const int64_t n, EnsureZeroedCounters(st->skinny_counters,
                                                                 SkinnyGemmCounters(g.n), stream));
    return LaunchSkinnyGemm(g, st->skinny_counters.as<unsigned int>(), n, stream);
  }
  if (st->choice == GemmKernelChoice::kSm90 && Sm90GemmArgsSupported(g) &&
      Sm90GemmDeviceSupported()) {
    // The global split-K keeps its fp32 partials in the workspace (16-byte aligned).
    const bool ws_ok = reinterpret_cast<uintptr_t>(g.workspace) % 16 == 0;
    SYMTP_ASSIGN_OR_RETURN(
        Sm90GemmPlan plan,
        PlanSm90GemmForDevice(g.m, g.n, g.k, ws_ok && g.workspace ? g.workspace_bytes : 0));
    if (plan.global_reduce) {
      // Tile counters for the global split-K, zeroed once and kept zeroed by
      // every launch (the handle serves one stream at a time).
      SYMTP_ASSIGN_OR_RETURN(
          const int64_t n,
          EnsureZeroedCounters(st->sm90_counters, 2 * Sm90GemmTiles(g.m, g.n, plan), stream));
      return LaunchSm90Gemm(g, plan, stream, st->sm90_counters.as<unsigned int>(), n);
    }
    return LaunchSm90Gemm(g, plan, stream);
  }
  GemmTuningKey key;
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
  key.sm_count_target = g.sm_count_target;
  auto it = st->plans.find(key);
  if (it == st->plans.end()) {
    SYMTP_ASSIGN_OR_RETURN(Plan plan, BuildPlan(*st, key, g, stream));
    it = st->plans.emplace(key, plan).first;
  }
  const Plan& p = it->second;
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(st->handle, p.op, &alpha, g.w, p.w, g.a, p.a, &beta, g.c,
                                        p.c, g.c, p.c, &p.algo, g.workspace, g.workspace_bytes,
                                        stream));
  return absl::OkStatus();
}

}  // namespace symtp::kernels

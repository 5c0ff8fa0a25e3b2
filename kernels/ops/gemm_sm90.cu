// Host side of the sm_90a GEMM: tensor maps (internal/tma_map.h), the split
// plan and the cluster launch. Built for sm_90a only (CMakeLists.txt).
#include "kernels/ops/gemm_sm90.h"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/internal/sm90_gemm_kernel.cuh"
#include "kernels/ops/internal/sm90_launch.h"
#include "kernels/ops/internal/tma_map.h"

namespace symtp::kernels {
namespace {

template <int kMSub>
absl::Status ConfigureSmem() {
  return sm90::SetMaxDynamicSmemOnce(reinterpret_cast<const void*>(sm90::Sm90GemmKernel<kMSub>),
                                     sm90::TileShape<kMSub>::kSmemBytes);
}

// The launch attribute that groups a tile's splits: a cooperative launch
// (global split-K) or clusters of `splits` CTAs along grid x.
cudaLaunchAttribute SplitAttribute(int splits, bool cooperative) {
  return cooperative ? sm90::CooperativeAttribute() : sm90::ClusterAttribute(splits);
}

template <int kMSub>
absl::StatusOr<int> MaxActiveClusters(int splits) {
  if (absl::Status s = ConfigureSmem<kMSub>(); !s.ok()) return s;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(splits), 1, 1024);
  cfg.blockDim = dim3(sm90::kThreads);
  cfg.dynamicSmemBytes = sm90::TileShape<kMSub>::kSmemBytes;
  cudaLaunchAttribute attr = SplitAttribute(splits, /*cooperative=*/false);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&n, sm90::Sm90GemmKernel<kMSub>, &cfg));
  return n;
}

template <int kMSub>
absl::Status Launch(const CUtensorMap& map_a, const CUtensorMap& map_w,
                    const sm90::Sm90GemmParams& params, int splits, bool cooperative,
                    cudaStream_t stream) {
  using T = sm90::TileShape<kMSub>;
  if (absl::Status s = ConfigureSmem<kMSub>(); !s.ok()) return s;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(splits),
                     static_cast<unsigned>((params.m + T::kBM - 1) / T::kBM),
                     static_cast<unsigned>((params.n + sm90::kBN - 1) / sm90::kBN));
  cfg.blockDim = dim3(sm90::kThreads);
  cfg.dynamicSmemBytes = T::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr = SplitAttribute(splits, cooperative);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, sm90::Sm90GemmKernel<kMSub>, map_a, map_w, params));
  return absl::OkStatus();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

std::string Sm90GemmPlan::ToString() const {
  return absl::StrFormat("sm90 %dx%d tiles, %d-way split-K%s", 128 * m_sub, sm90::kBN, splits,
                         splits == 1       ? ""
                         : global_reduce ? " (global, cooperative)"
                                           : " (cluster)");
}

int64_t Sm90GemmTiles(int64_t m, int64_t n, const Sm90GemmPlan& plan) {
  const int64_t bm = 128 * plan.m_sub;
  return ((m + bm - 1) / bm) * ((n + sm90::kBN - 1) / sm90::kBN);
}

size_t Sm90GemmPartialBytes(int64_t m, int64_t n, const Sm90GemmPlan& plan) {
  return static_cast<size_t>(Sm90GemmTiles(m, n, plan)) * plan.splits * 128 * plan.m_sub *
         sm90::kBN * sizeof(float);
}

bool Sm90GemmDeviceSupported() {
  static std::atomic<uint64_t> known{0}, yes{0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) return false;
  const uint64_t bit = uint64_t{1} << dev;
  if (known.load(std::memory_order_acquire) & bit) return (yes.load() & bit) != 0;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return false;
  }
  if (major == 9 && minor == 0) yes.fetch_or(bit);
  known.fetch_or(bit, std::memory_order_acq_rel);
  return major == 9 && minor == 0;
}

bool Sm90GemmArgsSupported(const GemmArgs& g) {
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k, ldc = g.ldc ? g.ldc : g.n;
  constexpr int64_t kMax = int64_t{1} << 31;
  return g.in_dtype == DType::kBF16 && g.out_dtype == DType::kBF16 && g.sm_count_target == 0 &&
         g.m > 0 && g.n > 0 && g.k > 0 && g.m < kMax && g.n < kMax && g.k < kMax && g.k % 8 == 0 &&
         lda % 8 == 0 && ldw % 8 == 0 && ldc % 8 == 0 && Aligned16(g.a) && Aligned16(g.w) &&
         Aligned16(g.c);
}

Sm90GemmPlan PlanSm90Gemm(int64_t m, int64_t n, int64_t k, int num_sms, const int* max_clusters,
                          size_t workspace_bytes) {
  // Costs in units of a 128-row tile's K step (~385 ns on the H200), fitted to
  // the per-CTA timelines of kernels_bench --sections sm90probe (run ao of
  // bench/results/h200-2026-11-23, M = 256): a 256-row tile's K step is 1.6 of them (1.85 once most
  // SMs load), the epilogue of an unsplit tile 3.4 / 6.8 (128 / 256 rows),
  // of a split tile (chunks to the owner, sum, store) 12.5 / 20.5 whichever
  // way the chunks travel.
  const int64_t k_tiles = (k + sm90::kBK - 1) / sm90::kBK;
  Sm90GemmPlan best_plan;
  best_plan.m_sub = m <= 128 ? 1 : 2;
  double best = -1;
  // 128-row tiles at M <= 256 as well: twice the tiles, a cheaper epilogue.
  for (int m_sub = m <= 128 ? 1 : 2; m_sub >= (m <= 256 ? 1 : 2); --m_sub) {
    Sm90GemmPlan p;
    p.m_sub = m_sub;
    const int64_t tiles = Sm90GemmTiles(m, n, p);
    for (int s = 1; s <= 8; ++s) {
      if (s > 1 && k_tiles / s < 4) break;
      const int64_t steps = (k_tiles + s - 1) / s;
      const auto cost = [&](int64_t ctas_at_once, int64_t waves) {
        const double step = m_sub == 1 ? 1.0 : (2 * ctas_at_once > num_sms ? 1.85 : 1.6);
        constexpr double kEpilogue[2][2] = {{3.4, 12.5}, {6.8, 20.5}};  // [m_sub - 1][split]
        const double epilogue = kEpilogue[m_sub - 1][s > 1 ? 1 : 0];
        return static_cast<double>(waves) * (static_cast<double>(steps) * step + epilogue);
      };
      // Clusters of s CTAs (s = 1: plain CTAs), as many waves as they take.
      const int64_t per_wave = std::max<int64_t>(
          1, max_clusters != nullptr ? max_clusters[s] : std::max(1, num_sms) / s);
      const int64_t waves = (tiles + per_wave - 1) / per_wave;
      const double c = cost(std::min(tiles, per_wave) * s, waves);
      if (best < 0 || c < best) {
        best = c;
        best_plan = {m_sub, s, false};
      }
      // Global split-K: one cooperative wave, partials in the workspace.
      Sm90GemmPlan g{m_sub, s, true};
      if (s > 1 && tiles * s <= num_sms && Sm90GemmPartialBytes(m, n, g) <= workspace_bytes) {
        const double cg = cost(tiles * s, 1);
        if (cg < best) {
          best = cg;
          best_plan = g;
        }
      }
    }
  }
  return best_plan;
}

absl::StatusOr<int> Sm90GemmMaxActiveClusters(const Sm90GemmPlan& plan) {
  if (!Sm90GemmDeviceSupported()) {
    return absl::InvalidArgumentError("Sm90Gemm: the current device is not compute capability 9.0");
  }
  if ((plan.m_sub != 1 && plan.m_sub != 2) || plan.splits < 1 || plan.splits > 8) {
    return absl::InvalidArgumentError("Sm90Gemm: bad plan " + plan.ToString());
  }
  return plan.m_sub == 1 ? MaxActiveClusters<1>(plan.splits) : MaxActiveClusters<2>(plan.splits);
}

absl::StatusOr<Sm90GemmPlan> PlanSm90GemmForDevice(int64_t m, int64_t n, int64_t k,
                                                   size_t workspace_bytes) {
  // Per device and tile height: SM count and clusters per wave for 1-8 splits.
  struct Table {
    int num_sms = 0;
    int clusters[2][9] = {};
  };
  static std::mutex mu;
  static Table tables[64];
  static uint64_t known = 0;
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev >= 64) return absl::InvalidArgumentError("Sm90Gemm: device index >= 64");
  std::lock_guard<std::mutex> lock(mu);
  Table& t = tables[dev];
  if ((known & (uint64_t{1} << dev)) == 0) {
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&t.num_sms, cudaDevAttrMultiProcessorCount, dev));
    for (int m_sub = 1; m_sub <= 2; ++m_sub) {
      for (int s = 1; s <= 8; ++s) {
        auto c = Sm90GemmMaxActiveClusters(Sm90GemmPlan{m_sub, s});
        if (!c.ok()) return c.status();
        t.clusters[m_sub - 1][s] = *c;
      }
    }
    known |= uint64_t{1} << dev;
  }
  // Both tile heights take the same shared memory (a 192 KB ring), so the
  // same cluster occupancy; the 256-row kernel's is the one passed.
  return PlanSm90Gemm(m, n, k, t.num_sms, t.clusters[1], workspace_bytes);
}

absl::Status LaunchSm90Gemm(const GemmArgs& g, const Sm90GemmPlan& plan, cudaStream_t stream,
                            unsigned int* counters, int64_t num_counters,
                            const Sm90GemmProbe* probe) {
  if (!Sm90GemmArgsSupported(g)) {
    return sm90::UnsupportedGemmCall(
        "Sm90Gemm", g,
        "bf16 in and out, k and strides multiples of 8, 16-byte aligned operands, no "
        "sm_count_target");
  }
  if (!Sm90GemmDeviceSupported()) {
    return absl::InvalidArgumentError("Sm90Gemm: the current device is not compute capability 9.0");
  }
  if ((plan.m_sub != 1 && plan.m_sub != 2) || plan.splits < 1 || plan.splits > 8) {
    return absl::InvalidArgumentError("Sm90Gemm: bad plan " + plan.ToString());
  }
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k, ldc = g.ldc ? g.ldc : g.n;
  static_assert(sm90::kBK == 64, "tma::MakeBf16Map's box is 64 wide");
  auto map_a = tma::MakeBf16Map(g.a, g.m, g.k, lda, 128 * plan.m_sub, "Sm90Gemm A");
  if (!map_a.ok()) return map_a.status();
  auto map_w = tma::MakeBf16Map(g.w, g.n, g.k, ldw, sm90::kBN, "Sm90Gemm W");
  if (!map_w.ok()) return map_w.status();
  sm90::Sm90GemmParams params;
  params.c = static_cast<__nv_bfloat16*>(g.c);
  params.ldc = ldc;
  params.m = static_cast<int>(g.m);
  params.n = static_cast<int>(g.n);
  params.k_tiles = static_cast<int>((g.k + sm90::kBK - 1) / sm90::kBK);
  if (probe != nullptr) {
    params.probe = probe->flags;
    params.stamps = probe->stamps;
  }
  const bool global = plan.global_reduce && plan.splits > 1;
  if (global) {
    const int64_t tiles = Sm90GemmTiles(g.m, g.n, plan);
    const size_t need = Sm90GemmPartialBytes(g.m, g.n, plan);
    if (g.workspace == nullptr || g.workspace_bytes < need || !Aligned16(g.workspace) ||
        counters == nullptr || num_counters < 2 * tiles) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Sm90Gemm: %s needs %d workspace bytes (have %d at %p) and %d counters (have %d)",
          plan.ToString(), need, g.workspace_bytes, g.workspace, 2 * tiles, num_counters));
    }
    params.partials = static_cast<float*>(g.workspace);
    params.counters = counters;
  }
  return plan.m_sub == 1 ? Launch<1>(*map_a, *map_w, params, plan.splits, global, stream)
                         : Launch<2>(*map_a, *map_w, params, plan.splits, global, stream);
}

}  // namespace symtp::kernels

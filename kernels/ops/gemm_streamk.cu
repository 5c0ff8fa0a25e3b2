// Host side of the stream-K sm_90a GEMM: tensor maps, the grid, the
// cooperative or cluster launch. Built for sm_90a only (CMakeLists.txt).
#include "kernels/ops/gemm_streamk.h"

#include <cuda.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/status_macros.h"
#include "kernels/ops/gemm_sm90.h"
#include "kernels/ops/internal/sm90_launch.h"
#include "kernels/ops/internal/streamk_gemm_kernel.cuh"
#include "kernels/ops/internal/tma_map.h"

namespace symtp::kernels {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int TokensPerTile(int64_t m) { return m <= 128 ? 128 : 256; }

template <int kTn, int kC, int kWG>
absl::Status Configure() {
  return sm90::SetMaxDynamicSmemOnce(
      reinterpret_cast<const void*>(streamk::StreamKGemmKernel<kTn, kC, kWG>),
      streamk::TileShape<kTn, kWG>::kSmemBytes);
}

// A cooperative launch (kC = 1) or clusters of kC CTAs along x.
template <int kTn, int kC, int kWG>
cudaLaunchConfig_t Config(int64_t ctas, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(streamk::kThreads<kWG>);
  cfg.dynamicSmemBytes = streamk::TileShape<kTn, kWG>::kSmemBytes;
  cfg.stream = stream;
  *attr = kC == 1 ? sm90::CooperativeAttribute() : sm90::ClusterAttribute(kC);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <int kTn, int kC, int kWG>
absl::StatusOr<int64_t> MaxCtas() {
  SYMTP_RETURN_IF_ERROR((Configure<kTn, kC, kWG>()));
  int dev = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (kC == 1) return sms;  // one CTA per SM (its shared memory)
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = Config<kTn, kC, kWG>(1024 * kC, nullptr, &attr);
  int clusters = 0;
  CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveClusters(&clusters, streamk::StreamKGemmKernel<kTn, kC, kWG>, &cfg));
  return static_cast<int64_t>(clusters) * kC;
}

// f(kTn, kC, kWG) with std::integral_constant arguments for the kernel
// instance of token width `tn` (128 or 256), cluster size `cluster` (1, 2 or
// 4) and `warpgroups` consumer warpgroups (1 or 2).
template <typename F>
auto ForInstance(int tn, int cluster, int warpgroups, F&& f) {
  const auto with_wg = [&](auto tn_c, auto c_c) {
    return warpgroups == 2 ? f(tn_c, c_c, std::integral_constant<int, 2>{})
                           : f(tn_c, c_c, std::integral_constant<int, 1>{});
  };
  const auto with_cluster = [&](auto tn_c) {
    switch (cluster) {
      case 1:
        return with_wg(tn_c, std::integral_constant<int, 1>{});
      case 2:
        return with_wg(tn_c, std::integral_constant<int, 2>{});
      default:
        return with_wg(tn_c, std::integral_constant<int, 4>{});
    }
  };
  return tn == 128 ? with_cluster(std::integral_constant<int, 128>{})
                   : with_cluster(std::integral_constant<int, 256>{});
}

template <int kTn, int kC, int kWG>
absl::Status Launch(const CUtensorMap& map_w, const CUtensorMap& map_t,
                    const streamk::StreamKParams& params, int64_t ctas, cudaStream_t stream) {
  SYMTP_RETURN_IF_ERROR((Configure<kTn, kC, kWG>()));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = Config<kTn, kC, kWG>(ctas, stream, &attr);
  CUDA_RETURN_IF_ERROR(
      cudaLaunchKernelEx(&cfg, streamk::StreamKGemmKernel<kTn, kC, kWG>, map_w, map_t, params));
  return absl::OkStatus();
}

absl::Status CheckWarpgroups(int warpgroups) {
  if (warpgroups == 1 || warpgroups == 2) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("StreamKGemm: %d consumer warpgroups (1 or 2)", warpgroups));
}

}  // namespace

bool StreamKGemmArgsSupported(const GemmArgs& g) {
  return Sm90GemmArgsSupported(g) && g.m <= 256;  // all tokens in one tile
}

std::string StreamKGemmPlan::ToString() const {
  return absl::StrFormat("stream-K, %d CTAs in clusters of %d, %d consumer warpgroups", ctas,
                         cluster, warpgroups);
}

int64_t StreamKGemmUnits(int64_t n, int64_t k, int cluster, int warpgroups) {
  const int64_t rows = streamk::kBW * std::max(warpgroups, 1) * std::max(cluster, 1);
  return ((n + rows - 1) / rows) * ((k + streamk::kBK - 1) / streamk::kBK);
}

size_t StreamKGemmWorkspaceBytes(int64_t m, int64_t ctas, int warpgroups) {
  // kPartialBytes is 128 kWG threads x kTn / 2 floats.
  const size_t per_cta = static_cast<size_t>(128 * std::max(warpgroups, 1)) *
                         static_cast<size_t>(TokensPerTile(m) / 2) * sizeof(float);
  static_assert(streamk::TileShape<256, 2>::kPartialBytes == 256 * 128 * 4);
  return static_cast<size_t>(std::max<int64_t>(ctas, 0)) * per_cta;
}

absl::StatusOr<int64_t> StreamKGemmMaxCtas(int64_t m, int cluster, int warpgroups) {
  if (cluster != 1 && cluster != 2 && cluster != 4) {
    return absl::InvalidArgumentError(
        absl::StrFormat("StreamKGemm: cluster %d (1, 2 or 4)", cluster));
  }
  SYMTP_RETURN_IF_ERROR(CheckWarpgroups(warpgroups));
  if (!Sm90GemmDeviceSupported()) {
    return absl::InvalidArgumentError(
        "StreamKGemm: the current device is not compute capability 9.0");
  }
  // Per device, token width, cluster size and warpgroups: asked once.
  static std::mutex mu;
  static int64_t known[64][2][3][2] = {};
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev >= 64) return absl::InvalidArgumentError("StreamKGemm: device index >= 64");
  const int wide = TokensPerTile(m) == 256 ? 1 : 0;
  std::lock_guard<std::mutex> lock(mu);
  int64_t& slot = known[dev][wide][cluster == 4 ? 2 : cluster - 1][warpgroups - 1];
  if (slot == 0) {
    absl::StatusOr<int64_t> n =
        ForInstance(TokensPerTile(m), cluster, warpgroups, [](auto tn_c, auto c_c, auto wg_c) {
          return MaxCtas<decltype(tn_c)::value, decltype(c_c)::value, decltype(wg_c)::value>();
        });
    if (!n.ok()) return n.status();
    if (*n < cluster) {
      return absl::UnavailableError(absl::StrFormat(
          "StreamKGemm: the device runs no cluster of %d of this kernel at once", cluster));
    }
    slot = *n;
  }
  return slot;
}

absl::StatusOr<int64_t> StreamKGemmDefaultCtas(int64_t m, int64_t n, int64_t k, int cluster,
                                               int warpgroups) {
  SYMTP_ASSIGN_OR_RETURN(const int64_t most, StreamKGemmMaxCtas(m, cluster, warpgroups));
  return std::min<int64_t>(most, cluster * StreamKGemmUnits(n, k, cluster, warpgroups));
}

absl::Status LaunchStreamKGemm(const GemmArgs& g, const StreamKGemmPlan& plan, cudaStream_t stream,
                               unsigned int* flags, int64_t num_flags,
                               const StreamKGemmProbe* probe) {
  if (!StreamKGemmArgsSupported(g)) {
    return sm90::UnsupportedGemmCall(
        "StreamKGemm", g,
        "bf16 in and out, 1 <= m <= 256, k and strides multiples of 8, 16-byte aligned operands, "
        "no sm_count_target");
  }
  const int cluster = plan.cluster, wg = plan.warpgroups;
  SYMTP_ASSIGN_OR_RETURN(const int64_t most, StreamKGemmMaxCtas(g.m, cluster, wg));
  const int64_t units = StreamKGemmUnits(g.n, g.k, cluster, wg);
  int64_t ctas = plan.ctas;
  if (ctas == 0) ctas = std::min<int64_t>(most, cluster * units);
  if (ctas < cluster || ctas % cluster != 0 || ctas / cluster > units || ctas > most) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StreamKGemm: %d CTAs in clusters of %d for %d units (needs a multiple of the cluster, "
        "at most one cluster per unit and at most %d CTAs on this device)",
        ctas, cluster, units, most));
  }
  const size_t need = StreamKGemmWorkspaceBytes(g.m, ctas, wg);
  if (g.workspace == nullptr || g.workspace_bytes < need || !Aligned16(g.workspace) ||
      flags == nullptr || num_flags < ctas) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StreamKGemm: %d CTAs need %d workspace bytes (have %d at %p) and %d flags (have %d)", ctas,
        need, g.workspace_bytes, g.workspace, ctas, num_flags));
  }
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k, ldc = g.ldc ? g.ldc : g.n;
  const int tn = TokensPerTile(g.m);
  const int rows = streamk::kBW * wg;  // W rows per CTA
  SYMTP_ASSIGN_OR_RETURN(CUtensorMap map_w,
                         tma::MakeBf16Map(g.w, g.n, g.k, ldw, rows, "StreamKGemm W"));
  // Each CTA of a cluster loads (and multicasts) 1/cluster of the token rows.
  SYMTP_ASSIGN_OR_RETURN(CUtensorMap map_t,
                         tma::MakeBf16Map(g.a, g.m, g.k, lda, tn / cluster, "StreamKGemm A"));
  streamk::StreamKParams params;
  params.c = static_cast<__nv_bfloat16*>(g.c);
  params.ldc = ldc;
  params.m = static_cast<int>(g.m);
  params.n = static_cast<int>(g.n);
  params.k_steps = static_cast<int>((g.k + streamk::kBK - 1) / streamk::kBK);
  params.tiles = static_cast<int>((g.n + rows * cluster - 1) / (rows * cluster));
  params.partials = static_cast<float*>(g.workspace);
  params.flags = flags;
  if (probe != nullptr) params.stamps = probe->stamps;
  return ForInstance(tn, cluster, wg, [&](auto tn_c, auto c_c, auto wg_c) {
    return Launch<decltype(tn_c)::value, decltype(c_c)::value, decltype(wg_c)::value>(
        map_w, map_t, params, ctas, stream);
  });
}

}  // namespace symtp::kernels

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

template <int kTn, int kC>
absl::Status Configure() {
  return sm90::SetMaxDynamicSmemOnce(
      reinterpret_cast<const void*>(streamk::StreamKGemmKernel<kTn, kC>),
      streamk::TileShape<kTn>::kSmemBytes);
}

// A cooperative launch (kC = 1) or clusters of kC CTAs along x.
template <int kTn, int kC>
cudaLaunchConfig_t Config(int64_t ctas, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(streamk::kThreads);
  cfg.dynamicSmemBytes = streamk::TileShape<kTn>::kSmemBytes;
  cfg.stream = stream;
  *attr = kC == 1 ? sm90::CooperativeAttribute() : sm90::ClusterAttribute(kC);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <int kTn, int kC>
absl::StatusOr<int64_t> MaxCtas() {
  SYMTP_RETURN_IF_ERROR((Configure<kTn, kC>()));
  int dev = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (kC == 1) return sms;  // one CTA per SM (its shared memory)
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = Config<kTn, kC>(1024 * kC, nullptr, &attr);
  int clusters = 0;
  CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveClusters(&clusters, streamk::StreamKGemmKernel<kTn, kC>, &cfg));
  return static_cast<int64_t>(clusters) * kC;
}

// f(kTn, kC) with std::integral_constant arguments for the kernel instance of
// token width `tn` (128 or 256) and cluster size `cluster` (1, 2 or 4).
template <typename F>
auto ForInstance(int tn, int cluster, F&& f) {
  const auto with_cluster = [&](auto tn_c) {
    switch (cluster) {
      case 1:
        return f(tn_c, std::integral_constant<int, 1>{});
      case 2:
        return f(tn_c, std::integral_constant<int, 2>{});
      default:
        return f(tn_c, std::integral_constant<int, 4>{});
    }
  };
  return tn == 128 ? with_cluster(std::integral_constant<int, 128>{})
                   : with_cluster(std::integral_constant<int, 256>{});
}

template <int kTn, int kC>
absl::Status Launch(const CUtensorMap& map_w, const CUtensorMap& map_t,
                    const streamk::StreamKParams& params, int64_t ctas, cudaStream_t stream) {
  SYMTP_RETURN_IF_ERROR((Configure<kTn, kC>()));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = Config<kTn, kC>(ctas, stream, &attr);
  CUDA_RETURN_IF_ERROR(
      cudaLaunchKernelEx(&cfg, streamk::StreamKGemmKernel<kTn, kC>, map_w, map_t, params));
  return absl::OkStatus();
}

}  // namespace

bool StreamKGemmArgsSupported(const GemmArgs& g) {
  return Sm90GemmArgsSupported(g) && g.m <= 256;  // all tokens in one tile
}

std::string StreamKGemmPlan::ToString() const {
  return absl::StrFormat("stream-K, %d CTAs in clusters of %d", ctas, cluster);
}

int64_t StreamKGemmUnits(int64_t n, int64_t k, int cluster) {
  const int64_t rows = streamk::kBW * std::max(cluster, 1);
  return ((n + rows - 1) / rows) * ((k + streamk::kBK - 1) / streamk::kBK);
}

size_t StreamKGemmWorkspaceBytes(int64_t m, int64_t ctas) {
  const size_t per_cta = TokensPerTile(m) == 128 ? streamk::TileShape<128>::kPartialBytes
                                                 : streamk::TileShape<256>::kPartialBytes;
  return static_cast<size_t>(std::max<int64_t>(ctas, 0)) * per_cta;
}

absl::StatusOr<int64_t> StreamKGemmMaxCtas(int64_t m, int cluster) {
  if (cluster != 1 && cluster != 2 && cluster != 4) {
    return absl::InvalidArgumentError(
        absl::StrFormat("StreamKGemm: cluster %d (1, 2 or 4)", cluster));
  }
  if (!Sm90GemmDeviceSupported()) {
    return absl::InvalidArgumentError(
        "StreamKGemm: the current device is not compute capability 9.0");
  }
  // Per device, token width and cluster size: asked once.
  static std::mutex mu;
  static int64_t known[64][2][3] = {};
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev >= 64) return absl::InvalidArgumentError("StreamKGemm: device index >= 64");
  const int wide = TokensPerTile(m) == 256 ? 1 : 0;
  std::lock_guard<std::mutex> lock(mu);
  int64_t& slot = known[dev][wide][cluster == 4 ? 2 : cluster - 1];
  if (slot == 0) {
    absl::StatusOr<int64_t> n = ForInstance(TokensPerTile(m), cluster, [](auto tn_c, auto c_c) {
      return MaxCtas<decltype(tn_c)::value, decltype(c_c)::value>();
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

absl::StatusOr<int64_t> StreamKGemmDefaultCtas(int64_t m, int64_t n, int64_t k, int cluster) {
  SYMTP_ASSIGN_OR_RETURN(const int64_t most, StreamKGemmMaxCtas(m, cluster));
  return std::min<int64_t>(most, cluster * StreamKGemmUnits(n, k, cluster));
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
  const int cluster = plan.cluster;
  SYMTP_ASSIGN_OR_RETURN(const int64_t most, StreamKGemmMaxCtas(g.m, cluster));
  const int64_t units = StreamKGemmUnits(g.n, g.k, cluster);
  int64_t ctas = plan.ctas;
  if (ctas == 0) ctas = std::min<int64_t>(most, cluster * units);
  if (ctas < cluster || ctas % cluster != 0 || ctas / cluster > units || ctas > most) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StreamKGemm: %d CTAs in clusters of %d for %d units (needs a multiple of the cluster, "
        "at most one cluster per unit and at most %d CTAs on this device)",
        ctas, cluster, units, most));
  }
  const size_t need = StreamKGemmWorkspaceBytes(g.m, ctas);
  if (g.workspace == nullptr || g.workspace_bytes < need || !Aligned16(g.workspace) ||
      flags == nullptr || num_flags < ctas) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StreamKGemm: %d CTAs need %d workspace bytes (have %d at %p) and %d flags (have %d)", ctas,
        need, g.workspace_bytes, g.workspace, ctas, num_flags));
  }
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k, ldc = g.ldc ? g.ldc : g.n;
  const int tn = TokensPerTile(g.m);
  SYMTP_ASSIGN_OR_RETURN(CUtensorMap map_w,
                         tma::MakeBf16Map(g.w, g.n, g.k, ldw, streamk::kBW, "StreamKGemm W"));
  // Each CTA of a cluster loads (and multicasts) 1/cluster of the token rows.
  SYMTP_ASSIGN_OR_RETURN(CUtensorMap map_t,
                         tma::MakeBf16Map(g.a, g.m, g.k, lda, tn / cluster, "StreamKGemm A"));
  streamk::StreamKParams params;
  params.c = static_cast<__nv_bfloat16*>(g.c);
  params.ldc = ldc;
  params.m = static_cast<int>(g.m);
  params.n = static_cast<int>(g.n);
  params.k_steps = static_cast<int>((g.k + streamk::kBK - 1) / streamk::kBK);
  params.tiles = static_cast<int>((g.n + streamk::kBW * cluster - 1) / (streamk::kBW * cluster));
  params.partials = static_cast<float*>(g.workspace);
  params.flags = flags;
  if (probe != nullptr) params.stamps = probe->stamps;
  return ForInstance(tn, cluster, [&](auto tn_c, auto c_c) {
    return Launch<decltype(tn_c)::value, decltype(c_c)::value>(map_w, map_t, params, ctas, stream);
  });
}

}  // namespace symtp::kernels

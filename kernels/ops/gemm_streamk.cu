// Host side of the stream-K sm_90a GEMM: tensor maps, the grid, the
// cooperative launch. Built for sm_90a only (CMakeLists.txt).
#include "kernels/ops/gemm_streamk.h"

#include <cuda.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/status_macros.h"
#include "kernels/ops/gemm_sm90.h"
#include "kernels/ops/internal/streamk_gemm_kernel.cuh"
#include "kernels/ops/internal/tma_map.h"

namespace symtp::kernels {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int TokensPerTile(int64_t m) { return m <= 128 ? 128 : 256; }

template <int kTn>
absl::Status Launch(const CUtensorMap& map_w, const CUtensorMap& map_t,
                    const streamk::StreamKParams& params, int64_t ctas, cudaStream_t stream) {
  using T = streamk::TileShape<kTn>;
  // The dynamic shared memory limit is a per-device function attribute.
  static std::atomic<uint64_t> configured{0};
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev % 64);
  if ((configured.load(std::memory_order_acquire) & bit) == 0) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(streamk::StreamKGemmKernel<kTn>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              T::kSmemBytes));
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(streamk::kThreads);
  cfg.dynamicSmemBytes = T::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;  // owners wait for later CTAs: all resident
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CUDA_RETURN_IF_ERROR(
      cudaLaunchKernelEx(&cfg, streamk::StreamKGemmKernel<kTn>, map_w, map_t, params));
  return absl::OkStatus();
}

}  // namespace

bool StreamKGemmArgsSupported(const GemmArgs& g) {
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k, ldc = g.ldc ? g.ldc : g.n;
  constexpr int64_t kMax = int64_t{1} << 31;
  return g.in_dtype == DType::kBF16 && g.out_dtype == DType::kBF16 && g.sm_count_target == 0 &&
         g.m > 0 && g.m <= 256 && g.n > 0 && g.k > 0 && g.n < kMax && g.k < kMax && g.k % 8 == 0 &&
         lda % 8 == 0 && ldw % 8 == 0 && ldc % 8 == 0 && Aligned16(g.a) && Aligned16(g.w) &&
         Aligned16(g.c);
}

int64_t StreamKGemmUnits(int64_t n, int64_t k) {
  return ((n + streamk::kBW - 1) / streamk::kBW) * ((k + streamk::kBK - 1) / streamk::kBK);
}

size_t StreamKGemmWorkspaceBytes(int64_t m, int64_t ctas) {
  const size_t per_cta = TokensPerTile(m) == 128 ? streamk::TileShape<128>::kPartialBytes
                                                 : streamk::TileShape<256>::kPartialBytes;
  return static_cast<size_t>(std::max<int64_t>(ctas, 0)) * per_cta;
}

absl::StatusOr<int64_t> StreamKGemmDefaultCtas(int64_t n, int64_t k) {
  int dev = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return std::min<int64_t>(sms, StreamKGemmUnits(n, k));
}

absl::Status LaunchStreamKGemm(const GemmArgs& g, int64_t ctas, cudaStream_t stream,
                               unsigned int* flags, int64_t num_flags,
                               const StreamKGemmProbe* probe) {
  if (!StreamKGemmArgsSupported(g)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StreamKGemm: unsupported call m=%d n=%d k=%d lda=%d ldw=%d ldc=%d a=%p w=%p c=%p "
        "(needs bf16 in and out, 1 <= m <= 256, k and strides multiples of 8, 16-byte aligned "
        "operands, no sm_count_target)",
        g.m, g.n, g.k, g.lda, g.ldw, g.ldc, g.a, g.w, g.c));
  }
  if (!Sm90GemmDeviceSupported()) {
    return absl::InvalidArgumentError(
        "StreamKGemm: the current device is not compute capability 9.0");
  }
  const int64_t units = StreamKGemmUnits(g.n, g.k);
  if (ctas == 0) {
    SYMTP_ASSIGN_OR_RETURN(ctas, StreamKGemmDefaultCtas(g.n, g.k));
  }
  int dev = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (ctas < 1 || ctas > units || ctas > sms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StreamKGemm: %d CTAs for %d units on %d SMs (needs 1 <= CTAs <= min(units, SMs))", ctas,
        units, sms));
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
  SYMTP_ASSIGN_OR_RETURN(CUtensorMap map_t,
                         tma::MakeBf16Map(g.a, g.m, g.k, lda, tn, "StreamKGemm A"));
  streamk::StreamKParams params;
  params.c = static_cast<__nv_bfloat16*>(g.c);
  params.ldc = ldc;
  params.m = static_cast<int>(g.m);
  params.n = static_cast<int>(g.n);
  params.k_steps = static_cast<int>((g.k + streamk::kBK - 1) / streamk::kBK);
  params.tiles = static_cast<int>((g.n + streamk::kBW - 1) / streamk::kBW);
  params.partials = static_cast<float*>(g.workspace);
  params.flags = flags;
  if (probe != nullptr) params.stamps = probe->stamps;
  return tn == 128 ? Launch<128>(map_w, map_t, params, ctas, stream)
                   : Launch<256>(map_w, map_t, params, ctas, stream);
}

}  // namespace symtp::kernels

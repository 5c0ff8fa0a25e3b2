// The weight-streaming decode GEMM (kernels/ops/gemm_skinny.h).
#include <algorithm>
#include <atomic>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/gemm_skinny.h"
#include "kernels/ops/internal/mma_common.cuh"

namespace symtp::kernels {
namespace {

using internal::Aligned16;

using internal::bf16;
using internal::CpAsync16Shared;
using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::MmaBf16;

constexpr int kThreads = 128;  // 4 warps x 16 rows of W
constexpr int kTileRows = 64;
constexpr int kMaxTok = 32;  // partials are laid out for 32 tokens

constexpr int kChunks = 4;             // 32-wide K chunks per ring stage
constexpr int kStageK = 32 * kChunks;  // K per ring stage
constexpr int kP = kStageK / 8;        // 16-byte pieces of a W row per stage (16)
constexpr int kRowsPer = 32 / kP;      // W rows per warp copy instruction (2)
constexpr int kPer = 16 * kP / 32;     // copies per thread per stage (8)
constexpr int kStages = 3;             // ring depth
constexpr int kStageU = 4 * 16 * kP;   // uint4 per ring stage: 4 warps x 16 rows x kP
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageU * 16;

struct Params {
  const bf16* a;
  int64_t lda;
  const bf16* w;
  int64_t ldw;
  bf16* c;
  int64_t ldc;
  int m, n;
  int tiles, splits;  // items = tiles x splits
  int item_stages;    // ring stages per item (slice K / kStageK)
  float* partial;     // [tiles][splits][kMaxTok][kTileRows] when splits > 1
  unsigned int* counters;
};

// Output fragment element e of token group j: W row (within the warp's 16)
// and token, for thread (g, t) of the mma.m16n8k16 layout.
__device__ __forceinline__ int FragRow(int g, int e) { return g + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int FragTok(int j, int t, int e) { return 8 * j + 2 * t + (e & 1); }

// Piece index (16-byte units) of row rw's piece `piece` in a warp's stage
// region of 16 rows x kP pieces: odd rows swap the 64-byte halves of each
// 128 bytes, so the quarter warp reading rows g, g + 1 at pieces 4 ch + t
// hits all 8 bank groups (and a copy's 8 lanes writing one row's 8 aligned
// pieces do too).
__device__ __forceinline__ int Swizzled(int rw, int piece) {
  return rw * kP + (piece ^ ((rw & 1) << 2));
}

// kGroups: tokens in groups of 8 (m <= 8 * kGroups).
template <int kGroups>
__global__ void __launch_bounds__(kThreads) SkinnyGemmKernel(const Params p) {
  internal::GridDependencyWait();
  extern __shared__ __align__(16) uint4 ring[];
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int items = p.tiles * p.splits;
  const int G = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int my_items = b < items ? (items - 1 - b) / G + 1 : 0;
  const int nq = my_items * p.item_stages;
  const int64_t slice_k = static_cast<int64_t>(p.item_stages) * kStageK;
  const unsigned ring_base = static_cast<unsigned>(__cvta_generic_to_shared(ring));

  // Stage q of this block is stage q % item_stages of item b + (q / item_stages) * G.
  // Two cursors walk that sequence without divisions: one for the W copies
  // (kStages - 1 ahead), one for the A loads.
  struct Cursor {
    int item, st;
    int row;    // the warp's first W row (the tile's plus the warp's)
    int64_t k;  // the stage's first K
  };
  auto start = [&](int item) {
    const int tile = item / p.splits, split = item - tile * p.splits;
    return Cursor{item, 0, tile * kTileRows + warp * 16, static_cast<int64_t>(split) * slice_k};
  };
  auto advance = [&](Cursor& c) {
    if (++c.st == p.item_stages) {
      c = start(c.item + G);
    } else {
      c.k += kStageK;
    }
  };
  // The warp copies its 16 rows x kStageK of stage q, kRowsPer whole rows
  // (kRowsPer x 256 contiguous bytes) per instruction: copy i of this lane is
  // row kRowsPer * i + lane / kP, piece lane % kP. (Copies of 8 rows x 64
  // bytes each, the session-9 kernel, stream W at 0.75-0.9x of this rate
  // even with the products switched off: bench/results/h200-2026-11-24.)
  auto issue = [&](const Cursor& c, int q) {
    const unsigned slot =
        ring_base + static_cast<unsigned>(((q % kStages) * kStageU + warp * 16 * kP) * 16);
    const int piece = lane % kP;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int rw = kRowsPer * i + lane / kP, r = c.row + rw;
      const bool ok = r < p.n;
      const bf16* src = p.w + static_cast<int64_t>(ok ? r : 0) * p.ldw + c.k + piece * 8;
      CpAsync16Shared(slot + static_cast<unsigned>(Swizzled(rw, piece) * 16), src, ok);
    }
  };
  // A of a stage for this thread's tokens 8 j + g, K order as W's below.
  auto load_a = [&](const Cursor& c, uint4(&dst)[kGroups][kChunks]) {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int tok = 8 * j + g;
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) {
        dst[j][ch] =
            tok < p.m
                ? __ldg(reinterpret_cast<const uint4*>(p.a + tok * p.lda + c.k + 32 * ch + 8 * t))
                : make_uint4(0, 0, 0, 0);
      }
    }
  };

  float acc[kGroups][4];
  internal::ZeroFragments(acc);
  uint4 a[kGroups][kChunks];
  Cursor wc = start(b), ac = start(b);
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q) {
    if (q < nq) {
      issue(wc, q);
      advance(wc);
    }
    CpAsyncCommit();
  }
  for (int q = 0; q < nq; ++q) {
    // A of stage q (L2 / L1) is in flight while the warp waits for its W.
    load_a(ac, a);
    // Stage q landed for the whole warp (each lane waits for its own copies,
    // the warp barrier shares them); every lane has also read stage q - 1,
    // whose slot the next copies overwrite.
    CpAsyncWait<kStages - 2>();
    __syncwarp();
    if (q + kStages - 1 < nq) {
      issue(wc, q + kStages - 1);
      advance(wc);
    }
    CpAsyncCommit();
    const int item = ac.item;  // the item of stage q
    const bool item_done = ac.st == p.item_stages - 1;
    advance(ac);
    const uint4* sw = ring + (q % kStages) * kStageU + warp * 16 * kP;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      // Rows g (wa) and g + 8 (wb); K order within a 32-wide chunk: this
      // thread's 8 elements 8t..8t+7 feed k slots {2t, 2t+1, 2t+8, 2t+9} of
      // two products, the same for A.
      const uint4 wa = sw[Swizzled(g, 4 * ch + t)], wb = sw[Swizzled(g + 8, 4 * ch + t)];
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        MmaBf16(acc[j], wa.x, wb.x, wa.y, wb.y, a[j][ch].x, a[j][ch].y);
        MmaBf16(acc[j], wa.z, wb.z, wa.w, wb.w, a[j][ch].z, a[j][ch].w);
      }
    }
    if (!item_done) continue;

    // ---- the item is done: its 64 x m block of C, or its partial
    const int tile = item / p.splits, split = item % p.splits;
    const int row0 = tile * kTileRows + warp * 16;
    if (p.splits == 1) {
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row0 + FragRow(g, e), tok = FragTok(j, t, e);
          if (row < p.n && tok < p.m) p.c[tok * p.ldc + row] = __float2bfloat16_rn(acc[j][e]);
        }
      }
      internal::ZeroFragments(acc);
      continue;
    }
    float* part = p.partial + (static_cast<int64_t>(tile) * p.splits + split) * kMaxTok * kTileRows;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        part[FragTok(j, t, e) * kTileRows + warp * 16 + FragRow(g, e)] = acc[j][e];
      }
    }
    internal::ZeroFragments(acc);
    __threadfence();  // the partial is visible before the count says so
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(&p.counters[tile], 1u) == static_cast<unsigned>(p.splits - 1);
    __syncthreads();
    if (!s_last) continue;
    __threadfence();
    // Last of the tile: sum the splits in order. Each thread owns up to
    // kOut groups of 4 rows x 1 token and loads all of them per split at once
    // (L2 reads: other SMs wrote the partials).
    constexpr int kOut = kGroups * 8 * (kTileRows / 4) / kThreads;
    const float* tp = p.partial + static_cast<int64_t>(tile) * p.splits * kMaxTok * kTileRows;
    float4 sum[kOut];
#pragma unroll
    for (int i = 0; i < kOut; ++i) sum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp = 0; sp < p.splits; ++sp) {
      const float4* src =
          reinterpret_cast<const float4*>(tp + static_cast<int64_t>(sp) * kMaxTok * kTileRows);
      float4 v[kOut];
#pragma unroll
      for (int i = 0; i < kOut; ++i) {
        const int idx = tid + i * kThreads;  // token idx / 16, rows 4 * (idx % 16)
        v[i] = idx < p.m * (kTileRows / 4) ? __ldcg(src + idx) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int i = 0; i < kOut; ++i) {
        sum[i].x += v[i].x;
        sum[i].y += v[i].y;
        sum[i].z += v[i].z;
        sum[i].w += v[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < kOut; ++i) {
      const int idx = tid + i * kThreads;
      if (idx >= p.m * (kTileRows / 4)) continue;
      const int tok = idx / (kTileRows / 4), row = tile * kTileRows + 4 * (idx % (kTileRows / 4));
      bf16* out = p.c + tok * p.ldc + row;
      const float vals[4] = {sum[i].x, sum[i].y, sum[i].z, sum[i].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (row + e < p.n) out[e] = __float2bfloat16_rn(vals[e]);
      }
    }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch
  }
  CpAsyncWait<0>();
}

int Tiles(int64_t n) { return static_cast<int>((n + kTileRows - 1) / kTileRows); }

// Resident blocks of the kernel on this device (cached per device).
int GridFor(int items) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return std::max(1, std::min(items, 132));
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];
  int slots = dev < kMaxDevices ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (slots == 0) {
    int sms = 0, per_sm = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaFuncSetAttribute(SkinnyGemmKernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kSmemBytes));
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, SkinnyGemmKernel<4>, kThreads,
                                                  kSmemBytes);
    (void)cudaGetLastError();
    slots = std::max(1, sms * std::max(1, per_sm));
    if (dev < kMaxDevices) cached[dev].store(slots, std::memory_order_relaxed);
  }
  return std::max(1, std::min(items, slots));
}

bool DeviceSupported() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 8;
}

}  // namespace

int64_t SkinnyGemmSliceK(int64_t n, int64_t k) {
  // About two items per three resident blocks: one round of items that keeps
  // every SM streaming, with as few K slices (partials to sum) as that allows.
  // Slices are whole stages dividing K.
  const int64_t stages = k / kStageK, tiles = Tiles(n);
  const int64_t slots = GridFor(1 << 30);
  const int64_t target = std::max<int64_t>(1, (2 * slots + 3 * tiles / 2) / (3 * tiles));
  int64_t splits = std::min(target, stages);
  while (stages % splits != 0) ++splits;
  return k / splits;
}

size_t SkinnyGemmWorkspaceBytes(int64_t n, int64_t k) {
  const int64_t splits = k / SkinnyGemmSliceK(n, k);
  if (splits <= 1) return 0;
  return static_cast<size_t>(Tiles(n)) * splits * kMaxTok * kTileRows * sizeof(float);
}

int64_t SkinnyGemmCounters(int64_t n) { return Tiles(n); }

bool SkinnyGemmSupported(const GemmArgs& g) {
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k;
  const int64_t ldc = g.ldc ? g.ldc : g.n;
  return g.in_dtype == DType::kBF16 && g.out_dtype == DType::kBF16 && g.m >= 1 &&
         g.m <= kSkinnyMaxM && g.n >= 1 && g.n <= (int64_t{1} << 30) && g.k % kStageK == 0 &&
         lda % 8 == 0 && ldw % 8 == 0 && ldc >= g.n && Aligned16(g.a) && Aligned16(g.w) &&
         g.sm_count_target == 0 &&
         (SkinnyGemmWorkspaceBytes(g.n, g.k) == 0 ||
          (Aligned16(g.workspace) && g.workspace != nullptr &&
           g.workspace_bytes >= SkinnyGemmWorkspaceBytes(g.n, g.k))) &&
         DeviceSupported();
}

absl::Status LaunchSkinnyGemm(const GemmArgs& g, unsigned int* counters, int64_t num_counters,
                              cudaStream_t stream) {
  if (!SkinnyGemmSupported(g)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("LaunchSkinnyGemm: unsupported call m=%d n=%d k=%d", g.m, g.n, g.k));
  }
  Params p{};
  p.a = static_cast<const bf16*>(g.a);
  p.lda = g.lda ? g.lda : g.k;
  p.w = static_cast<const bf16*>(g.w);
  p.ldw = g.ldw ? g.ldw : g.k;
  p.c = static_cast<bf16*>(g.c);
  p.ldc = g.ldc ? g.ldc : g.n;
  p.m = static_cast<int>(g.m);
  p.n = static_cast<int>(g.n);
  p.tiles = Tiles(g.n);
  const int64_t slice = SkinnyGemmSliceK(g.n, g.k);
  p.splits = static_cast<int>(g.k / slice);
  p.item_stages = static_cast<int>(slice / kStageK);
  p.partial = static_cast<float*>(g.workspace);
  p.counters = counters;
  if (p.splits > 1 && (counters == nullptr || num_counters < p.tiles)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LaunchSkinnyGemm: %d tile counters needed, %d given", p.tiles, num_counters));
  }
  const int items = p.tiles * p.splits;
  const dim3 grid(static_cast<unsigned>(GridFor(items)));
  static const cudaError_t attr = [] {
    for (auto* kernel : {SkinnyGemmKernel<1>, SkinnyGemmKernel<2>, SkinnyGemmKernel<4>}) {
      const cudaError_t e = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }();
  CUDA_RETURN_IF_ERROR(attr);
  auto* kernel = g.m <= 8    ? SkinnyGemmKernel<1>
                 : g.m <= 16 ? SkinnyGemmKernel<2>
                             : SkinnyGemmKernel<4>;
  CUDA_RETURN_IF_ERROR(
      internal::LaunchDependent(kernel, grid, dim3(kThreads), kSmemBytes, stream, p));
  return absl::OkStatus();
}

}  // namespace symtp::kernels

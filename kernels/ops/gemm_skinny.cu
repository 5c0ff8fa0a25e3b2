// The weight-streaming decode GEMM (kernels/ops/gemm_skinny.h).
#include <algorithm>
#include <array>
#include <atomic>
#include <utility>

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

// Experiment variants (kernels_bench --skinny-variants): K per ring stage
// (32 x kChunks), an L2 256-byte prefetch on the W copies, the products
// switched off (W streamed and folded only; wrong output, diagnostics), and
// the W ring's first fill issued before the grid dependency wait.
struct Variant {
  int chunks, stages;
  bool prefetch, mma, early;
  bool contiguous = false;  // each copy instruction covers whole 128-512-byte row pieces
  bool a_per_chunk = false;  // A loaded per chunk at use (next stage prefetched to L1)
  bool a_before_wait = false;  // A of stage q loaded just before waiting for its W
  bool a_smem = false;         // A copied with W into the stage (block barrier per stage)
};
constexpr Variant kVariants[] = {
    {2, 6, false, true, false},              // 0: session 9's kernel
    {2, 6, true, true, false},               // 1: + L2::256B prefetch
    {2, 6, true, false, false},              // 2: 1 without products or A (streaming only)
    {4, 3, true, true, false},               // 3: 128-wide stages
    {2, 6, true, true, true},                // 4: 1 + ring's first fill before the dependency wait
    {4, 3, true, false, false},              // 5: 3 without products or A
    {2, 3, true, true, false},               // 6: 1 with a 3-stage ring (more blocks per SM)
    {2, 3, true, false, false},              // 7: 6 without products or A
    {2, 6, false, false, false, true},       // 8: streaming only, 4 rows x 128 B per instruction
    {8, 3, false, false, false, true},       // 9: streaming only, 1 row x 512 B per instruction
    {4, 3, false, false, false, true},       // 10: streaming only, 2 rows x 256 B per instruction
    {2, 6, false, true, false, true},        // 11: 8 with products, A by stage in registers
    {8, 3, false, true, false, true, true},  // 12: 9 with products, A per chunk
    {4, 3, false, true, false, true, true},  // 13: 10 with products, A per chunk
    {2, 6, false, true, false, true, true},  // 14: 8 with products, A per chunk
    {8, 3, false, true, false, true, false, true},  // 15: 9 with products, A before the wait
    {4, 3, false, true, false, true, false, true},  // 16: 10 with products, A before the wait
    {2, 6, false, true, false, true, false, true},  // 17: 8 with products, A before the wait
    {4, 3, false, true, false, true, false, false, true},  // 18: 16, A in the stage
    {2, 6, false, true, false, true, false, false, true},  // 19: 17, A in the stage
    {8, 2, false, true, false, true, false, false, true},  // 20: 15, A in the stage, 2 stages
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);
std::atomic<int> g_variant{0};

constexpr size_t SmemBytesFor(const Variant& v) {
  return static_cast<size_t>(v.stages) *
         (2 * v.chunks * kThreads + (v.a_smem ? kMaxTok * 4 * v.chunks : 0)) * 16;
}

struct Params {
  const bf16* a;
  int64_t lda;
  const bf16* w;
  int64_t ldw;
  bf16* c;
  int64_t ldc;
  int m, n;
  int tiles, splits;  // items = tiles x splits
  int item_stages;    // ring stages per item (slice K / stage K)
  float* partial;     // [tiles][splits][kMaxTok][kTileRows] when splits > 1
  unsigned int* counters;
};

// Output fragment element e of token group j: W row (within the warp's 16)
// and token, for thread (g, t) of the mma.m16n8k16 layout.
__device__ __forceinline__ int FragRow(int g, int e) { return g + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int FragTok(int j, int t, int e) { return 8 * j + 2 * t + (e & 1); }

template <bool kPrefetch>
__device__ __forceinline__ void CpAsyncW(unsigned dst, const void* gmem, bool valid) {
  if constexpr (kPrefetch) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
  } else {
    internal::CpAsync16Shared(dst, gmem, valid);
  }
}

// Piece index (16-byte units) of row rw's piece `piece` in a warp's stage
// region of 16 rows x kP pieces: odd rows swap their 64-byte halves so a
// quarter warp reading rows g, g + 1 at pieces 4 ch + t hits 8 bank groups.
template <int kP>
__device__ __forceinline__ int SwizzledPieceT(int rw, int piece) {
  return rw * kP + (piece ^ ((rw & 1) << 2));
}

// kGroups: tokens in groups of 8 (m <= 8 * kGroups); kV: the variant.
template <int kGroups, int kV>
__global__ void __launch_bounds__(kThreads) SkinnyGemmKernel(const Params p) {
  constexpr int kChunks = kVariants[kV].chunks;
  constexpr int kStages = kVariants[kV].stages;
  constexpr int kStageK = 32 * kChunks;
  constexpr int kPer = 2 * kChunks;  // 16-byte copies per thread per stage
  constexpr bool kPf = kVariants[kV].prefetch, kMma = kVariants[kV].mma;
  constexpr bool kEarly = kVariants[kV].early;
  constexpr bool kContig = kVariants[kV].contiguous, kAChunk = kVariants[kV].a_per_chunk;
  constexpr bool kABefore = kVariants[kV].a_before_wait;
  static_assert(!kABefore || kContig, "A before the wait is a contiguous-layout variant");
  constexpr bool kASmem = kVariants[kV].a_smem;
  static_assert(!kASmem || (kContig && !kABefore && !kAChunk), "A in the stage: contiguous W");
  constexpr int kP = kChunks * 4;  // 16-byte pieces per W row per stage (= lanes per row)
  constexpr int kRowsPer = 32 / kP;
  // uint4 units per ring stage: W (4 warps x 16 rows x kP), then A (32 tokens x kP)
  constexpr int kStageU = kPer * kThreads + (kASmem ? kMaxTok * kP : 0);
  static_assert(kP <= 32, "a copy instruction covers at least one row");
  if constexpr (!kEarly) internal::GridDependencyWait();
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
  // (kStages - 1 ahead), one for the A loads (one ahead).
  struct Cursor {
    int item, st;
    int row;    // this thread's first W row (the tile's, plus the warp's and g)
    int64_t k;  // K of this thread's first element in the stage
  };
  const int row_base = warp * 16 + g;
  auto start = [&](int item) {
    const int tile = item / p.splits, split = item - tile * p.splits;
    return Cursor{item, 0, tile * kTileRows + row_base,
                  static_cast<int64_t>(split) * slice_k + 8 * t};
  };
  auto advance = [&](Cursor& c) {
    if (++c.st == p.item_stages) {
      c = start(c.item + G);
    } else {
      c.k += kStageK;
    }
  };
  // Copy i of a stage: row g (even i) or g + 8 (odd i) of chunk i / 2.
  auto issue = [&](const Cursor& c, int q) {
    const int ra = c.row, rb = ra + 8;
    const bool oka = ra < p.n, okb = rb < p.n;
    const bf16* wa = p.w + static_cast<int64_t>(oka ? ra : 0) * p.ldw + c.k;
    const bf16* wb = p.w + static_cast<int64_t>(okb ? rb : 0) * p.ldw + c.k;
    const unsigned slot = ring_base + static_cast<unsigned>(((q % kStages) * kStageU + tid) * 16);
    (void)slot;
    if constexpr (kContig) {
      // The warp's 16 rows x kP 16-byte pieces per stage; copy i covers rows
      // kRowsPer * i .. + kRowsPer - 1 whole (lane / kP, piece lane % kP).
      const int row0 = c.row - g;  // the tile's and the warp's
      const int64_t kb = c.k - 8 * t;
      const unsigned wslot =
          ring_base + static_cast<unsigned>(((q % kStages) * kStageU + warp * 16 * kP) * 16);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int rw = kRowsPer * i + lane / kP, piece = lane % kP;
        const int r = row0 + rw;
        const bool ok = r < p.n;
        const bf16* src = p.w + static_cast<int64_t>(ok ? r : 0) * p.ldw + kb + piece * 8;
        CpAsyncW<kPf>(wslot + static_cast<unsigned>(SwizzledPieceT<kP>(rw, piece) * 16), src, ok);
      }
      if constexpr (kASmem) {
        // The stage's A: m rows x kP pieces, shared by the block's warps.
        const unsigned aslot =
            ring_base + static_cast<unsigned>(((q % kStages) * kStageU + kPer * kThreads) * 16);
#pragma unroll
        for (int i = 0; i < kMaxTok * kP / kThreads; ++i) {
          const int idx = tid + i * kThreads, tok = idx / kP, piece = idx % kP;
          if (tok < p.m) {
            CpAsyncW<false>(aslot + static_cast<unsigned>(SwizzledPieceT<kP>(tok, piece) * 16),
                            p.a + tok * p.lda + kb + piece * 8, true);
          }
        }
      }
    } else {
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) {
        CpAsyncW<kPf>(slot + (2 * ch) * kThreads * 16, wa + 32 * ch, oka);
        CpAsyncW<kPf>(slot + (2 * ch + 1) * kThreads * 16, wb + 32 * ch, okb);
      }
    }
  };
  auto load_a = [&](const Cursor& c, uint4(&dst)[kGroups][kChunks]) {
    if constexpr (!kMma || kAChunk) return;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int tok = 8 * j + g;
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) {
        if (tok < p.m) {
          const uint4* src = reinterpret_cast<const uint4*>(p.a + tok * p.lda + c.k);
          dst[j][ch] = __ldg(src + 4 * ch);  // + 32 elements per chunk
        } else {
          dst[j][ch] = make_uint4(0, 0, 0, 0);
        }
      }
    }
  };

  float acc[kGroups][4];
  internal::ZeroFragments(acc);
  uint4 a_cur[kGroups][kChunks], a_nxt[kGroups][kChunks];
  Cursor wc = start(b), ac = start(b);
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q) {
    if (q < nq) {
      issue(wc, q);
      advance(wc);
    }
    CpAsyncCommit();
  }
  if constexpr (kEarly) internal::GridDependencyWait();
  if (nq > 0 && !kABefore) load_a(ac, a_nxt);
  for (int q = 0; q < nq; ++q) {
    if constexpr (kABefore) load_a(ac, a_cur);  // in flight while the warp waits for W
    if constexpr (kContig) {
      // Stage q landed for the whole warp (each thread waits for its own
      // copies, the warp barrier shares them); every lane has also read
      // stage q - 1, whose slot the next copies overwrite.
      CpAsyncWait<kStages - 2>();
      if constexpr (kASmem) {
        __syncthreads();
      } else {
        __syncwarp();
      }
    }
    if (q + kStages - 1 < nq) {
      issue(wc, q + kStages - 1);
      advance(wc);
    }
    CpAsyncCommit();
    if constexpr (kMma && !kAChunk && !kABefore) {
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
#pragma unroll
        for (int ch = 0; ch < kChunks; ++ch) a_cur[j][ch] = a_nxt[j][ch];
      }
    }
    const int item = ac.item;  // the item of stage q
    const bool item_done = ac.st == p.item_stages - 1;
    const int64_t kq = ac.k;  // this thread's K in stage q
    advance(ac);
    if (q + 1 < nq && !kABefore) load_a(ac, a_nxt);
    if constexpr (kMma && kAChunk) {
      // The next stage's A rows into L1: one 128-byte line per thread.
      constexpr int kLines = kStageK * 2 / 128;
      const int tok = tid / kLines, line = tid % kLines;
      if (q + 1 < nq && tok < p.m) {
        asm volatile(
            "prefetch.global.L1 [%0];" ::"l"(p.a + tok * p.lda + (ac.k - 8 * t) + line * 64));
      }
    }
    if constexpr (!kContig) CpAsyncWait<kStages - 1>();  // this thread's copies of stage q
    const uint4* s = ring + (q % kStages) * kStageU + tid;
    const uint4* sa = ring + (q % kStages) * kStageU + kPer * kThreads;  // the stage's A
    const uint4* sw = ring + (q % kStages) * kStageU + warp * 16 * kP;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      // Rows g (wa) and g + 8 (wb); K order within a 32-wide chunk: this
      // thread's 8 elements 8t..8t+7 feed k slots {2t, 2t+1, 2t+8, 2t+9} of
      // two products, the same for A.
      uint4 wa, wb;
      if constexpr (kContig) {
        wa = sw[SwizzledPieceT<kP>(g, 4 * ch + t)];
        wb = sw[SwizzledPieceT<kP>(g + 8, 4 * ch + t)];
      } else {
        wa = s[(2 * ch) * kThreads];
        wb = s[(2 * ch + 1) * kThreads];
      }
      if constexpr (kMma) {
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          uint4 av;
          if constexpr (kASmem) {
            av = sa[SwizzledPieceT<kP>(8 * j + g, 4 * ch + t)];  // tokens >= m: unused columns
          } else if constexpr (kAChunk) {
            const int tok = 8 * j + g;
            av = tok < p.m ? __ldg(reinterpret_cast<const uint4*>(p.a + tok * p.lda + kq) + 4 * ch)
                           : make_uint4(0, 0, 0, 0);
          } else {
            av = a_cur[j][ch];
          }
          MmaBf16(acc[j], wa.x, wb.x, wa.y, wb.y, av.x, av.y);
          MmaBf16(acc[j], wa.z, wb.z, wa.w, wb.w, av.z, av.w);
        }
      } else {
        acc[0][0] += __uint_as_float((wa.x ^ wb.y ^ wa.z ^ wb.w) & 0x3f7fffffu);
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

using KernelFn = void (*)(Params);
template <int kV>
constexpr KernelFn kKernels[3] = {SkinnyGemmKernel<1, kV>, SkinnyGemmKernel<2, kV>,
                                  SkinnyGemmKernel<4, kV>};
// [variant][token groups 1 / 2 / 4]
template <size_t... kV>
constexpr auto KernelTable(std::index_sequence<kV...>) {
  return std::array<const KernelFn*, sizeof...(kV)>{kKernels<kV>...};
}
const KernelFn* KernelsOf(int v) {
  static constexpr auto table = KernelTable(std::make_index_sequence<kNumVariants>());
  return table[v];
}
int StageK(int v) { return 32 * kVariants[v].chunks; }
size_t SmemBytes(int v) { return SmemBytesFor(kVariants[v]); }

// Resident blocks of the variant's kernel on this device (cached per device).
int GridFor(int items, int v) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return std::max(1, std::min(items, 132));
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices][kNumVariants];
  int slots = dev < kMaxDevices ? cached[dev][v].load(std::memory_order_relaxed) : 0;
  if (slots == 0) {
    int sms = 0, per_sm = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const KernelFn k = KernelsOf(v)[2];
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(SmemBytes(v)));
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, SmemBytes(v));
    (void)cudaGetLastError();
    slots = std::max(1, sms * std::max(1, per_sm));
    if (dev < kMaxDevices) cached[dev][v].store(slots, std::memory_order_relaxed);
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

int64_t SliceK(int64_t n, int64_t k, int v) {
  // About two items per three resident blocks: one round of items that keeps
  // every SM streaming, with as few K slices (partials to sum) as that allows.
  // Slices are whole stages dividing K.
  const int64_t stages = k / StageK(v), tiles = Tiles(n);
  const int64_t slots = GridFor(1 << 30, v);
  const int64_t target = std::max<int64_t>(1, (2 * slots + 3 * tiles / 2) / (3 * tiles));
  int64_t splits = std::min(target, stages);
  while (stages % splits != 0) ++splits;
  return k / splits;
}

size_t WorkspaceBytes(int64_t n, int64_t k, int v) {
  const int64_t splits = k / SliceK(n, k, v);
  if (splits <= 1) return 0;
  return static_cast<size_t>(Tiles(n)) * splits * kMaxTok * kTileRows * sizeof(float);
}

}  // namespace

namespace internal {
int SkinnyGemmVariants() { return kNumVariants; }
void SetSkinnyGemmVariant(int v) { g_variant.store(std::clamp(v, 0, kNumVariants - 1)); }
bool SkinnyGemmVariantComputes(int v) { return kVariants[std::clamp(v, 0, kNumVariants - 1)].mma; }
}  // namespace internal

int64_t SkinnyGemmSliceK(int64_t n, int64_t k) { return SliceK(n, k, g_variant.load()); }

size_t SkinnyGemmWorkspaceBytes(int64_t n, int64_t k) {
  return WorkspaceBytes(n, k, g_variant.load());
}

int64_t SkinnyGemmCounters(int64_t n) { return Tiles(n); }

bool SkinnyGemmSupported(const GemmArgs& g) {
  const int v = g_variant.load();
  const int64_t lda = g.lda ? g.lda : g.k, ldw = g.ldw ? g.ldw : g.k;
  const int64_t ldc = g.ldc ? g.ldc : g.n;
  return g.in_dtype == DType::kBF16 && g.out_dtype == DType::kBF16 && g.m >= 1 &&
         g.m <= kSkinnyMaxM && g.n >= 1 && g.n <= (int64_t{1} << 30) && g.k % StageK(v) == 0 &&
         lda % 8 == 0 && ldw % 8 == 0 && ldc >= g.n && Aligned16(g.a) && Aligned16(g.w) &&
         g.sm_count_target == 0 &&
         (WorkspaceBytes(g.n, g.k, v) == 0 || (Aligned16(g.workspace) && g.workspace != nullptr &&
                                               g.workspace_bytes >= WorkspaceBytes(g.n, g.k, v))) &&
         DeviceSupported();
}

absl::Status LaunchSkinnyGemm(const GemmArgs& g, unsigned int* counters, int64_t num_counters,
                              cudaStream_t stream) {
  if (!SkinnyGemmSupported(g)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("LaunchSkinnyGemm: unsupported call m=%d n=%d k=%d", g.m, g.n, g.k));
  }
  const int v = g_variant.load();
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
  const int64_t slice = SliceK(g.n, g.k, v);
  p.splits = static_cast<int>(g.k / slice);
  p.item_stages = static_cast<int>(slice / StageK(v));
  p.partial = static_cast<float*>(g.workspace);
  p.counters = counters;
  if (p.splits > 1 && (counters == nullptr || num_counters < p.tiles)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LaunchSkinnyGemm: %d tile counters needed, %d given", p.tiles, num_counters));
  }
  const int items = p.tiles * p.splits;
  const dim3 grid(static_cast<unsigned>(GridFor(items, v)));
  static const cudaError_t attr = [] {
    for (int vv = 0; vv < kNumVariants; ++vv) {
      for (int i = 0; i < 3; ++i) {
        const cudaError_t e =
            cudaFuncSetAttribute(KernelsOf(vv)[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(SmemBytes(vv)));
        if (e != cudaSuccess) return e;
      }
    }
    return cudaSuccess;
  }();
  CUDA_RETURN_IF_ERROR(attr);
  const KernelFn kernel = KernelsOf(v)[g.m <= 8 ? 0 : g.m <= 16 ? 1 : 2];
  CUDA_RETURN_IF_ERROR(
      internal::LaunchDependent(kernel, grid, dim3(kThreads), SmemBytes(v), stream, p));
  return absl::OkStatus();
}

}  // namespace symtp::kernels

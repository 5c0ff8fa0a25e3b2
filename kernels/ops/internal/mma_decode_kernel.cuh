// The tensor-core decode kernel: launches whose items have at most 8 query
// rows per kv head (rows = tokens x group <= 8, e.g. one decode token with
// GQA group 4 or 8); included by mma_decode_bf16.cu. Same block split,
// outputs and workspace as MmaPrefillKernel (mma_prefill_kernel.cuh), which
// takes the launches with more rows (prefill, larger groups).
//
// With <= 8 query rows, putting the rows in the M dimension of
// mma.m16n8k16 would make half of every A operand padding, so the kernel
// computes the transposes, with the keys and head dims in M (~160
// instructions per 16-key tile):
//   S^T (16 keys x 8 rows) = K (16 x D) . Q^T (D x 8): A = the K tile, read
//     from shared memory with ldmatrix; B = Q^T, in registers for the whole
//     loop (2 per k-step); one product per 16 head dims.
//   O^T (D x 8 rows) += V^T (D x 16 keys) . P^T (16 x 8): A = V^T, read
//     with ldmatrix.trans; B = P^T, made from S^T's accumulators by
//     movmatrix.trans (the C layout of S^T transposed is the B layout of
//     P^T), as a bf16 term plus its bf16 residual (two products per 16 head
//     dims; P keeps ~16 bits, as in the other kernel).
// No operand is padding (N = 8 query rows), and the K/V tiles are copied
// whole, each copy instruction taking whole 128-byte lines of 4 key rows:
// 61-95% of the copy bandwidth at context 1024 on an H200 (two lanes per
// row, a 32-byte sector of each of 16 rows per instruction, reach only
// 45-69%: L2 then serves a request per piece).
//
// Layout: per warp, kStages stages of a K and a V tile, [key][head dim] with
// a row pitch of 2D + 16 bytes, so the 8 rows of each ldmatrix matrix fall in
// 8 different 16-byte bank groups. Lanes read rows other lanes copied, so a
// __syncwarp follows each cp.async wait (it also orders the previous
// iteration's reads before the refill of their stage).
//
// Head dim 128 with every tile in one page (pages of a multiple of 16
// tokens) and the cache's size known (PagedAttentionArgs::cache_slots) takes
// the TMA form instead: lane 0 of each warp copies a tile's K and V as four
// boxes of 16 slots x 64 dims (tma.cuh) that complete on the stage's
// mbarrier, each box 16 dense rows of 128 bytes in the 128-byte swizzle
// (chunk c of row r at chunk c ^ (r % 8)), which keeps the ldmatrix rows in
// 8 different bank groups.
// One lane's box copies stream the cache faster than every lane's 16-byte
// copies (bench/results/h100/kv_stream/; the kernel 0.97-0.98x from batch
// 64: bench/results/h100x2/attention_tma/). The math and its bits are the
// same; the rows of a last, partial tile past the warp's keys, which the
// cp.async form zero-fills, are copied too (they lie in the tile's page) and
// their V rows zeroed in shared memory, so stale cache contents never reach
// the products (their scores are masked).
//
// Softmax (base-2 units, lazy rescaling by 2^8 as in the other kernel): a
// lane holds scores of rows 2tig and 2tig+1 for keys gid and gid + 8; the
// row maxima need a reduction over the 8 lanes of a tig, done only on the
// (rare, warp-uniform) tiles that move a reference max; the row sums are
// kept per lane and reduced once at the end.
#pragma once

#include "common/status_macros.h"
#include "kernels/ops/internal/mma_common.cuh"
#include "kernels/ops/internal/tma.cuh"

namespace symtp::kernels::internal {

// Four 8x8 b16 matrices from shared memory (lane i gives the row address of
// matrix i / 8, row i % 8); lane i receives row i / 4, columns 2 (i % 4) and
// + 1 of each matrix (of its transpose with kTrans).
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], unsigned addr) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
}

// The transpose of an 8x8 b16 matrix held as lane i = (row i / 4, columns
// 2 (i % 4), + 1), in the same layout.
__device__ __forceinline__ uint32_t MovMatrixTrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

template <int D>
struct MmaDecodeLayout {
  static constexpr int kPitch = 2 * D + 16;  // bytes per key row in shared memory
  static constexpr int kTileBytes = kMmaKeyTile * kPitch;
  static constexpr int kStages = D == 128 ? 3 : 4;
  static constexpr int kWarpBytes = 2 * kTileBytes * kStages;  // K and V of every stage
  static constexpr size_t kRingBytes = static_cast<size_t>(kWarpBytes) * kMmaAttnWarps;
  // The epilogue's per-slice rows (accumulators, max, sum) and the merge's
  // scratch reuse the ring.
  static constexpr int kSliceRows = kMmaAttnWarps * kMmaDecodeRows;
  static constexpr size_t kEpilogueBytes =
      (static_cast<size_t>(kSliceRows) * D + 3 * kSliceRows + 2 * kMmaDecodeRows) * 4;
  static constexpr size_t kSmemBytes = kRingBytes > kEpilogueBytes ? kRingBytes : kEpilogueBytes;
  // The TMA form (D == 128): a stage holds K then V, each two 2 KB boxes
  // (dims 0-63, 64-127); the rings start at a 1024-byte boundary (the
  // swizzle's atom) and the warps' stage barriers follow them.
  static constexpr int kTmaHalfBytes = kMmaKeyTile * 128;
  static constexpr int kTmaTileBytes = 2 * kTmaHalfBytes;
  static constexpr int kTmaStageBytes = 2 * kTmaTileBytes;
  static constexpr size_t kTmaRingBytes =
      static_cast<size_t>(kTmaStageBytes) * kStages * kMmaAttnWarps;
  static_assert(D != 128 || kTmaRingBytes + 1023 + 8 * kStages * kMmaAttnWarps <= kSmemBytes,
                "the TMA ring, its alignment and its barriers fit the shared memory");
};

// One split of one block: keys [kb, ke) of `item` for
// kv head kvh, the 4 warps interleaving 16-key tiles; kTma: copied by TMA
// through kmap / vmap.
template <int D, bool kInPage, bool kTma>
__device__ __forceinline__ void MmaDecodeSplit(const PagedAttentionArgs& a,
                                               const AttentionItem& item, int kvh, int split,
                                               int kb, int ke, const CUtensorMap* kmap,
                                               const CUtensorMap* vmap) {
  static_assert(!kTma || (kInPage && D == 128), "TMA tiles: head dim 128, each in one page");
  using L = MmaDecodeLayout<D>;
  constexpr int kKS = D / 16;                 // k-steps of S^T, m-tiles of O^T
  constexpr int kChains = kKS < 4 ? kKS : 4;  // independent S^T accumulators
  constexpr int kStages = L::kStages;
  constexpr int kRows = kMmaDecodeRows;

  extern __shared__ __align__(16) unsigned char mma_smem[];
  float* wacc_s = reinterpret_cast<float*>(mma_smem);
  float* wm_s = wacc_s + L::kSliceRows * D;
  float* wl_s = wm_s + L::kSliceRows;
  float* merge_s = wl_s + L::kSliceRows;

  const int group = a.num_q_heads / a.num_kv_heads;
  const int rows = item.num_tokens * group;  // <= kRows (the launcher checks)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int slice = warp;

  // This lane's scores are of rows 2tig and 2tig + 1 (columns of S^T).
  auto row_pos = [&](int r) { return r < rows ? a.positions[item.token_begin + r / group] : -1; };
  const int pos0 = row_pos(2 * tig), pos1 = row_pos(2 * tig + 1);

  const int32_t* table = a.block_tables + static_cast<int64_t>(item.seq) * a.block_table_stride;
  const int bs = a.block_size;
  const int64_t slot_elems = static_cast<int64_t>(a.num_kv_heads) * D;
  const float scale = a.scale * 1.44269504088896341f;  // log2 e: base-2 scores

  // The warp's rows need keys up to their largest position; tiles below
  // unmasked_end are visible to every row that exists (rows past `rows` are
  // never stored), so they skip the mask.
  const int warp_end = min(ke, __reduce_max_sync(0xffffffffu, max(pos0, pos1)) + 1);
  int unmasked_end = 0x7fffffff;
  if (2 * tig < rows) unmasked_end = pos0 + 1;
  if (2 * tig + 1 < rows) unmasked_end = min(unmasked_end, pos1 + 1);
  unmasked_end = min(ke, __reduce_min_sync(0xffffffffu, unmasked_end));

  // This warp's tiles: t0 = first + i * stride, i < ntiles.
  constexpr int stride = kMmaAttnWarps * kMmaKeyTile;
  const int first = kb + slice * kMmaKeyTile;
  const int ntiles = first < warp_end ? (warp_end - first + stride - 1) / stride : 0;

  // Copies: whole 128-byte lines (KvLineCopy), the warp's 32 lanes per tile.
  using Copy = KvLineCopy<D, 32, kMmaKeyTile>;
  constexpr int kLpr = Copy::kLpr, kRpi = Copy::kRpi, kRowsPerLane = Copy::kRows;
  const int crow = lane / kLpr, cpiece = lane % kLpr;
  const int64_t lane_elem = static_cast<int64_t>(kvh) * D + cpiece * 8 +
                            (kInPage ? static_cast<int64_t>(crow) * slot_elems : 0);
  const bf16* k_lane = static_cast<const bf16*>(a.k_cache) + lane_elem;
  const bf16* v_lane = static_cast<const bf16*>(a.v_cache) + lane_elem;
  // kInPage: elements between a lane's rows.
  const int row_step = static_cast<int>(kRpi * slot_elems);
  const unsigned smem_s = static_cast<unsigned>(__cvta_generic_to_shared(mma_smem));
  const unsigned tma_base = (smem_s + 1023u) & ~1023u;
  constexpr unsigned kStageBytes = kTma ? L::kTmaStageBytes : 2 * L::kTileBytes;
  const unsigned ring = kTma ? tma_base + static_cast<unsigned>(warp * kStages * kStageBytes)
                             : smem_s + static_cast<unsigned>(warp * L::kWarpBytes);
  // kTma: stage s completes on the mbarrier at bars + 8 s.
  const unsigned bars = tma_base + static_cast<unsigned>(L::kTmaRingBytes) +
                        static_cast<unsigned>(warp * kStages * 8);
  if constexpr (kTma) {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) MbarInit(bars + 8 * s, 1);
      FenceMbarInit();
    }
    __syncwarp();
  }
  const unsigned copy_dst = static_cast<unsigned>(crow * L::kPitch + cpiece * 16);
  // ldmatrix row addresses, lane i for matrix i / 8, row i % 8. K as A of
  // S^T (keys x dims): matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15) in
  // register order a0..a3 = (0-7, 0-7), (8-15, 0-7), (0-7, 8-15), (8-15,
  // 8-15). V^T as A of O^T (dims x keys), transposed 8x8 blocks of V:
  // (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7),
  // (keys 8-15, dims 8-15).
  const int mi = lane >> 3, ri = lane & 7;
  const unsigned k_ld = static_cast<unsigned>((ri + 8 * (mi & 1)) * L::kPitch + 16 * (mi >> 1));
  const unsigned v_ld =
      static_cast<unsigned>((ri + 8 * (mi >> 1)) * L::kPitch + 16 * (mi & 1)) + L::kTileBytes;
  // The TMA form's swizzled rows: lane's row r of 128 bytes in half h (dims
  // 64h..), 16-byte chunk c at chunk c ^ (r % 8) = c ^ ri. K's chunk for
  // k-step ks is (mi >> 1) + 2 ks, V's for m-tile mt (mi & 1) + 2 mt.
  const unsigned k_row = static_cast<unsigned>((ri + 8 * (mi & 1)) * 128);
  const unsigned v_row = static_cast<unsigned>((ri + 8 * (mi >> 1)) * 128) + L::kTmaTileBytes;
  const unsigned k_x = static_cast<unsigned>(((mi >> 1) ^ ri) << 4);
  const unsigned v_x = static_cast<unsigned>(((mi & 1) ^ ri) << 4);
  // Shared addresses of the K fragment of k-step j and the V fragment of
  // m-tile j in the stage at kt.
  auto k_frag = [&](unsigned kt, int j) -> unsigned {
    if constexpr (kTma) {
      return kt + (j >> 2) * L::kTmaHalfBytes + k_row + ((((2 * j) & 7) << 4) ^ k_x);
    } else {
      return kt + k_ld + 32 * j;
    }
  };
  auto v_frag = [&](unsigned kt, int j) -> unsigned {
    if constexpr (kTma) {
      return kt + (j >> 2) * L::kTmaHalfBytes + v_row + ((((2 * j) & 7) << 4) ^ v_x);
    } else {
      return kt + v_ld + 32 * j;
    }
  };

  TileSlotQueue slots(table, bs, first, stride, kInPage ? ntiles : 0, lane);
  // kInPage: slot[0] = the tile's first slot; else the slots of this lane's rows.
  struct RowSlots {
    int slot[kInPage ? 1 : kRowsPerLane];
  };
  auto lookup = [&](int i) -> RowSlots {
    RowSlots r{};
    if (i >= ntiles) return r;
    if constexpr (kInPage) {
      r.slot[0] = slots.Take(i, lane);
    } else {
      Copy::LookupSlots(table, bs, first + i * stride + crow, warp_end, r.slot);
    }
    return r;
  };
  // Starts the copies of tile i into `stage` (an empty group past the last
  // tile, so that the waits count the same way). Rows past warp_end are
  // zero-filled (nothing is read; their addresses stay in the tile's page or
  // point at the cache's base). kTma: lane 0 arms the stage's barrier with
  // the tile's bytes and issues its four boxes (nothing past the last tile);
  // rows past warp_end are copied and their V rows zeroed after the wait.
  auto issue = [&](int i, int stage, const RowSlots& p) {
    if constexpr (kTma) {
      if (i < ntiles && lane == 0) {
        const unsigned bar = bars + 8 * stage, dst = ring + stage * kStageBytes;
        FenceProxyAsyncShared();  // the warp's reads of this stage come first
        MbarArriveExpectTx(bar, kStageBytes);
        const int slot = p.slot[0];
        TmaLoad3D(dst, kmap, bar, 0, kvh, slot);
        TmaLoad3D(dst + L::kTmaHalfBytes, kmap, bar, 64, kvh, slot);
        TmaLoad3D(dst + L::kTmaTileBytes, vmap, bar, 0, kvh, slot);
        TmaLoad3D(dst + L::kTmaTileBytes + L::kTmaHalfBytes, vmap, bar, 64, kvh, slot);
      }
      return;
    }
    if (i < ntiles) {
      int64_t elem[kRowsPerLane];
#pragma unroll
      for (int k = 0; k < kRowsPerLane; ++k) {
        elem[k] = kInPage ? static_cast<int64_t>(p.slot[0]) * slot_elems + k * row_step
                          : static_cast<int64_t>(p.slot[kInPage ? 0 : k]) * slot_elems;
      }
      Copy::template Issue<L::kPitch>(ring + static_cast<unsigned>(stage * kStageBytes) + copy_dst,
                                      L::kTileBytes, k_lane, v_lane, elem,
                                      first + i * stride + crow, warp_end);
    }
    CpAsyncCommit();
  };

  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // o[mt]: O^T rows (head dims) 16mt + gid (e < 2) and + 8 (e >= 2), columns
  // (query rows) 2tig + (e & 1).
  float o[kKS][4];
  ZeroFragments(o);

  // The first tiles' copies may start before the kernel before this one (the
  // RoPE + KV write) has finished when all their keys are older than every
  // token of the item, whose keys that kernel writes; the query, which it
  // rotates, is read after the wait.
  int newest_min = 0x7fffffff;
  for (int t = 0; t < item.num_tokens; ++t) {
    newest_min = min(newest_min, a.positions[item.token_begin + t]);
  }
  const bool early = first + (kStages - 2) * stride + kMmaKeyTile <= newest_min;
  if (early) {
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue(i, i, lookup(i));
  }
  GridDependencyWait();

  // Q^T as B fragments: dims 16ks + 2tig + {0, 1} (b0) and + 8 (b1) of row
  // gid, unscaled bf16 (the scale is applied to S in fp32); zero columns for
  // rows past `rows`.
  uint32_t qf[kKS][2];
  {
    const uint32_t* qrow = nullptr;
    if (gid < rows) {
      const int64_t tok = item.token_begin + gid / group;
      const int qh = kvh * group + gid % group;
      qrow = reinterpret_cast<const uint32_t*>(static_cast<const bf16*>(a.q) +
                                               tok * a.q_row_stride + static_cast<int64_t>(qh) * D);
    }
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      qf[ks][0] = qrow ? qrow[8 * ks + tig] : 0u;
      qf[ks][1] = qrow ? qrow[8 * ks + 4 + tig] : 0u;
    }
  }

  if (!early) {
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue(i, i, lookup(i));
  }
  RowSlots next_slots = lookup(kStages - 1);

  // Stage of tile i (read) and of tile i + kStages - 1 (refilled); kTma:
  // the parity of the stage's barrier phase that tile i completes.
  int stage = 0, fill_stage = kStages - 1;
  unsigned parity = 0;
  for (int i = 0; i < ntiles; ++i) {
    const int t0 = first + i * stride;
    const unsigned kt = ring + static_cast<unsigned>(stage * kStageBytes);
    if constexpr (kTma) {
      MbarWait(bars + 8 * stage, parity);  // tile i has landed
      if (t0 + kMmaKeyTile > warp_end) {
        // A partial last tile: zero the V rows of keys past warp_end.
        const int valid = warp_end - t0;
        for (int e = lane; e < kMmaKeyTile * 16; e += 32) {
          const int r = e >> 4;
          if (r >= valid) {
            const unsigned addr = kt + L::kTmaTileBytes + (e & 8 ? L::kTmaHalfBytes : 0) +
                                  static_cast<unsigned>(r * 128 + (e & 7) * 16);
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
          }
        }
        FenceProxyAsyncShared();  // before the stage's refill by TMA
      }
    } else {
      CpAsyncWait<kStages - 2>();  // this lane's copies of tile i have landed
    }
    __syncwarp();  // every lane's; and tile i - 1's stage is read
    issue(i + kStages - 1, fill_stage, next_slots);
    next_slots = lookup(i + kStages);  // in flight during this iteration's products

    // S^T: c[0] = (key gid, row 2tig), c[1] = (key gid, row 2tig+1),
    // c[2], c[3] = key gid + 8.
    float acc[kChains][4];
    ZeroFragments(acc);
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      uint32_t ka[4];
      LdMatrixX4<false>(ka, k_frag(kt, ks));
      MmaBf16(acc[ks % kChains], ka[0], ka[1], ka[2], ka[3], qf[ks][0], qf[ks][1]);
    }
    float s[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[e] = acc[0][e];
#pragma unroll
      for (int c = 1; c < kChains; ++c) s[e] += acc[c][e];
    }
    if (t0 + kMmaKeyTile <= unmasked_end) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] *= scale;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = t0 + gid + (e >> 1) * 8;
        const int pos = (e & 1) ? pos1 : pos0;
        s[e] = key <= pos && key < ke ? s[e] * scale : -INFINITY;
      }
    }
    // Lazy rescaling (mma_common.cuh): only when some score is more than
    // 2^8 above its row's reference max; then the true row maxima (over the 8
    // lanes of each tig) become the references.
    float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
    if (__any_sync(0xffffffffu, mx0 > m0 + kLazyLog2 || mx1 > m1 + kLazyLog2)) {
#pragma unroll
      for (int x = 4; x < 32; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
      }
      const float2 al = MoveReferenceMaxima(mx0, mx1, m0, m1, l0, l1);
#pragma unroll
      for (int mt = 0; mt < kKS; ++mt) {
        o[mt][0] *= al.x;
        o[mt][2] *= al.x;
        o[mt][1] *= al.y;
        o[mt][3] *= al.y;
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float m = (e & 1) ? m1 : m0;
      s[e] = Exp2Below(s[e], m);
    }
    l0 += s[0] + s[2];
    l1 += s[1] + s[3];

    // P^T's B fragments: the 8x8 blocks (keys 0-7 | 8-15) x rows of S^T's
    // accumulators, transposed, as bf16 plus residual.
    const uint32_t p_lo = PackBf16x2(s[0], s[1]), p_hi = PackBf16x2(s[2], s[3]);
    const uint32_t r_lo = PackBf16x2Residual(s[0], s[1], p_lo);
    const uint32_t r_hi = PackBf16x2Residual(s[2], s[3], p_hi);
    const uint32_t b0 = MovMatrixTrans(p_lo), b1 = MovMatrixTrans(p_hi);
    const uint32_t br0 = MovMatrixTrans(r_lo), br1 = MovMatrixTrans(r_hi);
#pragma unroll
    for (int mt = 0; mt < kKS; ++mt) {
      uint32_t va[4];
      LdMatrixX4<true>(va, v_frag(kt, mt));
      MmaBf16(o[mt], va[0], va[1], va[2], va[3], b0, b1);
      MmaBf16(o[mt], va[0], va[1], va[2], va[3], br0, br1);
    }
    fill_stage = stage;
    stage = stage + 1 == kStages ? 0 : stage + 1;
    if (stage == 0) parity ^= 1u;
  }

  // Every warp is out of its key loop before the ring is reused.
  CpAsyncWait<0>();
  __syncthreads();
#pragma unroll
  for (int x = 4; x < 32; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  // The epilogue and the split merge work in natural-log units.
  m0 *= 0.693147180559945309f;
  m1 *= 0.693147180559945309f;
  const int srow = slice * kRows;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 2 * tig + h;
    if (r < rows) {
      if (gid == 0) {
        wm_s[srow + r] = h ? m1 : m0;
        wl_s[srow + r] = h ? l1 : l0;
      }
      float* dst = wacc_s + (srow + r) * D + gid;
#pragma unroll
      for (int mt = 0; mt < kKS; ++mt) {
        dst[16 * mt] = o[mt][h];
        dst[16 * mt + 8] = o[mt][2 + h];
      }
    }
  }
  __syncthreads();
  MergeSlicesAndStore<bf16, D>(a, item.token_begin, kvh, split, group, rows, kMmaAttnWarps, kRows,
                               wm_s, wl_s, wacc_s, merge_s);
  // kTma: the epilogue's shared-memory writes (generic proxy) overlap the
  // rings that a next split of this block refills by TMA (async proxy): each
  // writer orders its writes before them here, ahead of the block barrier
  // between splits.
  if constexpr (kTma) FenceProxyAsyncShared();
}

// kTma (D == 128): splits whose tiles each lie in one page copy them with
// TMA through kmap / vmap (the K and V caches' maps, MakeKvCacheTensorMap);
// otherwise the maps are unused.
template <int D, bool kTma>
__global__ void __launch_bounds__(kMmaAttnThreads, 2)
    MmaDecodeKernel(const PagedAttentionArgs a, const __grid_constant__ CUtensorMap kmap,
                    const __grid_constant__ CUtensorMap vmap) {
  SYMTP_TRACE_KERNEL(kDecodeAttention);
  static_assert(D == 32 || D == 64 || D == 128, "head_dim");
  // Launched with PDL: the items, positions, block tables and the older keys
  // were written before the previous kernel started; MmaDecodeSplit waits
  // for it before it reads what it writes (the query, the newest keys).
  const AttentionItem item = a.items[blockIdx.x];
  const int kvh = blockIdx.y;
  ForEachBlockSplit(a, item, [&](int split, int kb, int ke, bool in_page) {
    if (in_page) {
      MmaDecodeSplit<D, true, kTma>(a, item, kvh, split, kb, ke, &kmap, &vmap);
    } else {
      MmaDecodeSplit<D, false, false>(a, item, kvh, split, kb, ke, &kmap, &vmap);
    }
  });
  // Blocks whose splits were empty wait too: this grid completes only after
  // the previous kernel did.
  GridDependencyWait();
}

template <int D, bool kTma>
absl::Status LaunchMmaDecodeKernel(const PagedAttentionArgs& a, const CUtensorMap& kmap,
                                   const CUtensorMap& vmap, cudaStream_t stream) {
  const int zgrid = a.split_grid > 0 ? std::min(a.split_grid, a.num_splits) : a.num_splits;
  const dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(zgrid));
  constexpr size_t kSmem = MmaDecodeLayout<D>::kSmemBytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(MmaDecodeKernel<D, kTma>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSmem));
  CUDA_RETURN_IF_ERROR(attr);
  CUDA_RETURN_IF_ERROR(LaunchDependent(MmaDecodeKernel<D, kTma>, grid, dim3(kMmaAttnThreads), kSmem,
                                       stream, a, kmap, vmap));
  return absl::OkStatus();
}

// Whether a launch of this head dim over pages of `block_size` slots takes
// the TMA form, given the cache's size (PagedAttentionArgs::cache_slots):
// head dim 128 with every 16-key tile in one page. The launcher and the split
// planner's slots (DecodePlanBlocksPerSm) both ask this.
constexpr bool MmaDecodeTmaShape(int head_dim, int block_size) {
  return head_dim == 128 && block_size > 0 && block_size % kMmaKeyTile == 0;
}

// The shapes of MmaDecodeTmaShape over a cache whose size is known take the
// TMA form; the rest the cp.async form. The two tensor maps are encoded at
// every launch: a host-only call of about 60 ns each (H100 machine), and a
// captured graph keeps the launch's copy.
template <int D>
absl::Status LaunchMmaDecodeT(const PagedAttentionArgs& a, cudaStream_t stream) {
  if constexpr (D == 128) {
    if (a.cache_slots > 0 && MmaDecodeTmaShape(D, a.block_size)) {
      SYMTP_ASSIGN_OR_RETURN(
          const CUtensorMap kmap,
          MakeKvCacheTensorMap(a.k_cache, a.cache_slots, a.num_kv_heads, D, kMmaKeyTile));
      SYMTP_ASSIGN_OR_RETURN(
          const CUtensorMap vmap,
          MakeKvCacheTensorMap(a.v_cache, a.cache_slots, a.num_kv_heads, D, kMmaKeyTile));
      return LaunchMmaDecodeKernel<D, true>(a, kmap, vmap, stream);
    }
  }
  const CUtensorMap unused{};
  return LaunchMmaDecodeKernel<D, false>(a, unused, unused, stream);
}

}  // namespace symtp::kernels::internal

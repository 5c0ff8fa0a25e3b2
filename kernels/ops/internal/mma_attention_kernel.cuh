// The tensor-core paged-attention kernel for launches with more than 8 query
// rows per item and kv head (prefill, chunked prefill, groups above 8:
// PrefillKernel::kTensorCore, and DecodeKernel::kTensorCore with G > 8), bf16
// only; included by mma_attention_bf16.cu. Decode with G <= 8 runs
// MmaDecodeKernel (mma_decode_kernel.cuh), which shares the helpers here.
//
// Same work split and outputs as the tiled kernel (attention_kernel.cuh): a
// block = (item, kv head, split), rows r = (token i of the item, q head g of
// the group), R = num_tokens * G <= 64, split-K partials in the same
// workspace layout so MergeSplitsKernel is shared. The arithmetic differs:
// both products run on mma.sync.m16n8k16 (bf16 in, fp32 accumulate) with the
// online softmax in fp32 registers, so a warp handles 16 rows x 16 keys per
// step with no barrier in the key loop.
//
// Warps: the R rows form nrg = 1, 2 or 4 row groups of 16; the 4 warps are
// nrg row groups x (4 / nrg) key slices (interleaving 16-key tiles); the
// slices' (max, sum, acc) are merged through shared memory at the end.
//
// Fragments (PTX ISA, mma.m16n8k16 .bf16; lane = 4 * gid + tig):
//   A 16x16: {a0,a1} = (row gid, cols 2tig..+1), {a2,a3} = (row gid+8, same),
//            {a4,a5} = (row gid, cols 2tig+8..+9), {a6,a7} = (row gid+8, same)
//   B 16x8:  {b0,b1} = (rows 2tig..+1, col gid), {b2,b3} = (rows 2tig+8..+9)
//   C 16x8:  c0,c1 = (row gid, cols 2tig..+1), c2,c3 = (row gid+8, same)
// A dot product does not care in which order it sums, so the kernel permutes
// the reduction index to make every global load 16 bytes wide:
//   S = Q K^T, k-step ks = 2c+h: logical k 2tig+{0,1} is head dim
//     32c + 8tig + 4h + {0,1} and 2tig+8+{0,1} is 32c + 8tig + 4h + {2,3};
//     lane (gid, tig) loads dims [32c + 8tig, +8) of the K row of key gid of
//     the n-tile in one uint4 and Q is gathered in the same order.
//   O = P V, n-tile j: output column n is head dim n * D/8 + j, so lane
//     (gid, tig) needs dims [gid * D/8, +D/8) of 4 V rows (keys 2tig, 2tig+1,
//     2tig+8, 2tig+9): contiguous loads, paired across keys with byte_perm.
//   P is the C fragment of S re-packed as the A fragment of P V (the
//     FlashAttention-2 register reuse), as a bf16 term plus a bf16 residual.
//     Scores are in base-2 units (ex2.approx) and O, l are rescaled lazily,
//     only when a row's max grows by more than 2^8.
//
// Loads: every lane reads exactly the K and V bytes it later feeds to its own
// fragments, so the tiles can be staged through shared memory with cp.async
// without any exchange between lanes: each warp keeps a ring of kStages
// tiles per lane (layout [stage][warp][16-byte unit][lane], conflict-free),
// issues tile i + kStages - 1 before it waits for tile i and never needs a
// barrier in the key loop. The price is the access pattern: each copy
// instruction takes 16- or 32-byte pieces of 8-16 different rows, so L2
// serves several requests per 128-byte line. That, not the instruction
// count, is what held the decode launches (which this kernel also ran until
// session 6) at 45-68% of the copy bandwidth; MmaDecodeKernel, copying whole
// lines, reaches 61-95% (bench/results/h200-2026-11-23/README.md). Prefill
// here runs at ~75 TFLOP/s (a 4096-token prompt, run w), 9% of the bf16 rate:
// block-shared K/V tiles copied in whole lines and more keys per warp step
// (FlashAttention-2's layout) are the next thing to try for it.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/internal/attention_epilogue.cuh"
#include "kernels/ops/internal/device_utils.cuh"

namespace symtp::kernels::internal {

constexpr int kMmaAttnThreads = 128;
constexpr int kMmaAttnWarps = kMmaAttnThreads / 32;
constexpr int kMmaAttnMaxRows = 64;
constexpr int kMmaKeyTile = 16;
// Launches with at most this many query rows per item and kv head run the
// decode kernel (mma_decode_kernel.cuh), the others MmaAttentionKernel.
constexpr int kMmaDecodeRows = 8;

// d = a * b + d, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void MmaBf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as a bf16x2 register, `lo` in the low half.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

// What PackBf16x2(lo, hi) == `packed` left out, as bf16x2: with both terms
// in the P V products, P carries ~16 significant bits instead of 8.
__device__ __forceinline__ uint32_t PackBf16x2Residual(float lo, float hi, uint32_t packed) {
  return PackBf16x2(lo - __uint_as_float(packed << 16), hi - __uint_as_float(packed & 0xffff0000u));
}

// 2^x in one MUFU op (ex2.approx.ftz: ~2 ulp, -inf -> 0). The kernel keeps
// scores in base-2 units (scale * log2 e folded into the Q K^T scale), so the
// online softmax needs no expf (a dozen instructions each, 10 per tile).
__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Asynchronous global -> shared copies of 16 or 8 bytes, also cached in L1
// (the row groups' warps of a prefill block read the same K/V); with `valid`
// false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsync8(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 8 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Per-lane staging of one 16-key tile, in 16-byte units: K rows (2 n-tiles x
// D/32 units), then the 4 V row slices (D/16 words each, packed).
template <int D>
struct MmaTileLayout {
  static constexpr int kKC = D / 32;            // 16-byte K units per n-tile
  static constexpr int kVW = D / 16;            // 32-bit V words per key row
  static constexpr int kUnits = 2 * kKC + kVW;  // 4 rows x kVW words = kVW units
  static constexpr int kStages = D == 128 ? 3 : 4;
  static constexpr size_t kStageBytes = static_cast<size_t>(kUnits) * 32 * 16;  // per warp
  static constexpr size_t kRingBytes = kStageBytes * kMmaAttnWarps * kStages;
  // The epilogue's per-row accumulators and stats reuse the ring.
  // (accumulators, max, sum, then the merge's weights, denominators, maxima)
  static constexpr size_t kEpilogueBytes = (kMmaAttnMaxRows * D + 5 * kMmaAttnMaxRows) * 4;
  static constexpr size_t kSmemBytes = kRingBytes > kEpilogueBytes ? kRingBytes : kEpilogueBytes;
};

// The decode kernel's copy (mma_decode_kernel.cuh): a shared-memory address,
// L2 only (each byte is read once).
__device__ __forceinline__ void CpAsync16Shared(unsigned dst, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// The first slot of each of a warp's 16-key tiles when every tile lies in one
// page: lane l holds the slot of tile 32b + l for two blocks b of 32 tiles,
// read 32 tiles before use, and each tile takes its slot with one shuffle.
// (A copy's address depends on a block-table read, and reading the table
// next to the copies stalled the warps on it: ncu's source view at small
// batch put a fifth of all stall samples on the first use of the entry and
// most of the rest of the copy path on the entry's division by the page size.)
// Tile i starts at key first + i * stride.
struct TileSlotQueue {
  const int32_t* table;
  int bs, first, stride, ntiles;
  int even = 0, odd = 0;

  __device__ __forceinline__ TileSlotQueue(const int32_t* table_, int bs_, int first_, int stride_,
                                           int ntiles_, int lane)
      : table(table_), bs(bs_), first(first_), stride(stride_), ntiles(ntiles_) {
    even = SlotOf(lane);
    odd = SlotOf(32 + lane);
  }
  __device__ __forceinline__ int SlotOf(int i) const {
    if (i >= ntiles) return 0;
    const int t0 = first + i * stride;
    return table[t0 / bs] * bs + t0 % bs;
  }
  // Tile i's first slot; call for i = 0, 1, 2, ... < ntiles in order, from the
  // whole warp.
  __device__ __forceinline__ int Take(int i, int lane) {
    const bool o = (i >> 5) & 1;
    const int slot = __shfl_sync(0xffffffffu, o ? odd : even, i & 31);
    if ((i & 31) == 31) {  // block i >> 5 used up: its register takes block (i >> 5) + 2
      const int next = SlotOf(i + 1 + 32 + lane);
      if (o) {
        odd = next;
      } else {
        even = next;
      }
    }
    return slot;
  }
};

// Calls body(split, kb, ke, in_page) for each split of the block: splits
// blockIdx.z, + gridDim.z, ... (a launch with split_grid < num_splits, as in
// GpuModel's CUDA graphs sized for the splits a batch of that size plans,
// walks several per block), with the block's key range [kb, ke) in it and
// whether every 16-key tile of it lies in one page (block size and kb
// multiples of 16). Barrier between splits: they reuse the shared memory.
template <typename Body>
__device__ __forceinline__ void ForEachBlockSplit(const PagedAttentionArgs& a,
                                                  const AttentionItem& item, Body&& body) {
  const int lane = threadIdx.x & 31;
  // The block's key range, as in the tiled kernel.
  int max_pos = -1;
  for (int i = lane; i < item.num_tokens; i += 32)
    max_pos = max(max_pos, a.positions[item.token_begin + i]);
  max_pos = __reduce_max_sync(0xffffffffu, max_pos);
  const int key_end = max_pos + 1;
  for (int split = blockIdx.z; split < a.num_splits; split += gridDim.z) {
    int kb = 0, ke = key_end;
    if (a.num_splits > 1) {
      const int chunk = SplitChunk(a);
      kb = split * chunk;
      ke = min(key_end, kb + chunk);
      // Block-uniform: nothing in this split, nor in the later ones; the merge
      // skips them.
      if (kb >= ke) return;
    }
    body(split, kb, ke, a.block_size % kMmaKeyTile == 0 && kb % kMmaKeyTile == 0);
    __syncthreads();
  }
}

// One split of one block: keys [kb, ke) of `item` for kv head kvh, by the
// block's four warps, ending with the output (or the split's partials)
// stored. kInPage: every 16-key tile lies in one page (block size and kb
// multiples of 16; tiles start on 16-key boundaries), so a lane's six rows sit
// at fixed offsets from the tile's first slot and the copies need neither a
// per-row table lookup nor a branch (the general path had both, and at small
// batch the warps are bound by their instruction count).
template <int D, bool kInPage>
__device__ __forceinline__ void MmaAttendSplit(const PagedAttentionArgs& a,
                                               const AttentionItem& item, int kvh, int split,
                                               int kb, int ke) {
  using L = MmaTileLayout<D>;
  constexpr int kKS = D / 16;  // k-steps of Q K^T
  constexpr int kKC = L::kKC;  // uint4 per K row per lane
  constexpr int kNT = D / 8;   // n-tiles of P V = V elements per row per lane
  constexpr int kVW = L::kVW;  // 32-bit words of those
  constexpr int kStages = L::kStages;

  extern __shared__ __align__(16) unsigned char mma_smem[];
  float* wacc_s = reinterpret_cast<float*>(mma_smem);
  float* wm_s = wacc_s + kMmaAttnMaxRows * D;
  float* wl_s = wm_s + kMmaAttnMaxRows;
  float* merge_s = wl_s + kMmaAttnMaxRows;

  const int group = a.num_q_heads / a.num_kv_heads;
  const int rows = item.num_tokens * group;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;

  const int nrg = rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
  const int nslices = kMmaAttnWarps / nrg;
  const int rg = warp % nrg, slice = warp / nrg;
  const int r0 = rg * 16 + gid, r1 = r0 + 8;
  const int pos0 = r0 < rows ? a.positions[item.token_begin + r0 / group] : -1;
  const int pos1 = r1 < rows ? a.positions[item.token_begin + r1 / group] : -1;

  // Q as A fragments (unscaled bf16; the scale is applied to S in fp32).
  // Lane (gid, tig) needs dims [32c + 8tig, +8) of its rows for k-steps 2c
  // and 2c + 1: one 16-byte load per row and c (the launcher checks the
  // alignment).
  const bf16* q = static_cast<const bf16*>(a.q);
  auto q_row = [&](int r) -> const uint4* {
    if (r >= rows) return nullptr;
    const int64_t tok = item.token_begin + r / group;
    const int qh = kvh * group + r % group;
    return reinterpret_cast<const uint4*>(q + tok * a.q_row_stride + static_cast<int64_t>(qh) * D);
  };
  const uint4* q0 = q_row(r0);
  const uint4* q1 = q_row(r1);
  uint32_t qf[kKS][4];
#pragma unroll
  for (int c = 0; c < kKS / 2; ++c) {
    const uint4 v0 = q0 ? q0[4 * c + tig] : make_uint4(0u, 0u, 0u, 0u);
    const uint4 v1 = q1 ? q1[4 * c + tig] : make_uint4(0u, 0u, 0u, 0u);
    qf[2 * c][0] = v0.x;
    qf[2 * c][2] = v0.y;
    qf[2 * c + 1][0] = v0.z;
    qf[2 * c + 1][2] = v0.w;
    qf[2 * c][1] = v1.x;
    qf[2 * c][3] = v1.y;
    qf[2 * c + 1][1] = v1.z;
    qf[2 * c + 1][3] = v1.w;
  }

  const int32_t* table = a.block_tables + static_cast<int64_t>(item.seq) * a.block_table_stride;
  const bf16* kc = static_cast<const bf16*>(a.k_cache);
  const bf16* vc = static_cast<const bf16*>(a.v_cache);
  const int bs = a.block_size;
  const int64_t slot_elems = static_cast<int64_t>(a.num_kv_heads) * D;
  const float scale = a.scale * 1.44269504088896341f;  // log2 e: base-2 scores

  // This warp's rows need keys up to their largest position.
  const int warp_end = min(ke, __reduce_max_sync(0xffffffffu, max(pos0, pos1)) + 1);

  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // o[j][e]: row (e < 2 ? r0 : r1).
  float o[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
  }
  // Keys below unmasked_end are visible to every row of this warp (rows past
  // `rows` do not count: their outputs are never stored), so tiles below it
  // skip the per-score mask.
  int unmasked_end = 0x7fffffff;
  if (r0 < rows) unmasked_end = pos0 + 1;
  if (r1 < rows) unmasked_end = min(unmasked_end, pos1 + 1);
  unmasked_end = min(ke, __reduce_min_sync(0xffffffffu, unmasked_end));

  // This warp's tiles: t0 = first + i * stride, i < ntiles.
  const int stride = nslices * kMmaKeyTile;
  const int first = kb + slice * kMmaKeyTile;
  const int ntiles = first < warp_end ? (warp_end - first + stride - 1) / stride : 0;
  uint4* ring = reinterpret_cast<uint4*>(mma_smem) +
                static_cast<size_t>(warp) * kStages * L::kUnits * 32 + lane;
  auto unit = [&](int stage, int u) -> uint4* { return ring + (stage * L::kUnits + u) * 32; };
  // The keys this lane copies for the tile at t0: K rows 8nt + gid, V rows
  // 2tig + (qi & 1) + 8 (qi >> 1).
  auto k_key = [&](int t0, int nt) { return t0 + nt * 8 + gid; };
  auto v_key = [&](int t0, int qi) { return t0 + 2 * tig + (qi & 1) + (qi >> 1) * 8; };
  // Where those rows start: with kInPage (the caller checked the block size
  // and kb; `first` and `stride` add multiples of 16) the whole tile is one
  // slot, taken from a TileSlotQueue, and each lane's six rows sit at fixed
  // offsets from it; otherwise every row is looked up one iteration ahead.
  TileSlotQueue slots(table, bs, first, stride, kInPage ? ntiles : 0, lane);
  const int64_t head_off = static_cast<int64_t>(kvh) * D;
  // kInPage: this lane's first copied element of each of its rows, relative
  // to the tile's first slot (head, row and the lane's column folded in).
  int k_off[2], v_off[4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
    k_off[nt] = static_cast<int>(k_key(0, nt) * slot_elems + head_off) + tig * 8;
#pragma unroll
  for (int qi = 0; qi < 4; ++qi)
    v_off[qi] = static_cast<int>(v_key(0, qi) * slot_elems + head_off) + gid * kNT;
  struct TilePages {
    int k[2];  // kInPage: k[0] = the tile's first slot; else each row's page
    int v[4];
  };
  // Called for i = 0, 1, 2, ... in order.
  auto lookup = [&](int i, TilePages& p) {
    if (i >= ntiles) return;
    if constexpr (kInPage) {
      p.k[0] = slots.Take(i, lane);
    } else {
      const int t0 = first + i * stride;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = k_key(t0, nt);
        p.k[nt] = key < warp_end ? table[key / bs] : 0;
      }
#pragma unroll
      for (int qi = 0; qi < 4; ++qi) {
        const int key = v_key(t0, qi);
        p.v[qi] = key < warp_end ? table[key / bs] : 0;
      }
    }
  };
  auto slot_row = [&](const bf16* cache, int page, int key) -> const bf16* {
    const int64_t slot = static_cast<int64_t>(page) * bs + key % bs;
    return cache + slot * slot_elems + head_off;
  };
  // Starts the copies of tile i into `stage` (an empty group past the last
  // tile, so that the wait below counts the same way). Keys past warp_end are
  // zero-filled (nothing is read; their addresses stay inside the tile's page
  // or point at the cache's base).
  auto issue = [&](int i, int stage, const TilePages& p) {
    if (i < ntiles) {
      const int t0 = first + i * stride;
      const int64_t tile_elem = static_cast<int64_t>(p.k[0]) * slot_elems;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = k_key(t0, nt);
        const bool ok = key < warp_end;
        const bf16* krow;
        if constexpr (kInPage) {
          krow = kc + tile_elem + k_off[nt];
        } else {
          krow = (ok ? slot_row(kc, p.k[nt], key) : kc) + tig * 8;
        }
#pragma unroll
        for (int c = 0; c < kKC; ++c) CpAsync16(unit(stage, nt * kKC + c), krow + c * 32, ok);
      }
#pragma unroll
      for (int qi = 0; qi < 4; ++qi) {
        const int key = v_key(t0, qi);
        const bool ok = key < warp_end;
        const bf16* vrow;
        if constexpr (kInPage) {
          vrow = vc + tile_elem + v_off[qi];
        } else {
          vrow = (ok ? slot_row(vc, p.v[qi], key) : vc) + gid * kNT;
        }
        if constexpr (kVW >= 4) {
#pragma unroll
          for (int c = 0; c < kVW / 4; ++c)
            CpAsync16(unit(stage, 2 * kKC + qi * (kVW / 4) + c), vrow + c * 8, ok);
        } else {  // 8 bytes per row: two rows per unit
          CpAsync8(reinterpret_cast<uint2*>(unit(stage, 2 * kKC + qi / 2)) + (qi & 1), vrow, ok);
        }
      }
    }
    CpAsyncCommit();
  };
  TilePages pages{};
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    lookup(i, pages);
    issue(i, i, pages);
  }
  lookup(kStages - 1, pages);

  // Stage of tile i (read) and of tile i + kStages - 1 (refilled), i % kStages
  // without the division.
  int stage = 0, fill_stage = kStages - 1;
  for (int i = 0; i < ntiles; ++i) {
    issue(i + kStages - 1, fill_stage, pages);  // refills the stage read in iteration i - 1
    lookup(i + kStages, pages);                 // in flight during this iteration's products
    CpAsyncWait<kStages - 1>();                 // tile i has landed
    const int t0 = first + i * stride;
    uint4 kr[2][kKC];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int c = 0; c < kKC; ++c) kr[nt][c] = *unit(stage, nt * kKC + c);
    }
    uint32_t vr[4][kVW];
    {
      uint4 vu[kVW];
#pragma unroll
      for (int u = 0; u < kVW; ++u) vu[u] = *unit(stage, 2 * kKC + u);
#pragma unroll
      for (int qi = 0; qi < 4; ++qi) {
#pragma unroll
        for (int w = 0; w < kVW; ++w) {
          const int word = qi * kVW + w;
          const uint4 v = vu[word / 4];
          vr[qi][w] = (word & 3) == 0 ? v.x : (word & 3) == 1 ? v.y : (word & 3) == 2 ? v.z : v.w;
        }
      }
    }

    // S = Q K^T for the two 8-key n-tiles, even and odd k-steps in separate
    // accumulators: four dependent chains of D/32 products instead of two of
    // D/16 (a warp waits on each product's latency at small batch).
    float s[2][4], so[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = so[nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        const uint4 k4 = kr[nt][ks >> 1];
        const uint32_t b0 = (ks & 1) ? k4.z : k4.x;
        const uint32_t b1 = (ks & 1) ? k4.w : k4.y;
        MmaBf16((ks & 1) ? so[nt] : s[nt], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b0, b1);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] += so[nt][e];
    }
    // Scale and mask: s[nt][e] is row (e < 2 ? r0 : r1), key t0 + 8nt + 2tig + (e & 1).
    if (t0 + kMmaKeyTile <= unmasked_end) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= scale;
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = t0 + nt * 8 + 2 * tig + (e & 1);
          const int pos = e < 2 ? pos0 : pos1;
          s[nt][e] = key <= pos && key < ke ? s[nt][e] * scale : -INFINITY;
        }
      }
    }
    float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    // Row max over the quad (the 4 lanes of a row), then the online softmax.
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Lazy rescaling: the reference max m moves (and O and l are rescaled)
    // only when some row of the warp sees a score more than kLazyLog2 above
    // it, so the weights stay <= 2^kLazyLog2 (exact enough in fp32 and as
    // bf16 + residual) and the 4 x D/8 multiplies of O are skipped on most
    // tiles once the maxima settle. A warp-uniform branch.
    constexpr float kLazyLog2 = 8.f;
    if (__any_sync(0xffffffffu, mx0 > m0 + kLazyLog2 || mx1 > m1 + kLazyLog2)) {
      const float mn0 = fmaxf(m0, mx0);
      const float al0 = mn0 == -INFINITY ? 1.f : Exp2Approx(m0 - mn0);
      m0 = mn0;
      l0 *= al0;
      const float mn1 = fmaxf(m1, mx1);
      const float al1 = mn1 == -INFINITY ? 1.f : Exp2Approx(m1 - mn1);
      m1 = mn1;
      l1 *= al1;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        o[j][0] *= al0;
        o[j][1] *= al0;
        o[j][2] *= al1;
        o[j][3] *= al1;
      }
    }
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float m = e < 2 ? m0 : m1;
        s[nt][e] = m == -INFINITY ? 0.f : Exp2Approx(s[nt][e] - m);
      }
      ps0 += s[nt][0] + s[nt][1];
      ps1 += s[nt][2] + s[nt][3];
    }
    l0 += ps0;
    l1 += ps1;

    // O = O * alpha + P V, P as bf16 (pa) plus its bf16 residual (pr): two
    // products per n-tile, nearly free where loads bound the kernel, and the
    // weights keep ~16 bits (bf16 alone: ~5e-3 relative error in the lane
    // model's output, the residual: ~1e-5).
    const uint32_t pa0 = PackBf16x2(s[0][0], s[0][1]);  // P[r0][keys 2tig, 2tig+1]
    const uint32_t pa1 = PackBf16x2(s[0][2], s[0][3]);  // P[r1][keys 2tig, 2tig+1]
    const uint32_t pa2 = PackBf16x2(s[1][0], s[1][1]);  // P[r0][keys 2tig+8, 2tig+9]
    const uint32_t pa3 = PackBf16x2(s[1][2], s[1][3]);
    const uint32_t pr0 = PackBf16x2Residual(s[0][0], s[0][1], pa0);
    const uint32_t pr1 = PackBf16x2Residual(s[0][2], s[0][3], pa1);
    const uint32_t pr2 = PackBf16x2Residual(s[1][0], s[1][1], pa2);
    const uint32_t pr3 = PackBf16x2Residual(s[1][2], s[1][3], pa3);
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int w = j >> 1;
      const unsigned sel = (j & 1) ? 0x7632u : 0x5410u;  // high or low halves of both
      const uint32_t b0 = __byte_perm(vr[0][w], vr[1][w], sel);
      const uint32_t b1 = __byte_perm(vr[2][w], vr[3][w], sel);
      MmaBf16(o[j], pa0, pa1, pa2, pa3, b0, b1);
      MmaBf16(o[j], pr0, pr1, pr2, pr3, b0, b1);
    }
    fill_stage = stage;
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }

  // Every warp is out of its key loop before the ring is reused.
  CpAsyncWait<0>();
  __syncthreads();
  // Each slice's rows to shared memory: o[j][e] is row (e < 2 ? r0 : r1),
  // head dim (2tig + (e & 1)) * kNT + j.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const int srow = slice * nrg * 16;
  // The epilogue and the split merge work in natural-log units.
  m0 *= 0.693147180559945309f;
  m1 *= 0.693147180559945309f;
  // Row r's (max, sum) and accumulators o[j][e0], o[j][e0 + 1].
  auto store_row = [&](int r, float m, float l, int e0) {
    if (r >= rows) return;
    if (tig == 0) {
      wm_s[srow + r] = m;
      wl_s[srow + r] = l;
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      wacc_s[(srow + r) * D + (2 * tig) * kNT + j] = o[j][e0];
      wacc_s[(srow + r) * D + (2 * tig + 1) * kNT + j] = o[j][e0 + 1];
    }
  };
  store_row(r0, m0, l0, 0);
  store_row(r1, m1, l1, 2);
  __syncthreads();
  MergeSlicesAndStore<bf16, D>(a, item.token_begin, kvh, split, group, rows, nslices, nrg * 16,
                               wm_s, wl_s, wacc_s, merge_s);
}

// Launches with more than 8 query rows per item and kv head (prefill,
// chunked prefill, groups above 8); the others run MmaDecodeKernel
// (mma_decode_kernel.cuh).
template <int D>
__global__ void __launch_bounds__(kMmaAttnThreads, 2)
    MmaAttentionKernel(const PagedAttentionArgs a) {
  static_assert(D == 32 || D == 64 || D == 128, "head_dim");
  const AttentionItem item = a.items[blockIdx.x];
  const int kvh = blockIdx.y;
  ForEachBlockSplit(a, item, [&](int split, int kb, int ke, bool in_page) {
    if (in_page) {
      MmaAttendSplit<D, true>(a, item, kvh, split, kb, ke);
    } else {
      MmaAttendSplit<D, false>(a, item, kvh, split, kb, ke);
    }
  });
}

template <int D>
absl::Status LaunchMmaAttentionT(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int zgrid = a.split_grid > 0 ? std::min(a.split_grid, a.num_splits) : a.num_splits;
  const dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(zgrid));
  constexpr size_t kSmem = MmaTileLayout<D>::kSmemBytes;
  // Above the 48 KiB default: opt in once per instantiation (not a stream
  // operation, so also fine while a graph is being captured).
  static const cudaError_t attr = cudaFuncSetAttribute(
      MmaAttentionKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  CUDA_RETURN_IF_ERROR(attr);
  MmaAttentionKernel<D><<<grid, kMmaAttnThreads, kSmem, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace symtp::kernels::internal

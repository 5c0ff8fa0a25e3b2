// The tensor-core kernel for launches with more than 8 query rows per item
// and kv head (prefill, chunked prefill, groups above 8) with block-shared
// K/V tiles; included by mma_prefill_bf16.cu. Rows form nrg = 1, 2 or 4 row
// groups of 16 (query rows in the M dimension of mma.m16n8k16); the 4 warps
// are nrg row groups x 4 / nrg key slices, whose (max, sum, acc) are merged
// through shared memory at the end (attention_epilogue.cuh). K/V fragments:
//   - the block copies each 64-key tile of K and V once into shared memory
//     ([key][head dim], row pitch 2D + 16 bytes), every copy instruction
//     taking whole 128-byte lines (as MmaDecodeKernel does), one barrier per
//     tile;
//   - Q K^T's B operands come from the K tile by ldmatrix, and P V's from
//     the V tile by ldmatrix.trans (no byte permutes), in natural head-dim
//     order.
//   - a warp that owns the whole 64-key tile for its 16 rows (4 row groups)
//     takes it in one step: 8 independent Q K^T chains and one softmax pass
//     per tile instead of four 16-key steps (13% faster at 4096 tokens on an
//     H200: at 8 warps per SM the kernel is latency-bound).
//   - P enters P V as bf16 (as FlashAttention and cuDNN take it; the output
//     is bf16 too), with the softmax scale folded into the exponent's FMA.
// Launches with items of 65-128 rows (what prefill at bf16 head dim 128
// cuts, MaxAttentionItemTokens) run the wgmma kernel instead
// (wgmma_prefill_bf16.cu). Blocks take the items in reverse order (longest
// first under causal masks).
#pragma once

#include "kernels/ops/internal/mma_decode_kernel.cuh"

namespace symtp::kernels::internal {

template <int D>
struct MmaPrefillLayout {
  static constexpr int kTileKeys = 64;  // keys per stage, shared by the block
  static constexpr int kPitch = 2 * D + 16;
  static constexpr int kTileBytes = kTileKeys * kPitch;  // K or V
  static constexpr int kStages = D == 128 ? 3 : 4;
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr size_t kRingBytes = static_cast<size_t>(kStageBytes) * kStages;
  static constexpr size_t kEpilogueBytes = (kMmaAttnMaxRows * D + 5 * kMmaAttnMaxRows) * 4;
  static constexpr size_t kSmemBytes = kRingBytes > kEpilogueBytes ? kRingBytes : kEpilogueBytes;
};

// One split of one block: keys [kb, ke) of `item` for kv head kvh.
template <int D>
__device__ __forceinline__ void MmaPrefillSplit(const PagedAttentionArgs& a,
                                                const AttentionItem& item, int kvh, int split,
                                                int kb, int ke) {
  using L = MmaPrefillLayout<D>;
  constexpr int kKS = D / 16;  // k-steps of Q K^T; 16-dim column pairs of P V
  constexpr int kNT = D / 8;   // n-tiles of P V
  constexpr int kStages = L::kStages;
  constexpr int kSub = L::kTileKeys / kMmaKeyTile;  // 16-key steps per tile

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
  // This warp's 16-key steps of each tile: [slice * per, (slice + 1) * per).
  const int per = kSub / nslices;
  const int r0 = rg * 16 + gid, r1 = r0 + 8;
  const int pos0 = r0 < rows ? a.positions[item.token_begin + r0 / group] : -1;
  const int pos1 = r1 < rows ? a.positions[item.token_begin + r1 / group] : -1;

  // Q as A fragments in natural head-dim order: dims 16ks + 2tig + {0, 1}
  // (+ 8 for a2, a3) of rows r0 (a0, a2) and r1 (a1, a3).
  uint32_t qf[kKS][4];
  {
    auto q_row = [&](int r) -> const uint32_t* {
      if (r >= rows) return nullptr;
      const int64_t tok = item.token_begin + r / group;
      const int qh = kvh * group + r % group;
      return reinterpret_cast<const uint32_t*>(static_cast<const bf16*>(a.q) +
                                               tok * a.q_row_stride + static_cast<int64_t>(qh) * D);
    };
    const uint32_t* q0 = q_row(r0);
    const uint32_t* q1 = q_row(r1);
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      qf[ks][0] = q0 ? q0[8 * ks + tig] : 0u;
      qf[ks][1] = q1 ? q1[8 * ks + tig] : 0u;
      qf[ks][2] = q0 ? q0[8 * ks + 4 + tig] : 0u;
      qf[ks][3] = q1 ? q1[8 * ks + 4 + tig] : 0u;
    }
  }

  const int32_t* table = a.block_tables + static_cast<int64_t>(item.seq) * a.block_table_stride;
  const int bs = a.block_size;
  const int64_t slot_elems = static_cast<int64_t>(a.num_kv_heads) * D;
  const float scale = a.scale * 1.44269504088896341f;  // log2 e: base-2 scores
  const int warp_end = min(ke, __reduce_max_sync(0xffffffffu, max(pos0, pos1)) + 1);
  int unmasked_end = 0x7fffffff;
  if (r0 < rows) unmasked_end = pos0 + 1;
  if (r1 < rows) unmasked_end = min(unmasked_end, pos1 + 1);
  unmasked_end = min(ke, __reduce_min_sync(0xffffffffu, unmasked_end));

  // The block's tiles: t0 = kb + 64 i, i < ntiles.
  const int ntiles = (ke - kb + L::kTileKeys - 1) / L::kTileKeys;

  // Copies: whole 128-byte lines (KvLineCopy), the block's threads per tile.
  using Copy = KvLineCopy<D, kMmaAttnThreads, L::kTileKeys>;
  constexpr int kLpr = Copy::kLpr, kRowsPerThread = Copy::kRows;
  const int crow = threadIdx.x / kLpr, cpiece = threadIdx.x % kLpr;
  const int64_t lane_elem = static_cast<int64_t>(kvh) * D + cpiece * 8;
  const bf16* k_lane = static_cast<const bf16*>(a.k_cache) + lane_elem;
  const bf16* v_lane = static_cast<const bf16*>(a.v_cache) + lane_elem;
  const unsigned ring = static_cast<unsigned>(__cvta_generic_to_shared(mma_smem));
  const unsigned copy_dst = static_cast<unsigned>(crow * L::kPitch + cpiece * 16);
  struct RowSlots {
    int slot[kRowsPerThread];
  };
  auto lookup = [&](int i) -> RowSlots {
    RowSlots r{};
    if (i < ntiles) Copy::LookupSlots(table, bs, kb + i * L::kTileKeys + crow, ke, r.slot);
    return r;
  };
  // Starts tile i's copies into `stage` (an empty group past the last tile).
  // Keys past ke are zero-filled.
  auto issue = [&](int i, int stage, const RowSlots& p) {
    if (i < ntiles) {
      int64_t elem[kRowsPerThread];
#pragma unroll
      for (int k = 0; k < kRowsPerThread; ++k) elem[k] = static_cast<int64_t>(p.slot[k]) * slot_elems;
      Copy::template Issue<L::kPitch>(ring + static_cast<unsigned>(stage * L::kStageBytes) + copy_dst,
                                      L::kTileBytes, k_lane, v_lane, elem,
                                      kb + i * L::kTileKeys + crow, ke);
    }
    CpAsyncCommit();
  };
  // ldmatrix row addresses (lane i: matrix i / 8, row i % 8). K, for Q K^T's
  // B (k = dims, n = keys): (keys 0-7, dims 0-7), (keys 0-7, dims 8-15) = b0,
  // b1 of keys 0-7; (keys 8-15, ...) = b0, b1 of keys 8-15. V transposed, for
  // P V's B (k = keys, n = dims): (keys 0-7, dims 0-7), (keys 8-15, dims 0-7)
  // = b0, b1 of dims 0-7; then dims 8-15.
  const int mi = lane >> 3, ri = lane & 7;
  const unsigned k_ld = static_cast<unsigned>((8 * (mi >> 1) + ri) * L::kPitch + 16 * (mi & 1));
  const unsigned v_ld =
      static_cast<unsigned>((8 * (mi & 1) + ri) * L::kPitch + 16 * (mi >> 1)) + L::kTileBytes;

  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // o[j][e]: row (e < 2 ? r0 : r1), head dim 8j + 2tig + (e & 1).
  float o[kNT][4];
  ZeroFragments(o);

  // One step of `kU` 16-key sub-tiles starting at key t0 (sub-tile `sub` of
  // the stage at `tile`): S = Q K^T, masking, online softmax, O += P V.
  auto step = [&](auto u_count, unsigned tile, int t0, int sub) {
    constexpr int kU = decltype(u_count)::value;
    if (t0 >= warp_end) return;  // warp-uniform
    const unsigned kt = tile + static_cast<unsigned>(sub * kMmaKeyTile * L::kPitch);
    // S = Q K^T: s[u][nt][e] is row (e < 2 ? r0 : r1), key t0 + 16u + 8nt +
    // 2tig + (e & 1). One 16-key sub-tile: even and odd k-steps in separate
    // accumulators (two chains per n-tile); more: one chain per n-tile.
    constexpr int kChains = kU == 1 ? 2 : 1;
    float s[kU][2][4], so[2][4];  // so: the odd k-steps of a single sub-tile
#pragma unroll
    for (int u = 0; u < kU; ++u) ZeroFragments(s[u]);
    ZeroFragments(so);
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        uint32_t kb4[4];
        LdMatrixX4<false>(kb4,
                          kt + static_cast<unsigned>(u * kMmaKeyTile * L::kPitch) + k_ld + 32 * ks);
        float(&d0)[4] = (kChains == 2 && (ks & 1)) ? so[0] : s[u][0];
        float(&d1)[4] = (kChains == 2 && (ks & 1)) ? so[1] : s[u][1];
        MmaBf16(d0, qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], kb4[0], kb4[1]);
        MmaBf16(d1, qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], kb4[2], kb4[3]);
      }
    }
    if constexpr (kChains == 2) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[0][nt][e] += so[nt][e];
      }
    }
    if (t0 + kU * kMmaKeyTile > unmasked_end) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = t0 + u * kMmaKeyTile + nt * 8 + 2 * tig + (e & 1);
            const int pos = e < 2 ? pos0 : pos1;
            if (!(key <= pos && key < ke)) s[u][nt][e] = -INFINITY;
          }
        }
      }
    }
    // Row maxima over the quad (the 4 lanes of a row); lazy rescaling: the
    // reference max moves (and O, l are rescaled) only when some row sees a
    // score more than 2^8 above it, a warp-uniform branch.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      mx0 = fmaxf(mx0, fmaxf(fmaxf(s[u][0][0], s[u][0][1]), fmaxf(s[u][1][0], s[u][1][1])));
      mx1 = fmaxf(mx1, fmaxf(fmaxf(s[u][0][2], s[u][0][3]), fmaxf(s[u][1][2], s[u][1][3])));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    mx0 *= scale;
    mx1 *= scale;
    if (__any_sync(0xffffffffu, mx0 > m0 + kLazyLog2 || mx1 > m1 + kLazyLog2)) {
      const float2 al = MoveReferenceMaxima(mx0, mx1, m0, m1, l0, l1);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        o[j][0] *= al.x;
        o[j][1] *= al.x;
        o[j][2] *= al.y;
        o[j][3] *= al.y;
      }
    }
    const float ms0 = m0 == -INFINITY ? 0.f : -m0, ms1 = m1 == -INFINITY ? 0.f : -m1;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[u][nt][e] = Exp2Approx(fmaf(s[u][nt][e], scale, e < 2 ? ms0 : ms1));
        }
        l0 += s[u][nt][0] + s[u][nt][1];
        l1 += s[u][nt][2] + s[u][nt][3];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      // P as A (FlashAttention-2 register reuse), bf16.
      const uint32_t pa0 = PackBf16x2(s[u][0][0], s[u][0][1]),
                     pa1 = PackBf16x2(s[u][0][2], s[u][0][3]);
      const uint32_t pa2 = PackBf16x2(s[u][1][0], s[u][1][1]),
                     pa3 = PackBf16x2(s[u][1][2], s[u][1][3]);
      const unsigned vt = kt + static_cast<unsigned>(u * kMmaKeyTile * L::kPitch);
#pragma unroll
      for (int dp = 0; dp < kKS; ++dp) {
        uint32_t vb[4];
        LdMatrixX4<true>(vb, vt + v_ld + 32 * dp);
        MmaBf16(o[2 * dp], pa0, pa1, pa2, pa3, vb[0], vb[1]);
        MmaBf16(o[2 * dp + 1], pa0, pa1, pa2, pa3, vb[2], vb[3]);
      }
    }
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, i, lookup(i));
  RowSlots next_slots = lookup(kStages - 1);
  int stage = 0, fill_stage = kStages - 1;
  for (int i = 0; i < ntiles; ++i) {
    CpAsyncWait<kStages - 2>();  // this thread's copies of tile i have landed
    __syncthreads();             // everyone's; and tile i - 1's stage is read
    issue(i + kStages - 1, fill_stage, next_slots);
    next_slots = lookup(i + kStages);
    const unsigned tile = ring + static_cast<unsigned>(stage * L::kStageBytes);
    // This warp's share of the tile: per 16-key steps from sub0. A warp with
    // the whole tile (4 row groups: prefill) takes its 64 keys in one step
    // (8 independent Q K^T chains, one softmax pass); otherwise 16 at a time.
    const int sub0 = slice * per;
    if (per == kSub) {
      step(std::integral_constant<int, kSub>{}, tile, kb + i * L::kTileKeys + sub0 * kMmaKeyTile,
           sub0);
    } else {
      for (int sub = sub0; sub < sub0 + per; ++sub) {
        step(std::integral_constant<int, 1>{}, tile, kb + i * L::kTileKeys + sub * kMmaKeyTile,
             sub);
      }
    }
    fill_stage = stage;
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }

  CpAsyncWait<0>();
  __syncthreads();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const int srow = slice * nrg * 16;
  m0 *= 0.693147180559945309f;  // natural-log units for the merges
  m1 *= 0.693147180559945309f;
  auto store_row = [&](int r, float m, float l, int e0) {
    if (r >= rows) return;
    if (tig == 0) {
      wm_s[srow + r] = m;
      wl_s[srow + r] = l;
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      wacc_s[(srow + r) * D + 8 * j + 2 * tig] = o[j][e0];
      wacc_s[(srow + r) * D + 8 * j + 2 * tig + 1] = o[j][e0 + 1];
    }
  };
  store_row(r0, m0, l0, 0);
  store_row(r1, m1, l1, 2);
  __syncthreads();
  MergeSlicesAndStore<bf16, D>(a, item.token_begin, kvh, split, group, rows, nslices, nrg * 16,
                               wm_s, wl_s, wacc_s, merge_s);
}

template <int D>
__global__ void __launch_bounds__(kMmaAttnThreads, 2) MmaPrefillKernel(const PagedAttentionArgs a) {
  static_assert(D == 32 || D == 64 || D == 128, "head_dim");
  // Items in reverse: a prompt's later items have more keys (causal), and
  // starting the longest blocks first keeps the grid's tail short.
  const AttentionItem item = a.items[gridDim.x - 1 - blockIdx.x];
  const int kvh = blockIdx.y;
  ForEachBlockSplit(a, item, [&](int split, int kb, int ke, bool) {
    MmaPrefillSplit<D>(a, item, kvh, split, kb, ke);
  });
}

template <int D>
absl::Status LaunchMmaPrefillT(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int item_rows = a.max_item_tokens * (a.num_q_heads / a.num_kv_heads);
  if (item_rows > kMmaAttnMaxRows) {
    // Items of 65-128 rows (head dim 128): the wgmma kernel takes the launch.
    if constexpr (D == 128) {
      return LaunchWgmmaPrefillBF16(a, stream);
    } else {
      return absl::InvalidArgumentError(absl::StrFormat(
          "PagedAttention (tensor-core prefill): %d query rows per item need head dim 128 (head "
          "dim %d)",
          item_rows, D));
    }
  }
  const int zgrid = a.split_grid > 0 ? std::min(a.split_grid, a.num_splits) : a.num_splits;
  const dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(zgrid));
  constexpr size_t kSmem = MmaPrefillLayout<D>::kSmemBytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      MmaPrefillKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  CUDA_RETURN_IF_ERROR(attr);
  MmaPrefillKernel<D><<<grid, kMmaAttnThreads, kSmem, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace symtp::kernels::internal

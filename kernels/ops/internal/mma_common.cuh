// What the tensor-core attention kernels share (bf16, mma.sync.m16n8k16 with
// fp32 accumulators): MmaDecodeKernel (mma_decode_kernel.cuh) for launches
// with at most 8 query rows per item and kv head, MmaPrefillKernel
// (mma_prefill_kernel.cuh) for the others; mma_attention_bf16.cu dispatches.
//
// Both keep the tiled kernel's work split and outputs (attention_kernel.cuh):
// a block = (item, kv head, split), rows r = (token i of the item, q head g of
// the group), R = num_tokens * G <= 64, split-K partials in the same
// workspace layout so MergeSplitsKernel is shared; the online softmax runs in
// fp32 registers in base-2 units (ex2.approx), O and l rescaled lazily (only
// when a row's max grows by more than 2^8), and P enters the P V products as
// a bf16 term plus its bf16 residual (~16 significant bits).
//
// Fragments (PTX ISA, mma.m16n8k16 .bf16; lane = 4 * gid + tig):
//   A 16x16: {a0,a1} = (row gid, cols 2tig..+1), {a2,a3} = (row gid+8, same),
//            {a4,a5} = (row gid, cols 2tig+8..+9), {a6,a7} = (row gid+8, same)
//   B 16x8:  {b0,b1} = (rows 2tig..+1, col gid), {b2,b3} = (rows 2tig+8..+9)
//   C 16x8:  c0,c1 = (row gid, cols 2tig..+1), c2,c3 = (row gid+8, same)
//
// K/V reach shared memory as whole 128-byte lines (KvLineCopy) into tiles the
// warp (decode) or the block (prefill) shares, and fragments are read from
// there with ldmatrix: lanes that copied only the 16- and 32-byte pieces of
// their own fragments made L2 serve a request per piece (45-69% of the copy
// bandwidth at decode against 61-95% with line copies).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
// decode kernel, the others the prefill kernel.
constexpr int kMmaDecodeRows = 8;

// Calls launch(std::integral_constant<int, D>{}) for the head dims the kernels
// are built for (32, 64, 128); InvalidArgument for any other.
template <typename Launch>
absl::Status DispatchMmaHeadDim(int head_dim, Launch&& launch) {
  switch (head_dim) {
    case 32:
      return launch(std::integral_constant<int, 32>{});
    case 64:
      return launch(std::integral_constant<int, 64>{});
    case 128:
      return launch(std::integral_constant<int, 128>{});
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", head_dim));
  }
}

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

// Lazy rescaling (see the header): a row's reference max moves only when
// some score of the warp is more than 2^kLazyLog2 above it.
constexpr float kLazyLog2 = 8.f;

// Moves two rows' reference maxima m0, m1 to max(m, mx) and rescales their
// sums l0, l1; returns the factors (x: row 0, y: row 1) the caller applies to
// its O accumulators (1 for a row with no finite max yet).
__device__ __forceinline__ float2 MoveReferenceMaxima(float mx0, float mx1, float& m0, float& m1,
                                                      float& l0, float& l1) {
  const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
  const float2 al = make_float2(mn0 == -INFINITY ? 1.f : Exp2Approx(m0 - mn0),
                                mn1 == -INFINITY ? 1.f : Exp2Approx(m1 - mn1));
  m0 = mn0;
  m1 = mn1;
  l0 *= al.x;
  l1 *= al.y;
  return al;
}

// A score's weight 2^(s - m) against its row's reference max (0 while the
// row has none).
__device__ __forceinline__ float Exp2Below(float s, float m) {
  return m == -INFINITY ? 0.f : Exp2Approx(s - m);
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Zeroes an array of mma.m16n8k16 accumulator fragments.
template <int N>
__device__ __forceinline__ void ZeroFragments(float (&f)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) f[i][e] = 0.f;
  }
}

// Asynchronous global -> shared copy of 16 bytes to a shared-memory address,
// L2 only (each byte is read once); with `valid` false the destination is
// zero-filled and nothing is read. The 256-byte L2 prefetch hint lets a miss
// fetch a whole bf16 head-dim-128 key or value row at once, since the copies
// read every byte of it (measured: bench/results/h100x2/kv_prefetch_hint/).
__device__ __forceinline__ void CpAsync16Shared(unsigned dst, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// How kThreads threads (a warp for the decode kernel, the block for the
// prefill kernel) copy a tile of kTileRows K and V rows of head dim D into
// shared memory with cp.async: every instruction copies whole 128-byte lines,
// kLpr threads per row and kRpi rows at a time; thread t copies the 16-byte
// pieces t % kLpr + kLpr h (h < kPieces) of the tile's rows t / kLpr + kRpi k
// (k < kRows). (Two threads per row, one 32-byte sector each of 16 rows per
// instruction, makes L2 serve 4x the requests.)
template <int D, int kThreads, int kTileRows>
struct KvLineCopy {
  static constexpr int kLpr = D / 8 < 8 ? D / 8 : 8;
  static constexpr int kRpi = kThreads / kLpr;
  static constexpr int kRows = kTileRows / kRpi;
  static constexpr int kPieces = D / 8 / kLpr;
  static_assert(kRows * kRpi == kTileRows && kPieces * kLpr * 8 == D);

  // Cache slots of the thread's rows, keys key0 + kRpi k (key0: the tile's
  // first key + t / kLpr); 0 for keys >= end (their copies are zero-filled).
  __device__ static __forceinline__ void LookupSlots(const int32_t* table, int bs, int key0,
                                                     int end, int (&slot)[kRows]) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int key = key0 + kRpi * k;
      slot[k] = key < end ? table[key / bs] * bs + key % bs : 0;
    }
  }

  // Starts the copies of the thread's rows: row k's K pieces from k_lane +
  // elem[k] to dst + k kRpi kPitch, its V pieces from v_lane + elem[k] to
  // the same place + v_offset; rows with key0 + kRpi k >= end are zero-filled
  // (nothing read).
  template <int kPitch>
  __device__ static __forceinline__ void Issue(unsigned dst, unsigned v_offset, const bf16* k_lane,
                                               const bf16* v_lane, const int64_t (&elem)[kRows],
                                               int key0, int end) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const bool ok = key0 + kRpi * k < end;
      const unsigned d = dst + static_cast<unsigned>(k * kRpi * kPitch);
#pragma unroll
      for (int h = 0; h < kPieces; ++h) {
        CpAsync16Shared(d + h * kLpr * 16, k_lane + elem[k] + h * kLpr * 8, ok);
        CpAsync16Shared(d + v_offset + h * kLpr * 16, v_lane + elem[k] + h * kLpr * 8, ok);
      }
    }
  }
};

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

}  // namespace symtp::kernels::internal

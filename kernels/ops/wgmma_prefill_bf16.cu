// The prefill attention kernel for items of more than 64 query rows at bf16
// head dim 128 (what prefill cuts at that head dim: 128 rows an item,
// MaxAttentionItemTokens), on Hopper's warpgroup MMA (wgmma, sm_90a; its own
// compile unit). FlashAttention-3's layout without its producer warp:
//   - a block = (item, kv head): two warpgroups of 4 warps, each owning 64 of
//     the item's 128 rows (row r = token r / group, q head r % group of the
//     kv head's group) over all of the item's keys;
//   - Q and each 64-key tile of K and V sit in shared memory in the 128-byte
//     swizzled layout wgmma's descriptors read (a 64 x 128 matrix as two
//     64 x 64 halves of 128-byte rows, 16-byte chunk c of row r at chunk
//     c ^ (r % 8)), copied there by every thread's 16-byte cp.async through a
//     ring of kStages tiles, one block barrier per tile;
//   - S = Q K^T as m64n64k16 from two shared-memory descriptors (K-major);
//     O += P V as m64n128k16 with P in registers (S's accumulators as bf16
//     pairs are wgmma's A fragments) and V's tile read N-major (transposed);
//   - per warpgroup the products of consecutive tiles overlap the softmax:
//     tile t's S is issued, then tile t - 1's P V, and the softmax of tile t
//     runs while that P V is still in flight (O's rescale waits for it);
//   - the online softmax in base-2 units with lazy rescaling, as the mma.sync
//     kernels (mma_common.cuh); rows normalized and stored from registers.
// Blocks take the items longest first (the launch's last item first).
#include "kernels/ops/internal/mma_common.cuh"
#include "kernels/ops/internal/tma.cuh"

namespace symtp::kernels::internal {
namespace {

constexpr int kWgThreads = 256;             // two warpgroups
constexpr int kD = 128;                     // head dim
constexpr int kTileKeys = 64;               // keys per tile
constexpr int kHalfBytes = 64 * 128;        // 64 rows x 64 bf16
constexpr int kMatBytes = 2 * kHalfBytes;   // 64 rows x 128 bf16
constexpr int kQBytes = 2 * kMatBytes;      // 128 rows of Q
constexpr int kStageBytes = 2 * kMatBytes;  // one tile of K and of V
constexpr int kStages = 4;
// Tiles copied ahead: a stage holds tile t's K (S), one holds tile t - 1's
// V (the P V in flight), the rest are in flight.
constexpr int kAhead = kStages - 2;
constexpr size_t kSmemBytes = kQBytes + static_cast<size_t>(kStages) * kStageBytes + 1024;

static_assert(kMmaPrefillWideRows == 128, "two warpgroups of 64 rows");

// Byte offset of 16-byte chunk p (0..15) of row r (0..63) of a 64 x 128
// matrix in the swizzled layout.
__device__ __forceinline__ unsigned Swizzled(int r, int p) {
  return static_cast<unsigned>((p >> 3) * kHalfBytes + r * 128 + (((p & 7) ^ (r & 7)) << 4));
}

// Shared-memory matrix descriptor with 128-byte swizzle (the layout above,
// 1024-byte aligned): lbo / sbo in bytes. K-major (Q, K): 8-row groups sbo =
// 1024 apart, lbo unused; the start may step by 32 bytes (16 elements) inside
// a row. N-major (V read transposed): 64-column halves lbo = 8192 apart,
// 8-key groups sbo = 1024 apart.
__device__ __forceinline__ uint64_t SmemDesc(unsigned addr, unsigned lbo, unsigned sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulators across a
// wgmma issue or wait.
template <int N>
__device__ __forceinline__ void FenceOperands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A(64x16) B(16x64): A, B K-major descriptors; accumulate = 0 starts
// from zero. d[4j + 2i + c]: row 16 (warp % 4) + lane / 4 + 8i, column 8j +
// 2 (lane % 4) + c.
__device__ __forceinline__ void WgmmaQK(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

// d += A(64x16) B(16x128): A from registers (mma.m16n8k16's A fragment of
// the warp's 16 rows), B an N-major descriptor (transposed read).
__device__ __forceinline__ void WgmmaPV(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

__global__ void __launch_bounds__(kWgThreads, 1) WgmmaPrefillKernel(const PagedAttentionArgs a) {
  extern __shared__ unsigned char wgmma_smem[];
  const unsigned q_s =
      (static_cast<unsigned>(__cvta_generic_to_shared(wgmma_smem)) + 1023u) & ~1023u;
  const unsigned ring = q_s + kQBytes;

  const AttentionItem item = a.items[gridDim.x - 1 - blockIdx.x];
  const int kvh = blockIdx.y;
  const int group = a.num_q_heads / a.num_kv_heads;
  const int rows = item.num_tokens * group;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;  // warpgroup: rows [64 wg, 64 wg + 64)
  const int gid = lane >> 2, tig = lane & 3;

  // Q's 128 rows (zeros past `rows`), in the first copy group.
  {
    const bf16* q = static_cast<const bf16*>(a.q);
    for (int idx = tid; idx < 128 * 16; idx += kWgThreads) {
      const int r = idx >> 4, p = idx & 15;
      const bool ok = r < rows;
      const bf16* src = q;
      if (ok) {
        src += (item.token_begin + r / group) * a.q_row_stride +
               static_cast<int64_t>(kvh * group + r % group) * kD + p * 8;
      }
      CpAsync16Shared(q_s + static_cast<unsigned>((r >> 6) * kMatBytes) + Swizzled(r & 63, p), src,
                      ok);
    }
  }

  // Keys: the block's [0, ke) (ke = the item's last position + 1), the
  // warpgroup's [0, wg_end) with every key below wg_unmasked unmasked for
  // all of its rows.
  int ke, wg_end, wg_unmasked;
  {
    int mx = -1;
    for (int i = lane; i < item.num_tokens; i += 32)
      mx = max(mx, a.positions[item.token_begin + i]);
    ke = __reduce_max_sync(0xffffffffu, mx) + 1;
    const int t_lo = 64 * wg / group;
    const int t_hi = min(item.num_tokens, (64 * wg + 63) / group + 1);
    int wmx = -1, wmn = 0x7fffffff;  // no rows: no tiles
    for (int t = t_lo + lane; t < t_hi; t += 32) {
      const int pos = a.positions[item.token_begin + t];
      wmx = max(wmx, pos);
      wmn = min(wmn, pos);
    }
    wg_end = __reduce_max_sync(0xffffffffu, wmx) + 1;
    wmn = __reduce_min_sync(0xffffffffu, wmn);
    wg_unmasked = wmn == 0x7fffffff ? 0 : wmn + 1;
  }
  // This thread's rows: 64 wg + 16 (warp % 4) + gid + 8i; position -1 past
  // the item (masked or not, such rows are never stored).
  int pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 64 * wg + 16 * (warp & 3) + gid + 8 * i;
    pos[i] = r < rows ? a.positions[item.token_begin + r / group] : -1;
  }

  const int ntiles = (ke + kTileKeys - 1) / kTileKeys;
  const int wg_tiles = (wg_end + kTileKeys - 1) / kTileKeys;

  // Copies: thread t takes 16-byte chunks t % 8 and t % 8 + 8 of tile rows
  // t / 8 and t / 8 + 32 (each instruction of a warp: four whole 128-byte
  // lines).
  const int crow = tid >> 3, cchunk = tid & 7;
  const int32_t* table = a.block_tables + static_cast<int64_t>(item.seq) * a.block_table_stride;
  const int bs = a.block_size;
  const int64_t slot_elems = static_cast<int64_t>(a.num_kv_heads) * kD;
  const bf16* k_lane =
      static_cast<const bf16*>(a.k_cache) + static_cast<int64_t>(kvh) * kD + cchunk * 8;
  const bf16* v_lane =
      static_cast<const bf16*>(a.v_cache) + static_cast<int64_t>(kvh) * kD + cchunk * 8;
  auto issue = [&](int t) {
    if (t < ntiles) {
      const unsigned stage = ring + static_cast<unsigned>((t % kStages) * kStageBytes);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int row = crow + 32 * k, key = t * kTileKeys + row;
        const bool ok = key < ke;
        const int64_t elem =
            ok ? static_cast<int64_t>(table[key / bs] * bs + key % bs) * slot_elems : 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned off = Swizzled(row, cchunk + 8 * h);
          CpAsync16Shared(stage + off, k_lane + elem + h * 64, ok);
          CpAsync16Shared(stage + kMatBytes + off, v_lane + elem + h * 64, ok);
        }
      }
    }
    CpAsyncCommit();
  };

  const float scale = a.scale * 1.44269504088896341f;  // log2 e: base-2 scores
  const unsigned q_w = q_s + static_cast<unsigned>(wg * kMatBytes);
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float s[32];
  uint32_t p[4][4];  // P of the tile whose P V is next: k-step kk's A fragment
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float alpha[2] = {1.f, 1.f};

  auto issue_qk = [&](int t) {
    const unsigned kt = ring + static_cast<unsigned>((t % kStages) * kStageBytes);
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const unsigned off = static_cast<unsigned>((ks >> 2) * kHalfBytes + (ks & 3) * 32);
      WgmmaQK(s, SmemDesc(q_w + off, 16, 1024), SmemDesc(kt + off, 16, 1024), ks > 0);
    }
  };
  auto issue_pv = [&](int t) {
    const unsigned vt = ring + static_cast<unsigned>((t % kStages) * kStageBytes + kMatBytes);
#pragma unroll
    for (int kk = 0; kk < kTileKeys / 16; ++kk) {
      WgmmaPV(o, p[kk], SmemDesc(vt + static_cast<unsigned>(kk * 16 * 128), 8192, 1024));
    }
  };
  // Tile t's softmax on s (complete): masks, moves the reference maxima
  // (alpha: the factor O's earlier terms take), P = 2^(s scale - m) into s,
  // sums into l.
  auto softmax = [&](int t) {
    const int t0 = t * kTileKeys;
    if (t0 + kTileKeys > wg_unmasked) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = t0 + 8 * j + 2 * tig + (e & 1);
          if (key > pos[e >> 1]) s[4 * j + e] = -INFINITY;
        }
      }
    }
    float mx[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float v = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) v = fmaxf(v, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
      mx[i] = v * scale;
    }
    if (__any_sync(0xffffffffu, mx[0] > m[0] + kLazyLog2 || mx[1] > m[1] + kLazyLog2)) {
      const float2 al = MoveReferenceMaxima(mx[0], mx[1], m[0], m[1], l[0], l[1]);
      alpha[0] *= al.x;
      alpha[1] *= al.y;
    }
    const float ms0 = m[0] == -INFINITY ? 0.f : -m[0];
    const float ms1 = m[1] == -INFINITY ? 0.f : -m[1];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[4 * j + e] = Exp2Approx(fmaf(s[4 * j + e], scale, e < 2 ? ms0 : ms1));
      l[0] += s[4 * j] + s[4 * j + 1];
      l[1] += s[4 * j + 2] + s[4 * j + 3];
    }
  };
  // P into p (after the P V that reads p has completed).
  auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      p[kk][0] = PackBf16x2(s[8 * kk], s[8 * kk + 1]);
      p[kk][1] = PackBf16x2(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = PackBf16x2(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = PackBf16x2(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  auto rescale = [&]() {
    if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
      alpha[0] = alpha[1] = 1.f;
    }
  };

  // Copy groups: Q with tile 0, then one per tile (empty past the last).
#pragma unroll
  for (int t = 0; t < kAhead; ++t) issue(t);
  for (int t = 0; t < ntiles; ++t) {
    CpAsyncWait<kAhead - 1>();  // this thread's copies of tile t (and Q) have landed
    FenceProxyAsyncShared();    // ... visible to wgmma's reads
    __syncthreads();            // everyone's; tile t - 2's stage is no longer read
    issue(t + kAhead);
    if (t < wg_tiles) {  // warpgroup-uniform
      WgmmaFence();
      issue_qk(t);
      WgmmaCommit();
      if (t > 0) {
        issue_pv(t - 1);
        WgmmaCommit();
        WgmmaWait<1>();  // S of tile t
      } else {
        WgmmaWait<0>();
      }
      FenceOperands(s);
      softmax(t);
      WgmmaWait<0>();  // tile t - 1's P V: p and o are free
      FenceOperands(o);
      rescale();
      pack_p();
    } else if (t == wg_tiles && t > 0) {  // the last P V (a warpgroup without rows has none)
      WgmmaFence();
      issue_pv(t - 1);
      WgmmaCommit();
      WgmmaWait<0>();
      FenceOperands(o);
    }
  }
  if (wg_tiles == ntiles && ntiles > 0) {
    WgmmaFence();
    issue_pv(ntiles - 1);
    WgmmaCommit();
    WgmmaWait<0>();
    FenceOperands(o);
  }
  CpAsyncWait<0>();

  // Each thread's rows, normalized, as bf16 pairs.
  const int64_t out_ld = static_cast<int64_t>(a.num_q_heads) * kD;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    const int r = 64 * wg + 16 * (warp & 3) + gid + 8 * i;
    if (r >= rows) continue;
    const float inv = li > 0.f ? 1.f / li : 0.f;
    bf16* dst = static_cast<bf16*>(a.out) + (item.token_begin + r / group) * out_ld +
                static_cast<int64_t>(kvh * group + r % group) * kD + 2 * tig;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<uint32_t*>(dst + 8 * j) =
          PackBf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
    }
  }
}

}  // namespace

absl::Status LaunchWgmmaPrefillBF16(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int item_rows = a.max_item_tokens * (a.num_q_heads / a.num_kv_heads);
  if (a.head_dim != kD || a.num_splits != 1 || item_rows > kMmaPrefillWideRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention (wgmma prefill): needs head dim 128, one split and at most %d query rows "
        "per item (head dim %d, %d splits, %d rows)",
        kMmaPrefillWideRows, a.head_dim, a.num_splits, item_rows));
  }
  static const cudaError_t attr =
      cudaFuncSetAttribute(WgmmaPrefillKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSmemBytes));
  CUDA_RETURN_IF_ERROR(attr);
  const dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.num_kv_heads));
  WgmmaPrefillKernel<<<grid, kWgThreads, kSmemBytes, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace symtp::kernels::internal

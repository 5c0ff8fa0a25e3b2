// A Hopper (sm_90a) bf16 GEMM for decode-sized products:
//
//   C[M, N] = A[M, K] · W[N, K]ᵀ      bf16 in, fp32 accumulate, bf16 out
//
// The idea: at M = 128-256 tokens and N of a few thousand, cuBLASLt's kernels
// make 24-64 output tiles for 132 SMs and re-read A once per 64-column tile
// (run w: llama-8b wo M=256 at 51% of the bf16 rate). Here a CTA owns a
// BM x 128 tile (BM = 128 or 256: all of a decode batch, so W is streamed
// from HBM once) and the K loop is split across the CTAs of a thread-block
// cluster (Sm90GemmPlan::splits <= 8) or of a cooperative launch, whose fp32
// partials are summed in a fixed order, so results are deterministic.
//
// Measured (H200, bench/results/h200-2026-11-23 runs aa-ap): correct on every
// plan, but slower than cuBLASLt on the short decode GEMMs it was written for
// (llama-8b wo, M = 256, per call in a CUDA graph: 18.7-19.5 us, best plan,
// vs 17.2-18.0), so it is opt-in (GemmKernelChoice::kSm90). Where its time
// goes (Sm90GemmProbe per-CTA timelines, run ao): the K loop is not the
// problem: a 256 x 128 tile's K step runs at the SM's tensor peak (~600 ns
// at ~1.75 GHz; ~650-700 ns once 96+ CTAs load), a 128-row tile's at ~78%,
// and switching A or W loads off changes nothing. What costs is around it:
// ~1.5-2.5 us until the first stage lands, and 4.5 us (128-row tiles, 2
// splits) to 8 us (256 rows, 2-5 splits) of split-K epilogue: moving the
// partials between SMs, summing, storing; three designs of it (rows summed
// from remote loads; owners adding into registers; owners summing pushed or
// bulk-copied chunks in shared memory: the current one) measured alike (runs
// am-ao), near the rate the device moves partials at. So a tile big enough
// for the tensor peak leaves too few tiles, and splitting K to fill the SMs
// costs about what it gains. Earlier: clusters of 3+ CTAs do not all fit at
// once (the device runs 39 / 30 / 22 clusters of 3 / 4 / 5); a multicast of
// A to N-tile pairs was slower (run ai).
//
// Structure (one CTA, 384 threads = 3 warpgroups):
//   warpgroup 0, one thread: producer. TMA (cp.async.bulk.tensor, 128-byte
//     swizzle) loads the A and W tiles of each 64-wide K step into a ring of
//     kStages shared-memory stages; mbarriers full[s] (TMA bytes landed) and
//     empty[s] (all 256 consumer threads done with the stage).
//   warpgroups 1-2: consumers. Each owns BM/2 rows of the tile and issues
//     wgmma.m64n128k16 (A and W from shared memory through descriptors),
//     keeping one K step's products in flight while it releases the stage
//     before.
//   epilogue: the output is staged as bf16 in shared memory and written with
//     16-byte stores. splits > 1: split r owns a range of the tile's columns;
//     the other splits' accumulator chunks reach it (cluster mode: stored
//     into its shared memory with st.shared::cluster between two cluster
//     barriers; global mode, Sm90GemmParams::partials: through the workspace,
//     pulled with bulk copies once the tile's counter shows every split in),
//     and it sums them in rank order. See the comment at the split-K code.
//
// wgmma m64nNk16 accumulator layout (fp32), thread t of the warpgroup, warp
// w = t / 32, lane l: d[4 j + 2 i + c] = D[16 w + l / 4 + 8 i][8 j + 2 (l % 4) + c].
//
// Every mbarrier wait has a deadline (kWaitTimeoutCycles): a lost TMA transfer
// traps (a launch error the caller sees) instead of hanging the stream.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/ops/gemm_sm90.h"

namespace symtp::kernels::sm90 {

inline constexpr int kBN = 128;       // W rows (output columns) per tile
inline constexpr int kBK = 64;        // K per stage: one 128-byte swizzle row of bf16
inline constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
// bf16 per staged output row holding `chunks` 8-column chunks: an odd number
// of 16-byte units, so the 8 rows of a fragment store hit distinct banks.
constexpr int StagePitch(int chunks) { return 8 * (chunks % 2 == 0 ? chunks + 1 : chunks + 2); }
inline constexpr long long kWaitTimeoutCycles = 4'000'000'000;  // ~2 s at 2 GHz

// kMSub: m64 row blocks per consumer warpgroup (1: BM = 128, 2: BM = 256).
template <int kMSub>
struct TileShape {
  static constexpr int kBM = 128 * kMSub;
  static constexpr int kStages = kMSub == 2 ? 4 : 6;
  static constexpr int kABytes = kBM * kBK * 2;
  static constexpr int kWBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kWBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // After the K loop (see the kernel's split-K comment): every split's
  // chunks of the columns this CTA owns, then its staged bf16 output.
  static constexpr int OwnedChunks(int splits) { return (16 + splits - 1) / splits; }
  static constexpr int RecvBytes(int splits) {
    return splits == 1 ? 0 : splits * kMSub * OwnedChunks(splits) * 256 * 16;
  }
  static constexpr int MaxEpilogueBytes() {
    int most = 0;
    for (int s = 1; s <= 8; ++s) {
      const int bytes = RecvBytes(s) + kBM * StagePitch(OwnedChunks(s)) * 2;
      most = bytes > most ? bytes : most;
    }
    return most;
  }
  static constexpr int kDataBytes = kRingBytes > MaxEpilogueBytes() ? kRingBytes
                                                                    : MaxEpilogueBytes();
  // + full/empty barriers, the reduction's barrier, slack to align the ring
  // to 1024 bytes (swizzle atom).
  static constexpr int kSmemBytes = kDataBytes + (2 * kStages + 1) * 8 + 1024;
  static_assert(kABytes % 1024 == 0 && kWBytes % 1024 == 0);
  static_assert(kSmemBytes <= 227 * 1024);
};

struct Sm90GemmParams {
  __nv_bfloat16* c = nullptr;
  int64_t ldc = 0;
  int m = 0, n = 0;
  int k_tiles = 0;  // ceil(K / kBK); split r runs [r k_tiles / splits, (r+1) k_tiles / splits)
  // Global split-K (cooperative launch, no cluster): split r of tile t writes
  // its fp32 partial to partials[(t splits + r) BM kBN], arrives on
  // counters[2 t], waits for the tile's other splits, sums its share of rows
  // and arrives on counters[2 t + 1]; the tile's last CTA zeroes both.
  float* partials = nullptr;
  unsigned int* counters = nullptr;
  // Diagnostics only (Sm90GemmProbe, kernels_bench --sections sm90probe).
  int probe = 0;
  unsigned long long* stamps = nullptr;
};

namespace detail {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Polls `done()` until it returns true; reads the SM clock every 1024 polls
// and traps after kWaitTimeoutCycles, so a lost transfer or a missing peer is
// a launch error, not a hang. (Reading %globaltimer on the first miss of every
// wait, in the first version, sat on the path of every K step.)
template <typename Poll>
__device__ __forceinline__ void SpinUntil(Poll&& done) {
  long long start = 0;
  for (uint32_t spin = 1;; ++spin) {
    if (done()) return;
    if ((spin & 1023) == 0) {
      const long long now = clock64();
      if (start == 0) {
        start = now;
      } else if (now - start > kWaitTimeoutCycles) {
        __trap();
      }
    }
  }
}

// Waits for the phase of parity `parity` of `bar` to complete.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  SpinUntil([&] {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
  });
}

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Diagnostic stamps of a probed launch (Probe: Sm90GemmProbe or
// StreamKGemmProbe, whose slots share these names): %globaltimer, clock64
// and the SM id at the start; clock64, then %globaltimer at the end.
template <typename Probe>
__device__ __forceinline__ void StampStart(unsigned long long* stamp) {
  stamp[Probe::kGlobalStart] = GlobalTimer();
  stamp[Probe::kClockStart] = clock64();
  uint32_t sm;
  asm volatile("mov.u32 %0, %smid;" : "=r"(sm));
  stamp[Probe::kSm] = sm;
}

template <typename Probe>
__device__ __forceinline__ void StampEnd(unsigned long long* stamp) {
  stamp[Probe::kClockEnd] = clock64();
  stamp[Probe::kGlobalEnd] = GlobalTimer();
}

__device__ __forceinline__ uint64_t L2Policy(bool evict_first) {
  uint64_t p;
  if (evict_first) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  }
  return p;
}

// TMA: the box at (c0 = K element, c1 = row) of `map` into shared `dst`,
// completing bytes on `bar`.
__device__ __forceinline__ void TmaLoad2D(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                          int c0, int c1, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}

// Shared-memory matrix descriptor: K-major tile, rows of 128 bytes, 128-byte
// swizzle, 8-row groups 1024 bytes apart. `addr` may step by 32 bytes (16 bf16)
// inside a row: the swizzle is a function of the address bits.
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;           // leading byte offset (unused here)
  d |= static_cast<uint64_t>(1024 >> 4) << 32;   // stride byte offset
  d |= static_cast<uint64_t>(1) << 62;           // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d += A(64x16) · B(128x16)ᵀ, both K-major in shared memory (descriptors);
// 64 fp32 accumulators per thread (layout: see the header comment).
__device__ __forceinline__ void WgmmaM64N128K16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}

// Row (in the tile) of the first value of accumulator chunk j of m64 block h
// of consumer thread ct (0-255): float4 {acc[h][4j..4j+3]} holds D[row][col],
// D[row][col + 1], D[row + 8][col], D[row + 8][col + 1], col = 8 j + 2 (ct % 4).
template <int kMSub>
__device__ __forceinline__ int ChunkRow(int h, int ct) {
  return (ct / 128) * 64 * kMSub + h * 64 + ((ct % 128) / 32) * 16 + (ct % 32) / 4;
}

// Puts one accumulator chunk (see ChunkRow) into the staged bf16 tile.
__device__ __forceinline__ void ToStaging(__nv_bfloat16* staging, int pitch, int row, int col,
                                          float4 v) {
  *reinterpret_cast<__nv_bfloat162*>(staging + row * pitch + col) = __floats2bfloat162_rn(v.x, v.y);
  *reinterpret_cast<__nv_bfloat162*>(staging + (row + 8) * pitch + col) =
      __floats2bfloat162_rn(v.z, v.w);
}

// Bulk copy (TMA engine) of `bytes` from global `src` into shared `dst`,
// completing on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

// Every thread of every CTA of the cluster; orders shared-memory writes before
// it with reads (local or remote) after it.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
// Not volatile and no memory clobber: the loads of one output chunk from
// every rank may be in flight together (ClusterSync orders them).
__device__ __forceinline__ void StoreRemote4(uint32_t local_addr, uint32_t rank, float4 v) {
  uint32_t remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_addr), "r"(rank));
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

}  // namespace detail

// Grid: x = split (cluster mode: the cluster, dims (splits, 1, 1); global
// mode: a cooperative launch), y = M tile, z = N tile (consecutive CTAs share
// a W tile). Dynamic shared memory
// TileShape<kMSub>::kSmemBytes.
template <int kMSub>
__global__ void __launch_bounds__(kThreads, 1)
    Sm90GemmKernel(const __grid_constant__ CUtensorMap map_a,
                   const __grid_constant__ CUtensorMap map_w, const Sm90GemmParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // built for sm_90a only; the host never launches it elsewhere
#else
  using T = TileShape<kMSub>;
  using namespace detail;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  uint8_t* const smem = smem_raw + (base - raw);
  const uint32_t bars = base + T::kDataBytes;  // full[kStages], then empty[kStages]
  const auto full = [&](int s) { return bars + 8 * s; };
  const auto empty = [&](int s) { return bars + 8 * (T::kStages + s); };
  const uint32_t reduce_bar = bars + 8 * 2 * T::kStages;  // global split-K's bulk copies
  const auto a_tile = [&](int s) { return base + s * T::kStageBytes; };
  const auto w_tile = [&](int s) { return base + s * T::kStageBytes + T::kABytes; };

  const int wg = threadIdx.x / 128;
  // Split r of `splits` (grid x); in cluster mode also the CTA's cluster rank.
  const uint32_t rank = blockIdx.x, splits = gridDim.x;
  const bool global_reduce = p.partials != nullptr;
  const int kt0 = static_cast<int>(rank * p.k_tiles / splits);
  const int kt1 = static_cast<int>((rank + 1) * p.k_tiles / splits);
  const int iters = kt1 - kt0;
  const int m0 = blockIdx.y * T::kBM, n0 = blockIdx.z * kBN;
  // Diagnostics (Sm90GemmParams::stamps / probe): consumer thread 0 stamps.
  using Probe = ::symtp::kernels::Sm90GemmProbe;
  unsigned long long* const stamp =
      p.stamps != nullptr && threadIdx.x == 128
          ? p.stamps +
                Probe::kSlots * (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))
          : nullptr;
  const auto mark = [&](int slot) {
    if (stamp != nullptr) stamp[slot] = clock64();
  };
  if (stamp != nullptr) {
    StampStart<Probe>(stamp);
    stamp[Probe::kIters] = static_cast<unsigned long long>(iters);
  }
  const auto finish = [&] {
    if (stamp != nullptr) StampEnd<Probe>(stamp);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), 256);  // every consumer thread, after its own wgmma wait
    }
    MbarInit(reduce_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
  }
  __syncthreads();

  float acc[kMSub][64];  // the consumers' accumulators (unused by the producer warpgroup)
  if (wg == 0) {
    if (threadIdx.x == 0) {
      // W is streamed once: evict it first; A (the activations) is re-read by
      // every N tile: keep it.
      const uint64_t keep = L2Policy(false), stream = L2Policy(true);
      for (int it = 0; it < iters; ++it) {
        const int s = it % T::kStages;
        const uint32_t phase = (it / T::kStages) & 1;
        MbarWait(empty(s), phase ^ 1);
        const bool load_a = it < T::kStages || (p.probe & Probe::kSkipA) == 0;
        const bool load_w = it < T::kStages || (p.probe & Probe::kSkipW) == 0;
        MbarExpectTx(full(s), (load_a ? T::kABytes : 0) + (load_w ? T::kWBytes : 0));
        const int k = (kt0 + it) * kBK;
        if (load_a) TmaLoad2D(a_tile(s), &map_a, full(s), k, m0, keep);
        if (load_w) TmaLoad2D(w_tile(s), &map_w, full(s), k, n0, stream);
      }
    }
    __syncwarp();
  } else {
    const int cw = wg - 1;  // consumer warpgroup: rows [cw BM/2, (cw+1) BM/2) of the tile
#pragma unroll
    for (int h = 0; h < kMSub; ++h) {
#pragma unroll
      for (int r = 0; r < 64; ++r) acc[h][r] = 0.f;
    }
    for (int it = 0; it < iters; ++it) {
      const int s = it % T::kStages;
      MbarWait(full(s), (it / T::kStages) & 1);
      if (it == 0) mark(Probe::kFirstStage);
      WgmmaFence();
      const uint32_t a_rows = a_tile(s) + cw * (64 * kMSub) * 128;
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t dw = SmemDesc(w_tile(s) + kk * 32);
#pragma unroll
        for (int h = 0; h < kMSub; ++h) {
          WgmmaM64N128K16(acc[h], SmemDesc(a_rows + h * 64 * 128 + kk * 32), dw);
        }
      }
      WgmmaCommit();
      // Keep this step's products in flight; the previous step's are done,
      // so its stage goes back to the producer.
      WgmmaWait<1>();
      if (it > 0) MbarArrive(empty((it - 1) % T::kStages));
    }
    WgmmaWait<0>();
    mark(Probe::kKLoopEnd);
  }

  // Split-K: split r owns the 8-column chunks j (of the tile's 16) with
  // j splits / 16 == r, columns [8 j0, 8 j1) of every row. Each split puts
  // its accumulator chunks (float4 j of m64 block h of consumer thread ct, the
  // wgmma fragment order) where the owner finds them: cluster mode stores them
  // straight into the owner's shared memory (st.shared::cluster, slot = the
  // sender's rank); global mode keeps its own in shared memory and writes the
  // others to the workspace, from where each owner pulls its columns with
  // bulk copies once the tile's counter says every split is in. Either way
  // the owner then sums the slots in rank order (deterministic) from its own
  // shared memory, stages bf16 and writes its columns with 16-byte stores.
  // Nothing waits on a remote load.
  const int j0 = static_cast<int>((16 * rank + splits - 1) / splits);
  const int j1 = static_cast<int>((16 * (rank + 1) + splits - 1) / splits);
  const int jn = j1 - j0, jmax = static_cast<int>((16 + splits - 1) / splits);
  const int pitch = StagePitch(jmax);
  const bool consumer = wg > 0;
  const int ct = threadIdx.x - 128;
  const int tile = blockIdx.z * gridDim.y + blockIdx.y;
  // recv[slot][h][j - j0 of the owner][ct] (float4), then the staged output.
  const uint32_t slot_floats4 = kMSub * jmax * 256;
  float4* const recv = reinterpret_cast<float4*>(smem);
  const uint32_t recv_bytes = splits == 1 ? 0u : splits * slot_floats4 * 16;
  __nv_bfloat16* const staging = reinterpret_cast<__nv_bfloat16*>(smem + recv_bytes);
  const auto chunk = [&](int h, int j) {
    return make_float4(acc[h][4 * j], acc[h][4 * j + 1], acc[h][4 * j + 2], acc[h][4 * j + 3]);
  };
  // Global mode: split q's partial, (h 16 + j) 256 + ct float4s.
  float4* const parts = global_reduce ? reinterpret_cast<float4*>(p.partials) +
                                            static_cast<int64_t>(tile) * splits * (T::kBM * kBN / 4)
                                      : nullptr;

  if (splits == 1) {
    mark(Probe::kStored);
    if (consumer) {
      // Both consumer warpgroups are done with the ring (the staging overlaps it).
      asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
      for (int h = 0; h < kMSub; ++h) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          ToStaging(staging, pitch, ChunkRow<kMSub>(h, ct), 8 * j + 2 * (ct % 4), chunk(h, j));
        }
      }
    }
    mark(Probe::kSplitsIn);
  } else {
    if (!global_reduce) ClusterSync();  // every ring of the cluster drained: recv is free
    if (consumer) {
      if (global_reduce) asm volatile("bar.sync 1, 256;" ::: "memory");  // this ring drained
#pragma unroll
      for (int h = 0; h < kMSub; ++h) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const uint32_t q = static_cast<uint32_t>(j) * splits / 16;  // the owner
          const int qj0 = static_cast<int>((16 * q + splits - 1) / splits);
          const uint32_t idx = rank * slot_floats4 + (h * jmax + (j - qj0)) * 256 + ct;
          if (q == rank) {
            recv[idx] = chunk(h, j);
          } else if (global_reduce) {
            __stcg(parts + rank * (T::kBM * kBN / 4) + (h * 16 + j) * 256 + ct, chunk(h, j));
          } else {
            StoreRemote4(base + 16 * idx, q, chunk(h, j));
          }
        }
      }
    }
    mark(Probe::kStored);
    if (!global_reduce) {
      ClusterSync();  // every chunk landed
    } else {
      __syncthreads();  // every partial store of this CTA issued
      if (threadIdx.x == 0) {
        unsigned int* arrive = p.counters + 2 * tile;
        __threadfence();
        atomicAdd(arrive, 1u);
        // All splits of the tile run at once (cooperative launch): wait for them.
        SpinUntil([&] {
          unsigned int seen;
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrive) : "memory");
          return seen >= splits;
        });
        __threadfence();
        // The partials were written through the generic proxy; the bulk
        // copies read them through the async proxy.
        asm volatile("fence.proxy.async.global;" ::: "memory");
        const uint32_t run_bytes = jn * 256 * 16;
        MbarExpectTx(reduce_bar, (splits - 1) * kMSub * run_bytes);
        for (uint32_t q = 0; q < splits; ++q) {
          if (q == rank) continue;
          for (int h = 0; h < kMSub; ++h) {
            BulkLoad(SmemAddr(recv + q * slot_floats4 + h * jmax * 256),
                     parts + q * (T::kBM * kBN / 4) + (h * 16 + j0) * 256, run_bytes, reduce_bar);
          }
        }
      }
      MbarWait(reduce_bar, 0);
    }
    mark(Probe::kSplitsIn);
    // Sum the slots of every owned chunk (h, j - j0, thread) and stage it.
    for (int e = threadIdx.x; e < kMSub * jn * 256; e += kThreads) {
      const int c = e % 256, hj = e / 256, h = hj / jn, jj = hj % jn;
      const uint32_t at = (h * jmax + jj) * 256 + c;
      float4 v[8];
#pragma unroll
      for (uint32_t q = 0; q < 8; ++q) {
        if (q < splits) v[q] = recv[q * slot_floats4 + at];
      }
      float4 sum = v[0];
#pragma unroll
      for (uint32_t q = 1; q < 8; ++q) {
        if (q < splits) {
          sum.x += v[q].x;
          sum.y += v[q].y;
          sum.z += v[q].z;
          sum.w += v[q].w;
        }
      }
      ToStaging(staging, pitch, ChunkRow<kMSub>(h, c), 8 * jj + 2 * (c % 4), sum);
    }
  }
  __syncthreads();  // staging complete; every read of recv done
  mark(Probe::kReduced);
  {
    // Owned columns [8 j0, 8 j1) of every valid row, 16 bytes per store.
    const int rows = min(T::kBM, p.m - m0);
    for (int t = threadIdx.x; t < rows * jn; t += kThreads) {
      const int row = t / jn, jj = t % jn, col = n0 + 8 * (j0 + jj);
      const __nv_bfloat16* src = staging + row * pitch + 8 * jj;
      __nv_bfloat16* out = p.c + static_cast<int64_t>(m0 + row) * p.ldc + col;
      if (col + 8 <= p.n) {
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(src);
      } else {
        for (int e = 0; e < 8 && col + e < p.n; ++e) out[e] = src[e];
      }
    }
  }
  if (splits > 1 && global_reduce && threadIdx.x == 0) {
    // The tile's last CTA resets its counters for the next launch (launches
    // on a stream are ordered: nothing of this tile runs concurrently). Its
    // partial reads (bulk copies) completed before the barrier above.
    unsigned int* arrive = p.counters + 2 * tile;
    if (atomicAdd(arrive + 1, 1u) == splits - 1) {
      atomicExch(arrive, 0u);
      atomicExch(arrive + 1, 0u);
    }
  }
  finish();
#endif
}

}  // namespace symtp::kernels::sm90

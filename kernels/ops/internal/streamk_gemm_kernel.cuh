// A Hopper (sm_90a) bf16 GEMM for decode batches of up to 256 tokens, with
// the weights as the wide operand and the K loop shared out stream-K:
//
//   C[M, N] = A[M, K] · W[N, K]ᵀ      bf16 in, fp32 accumulate, bf16 out
//
// Why it was tried (bench/results/h200-2026-11-23, runs u, al-ar): at M = 256
// and N of 3-4 K the output holds too few tiles for 132 SMs. cuBLASLt fills
// them with 128 x 64 (W rows x tokens) tiles that run at ~55-60% of an SM's
// tensor rate; the sm90 kernel (sm90_gemm_kernel.cuh) runs big tiles at the
// peak but pays 4.5-8 us to sum its K splits at the end. A model of shared
// memory traffic per FLOP-clock at the peak (wgmma reads its 64 x 16 A and
// n x 16 B operands from shared memory, TMA writes every stage there; 128
// bytes per clock per SM) gives 4096 / (W rows) + 8192 / tokens + 64 bytes
// with W as A (m64) and the tokens as B (n): 224 (57%) for cuBLASLt's 128 x
// 64, 160 (80%) for a 64 x 256 tile.
//
// Measured (bench/results/h200-2026-11-24, runs i-k; H200, per call in a
// CUDA graph): correct, deterministic, but slower than cuBLASLt on every
// decode shape (0.55-0.81x at M = 256, e.g. llama-8b TP=1 wo 22.3 us on 64
// pairs vs 18.0), so nothing but the tests and kernels_bench launches it. A
// unit (64 x 256 x 64) takes 369 ns with 64 CTAs (94% of the measured
// per-SM bf16 rate: the model holds per SM) but 556 ns with 132; sharing the
// token box between CTA pairs (TMA multicast, half the L2 reads) brings that
// to 422-466 ns, so L2 reads are only part of what the full grid contends
// for. Around the K loop, ~1.6-2 us until the first unit lands and ~2 us to
// write or gather the partials remain, as in the sm90 kernel. Runs n-p
// (session 12): clusters of 4 are no faster than pairs (451 vs 428 ns per
// unit), W asked into L2 ahead of its loads is slower, and per clock a unit
// takes 685-746 clocks on 64-128 CTAs (the tensor cores' bound is 512: ~70%,
// the traffic model's bound 80%) and 810-965 on the full grid; the 64-CTA
// runs also clock higher (1.7-1.8 GHz) than the 8192^3 ceiling GEMM.
// Run z (session 13): two consumer warpgroups (kWG = 2, 128 W rows per CTA,
// one token stage read by both) take 1240-1600 clocks per 128 x 256 x 64
// unit at M = 256 (bound 1024: 64-83%, against 61-74% for kWG = 1) and come
// to 0.85-0.93x of cuBLASLt on the long shapes at M = 128, but their
// partials are twice the bytes: on the short shapes the fix-up (3.1-3.9 us)
// and first unit (2.1-2.5 us) make them slower than kWG = 1.
//
// So here a tile is 64 kWG W rows x all kTn (128 or 256) tokens: one wgmma
// m64n256k16 (m64n128k16) per 16-wide K slice, W the A operand. There are
// only N / 64 such tiles, so the grid (one CTA per SM) shares the tiles' K
// steps out evenly, stream-K: of U = tiles x K steps units, CTA c runs
// [c U / G, (c + 1) U / G) in order (with kC = 2, cluster c: see below). A CTA's first
// segment may start inside a tile: it writes that fp32 partial to the
// workspace (early: it is the CTA's first work) and raises its flag. A
// segment that starts a tile (k = 0) owns it: if the tile continues past the
// CTA's range (only its last segment can), the owner waits for the flags of
// the CTAs that hold the rest and adds their partials in CTA order, so the
// sum is the same every launch. Owners only wait on higher CTAs, and every
// CTA is resident (a cooperative launch, or no more clusters than the device
// runs at once), so a wait ends unless a peer is lost (then the deadline).
//
// Structure (one CTA, 160 threads): warps 0-3 are the consumer warpgroup
// (wgmma, the partials, the output), warp 4 lane 0 the producer: TMA
// (128-byte swizzle) loads the W and token boxes of each unit into a ring of
// kStages stages; mbarriers full[s] (bytes landed) and empty[s] (the four
// consumer warps done with the stage). Outputs are staged in shared memory
// (transposed: the accumulators hold D = C^T) and written with 16-byte stores.
// Every wait has a deadline (sm90::kWaitTimeoutCycles): a lost transfer or
// peer traps instead of hanging.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/ops/gemm_streamk.h"
#include "kernels/ops/internal/sm90_gemm_kernel.cuh"

namespace symtp::kernels::streamk {

inline constexpr int kBW = 64;  // W rows (output columns) per consumer warpgroup: one m64 block
inline constexpr int kBK = 64;  // K per unit: one 128-byte swizzle row of bf16

// kWG consumer warpgroups (each 64 W rows of the CTA's tile, all kTn tokens)
// and one producer warp.
template <int kWG>
inline constexpr int kThreads = 128 * kWG + 32;

template <int kTn, int kWG>
struct TileShape {
  static_assert(kTn == 128 || kTn == 256);
  static_assert(kWG == 1 || kWG == 2);
  static constexpr int kRows = kBW * kWG;       // W rows per CTA
  static constexpr int kConsumers = 128 * kWG;  // consumer threads
  static constexpr int kAcc = kTn / 2;  // fp32 accumulators per consumer thread
  static constexpr int kWBytes = kRows * kBK * 2;
  static constexpr int kTBytes = kTn * kBK * 2;
  static constexpr int kStageBytes = kWBytes + kTBytes;
  // Staged output: kTn token rows of kRows bf16, padded so that the transposed
  // fragment writes (4 tokens x 8 W rows per warp store) hit distinct banks.
  static constexpr int kPitch = kRows + 8;
  static constexpr int kStagingBytes = kTn * kPitch * 2;
  static constexpr int kStages = (220 * 1024 - kStagingBytes) / kStageBytes > 8
                                     ? 8
                                     : (220 * 1024 - kStagingBytes) / kStageBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // Ring, staging, full/empty barriers, slack to align the ring to 1024 bytes.
  static constexpr int kSmemBytes = kRingBytes + kStagingBytes + 2 * kStages * 8 + 1024;
  // A partial: kAcc floats of each consumer thread.
  static constexpr int kPartialBytes = kConsumers * kAcc * 4;
  static_assert(kStages >= 3);
  static_assert(kWBytes % 1024 == 0 && kTBytes % 1024 == 0 && kStagingBytes % 16 == 0);
  static_assert(kSmemBytes <= 227 * 1024);
};

struct StreamKParams {
  __nv_bfloat16* c = nullptr;
  int64_t ldc = 0;
  int m = 0, n = 0;
  int k_steps = 0;  // S = ceil(K / kBK)
  int tiles = 0;    // T = ceil(N / (kRows kC)): one per cluster of kC CTAs
  // partials[c]: CTA c's first-segment partial when it starts inside a tile,
  // float4 j of consumer thread t at (j kConsumers + t); flags[c] = 1 once written,
  // reset to 0 by the tile's owner after reading (zero between launches).
  float* partials = nullptr;
  unsigned int* flags = nullptr;
  unsigned long long* stamps = nullptr;  // diagnostics (StreamKGemmProbe) or null
};

namespace detail {

// d += A(64x16) · B(256x16)ᵀ, both K-major in shared memory (descriptors);
// 128 fp32 accumulators per thread: d[4 j + 2 i + c] = D[16 w + l / 4 + 8 i][8 j + 2 (l % 4) + c].
__device__ __forceinline__ void WgmmaM64N256K16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127"
      "}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b));
}

// Acquire load of a flag another CTA releases (gpu scope).
__device__ __forceinline__ unsigned int LoadAcquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void StoreRelease(unsigned int* p, unsigned int v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The consumer warpgroups' threads (the producer warp never joins).
template <int kWG>
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, %0;" ::"n"(128 * kWG) : "memory");
}

// TMA into the same shared offset of every CTA in `mask` of the cluster,
// completing bytes on the barrier at `bar`'s offset in each.
__device__ __forceinline__ void TmaLoad2DMulticast(uint32_t dst, const CUtensorMap* map,
                                                   uint32_t bar, int c0, int c1, uint16_t mask,
                                                   uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster.L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5, %6;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask), "l"(policy)
      : "memory");
}

// Arrives on the barrier at `bar`'s offset in cluster CTA `rank`.
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

template <int kTn>
__device__ __forceinline__ void Wgmma(float (&d)[kTn / 2], uint64_t desc_w, uint64_t desc_t) {
  if constexpr (kTn == 128) {
    sm90::detail::WgmmaM64N128K16(d, desc_w, desc_t);
  } else {
    WgmmaM64N256K16(d, desc_w, desc_t);
  }
}

}  // namespace detail

// Grid: G clusters of kC CTAs along x (G <= units; every CTA resident:
// kC = 1 a cooperative launch, kC = 2 or 4 at most the clusters the device
// runs at once); dynamic shared memory TileShape<kTn, kWG>::kSmemBytes. A
// CTA covers 64 kWG W rows, 64 per consumer warpgroup (both read the same
// token stage). With kC > 1 the CTAs of a cluster run the same units on
// adjacent W tiles (a 64 kWG kC-row tile) and each loads 1/kC of the token box for all (TMA
// multicast): per unit an SM reads 8 + 32 / kC KB from L2 instead of 40 (run
// k, pairs: units 15-25% faster on the short shapes, no faster on the wide
// ones).
template <int kTn, int kC, int kWG>
__global__ void __launch_bounds__(kThreads<kWG>, 1)
    StreamKGemmKernel(const __grid_constant__ CUtensorMap map_w,
                      const __grid_constant__ CUtensorMap map_t, const StreamKParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // built for sm_90a only; the host never launches it elsewhere
#else
  using T = TileShape<kTn, kWG>;
  using namespace sm90::detail;
  using namespace detail;
  using Probe = ::symtp::kernels::StreamKGemmProbe;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  __nv_bfloat16* const staging =
      reinterpret_cast<__nv_bfloat16*>(smem_raw + (base - raw) + T::kRingBytes);
  const uint32_t bars = base + T::kRingBytes + T::kStagingBytes;
  const auto full = [&](int s) { return bars + 8 * s; };
  const auto empty = [&](int s) { return bars + 8 * (T::kStages + s); };
  const auto w_tile = [&](int s) { return base + s * T::kStageBytes; };
  const auto t_tile = [&](int s) { return base + s * T::kStageBytes + T::kWBytes; };

  const int64_t S = p.k_steps;
  const int64_t units = static_cast<int64_t>(p.tiles) * S;
  static_assert(kC == 1 || kC == 2 || kC == 4);
  // Stream-K workers are clusters: q of G; this CTA is rank `rank` of its
  // cluster (W rows kRows rank.. of each kRows kC-row tile) and slot `cta` of
  // the partials and flags.
  const int64_t G = gridDim.x / kC, cta = blockIdx.x, q = cta / kC;
  const int rank = static_cast<int>(cta % kC);
  const int64_t u0 = q * units / G, u1 = (q + 1) * units / G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  unsigned long long* const stamp =
      p.stamps != nullptr && threadIdx.x == 0 ? p.stamps + Probe::kSlots * cta : nullptr;
  const auto mark = [&](int slot) {
    if (stamp != nullptr) stamp[slot] = clock64();
  };
  if (stamp != nullptr) {
    StampStart<Probe>(stamp);
    stamp[Probe::kUnits] = static_cast<unsigned long long>(u1 - u0);
    stamp[Probe::kPartialsRead] = 0;
  }

  if (threadIdx.x == T::kConsumers) {
    for (int s = 0; s < T::kStages; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), 4 * kWG * kC);  // lane 0 of each consumer warp of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_t)) : "memory");
  }
  if constexpr (kC > 1) {
    ClusterSync();  // the peer's barriers are initialized before anything reaches them
  } else {
    __syncthreads();
  }

  if (warp == 4 * kWG) {
    // Producer: one box of W (streamed once: evict first) and one of the
    // tokens (re-read by every CTA: keep) per unit, in the consumers' order.
    if (lane == 0) {
      const uint64_t keep = L2Policy(false), stream = L2Policy(true);
      int it = 0;
      for (int64_t u = u0; u < u1; ++u, ++it) {
        const int s = it % T::kStages;
        MbarWait(empty(s), ((it / T::kStages) & 1) ^ 1);
        MbarExpectTx(full(s), T::kStageBytes);
        const int tile = static_cast<int>(u / S), k = static_cast<int>(u % S);
        TmaLoad2D(w_tile(s), &map_w, full(s), k * kBK, (tile * kC + rank) * T::kRows, stream);
        if constexpr (kC == 1) {
          TmaLoad2D(t_tile(s), &map_t, full(s), k * kBK, 0, keep);
        } else {
          // This CTA's 1/kC of the token rows, into every CTA of the cluster
          // (each CTA's full barrier expects the whole box).
          TmaLoad2DMulticast(t_tile(s) + rank * (T::kTBytes / kC), &map_t, full(s), k * kBK,
                             rank * (kTn / kC), static_cast<uint16_t>((1u << kC) - 1), keep);
        }
      }
    }
    __syncwarp();
  } else {
    // Consumers. Accumulator d[4 j + 2 i + c] of thread (warp w, lane l) is
    // D[16 w + l / 4 + 8 i][8 j + 2 (l % 4) + c], D = the tile of C^T
    // (W row, token); warp w of warpgroup g works on rows 64 g + 16 w.., so
    // with w = the CTA's warp index the same formula holds.
    const int ct = threadIdx.x;
    // This warpgroup's 64 W rows of a stage (8 KB: 128-byte swizzle atoms
    // stay 1024-byte aligned).
    const uint32_t w_rows = static_cast<uint32_t>(ct / 128) * (kBW * kBK * 2);
    float acc[T::kAcc];
    // A stage is free once the consumers of every CTA it was multicast to are
    // done with it.
    const auto release = [&](int it) {
      if (lane == 0) {
        if constexpr (kC == 1) {
          MbarArrive(empty(it % T::kStages));
        } else {
          MbarArrive(empty(it % T::kStages));
#pragma unroll
          for (int r = 1; r < kC; ++r) MbarArriveCluster(empty(it % T::kStages), (rank + r) % kC);
        }
      }
    };
    int it = 0;
    for (int64_t u = u0; u < u1;) {
      const int tile = static_cast<int>(u / S);
      const int64_t ks = u % S;
      const int64_t ke = ks + (u1 - u) < S ? ks + (u1 - u) : S;
#pragma unroll
      for (int r = 0; r < T::kAcc; ++r) acc[r] = 0.f;
      for (int64_t k = ks; k < ke; ++k, ++it) {
        const int s = it % T::kStages;
        MbarWait(full(s), (it / T::kStages) & 1);
        if (it == 0) mark(Probe::kFirstStage);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          Wgmma<kTn>(acc, SmemDesc(w_tile(s) + w_rows + kk * 32), SmemDesc(t_tile(s) + kk * 32));
        }
        WgmmaCommit();
        // Keep this unit's products in flight; the previous unit's are done.
        WgmmaWait<1>();
        if (k > ks) release(it - 1);
      }
      WgmmaWait<0>();
      release(it - 1);
      mark(Probe::kLoopEnd);
      u += ke - ks;

      constexpr int kCt = T::kConsumers;
      float4* const mine = reinterpret_cast<float4*>(p.partials) + cta * (T::kAcc / 4) * kCt;
      if (ks > 0) {
        // Starts inside the tile (only a CTA's first segment can): the tile's
        // owner, a lower CTA, adds it.
#pragma unroll
        for (int j = 0; j < T::kAcc / 4; ++j) {
          __stcg(mine + j * kCt + ct,
                 make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
        }
        __threadfence();
        ConsumerSync<kWG>();
        if (ct == 0) StoreRelease(p.flags + cta, 1u);
        mark(Probe::kPartialsIn);
        continue;
      }
      if (ke < S) {
        // Owner of a tile the next CTAs finish (this is its last segment): add
        // their partials in CTA order.
        int read = 0;
        for (int64_t d = q + 1; d < G && d * units / G < (tile + 1) * S; ++d, ++read) {
          const int64_t peer = d * kC + rank;  // same W rows of the tile
          if (ct == 0) {
            unsigned int* flag = p.flags + peer;
            SpinUntil([&] { return LoadAcquire(flag) != 0u; });
            *flag = 0u;  // for the next launch (nothing else reads it in this one)
          }
          ConsumerSync<kWG>();
          const float4* src =
              reinterpret_cast<const float4*>(p.partials) + peer * (T::kAcc / 4) * kCt;
#pragma unroll
          for (int j = 0; j < T::kAcc / 4; ++j) {
            const float4 v = __ldcg(src + j * kCt + ct);
            acc[4 * j] += v.x;
            acc[4 * j + 1] += v.y;
            acc[4 * j + 2] += v.z;
            acc[4 * j + 3] += v.w;
          }
        }
        if (stamp != nullptr) stamp[Probe::kPartialsRead] = static_cast<unsigned long long>(read);
      }
      mark(Probe::kPartialsIn);

      // The whole tile: stage it transposed (token rows of kRows bf16), then
      // 16-byte stores of each token row's kRows columns.
      ConsumerSync<kWG>();  // the previous tile's stores have read the staging
      {
        const int w = ct / 32, row = 16 * w + lane / 4, col = 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < T::kAcc / 4; ++j) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              staging[(8 * j + col + c) * T::kPitch + row + 8 * i] =
                  __float2bfloat16_rn(acc[4 * j + 2 * i + c]);
            }
          }
        }
      }
      ConsumerSync<kWG>();
      const int n0 = (tile * kC + rank) * T::kRows;
      const int rows = p.m < kTn ? p.m : kTn;
      for (int t = ct; t < rows * (T::kRows / 8); t += kCt) {
        const int row = t / (T::kRows / 8), col = n0 + 8 * (t % (T::kRows / 8));
        const __nv_bfloat16* src = staging + row * T::kPitch + (col - n0);
        __nv_bfloat16* out = p.c + static_cast<int64_t>(row) * p.ldc + col;
        if (col + 8 <= p.n) {
          *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; e < 8 && col + e < p.n; ++e) out[e] = src[e];
        }
      }
    }
  }
  if constexpr (kC > 1) {
    // Nothing may still arrive on or copy into a CTA that has exited.
    __syncwarp();
    ClusterSync();
  }
  if (stamp != nullptr) StampEnd<Probe>(stamp);
#endif
}

}  // namespace symtp::kernels::streamk

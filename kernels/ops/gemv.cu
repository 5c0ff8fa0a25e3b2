// Gemv: C[M, N] = A[M, K] · W[N, K]ᵀ for decode's few rows (M <= kGemvMaxRows), bf16.
//
// At M <= 4 a linear layer is a read of its weights and nothing else: the
// multiply-adds are a few per byte, far below what the CUDA cores issue. So
// the kernel is a stream over W, shaped for three things cuBLASLt's tiled
// kernels do not give a decode step:
//
//  * Every SM streams. Block b owns the weight rows [N b / G, N (b+1) / G)
//    of a grid G that fills the GPU once (blocks per SM from the occupancy
//    API), so rows split evenly whatever N is; a tiled kernel runs N / tile
//    tiles, 24 on an H100's 132 SMs for a 3072-wide TP=2 QKV shard.
//  * Its first weights are in flight before it waits for the kernel before it.
//    Launched with programmatic dependent launch (PDL), its blocks start as
//    soon as that kernel allows (the project's small kernels allow it right
//    after their own wait: AllowDependentLaunch), load kR weight rows each,
//    and only then wait for the activations: the latency-bound norm,
//    all-reduce, merge or SiLU before a GEMM overlaps the head of its read.
//  * No workspace, no second kernel, a fixed reduction order (bitwise the
//    same from run to run).
//
// Inside a block, thread t owns the 16-byte units t, t + kT, ... (kU of
// them) of every row: it holds A's values at those columns in registers for
// the whole kernel and streams kR rows of W at a time (kR x kU 16-byte loads
// in flight per thread). The kR x kM partial sums of a pass meet across a
// warp's lanes in one reduce-scatter, then across the warps, in warp order,
// in shared memory, flushed every kChunk rows.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/internal/device_utils.cuh"

namespace symtp::kernels {
namespace {

using internal::bf16;

constexpr int kChunk = 32;  // rows per flush of the block's partial sums

// A streamed weight load: read once, kept out of L1.
__device__ __forceinline__ uint4 LoadWeights(const bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// acc += dot of 8 bf16 weights with 8 bf16 activations, in element order.
__device__ __forceinline__ float Dot8(uint4 wv, uint4 xv, float acc) {
  const uint32_t* wp = &wv.x;
  const uint32_t* xp = &xv.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(wp[i] << 16), __uint_as_float(xp[i] << 16), acc);
    acc = fmaf(__uint_as_float(wp[i] & 0xffff0000u), __uint_as_float(xp[i] & 0xffff0000u), acc);
  }
  return acc;
}

// One exchange of a warp reduce-scatter: lanes that differ in bit kO swap
// halves of their kN values; each keeps the sum of the half it holds.
template <int kN, int kO>
__device__ __forceinline__ void HalveOver(float* v, int lane) {
  if constexpr (kN > 1) {
    const bool upper = (lane & kO) != 0;
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const float send = upper ? v[i] : v[i + kN / 2];
      const float keep = upper ? v[i + kN / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
    }
    HalveOver<kN / 2, kO / 2>(v, lane);
  }
}

constexpr int Log2(int n) { return n > 1 ? 1 + Log2(n / 2) : 0; }

// Sums each of a lane's kN values over the warp (kN a power of two <= 32),
// halving the values at each exchange: lane L ends with the total of value
// L >> (5 - log2 kN) (kN - 1 + 5 - log2 kN shuffles, not 5 kN). The order of
// the additions is fixed, so the result is the same from run to run.
template <int kN>
__device__ __forceinline__ float WarpReduceScatter(float (&v)[kN], int lane) {
  static_assert(kN >= 1 && kN <= 32 && (kN & (kN - 1)) == 0, "kN: a power of two <= 32");
  HalveOver<kN, 16>(v, lane);
  float s = v[0];
#pragma unroll
  for (int o = 16 >> Log2(kN); o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// One LL line {lo, e, hi, e} (custom_allreduce_kernels.cuh's format).
__device__ __forceinline__ void StoreLLLine(char* p, uint32_t lo, uint32_t hi, uint32_t e) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(lo), "r"(e),
               "r"(hi), "r"(e)
               : "memory");
}

// What a block does with its rows' sums.
enum class Epilogue {
  kStore,  // C[mm][row] = sum (times A's row factor; plus C with accumulate)
  // C is bf16 and contiguous, rows cut at multiples of 8, and each 16-byte
  // unit of C also goes to every rank of `push` (this one's own slot
  // included) as two LL lines once the block has written it.
  kPush,
  // W holds an MLP's gate rows then its up rows (n = 2 F); the block's rows
  // are taken in pairs (gate j, up j), cut at multiples of 2, and C, [m, F],
  // gets SiLU(gate) * up from the bf16-rounded sums, as SiluMul computes it
  // (a row's sum does not depend on its block or its place in a pass: the
  // same bits as the stored product then SiluMul).
  kSwiGlu,
};

// Rows a block's share is cut at multiples of: a pushed 16-byte unit has one
// writer, a (gate, up) pair one block.
constexpr int RowStep(Epilogue e) {
  return e == Epilogue::kPush ? 8 : e == Epilogue::kSwiGlu ? 2 : 1;
}

// A block with at most 2048 loads (32 KiB) in flight per pass runs two per SM:
// 64 KiB in flight per SM either way, from twice the threads.
template <int kT, int kU, int kR, int kM, typename TOut, Epilogue kEpi>
__global__ void __launch_bounds__(kT, kT * kU * kR <= 2048 ? 2 : 1)
    GemvKernel(const bf16* __restrict__ a, int64_t lda, const bf16* __restrict__ w, int64_t ldw,
               TOut* __restrict__ c, int64_t ldc, int m, int n, int k, const LLPush push,
               float rms_eps, bool accumulate) {
  SYMTP_TRACE_KERNEL(kGemv);
  constexpr int kWarps = kT / 32;
  static_assert(kChunk % kR == 0, "a pass of kR rows never straddles a flush");
  __shared__ float part[kChunk][kM][kWarps];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int units = k >> 3;
  constexpr bool kPush = kEpi == Epilogue::kPush, kSwiGlu = kEpi == Epilogue::kSwiGlu;
  static_assert((!kPush && !kSwiGlu) || sizeof(TOut) == 2, "pushed lines and SwiGLU carry bf16");
  constexpr int step = RowStep(kEpi);
  const int64_t cuts = n / step;
  // The weight row of the block's row r (kSwiGlu: r = 2 j + h, gate j or up j).
  const auto w_row = [&](int r) -> int64_t { return kSwiGlu ? (r >> 1) + (r & 1) * (n >> 1) : r; };
  const int r0 = step * static_cast<int>(cuts * blockIdx.x / gridDim.x);
  const int r1 = step * static_cast<int>(cuts * (blockIdx.x + 1) / gridDim.x);

  uint4 wv[kR][kU];
  // Weight row r + j of a pass into wv[j].
  auto load_row = [&](int j, int r) {
#pragma unroll
    for (int i = 0; i < kU; ++i) {
      const int u = tid + i * kT;
      wv[j][i] = r + j < r1 && u < units ? LoadWeights(w + w_row(r + j) * ldw + 8 * u)
                                         : make_uint4(0, 0, 0, 0);
    }
  };
  auto load = [&](int r) {
#pragma unroll
    for (int j = 0; j < kR; ++j) load_row(j, r);
  };
  load(r0);  // weights never depend on the kernel before: read them before the wait
  internal::GridDependencyWait();
  internal::AllowDependentLaunch();

  uint4 xv[kM][kU];
#pragma unroll
  for (int mm = 0; mm < kM; ++mm) {
#pragma unroll
    for (int i = 0; i < kU; ++i) {
      const int u = tid + i * kT;
      xv[mm][i] = mm < m && u < units ? __ldg(reinterpret_cast<const uint4*>(a + mm * lda + 8 * u))
                                      : make_uint4(0, 0, 0, 0);
    }
  }
  // A's RMSNorm factors (GemmArgs::a_rms_eps), from the rows the block holds
  // (the same order of additions in every block and epilogue); the barrier
  // before the first flush publishes them.
  __shared__ float row_scale[kM];
  const bool scaled = rms_eps >= 0.f;
  if (scaled) {
    // All rows in one pass: each warp sums its lanes' squares per row, then
    // one thread per row sums the warps' partials in warp order (one barrier).
    __shared__ float warp_ss[kM][kWarps];
#pragma unroll
    for (int mm = 0; mm < kM; ++mm) {
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < kU; ++i) ss = Dot8(xv[mm][i], xv[mm][i], ss);
      ss = internal::WarpSum(ss);
      if (lane == 0) warp_ss[mm][warp] = ss;
    }
    __syncthreads();
    if (tid < kM) {
      float ss = 0.f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) ss += warp_ss[tid][v];
      row_scale[tid] = rsqrtf(ss / static_cast<float>(k) + rms_eps);
    }
  }

  for (int base = r0; base < r1; base += kChunk) {
    const int end = min(base + kChunk, r1);
    for (int r = base; r < end; r += kR) {
      float acc[kR][kM];
      const bool more = r + kR < r1;
#pragma unroll
      for (int j = 0; j < kR; ++j) {
#pragma unroll
        for (int mm = 0; mm < kM; ++mm) {
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < kU; ++i) s = Dot8(wv[j][i], xv[mm][i], s);
          acc[j][mm] = s;
        }
        // Row j's registers are free: its next weights fly during the other
        // rows' products and the reduction.
        if (more) load_row(j, r + kR);
      }
      constexpr int kN = kR * kM, kShift = 5 - Log2(kN);
      float flat[kN];
#pragma unroll
      for (int j = 0; j < kR; ++j) {
#pragma unroll
        for (int mm = 0; mm < kM; ++mm) flat[j * kM + mm] = acc[j][mm];
      }
      const float sum = WarpReduceScatter<kN>(flat, lane);
      const int idx = lane >> kShift, j = idx / kM, mm = idx - j * kM;
      if ((lane & ((1 << kShift) - 1)) == 0 && r + j < end) part[r + j - base][mm][warp] = sum;
    }
    __syncthreads();
    if constexpr (kSwiGlu) {
      for (int e = tid; e < (end - base) / 2 * kM; e += kT) {
        const int pair = e / kM, mm = e - pair * kM;
        if (mm >= m) continue;
        float g = 0.f, u = 0.f;
#pragma unroll
        for (int v = 0; v < kWarps; ++v) g += part[2 * pair][mm][v];
#pragma unroll
        for (int v = 0; v < kWarps; ++v) u += part[2 * pair + 1][mm][v];
        if (scaled) {
          g *= row_scale[mm];
          u *= row_scale[mm];
        }
        g = internal::ToFloat(internal::FromFloat<bf16>(g));
        u = internal::ToFloat(internal::FromFloat<bf16>(u));
        c[mm * ldc + (base >> 1) + pair] = internal::FromFloat<TOut>(internal::SiluTimes(g, u));
      }
    } else {
      for (int e = tid; e < (end - base) * kM; e += kT) {
        const int row = e / kM, mm = e - row * kM;
        if (mm >= m) continue;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < kWarps; ++v) s += part[row][mm][v];
        if (scaled) s *= row_scale[mm];
        TOut* out = c + mm * ldc + base + row;
        if (accumulate) s += internal::ToFloat(*out);
        *out = internal::FromFloat<TOut>(s);
      }
    }
    __syncthreads();
  }
  if constexpr (kPush) {
    // After the stream, when no weights are in flight (sending from inside
    // the flush kept the next rows' loads live beside the sends' values:
    // 116-128 registers against 87-106): the block's units of C, which its
    // own threads wrote (visible after the barrier), go to every rank, this
    // one's own slot included, as lines 2 (mm n / 8 + u) and + 1.
    const uint32_t epoch = push.epoch[0] + 1;
    const uint32_t base_line = ((epoch & 1) * push.size + push.rank) * push.lines;
    const int u0 = r0 / 8, nu = (r1 - r0) / 8;
    for (int e = tid; e < nu * m; e += kT) {
      const int mm = e / nu, u = u0 + e - mm * nu;
      const uint32_t unit = static_cast<uint32_t>(mm) * (n / 8) + u;
      const uint4 d = *reinterpret_cast<const uint4*>(c + static_cast<int64_t>(mm) * ldc + 8 * u);
      const size_t off = (static_cast<size_t>(base_line) + 2 * unit) * 16;
      // Constant indices keep push.dst in the parameter bank.
#pragma unroll
      for (int p = 0; p < LLPush::kMaxRanks; ++p) {
        if (p < push.size) {
          StoreLLLine(push.dst[p] + off, d.x, d.y, epoch);
          StoreLLLine(push.dst[p] + off + 16, d.z, d.w, epoch);
        }
      }
    }
  }
}

// Blocks of `kernel` that fill every SM once (occupancy API, cached per
// device: a process drives at most a few GPUs).
int FullGrid(const void* kernel, int threads, std::atomic<int>* cache) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) dev = 0;
  int g = cache[dev].load(std::memory_order_relaxed);
  if (g > 0) return g;
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess) {
    cudaGetLastError();
    return 132;  // a valid grid either way; only the speed depends on it
  }
  g = std::max(1, sms * std::max(1, per_sm));
  cache[dev].store(g, std::memory_order_relaxed);
  return g;
}

// The row strides of A, W and C, where 0 in GemmArgs means contiguous (C of
// out_n columns: n, or n / 2 with SwiGLU).
struct Strides {
  int64_t lda, ldw, ldc;
};
Strides StridesOf(const GemmArgs& g, int64_t out_n) {
  return {g.lda ? g.lda : g.k, g.ldw ? g.ldw : g.k, g.ldc ? g.ldc : out_n};
}

// C's columns under epilogue kEpi.
template <Epilogue kEpi>
int64_t OutColumns(const GemmArgs& g) {
  return kEpi == Epilogue::kSwiGlu ? g.n / 2 : g.n;
}

template <int kT, int kU, int kR, int kM, typename TOut, Epilogue kEpi>
cudaError_t Launch(const GemmArgs& g, const LLPush& push, cudaStream_t s) {
  const Strides st = StridesOf(g, OutColumns<kEpi>(g));
  static std::atomic<int> cache[16];
  auto* kernel = GemvKernel<kT, kU, kR, kM, TOut, kEpi>;
  const int grid = std::min<int64_t>(FullGrid(reinterpret_cast<const void*>(kernel), kT, cache),
                                     g.n / RowStep(kEpi));
  return internal::LaunchDependent(
      kernel, dim3(static_cast<unsigned>(grid)), dim3(kT), 0, s, static_cast<const bf16*>(g.a),
      st.lda, static_cast<const bf16*>(g.w), st.ldw, static_cast<TOut*>(g.c), st.ldc,
      static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), push, g.a_rms_eps,
      g.accumulate);
}

// The thread shape for K and M: kT x kU 16-byte units cover a row; kR rows
// at a time keep kR x kU loads (128 bytes at kU kR = 8, 64 at 4) in flight per
// thread, 64 KiB per SM; kR x kM <= 32 values per reduction. Rows longer than
// 8192 take M <= 2 (A's registers would spill at 4: GemvSupports).
//
// The shape depends on M and K only, never on the epilogue: a row's sum, whose
// order of additions the shape fixes, is then the same bits whichever
// epilogue writes it, so GemvSwiGlu is bitwise Gemv then SiluMul and GemvPush
// then the fused all-reduce bitwise Gemv then the fused call (their tests).
//
// The memory system streams faster from 1024 threads per SM than from 512
// with the same bytes in flight (tools/device/read_bandwidth.sh: 4.5 against
// 4.35 TB/s on H200), so 1-2 rows, whose registers allow it, run 1024 threads
// per SM on rows of 2049 to 8192 columns: at llama-8b shapes 0.98-0.99x the
// TP 1 step at batch 1-2 and 0.97x at its TP 2 shard's shapes
// (bench/results/h200/gemv_threads/). Longer rows keep 512 threads (1024 x 2
// x 2 measured no faster there), and so do shorter ones (four 256 x 1 x 4
// blocks: no faster either). At 3-4 rows, two blocks of 256 per SM with 16
// values per reduction stream faster than one block of 512 with 32 (llama-8b
// TP 1 batch 3 / 4 on H200: 0.97 / 0.98x the step:
// bench/results/h200/gemv_rows34/).
template <int kM, typename TOut, Epilogue kEpi>
cudaError_t LaunchK(const GemmArgs& g, const LLPush& p, cudaStream_t s) {
  if (g.k <= 2048) return Launch<256, 1, 8, kM, TOut, kEpi>(g, p, s);
  if constexpr (kM <= 2) {
    if (g.k <= 4096) return Launch<512, 1, 4, kM, TOut, kEpi>(g, p, s);  // two per SM
    if (g.k <= 8192) return Launch<1024, 1, 4, kM, TOut, kEpi>(g, p, s);
    return Launch<512, 4, 2, kM, TOut, kEpi>(g, p, s);
  } else {
    if (g.k <= 4096) return Launch<256, 2, 4, kM, TOut, kEpi>(g, p, s);  // two per SM
    return Launch<512, 2, 4, kM, TOut, kEpi>(g, p, s);
  }
}

template <typename TOut, Epilogue kEpi>
cudaError_t LaunchM(const GemmArgs& g, const LLPush& p, cudaStream_t s) {
  if (g.m == 1) return LaunchK<1, TOut, kEpi>(g, p, s);
  if (g.m == 2) return LaunchK<2, TOut, kEpi>(g, p, s);
  return LaunchK<4, TOut, kEpi>(g, p, s);
}

// GemvSupports for a C of `out_n` columns (n, or n / 2 with SwiGLU).
bool Takes(const GemmArgs& g, int64_t out_n) {
  const auto [lda, ldw, ldc] = StridesOf(g, out_n);
  return g.in_dtype == DType::kBF16 &&
         (g.out_dtype == DType::kBF16 || g.out_dtype == DType::kF32) && g.m >= 1 &&
         g.m <= kGemvMaxRows && g.n >= 1 && g.n <= (int64_t{1} << 30) && g.k >= 8 &&
         g.k <= kGemvMaxK && (g.m <= 2 || g.k <= 8192) && g.k % 8 == 0 && lda >= g.k &&
         lda % 8 == 0 && ldw >= g.k && ldw % 8 == 0 && ldc >= out_n && internal::Aligned16(g.a) &&
         internal::Aligned16(g.w) && g.c != nullptr;
}

}  // namespace

bool GemvSupports(const GemmArgs& g) { return Takes(g, g.n); }

absl::Status Gemv(const GemmArgs& g, cudaStream_t stream) {
  if (!GemvSupports(g)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Gemv: unsupported m=%d n=%d k=%d lda=%d ldw=%d ldc=%d %s -> %s (bf16 in, 1 <= m <= %d, "
        "8 <= k <= %d (8192 for m > 2), k and strides multiples of 8, A and W 16-byte aligned)",
        g.m, g.n, g.k, g.lda, g.ldw, g.ldc, DTypeName(g.in_dtype), DTypeName(g.out_dtype),
        kGemvMaxRows, kGemvMaxK));
  }
  const LLPush none;
  const cudaError_t e = g.out_dtype == DType::kF32
                            ? LaunchM<float, Epilogue::kStore>(g, none, stream)
                            : LaunchM<bf16, Epilogue::kStore>(g, none, stream);
  CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

absl::Status GemvPush(const GemmArgs& g, const LLPush& push, cudaStream_t stream) {
  if (!GemvSupports(g) || g.accumulate || g.a_rms_eps >= 0.f || g.out_dtype != DType::kBF16 ||
      StridesOf(g, g.n).ldc != g.n ||
      g.n % 8 != 0 || !internal::Aligned16(g.c) || push.size < 2 || push.size > LLPush::kMaxRanks ||
      push.rank < 0 || push.rank >= push.size || push.epoch == nullptr ||
      static_cast<size_t>(g.m * g.n / 4) > push.lines) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GemvPush: unsupported m=%d n=%d k=%d ldc=%d %s -> %s, push size %d rank %d lines %d "
        "(bf16 out, contiguous C with n a multiple of 8 and 16-byte aligned, 2..8 ranks, "
        "2 m n / 8 lines, neither accumulate nor a_rms_eps)",
        g.m, g.n, g.k, g.ldc, DTypeName(g.in_dtype), DTypeName(g.out_dtype), push.size, push.rank,
        push.lines));
  }
  const cudaError_t e = LaunchM<bf16, Epilogue::kPush>(g, push, stream);
  CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

bool GemvSwiGluSupports(const GemmArgs& g) {
  return !g.accumulate && g.out_dtype == DType::kBF16 && g.n % 2 == 0 &&
         Takes(g, OutColumns<Epilogue::kSwiGlu>(g));
}

absl::Status GemvSwiGlu(const GemmArgs& g, cudaStream_t stream) {
  if (!GemvSwiGluSupports(g)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GemvSwiGlu: unsupported m=%d n=%d k=%d ldc=%d %s -> %s (Gemv's conditions, bf16 out, n "
        "even: the gate rows then the up rows, C of n / 2 columns, no accumulate)",
        g.m, g.n, g.k, g.ldc, DTypeName(g.in_dtype), DTypeName(g.out_dtype)));
  }
  const LLPush none;
  CUDA_RETURN_IF_ERROR((LaunchM<bf16, Epilogue::kSwiGlu>(g, none, stream)));
  return absl::OkStatus();
}

}  // namespace symtp::kernels

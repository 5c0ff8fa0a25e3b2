// One-shot all-reduce fused with the residual add and RMSNorm that follow a
// row-parallel layer: for every row r of a [rows, hidden] message
//
//   sum      = T(sum over ranks of data[r])            (fp32, rank order 0..N-1)
//   residual = T(float(residual[r]) + float(sum))
//   out[r]   = T(float(residual) * rsqrt(mean(residual^2) + eps) * weight)
//
// in one kernel instead of the all-reduce kernel plus AddRmsNorm (two
// launches, and the sum written and read back). `data` is only read.
//
// Transport and buffer reuse are the all-reduce's own (custom_allreduce_
// kernels.cuh): the same LL / LL128 receive lines and STAGED staging/flags, the same
// per-block epoch counters and the same fixed grids, so fused and plain calls
// interleave on one instance and the double-buffering argument holds
// unchanged. What differs is the partition: block b owns whole rows b, b + G,
// ... (G = the protocol's grid), so it can reduce a row's sum of squares
// itself (the LL and LL128 kernels' sends, though, are spread over the whole
// grid).
// Within a row, thread t owns the 16-byte units t, t + blockDim, ...
// (kPer of them) with blockDim chosen as AddRmsNorm chooses it, so the
// result is bitwise what the all-reduce followed by AddRmsNorm produce, and
// every rank's is bitwise identical. A row's residual and weight units are
// loaded before the wait for the peers' data, off the critical path.
//
// Spins are bounded as in the plain kernels; a thread that gave up records the
// error, stops waiting in later rows and the block finishes (its outputs are
// then garbage; Poll() reports the error).
#pragma once

#include <algorithm>

#include "kernels/allreduce/custom_allreduce_kernels.cuh"
#include "kernels/allreduce/fused_norm_launch.h"
#include "kernels/ops/internal/device_utils.cuh"  // BlockSum: AddRmsNorm's reduction tree

namespace symtp::kernels::allreduce_internal {

// A row's residual and weight units of this thread.
template <int kPer>
struct RowInputs {
  uint4 res[kPer], w[kPer];
};

template <typename T, int kPer>
__device__ __forceinline__ void LoadRowInputs(const FusedNormArgs& f, int64_t row,
                                              RowInputs<kPer>& in) {
  const int nunits = f.hidden / (16 / static_cast<int>(sizeof(T)));
  const uint4* res = reinterpret_cast<const uint4*>(static_cast<const char*>(f.residual) +
                                                    row * f.hidden * sizeof(T));
  const uint4* w4 = reinterpret_cast<const uint4*>(f.weight);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int u = threadIdx.x + j * blockDim.x;
    if (u >= nunits) continue;
    in.res[j] = res[u];
    in.w[j] = __ldg(w4 + u);
  }
}

// The epilogue of one row: `sum[j]` holds thread-owned unit j's all-reduced
// 16 bytes (already rounded to T), `in` the row's residual and weight;
// residual add, RMSNorm, stores.
template <typename T, int kPer>
__device__ __forceinline__ void NormRow(const FusedNormArgs& f, int64_t row, const uint4 (&sum)[kPer],
                                        const RowInputs<kPer>& in, float* scratch) {
  using E = Elem<T>;
  constexpr int kN = 16 / sizeof(T);
  constexpr int kW = 4;  // 32-bit words per unit
  const int nunits = f.hidden / kN;
  uint4* res = reinterpret_cast<uint4*>(static_cast<char*>(f.residual) + row * f.hidden * sizeof(T));
  float x[kPer][kN];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int u = threadIdx.x + j * blockDim.x;
    if (u >= nunits) continue;
    const uint32_t rw[kW] = {in.res[j].x, in.res[j].y, in.res[j].z, in.res[j].w};
    const uint32_t sw[kW] = {sum[j].x, sum[j].y, sum[j].z, sum[j].w};
    uint32_t ow[kW];
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      if constexpr (sizeof(T) == 4) {
        const uint32_t v = E::FromF(E::ToF(rw[w]) + E::ToF(sw[w]));
        ow[w] = v;
        x[j][w] = E::ToF(v);
      } else {
        const uint16_t lo = E::FromF(E::ToF(static_cast<uint16_t>(rw[w] & 0xffff)) +
                                     E::ToF(static_cast<uint16_t>(sw[w] & 0xffff)));
        const uint16_t hi = E::FromF(E::ToF(static_cast<uint16_t>(rw[w] >> 16)) +
                                     E::ToF(static_cast<uint16_t>(sw[w] >> 16)));
        ow[w] = uint32_t(lo) | (uint32_t(hi) << 16);
        x[j][2 * w] = E::ToF(lo);
        x[j][2 * w + 1] = E::ToF(hi);
      }
    }
    res[u] = make_uint4(ow[0], ow[1], ow[2], ow[3]);
#pragma unroll
    for (int i = 0; i < kN; ++i) ss += x[j][i] * x[j][i];
  }
  ss = internal::BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(f.hidden) + f.eps);
  uint4* o = reinterpret_cast<uint4*>(static_cast<char*>(f.out) + row * f.hidden * sizeof(T));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int u = threadIdx.x + j * blockDim.x;
    if (u >= nunits) continue;
    const uint32_t ww[kW] = {in.w[j].x, in.w[j].y, in.w[j].z, in.w[j].w};
    uint32_t ow[kW];
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      if constexpr (sizeof(T) == 4) {
        ow[w] = E::FromF(x[j][w] * inv * E::ToF(ww[w]));
      } else {
        const uint16_t lo =
            E::FromF(x[j][2 * w] * inv * E::ToF(static_cast<uint16_t>(ww[w] & 0xffff)));
        const uint16_t hi =
            E::FromF(x[j][2 * w + 1] * inv * E::ToF(static_cast<uint16_t>(ww[w] >> 16)));
        ow[w] = uint32_t(lo) | (uint32_t(hi) << 16);
      }
    }
    o[u] = make_uint4(ow[0], ow[1], ow[2], ow[3]);
  }
}

// Rank-order fp32 sum of N units, rounded to T.
template <typename T, int N>
__device__ __forceinline__ uint4 SumUnits(const uint32_t (&in)[N][4]) {
  uint32_t out[4];
  ReducePacked<T, N, 4>(in, out);
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Rows b, b + G, ... (G = the grid) of the block: each rank's partials from
// src[rank] (rows of f.hidden elements), summed in rank order, then the
// residual add and RMSNorm. `rin` holds row b's inputs on entry.
template <typename T, int N, int kPer>
__device__ __forceinline__ void NormRowsFrom(const FusedNormArgs& f, const char* const (&src)[N],
                                             RowInputs<kPer>& rin, float* scratch) {
  const int nunits = f.hidden / (16 / static_cast<int>(sizeof(T)));
  for (int64_t row = blockIdx.x; row < f.rows; row += gridDim.x) {
    if (row != blockIdx.x) LoadRowInputs<T, kPer>(f, row, rin);
    uint4 sum[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int u = threadIdx.x + j * blockDim.x;
      if (u >= nunits) continue;
      uint32_t in[N][4];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint4 v = LdCg16(src[r] + (row * nunits + u) * 16);
        in[r][0] = v.x, in[r][1] = v.y, in[r][2] = v.z, in[r][3] = v.w;
      }
      sum[j] = SumUnits<T, N>(in);
    }
    NormRow<T, kPer>(f, row, sum, rin, scratch);
  }
}

// ---------------------------------------------------------------------------
// STAGED transport: push own rows into every peer's staging slot, flag every
// peer, wait for every peer's flag, reduce from own rows and own slots.
// ---------------------------------------------------------------------------
template <typename T, int N, int kPer>
__global__ void __launch_bounds__(1024) StagedNormKernel(DeviceArgs a, FusedNormArgs f) {
  SYMTP_TRACE_KERNEL(kFusedNormStaged);
  internal::GridDependencyWait();  // launched with PDL: the previous kernel completes first
  internal::AllowDependentLaunch();  // the next GEMM may start loading its weights
  constexpr int kN = 16 / sizeof(T);
  __shared__ float scratch[32];
  __shared__ int s_fail;
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int me = a.rank;
  const int nunits = f.hidden / kN;
  char* const my_base = BaseOf<N>(a, me);
  uint32_t* const counter = reinterpret_cast<uint32_t*>(my_base + kEpochStagedOffset) + b;
  if (tid == 0) s_fail = 0;
  const uint32_t e = *counter + 1;
  const uint32_t parity = e & 1;
  const uint4* data = static_cast<const uint4*>(f.data);

  if (b < f.rows) {
    uint4* peer_slot[N];
#pragma unroll
    for (int p = 0; p < N; ++p) {
      peer_slot[p] = reinterpret_cast<uint4*>(a.base[p] + StageSlot<N>(a, parity, p, me));
    }
    for (int64_t r = b; r < f.rows; r += gridDim.x) {
      for (int u = tid; u < nunits; u += blockDim.x) {
        const uint4 v = data[r * nunits + u];
#pragma unroll
        for (int p = 0; p < N; ++p) {
          if (p != me) peer_slot[p][r * nunits + u] = v;
        }
      }
    }
    RowInputs<kPer> rin;
    LoadRowInputs<T, kPer>(f, b, rin);
    __syncthreads();
    StagedSignalAndWait<N>(a, b, e, &s_fail);
    __syncthreads();
    if (!s_fail) {
      const char* stage[N];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        stage[r] = r == me ? static_cast<const char*>(f.data)
                           : my_base + StageSlot<N>(a, parity, me, r);
      }
      NormRowsFrom<T, N, kPer>(f, stage, rin, scratch);
    }
  }
  __syncthreads();
  if (tid == 0) *counter = e;
}

// ---------------------------------------------------------------------------
// LL transport: each 16-byte unit goes to every peer as two LL lines
// {lo, e, hi, e}; the receiver polls its own lines.
// ---------------------------------------------------------------------------
// A pushed call (f.pushed) does not wait for the kernel before it: that
// kernel wrote every rank's lines, this rank's own slot included, so the
// lines alone say when the data is there; it waits for that kernel's
// completion only at its end, so its own completion still implies it.
template <typename T, int N, int kPer>
__global__ void __launch_bounds__(1024) LLNormKernel(DeviceArgs a, FusedNormArgs f) {
  SYMTP_TRACE_KERNEL(kFusedNormLL);
  if (!f.pushed) internal::GridDependencyWait();  // the previous kernel completes first
  internal::AllowDependentLaunch();  // the next GEMM may start loading its weights
  constexpr int kN = 16 / sizeof(T);
  __shared__ float scratch[32];
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int me = a.rank;
  const int nunits = f.hidden / kN;
  char* const my_base = BaseOf<N>(a, me);
  const uint32_t e = reinterpret_cast<const uint32_t*>(my_base + kEpochLLOffset)[b] + 1;
  const size_t parity = e & 1;
  const uint4* data = static_cast<const uint4*>(f.data);

  // 1. Send: the message's units are spread evenly over all the grid's blocks
  // (not by row owner: with fewer rows than blocks, one SM pushing a whole
  // row to N - 1 peers is bound by that SM's NVLink store rate). Every block
  // has the same epoch (all run every call) and a line lands in the slot of
  // its unit whoever sends it, so the receivers below are unchanged. A
  // pushed call's lines were sent by the kernel that wrote `data`.
  if (!f.pushed) {
    const int64_t total = f.rows * static_cast<int64_t>(nunits);
    const int64_t per_block = (total + gridDim.x - 1) / gridDim.x;
    const int64_t end = min(total, (b + 1) * per_block);
    for (int64_t unit = b * per_block + tid; unit < end; unit += blockDim.x) {
      const uint4 d = data[unit];
#pragma unroll
      for (int p = 0; p < N; ++p) {
        if (p == me) continue;
        StVolatileV4(const_cast<char*>(LLSlot<N>(a, a.base[p], parity, me, 2 * unit)), d.x, e,
                     d.y, e);
        StVolatileV4(const_cast<char*>(LLSlot<N>(a, a.base[p], parity, me, 2 * unit + 1)), d.z,
                     e, d.w, e);
      }
    }
  }

  // 2. Receive, reduce in rank order, residual + RMSNorm.
  bool failed = false;
  for (int64_t row = b; row < f.rows; row += gridDim.x) {
    RowInputs<kPer> rin;
    LoadRowInputs<T, kPer>(f, row, rin);
    uint4 sum[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int u = tid + j * blockDim.x;
      if (u >= nunits) continue;
      const size_t unit = static_cast<size_t>(row) * nunits + u;
      uint32_t in[N][4];
#pragma unroll
      for (int r = 0; r < N; ++r) in[r][0] = in[r][1] = in[r][2] = in[r][3] = 0;
      if (!f.pushed) {
        const uint4 mine = data[unit];
#pragma unroll
        for (int r = 0; r < N; ++r) {
          if (r == me) in[r][0] = mine.x, in[r][1] = mine.y, in[r][2] = mine.z, in[r][3] = mine.w;
        }
      }
      if (!failed) failed = !LLReceive<N, 2>(a, parity, 2 * unit, e, b, in, f.pushed);
      sum[j] = SumUnits<T, N>(in);
    }
    NormRow<T, kPer>(f, row, sum, rin, scratch);
  }
  if (f.pushed) internal::GridDependencyWait();
  __syncthreads();
  if (tid == 0) reinterpret_cast<uint32_t*>(my_base + kEpochLLOffset)[b] = e;
}

// Whether a TP 2 fused LL128 call runs the row-pair form (R = 2 below): more
// rows than blocks, and rows of at most 512 units, so a block of one thread
// per unit has the registers for two rows' inputs and the wide unroll.
inline bool LL128NormPairs(int64_t rows, int units_per_row, int blocks) {
  return rows > blocks && units_per_row <= 512;
}
// Lines a thread keeps in flight in the row-pair form (kLL128Unroll's 2 at
// TP 2 otherwise), so a pair's lines take one pass.
inline constexpr int kLL128WideUnroll = 4;

// ---------------------------------------------------------------------------
// LL128 transport: the message goes out as the plain LL128 kernel sends it
// (120-byte lines over the whole grid). A row's bytes span lines that do not
// start at row boundaries, and a line is only known complete to the load
// instruction that read its flag, so the row's owner block reads the row's
// lines whole (8 lanes a line), reduces them in rank order and puts the
// row's sums (rounded to T) into shared memory; the norm then takes unit u
// from there, in AddRmsNorm's thread mapping as the other transports do.
// ---------------------------------------------------------------------------
//
// With R = 2 (LL128NormPairs) a block owns adjacent row pairs 2p, 2p + 1 for
// p = b, b + G, ... and receives a pair's lines in one pass of the wide
// unroll, so a step of 2G rows costs one round trip per block instead of two;
// each row's arithmetic, and so every bit, is the same as with R = 1.
template <typename T, int N, int kPer, int R>
__global__ void __launch_bounds__(R == 1 ? 1024 : 512)
    LL128NormKernel(DeviceArgs a, FusedNormArgs f) {
  SYMTP_TRACE_KERNEL(kFusedNormLL128);
  internal::GridDependencyWait();  // launched with PDL: the previous kernel completes first
  internal::AllowDependentLaunch();  // the next GEMM may start loading its weights
  static_assert(R == 1 || (R == 2 && N == 2));
  constexpr int K = R == 1 ? kLL128Unroll<N> : kLL128WideUnroll;
  __shared__ float scratch[32];
  __shared__ uint4 row_sum[kFusedMaxUnits];  // R rows of at most kFusedMaxUnits / R units
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int u = tid & 7;
  const int me = a.rank;
  const int nunits = f.hidden / (16 / static_cast<int>(sizeof(T)));
  char* const my_base = BaseOf<N>(a, me);
  const uint32_t e = reinterpret_cast<const uint32_t*>(my_base + kEpochLL128Offset)[b] + 1;
  const size_t parity = e & 1;
  const char* const data = static_cast<const char*>(f.data);
  const size_t count = static_cast<size_t>(f.rows) * f.hidden;

  // 1. Send (data is 16-byte aligned: FusesResidualNorm checks it).
  LL128Send<T, N, K>(a, data, count, /*aligned8=*/true, parity, e);

  // 2. Per owned row (R = 1) or row pair (R = 2): receive its lines, reduce
  // into row_sum, residual + RMSNorm.
  const size_t row_bytes = static_cast<size_t>(f.hidden) * sizeof(T);
  const size_t lines_per_pass = blockDim.x / 8;
  bool failed = false;  // warp-uniform
  for (int64_t row = static_cast<int64_t>(b) * R; row < f.rows;
       row += static_cast<int64_t>(gridDim.x) * R) {
    const int nrows = R == 1 ? 1 : static_cast<int>(std::min<int64_t>(R, f.rows - row));
    RowInputs<kPer> rin[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (i < nrows) LoadRowInputs<T, kPer>(f, row + i, rin[i]);
    }
    const size_t r0 = static_cast<size_t>(row) * row_bytes, r1 = r0 + nrows * row_bytes;
    const size_t first = r0 / kLL128DataBytes;
    const size_t last = (r1 + kLL128DataBytes - 1) / kLL128DataBytes;
    for (size_t pass = first; pass < last; pass += K * lines_per_pass) {
      size_t l[K];
      bool active[K];
      uint32_t in[K][N][4];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        l[k] = pass + k * lines_per_pass + (tid >> 3);
        active[k] = l[k] < last;
        const uint4 mine = active[k] ? LoadLL128Unit<T>(data, l[k], u, count, true) : uint4{};
#pragma unroll
        for (int r = 0; r < N; ++r) {
          in[k][r][0] = in[k][r][1] = in[k][r][2] = in[k][r][3] = 0;
          if (r == me)
            in[k][r][0] = mine.x, in[k][r][1] = mine.y, in[k][r][2] = mine.z, in[k][r][3] = mine.w;
        }
      }
      if (!failed) failed = !LL128Receive<N, K>(a, parity, l, active, e, b, in);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (!active[k]) continue;
        uint32_t out[4];
        ReducePacked<T, N, 4>(in[k], out);
        // The unit's 8-byte words that fall in this row go to row_sum.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (u == 7 && h == 1) break;
          const size_t byte = (15 * l[k] + 2 * static_cast<size_t>(u) + h) * 8;
          if (byte >= r0 && byte < r1) {
            reinterpret_cast<uint2*>(row_sum)[(byte - r0) / 8] =
                make_uint2(out[2 * h], out[2 * h + 1]);
          }
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (i >= nrows) break;
      uint4 sum[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int unit = tid + j * blockDim.x;
        if (unit < nunits) sum[j] = row_sum[i * nunits + unit];
      }
      NormRow<T, kPer>(f, row + i, sum, rin[i], scratch);
    }
    __syncthreads();  // row_sum is rewritten by the next row
  }
  __syncthreads();
  if (tid == 0) reinterpret_cast<uint32_t*>(my_base + kEpochLL128Offset)[b] = e;
}

// ---------------------------------------------------------------------------
// COPY transport (the receive side of the copy exchange): every peer's copy
// engine put its chunk into this rank's receive slot for (op, peer) and then
// its step epoch into flags[copy_flag][peer]; wait for every peer's flag to
// reach this rank's step epoch, reduce from own rows and the slots. Nothing
// is sent here. Any grid: block b owns rows b, b + G, ...
// ---------------------------------------------------------------------------
template <typename T, int N, int kPer>
__global__ void __launch_bounds__(1024) CopyNormKernel(DeviceArgs a, FusedNormArgs f) {
  SYMTP_TRACE_KERNEL(kFusedNormCopy);
  internal::GridDependencyWait();  // launched with PDL: the previous kernel completes first
  internal::AllowDependentLaunch();
  __shared__ float scratch[32];
  __shared__ int s_fail;
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int me = a.rank;
  const uint32_t e =
      *reinterpret_cast<const volatile uint32_t*>(BaseOf<N>(a, me) + kCopyEpochOffset);
  if (tid == 0) s_fail = 0;
  RowInputs<kPer> rin;
  if (b < f.rows) LoadRowInputs<T, kPer>(f, b, rin);
  __syncthreads();
  if (tid < N && tid != me &&
      !WaitFlag<N>(a, a.copy_flags_offset, f.copy_flag, tid, e, b, kTagCopy)) {
    s_fail = 1;
  }
  __syncthreads();
  if (s_fail) return;
  const size_t row_bytes = static_cast<size_t>(f.hidden) * sizeof(T);
  const char* src[N];
#pragma unroll
  for (int r = 0; r < N; ++r) {
    src[r] = r == me ? static_cast<const char*>(f.data)
                     : BaseOf<N>(a, me) + CopySlotOffset(a, f.copy_op, me, r) + f.copy_row0 * row_bytes;
  }
  NormRowsFrom<T, N, kPer>(f, src, rin, scratch);
}

template <typename T, int N, int kPer>
cudaError_t LaunchFusedTyped(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                             int threads, cudaStream_t stream) {
  switch (protocol) {
    case Protocol::kStaged:
      return internal::LaunchDependent(StagedNormKernel<T, N, kPer>, dim3(a.staged_blocks),
                                       dim3(threads), 0, stream, a, f);
    case Protocol::kLL:
      return internal::LaunchDependent(LLNormKernel<T, N, kPer>, dim3(a.ll_blocks), dim3(threads),
                                       0, stream, a, f);
    case Protocol::kLL128:
      if constexpr (N == 2 && kPer == 1) {  // a pair's rows have at most 512 units each
        if (LL128NormPairs(f.rows, f.hidden / (16 / static_cast<int>(sizeof(T))),
                           a.ll128_blocks)) {
          return internal::LaunchDependent(LL128NormKernel<T, N, kPer, 2>, dim3(a.ll128_blocks),
                                           dim3(threads), 0, stream, a, f);
        }
      }
      return internal::LaunchDependent(LL128NormKernel<T, N, kPer, 1>, dim3(a.ll128_blocks),
                                       dim3(threads), 0, stream, a, f);
    case Protocol::kCopy: {
      // Enough blocks to fill the GPU a few times over; each waits for the
      // flags once.
      const int blocks = static_cast<int>(std::min<int64_t>(f.rows, 1024));
      return internal::LaunchDependent(CopyNormKernel<T, N, kPer>, dim3(std::max(blocks, 1)),
                                       dim3(threads), 0, stream, a, f);
    }
    case Protocol::kTwoShot:  // no fused form: FusedProtocolFor never picks it
      break;
  }
  return cudaErrorInvalidValue;
}

// Threads per block and units per thread as AddRmsNorm picks them (one or
// two 16-byte units per thread, at most 1024 threads).
template <typename T>
cudaError_t LaunchFusedForSize(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                               cudaStream_t stream) {
  constexpr int kN = 16 / sizeof(T);
  const int nunits = f.hidden / kN;
  const int per = nunits <= 1024 ? 1 : 2;
  const int threads = std::max(32, ((nunits + per - 1) / per + 31) / 32 * 32);
  return ForGroupSize(a, [&](auto n) {
    constexpr int N = decltype(n)::value;
    return per == 1 ? LaunchFusedTyped<T, N, 1>(protocol, a, f, threads, stream)
                    : LaunchFusedTyped<T, N, 2>(protocol, a, f, threads, stream);
  });
}

}  // namespace symtp::kernels::allreduce_internal

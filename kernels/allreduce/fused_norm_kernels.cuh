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
// kernels.cuh): the same LL receive lines and STAGED staging/flags, the same
// per-block epoch counters and the same fixed grids, so fused and plain calls
// interleave on one instance and the double-buffering argument holds
// unchanged (every block of the grid advances its counter on every call, so
// the partition of the lines among blocks may differ from call to call).
//
// Partition: a thread-block cluster of C blocks (C = 1, 2, 4 or 8, chosen
// per call so that rows x C fills the grid) owns whole rows q, q + G / C, ...
// (q = the cluster's index, G = the protocol's grid). Thread t of the
// cluster (block rank x blockDim + threadIdx) owns the row's 16-byte units
// t, t + T, ... (kPer of them; T = C x blockDim = the thread count AddRmsNorm
// uses), and the row's sum of squares is AddRmsNorm's BlockSum tree over the
// T threads, its per-warp partials gathered in the cluster's first block
// through distributed shared memory. So the result is bitwise what the
// all-reduce followed by AddRmsNorm produce, on every rank. The residual and
// the weight of a row are loaded before the wait for the peers' data.
//
// Spins are bounded as in the plain kernels; a thread that gave up records the
// error and stops waiting, and every block still runs every row (so the
// cluster barriers match); outputs are then garbage and Poll() reports it.
#pragma once

#include <cooperative_groups.h>

#include <algorithm>

#include "kernels/allreduce/custom_allreduce_kernels.cuh"
#include "kernels/allreduce/fused_norm_launch.h"
#include "kernels/ops/internal/device_utils.cuh"  // WarpSum: AddRmsNorm's reduction tree

namespace symtp::kernels::allreduce_internal {

// Which rows and units this thread owns (see the partition above).
struct RowSlice {
  int64_t first_row, row_step;
  int t, T;  // thread of the row, threads per row
};

__device__ __forceinline__ RowSlice MySlice() {
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  const int c = static_cast<int>(cl.num_blocks());
  return RowSlice{static_cast<int64_t>(blockIdx.x) / c, static_cast<int64_t>(gridDim.x) / c,
                  static_cast<int>(cl.block_rank()) * static_cast<int>(blockDim.x) +
                      static_cast<int>(threadIdx.x),
                  c * static_cast<int>(blockDim.x)};
}

// BlockSum over the cluster's threads as if they were one block (blockDim a
// multiple of 32): warp sums into the first block's scratch[par], one
// cluster barrier, the same final warp sum on every block. Alternating `par`
// between rows makes the next row's writes wait for this row's reads (they
// come after the next row's barrier).
__device__ __forceinline__ float ClusterSum(float v, float (*scratch)[32], int par) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int lane = threadIdx.x & 31;
  const int wpb = blockDim.x >> 5;
  const int warp = static_cast<int>(cl.block_rank()) * wpb + (threadIdx.x >> 5);
  const int nwarps = static_cast<int>(cl.num_blocks()) * wpb;
  float* lead = cl.map_shared_rank(&scratch[par][0], 0);
  v = internal::WarpSum(v);
  if (lane == 0) lead[warp] = v;
  cl.sync();
  v = lane < nwarps ? lead[lane] : 0.f;
  return internal::WarpSum(v);
}

// The row's residual and weight units of this thread.
template <int kPer>
struct RowInputs {
  uint4 res[kPer], w[kPer];
};

template <int kPer>
__device__ __forceinline__ void LoadRowInputs(const FusedNormArgs& f, int64_t row,
                                              const RowSlice& s, int nunits, int unit_bytes,
                                              RowInputs<kPer>& in) {
  const uint4* res = reinterpret_cast<const uint4*>(static_cast<const char*>(f.residual) +
                                                    row * nunits * unit_bytes);
  const uint4* w4 = reinterpret_cast<const uint4*>(f.weight);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int u = s.t + j * s.T;
    if (u >= nunits) continue;
    in.res[j] = res[u];
    in.w[j] = __ldg(w4 + u);
  }
}

// The epilogue of one row: `sum[j]` holds thread-owned unit j's all-reduced
// 16 bytes (already rounded to T); residual add, RMSNorm, stores.
template <typename T, int kPer>
__device__ __forceinline__ void NormRow(const FusedNormArgs& f, int64_t row, const RowSlice& s,
                                        const uint4 (&sum)[kPer], const RowInputs<kPer>& in,
                                        float (*scratch)[32], int par) {
  using E = Elem<T>;
  constexpr int kN = 16 / sizeof(T);
  constexpr int kW = 4;  // 32-bit words per unit
  const int nunits = f.hidden / kN;
  uint4* res =
      reinterpret_cast<uint4*>(static_cast<char*>(f.residual) + row * f.hidden * sizeof(T));
  float x[kPer][kN];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int u = s.t + j * s.T;
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
  ss = ClusterSum(ss, scratch, par);
  const float inv = rsqrtf(ss / static_cast<float>(f.hidden) + f.eps);
  uint4* o = reinterpret_cast<uint4*>(static_cast<char*>(f.out) + row * f.hidden * sizeof(T));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int u = s.t + j * s.T;
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

// ---------------------------------------------------------------------------
// STAGED transport: copy own units to the own staging buffer, flag every
// peer, wait for every peer's flag, read the units from every rank's staging.
// Block b's units are the same on every rank (same grid and cluster size), so
// flag b covers them.
// ---------------------------------------------------------------------------
template <typename T, int N, int kPer>
__global__ void __launch_bounds__(1024) StagedNormKernel(DeviceArgs a, FusedNormArgs f) {
  constexpr int kN = 16 / sizeof(T);
  __shared__ float scratch[2][32];
  __shared__ int s_fail;
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int me = a.rank;
  const int nunits = f.hidden / kN;
  const RowSlice sl = MySlice();
  char* const my_base = BaseOf<N>(a, me);
  uint32_t* const counter = reinterpret_cast<uint32_t*>(my_base + kEpochStagedOffset) + b;
  if (tid == 0) s_fail = 0;
  const uint32_t e = *counter + 1;
  const size_t parity_off = a.stage_offset + (e & 1) * a.stage_bytes;
  const uint4* data = static_cast<const uint4*>(f.data);

  if (sl.first_row < f.rows) {  // the same for the whole cluster
    uint4* const my_stage = reinterpret_cast<uint4*>(my_base + parity_off);
    for (int64_t r = sl.first_row; r < f.rows; r += sl.row_step) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int u = sl.t + j * sl.T;
        if (u < nunits) my_stage[r * nunits + u] = data[r * nunits + u];
      }
    }
    RowInputs<kPer> in;
    LoadRowInputs<kPer>(f, sl.first_row, sl, nunits, 16, in);
    __syncthreads();
    StagedSignalAndWait<N>(a, b, e, &s_fail);
    __syncthreads();
    const char* stage[N];
#pragma unroll
    for (int r = 0; r < N; ++r) stage[r] = a.base[r] + parity_off;
    int par = 0;
    for (int64_t row = sl.first_row; row < f.rows; row += sl.row_step, par ^= 1) {
      if (row != sl.first_row) LoadRowInputs<kPer>(f, row, sl, nunits, 16, in);
      uint4 sum[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int u = sl.t + j * sl.T;
        if (u >= nunits || s_fail) continue;  // after a timeout the outputs are garbage
        uint32_t in4[N][4];
#pragma unroll
        for (int r = 0; r < N; ++r) {
          const uint4 v = LdCg16(stage[r] + (row * nunits + u) * 16);
          in4[r][0] = v.x, in4[r][1] = v.y, in4[r][2] = v.z, in4[r][3] = v.w;
        }
        sum[j] = SumUnits<T, N>(in4);
      }
      NormRow<T, kPer>(f, row, sl, sum, in, scratch, par);
    }
    cooperative_groups::this_cluster().sync();  // peers may still read our scratch
  }
  __syncthreads();
  if (tid == 0) *counter = e;
}

// ---------------------------------------------------------------------------
// LL transport: each 16-byte unit goes to every peer as two LL lines
// {lo, e, hi, e}; the receiver polls its own lines.
// ---------------------------------------------------------------------------
template <typename T, int N, int kPer>
__global__ void __launch_bounds__(1024) LLNormKernel(DeviceArgs a, FusedNormArgs f) {
  constexpr int kN = 16 / sizeof(T);
  __shared__ float scratch[2][32];
  const int b = blockIdx.x;
  const int me = a.rank;
  const int nunits = f.hidden / kN;
  const RowSlice sl = MySlice();
  char* const my_base = BaseOf<N>(a, me);
  const uint32_t e = reinterpret_cast<const uint32_t*>(my_base + kEpochLLOffset)[b] + 1;
  const size_t parity = e & 1;
  const uint4* data = static_cast<const uint4*>(f.data);
  auto slot = [&](const char* dst_base, int src, size_t line) -> const char* {
    return dst_base + a.ll_offset +
           ((parity * N + static_cast<size_t>(src)) * a.ll_lines + line) * kLLLineBytes;
  };

  // 1. Send every owned unit to every peer.
  for (int64_t row = sl.first_row; row < f.rows; row += sl.row_step) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int u = sl.t + j * sl.T;
      if (u >= nunits) continue;
      const size_t unit = static_cast<size_t>(row) * nunits + u;
      const uint4 d = data[unit];
#pragma unroll
      for (int p = 0; p < N; ++p) {
        if (p == me) continue;
        StVolatileV4(const_cast<char*>(slot(a.base[p], me, 2 * unit)), d.x, e, d.y, e);
        StVolatileV4(const_cast<char*>(slot(a.base[p], me, 2 * unit + 1)), d.z, e, d.w, e);
      }
    }
  }

  // 2. Receive, reduce in rank order, residual + RMSNorm.
  bool failed = false;
  int par = 0;
  for (int64_t row = sl.first_row; row < f.rows; row += sl.row_step, par ^= 1) {
    RowInputs<kPer> in;
    LoadRowInputs<kPer>(f, row, sl, nunits, 16, in);
    uint4 sum[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int u = sl.t + j * sl.T;
      if (u >= nunits) continue;
      const size_t unit = static_cast<size_t>(row) * nunits + u;
      uint32_t in4[N][4];
      bool ready[N];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        ready[r] = r == me;
        in4[r][0] = in4[r][1] = in4[r][2] = in4[r][3] = 0;
      }
      const uint4 mine = data[unit];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        if (r == me) in4[r][0] = mine.x, in4[r][1] = mine.y, in4[r][2] = mine.z, in4[r][3] = mine.w;
      }
      SpinBound bound;
      while (!failed) {
        bool all = true;
        int missing = -1;
#pragma unroll
        for (int r = 0; r < N; ++r) {
          if (ready[r]) continue;
          const uint4 lo = LdVolatileV4(slot(my_base, r, 2 * unit));
          const uint4 hi = LdVolatileV4(slot(my_base, r, 2 * unit + 1));
          if (lo.y == e && lo.w == e && hi.y == e && hi.w == e) {
            in4[r][0] = lo.x, in4[r][1] = lo.z, in4[r][2] = hi.x, in4[r][3] = hi.z;
            ready[r] = true;
          } else {
            all = false;
            if (missing < 0) missing = r;
          }
        }
        if (all) break;
        if (const uint32_t err = bound.Check(a)) {
          RecordError<N>(a, err, missing, kTagLL, b, e);
          failed = true;
        }
      }
      sum[j] = SumUnits<T, N>(in4);
    }
    NormRow<T, kPer>(f, row, sl, sum, in, scratch, par);
  }
  if (sl.first_row < f.rows) cooperative_groups::this_cluster().sync();  // scratch stays live
  __syncthreads();
  if (threadIdx.x == 0) reinterpret_cast<uint32_t*>(my_base + kEpochLLOffset)[b] = e;
}

template <typename T, int N, int kPer>
cudaError_t LaunchFusedTyped(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                             int threads, int cluster, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(protocol == Protocol::kStaged ? a.staged_blocks : a.ll_blocks);
  cfg.blockDim = dim3(threads / cluster);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return protocol == Protocol::kStaged
             ? cudaLaunchKernelEx(&cfg, StagedNormKernel<T, N, kPer>, a, f)
             : cudaLaunchKernelEx(&cfg, LLNormKernel<T, N, kPer>, a, f);
}

// Threads per row and units per thread as AddRmsNorm picks them (one or two
// 16-byte units per thread, at most 1024 threads); the cluster size is the
// largest of 1, 2, 4, 8 that keeps rows x C within the grid, divides the grid
// and leaves whole warps per block.
template <typename T>
cudaError_t LaunchFusedForSize(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                               cudaStream_t stream) {
  constexpr int kN = 16 / sizeof(T);
  const int nunits = f.hidden / kN;
  const int per = nunits <= 1024 ? 1 : 2;
  const int threads = std::max(32, ((nunits + per - 1) / per + 31) / 32 * 32);
  const int grid = protocol == Protocol::kStaged ? a.staged_blocks : a.ll_blocks;
  int cluster = 1;
  while (cluster < 8 && f.rows * 2 * cluster <= grid && grid % (2 * cluster) == 0 &&
         threads % (64 * cluster) == 0) {
    cluster *= 2;
  }
  return ForGroupSize(a, [&](auto n) {
    constexpr int N = decltype(n)::value;
    return per == 1 ? LaunchFusedTyped<T, N, 1>(protocol, a, f, threads, cluster, stream)
                    : LaunchFusedTyped<T, N, 2>(protocol, a, f, threads, cluster, stream);
  });
}

}  // namespace symtp::kernels::allreduce_internal

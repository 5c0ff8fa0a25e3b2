// The warp-streamed decode attention kernel (PagedAttentionArgs::decode_kernel
// = kWarpStreamed), included by one .cu per dtype.
//
// One query token per item. A block = (item, kv head, split), 4 warps; each
// warp streams its own 32-key chunks of the split's key range with no block
// barrier in the loop: lane l scores key (chunk + l) for all G q heads of the
// group (its K row read with 16-byte loads, q broadcast from shared memory),
// the warp runs the online softmax with shuffles, then P·V with lane l owning
// columns [l*D/32, (l+1)*D/32). The 4 warps' (max, sum, acc) are merged in
// shared memory at the end and written like the tiled kernel's output, so
// the split-K merge kernel is shared. Verified on an H200 (the attention
// tests run every decode kernel).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/internal/attention_epilogue.cuh"
#include "kernels/ops/internal/device_utils.cuh"

namespace symtp::kernels::internal {

constexpr int kWarpDecodeThreads = 128;
constexpr int kWarpDecodeWarps = kWarpDecodeThreads / 32;

template <int kBytes>
struct VecOf;
template <>
struct VecOf<16> {
  using type = uint4;
};
template <>
struct VecOf<8> {
  using type = uint2;
};
template <>
struct VecOf<4> {
  using type = unsigned int;
};
template <>
struct VecOf<2> {
  using type = unsigned short;
};

template <typename T, int D, int kMaxG>
__global__ void __launch_bounds__(kWarpDecodeThreads, kMaxG <= 4 ? 4 : 3)
    WarpDecodeAttentionKernel(const PagedAttentionArgs a) {
  constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));  // per uint4
  constexpr int kChunksPerRow = D / kElemsPerChunk;
  constexpr int kSegChunks = kChunksPerRow < 8 ? kChunksPerRow : 8;
  constexpr int kSegs = kChunksPerRow / kSegChunks;
  constexpr int kVE = D / 32;  // V columns per lane
  constexpr int kVBytes = kVE * static_cast<int>(sizeof(T));
  using VT = typename VecOf<kVBytes>::type;
  static_assert(kChunksPerRow % kSegChunks == 0, "segments");

  __shared__ __align__(16) float q_s[kMaxG * D];
  __shared__ float wacc_s[kWarpDecodeWarps][kMaxG][D];
  __shared__ float wm_s[kWarpDecodeWarps][kMaxG];
  __shared__ float wl_s[kWarpDecodeWarps][kMaxG];
  __shared__ float merge_s[kWarpDecodeWarps * kMaxG + 2 * kMaxG];

  const AttentionItem item = a.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int group = a.num_q_heads / a.num_kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = item.token_begin;
  const int pos = item.num_tokens > 0 ? a.positions[t] : -1;
  const int key_end = pos + 1;
  int kb = 0, ke = key_end;
  if (a.num_splits > 1) {
    const int chunk = SplitChunk(a);
    kb = split * chunk;
    ke = min(key_end, kb + chunk);
    if (kb >= ke) return;  // block-uniform; the merge skips this split
  }
  if (item.num_tokens <= 0) return;

  const T* q = static_cast<const T*>(a.q);
  for (int idx = tid; idx < group * D; idx += kWarpDecodeThreads) {
    const int g = idx / D, d = idx - (idx / D) * D;
    q_s[idx] =
        ToFloat<T>(q[t * a.q_row_stride + static_cast<int64_t>(kvh * group + g) * D + d]) * a.scale;
  }
  __syncthreads();

  const int32_t* table = a.block_tables + static_cast<int64_t>(item.seq) * a.block_table_stride;
  const uint4* kc4 = static_cast<const uint4*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  const int bs = a.block_size;
  const int nkv = a.num_kv_heads;

  float m_run[kMaxG], l_lane[kMaxG], acc[kMaxG][kVE];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    m_run[g] = -INFINITY;
    l_lane[g] = 0.f;
#pragma unroll
    for (int e = 0; e < kVE; ++e) acc[g][e] = 0.f;
  }

  for (int base = kb + warp * 32; base < ke; base += kWarpDecodeWarps * 32) {
    const int key = base + lane;
    const bool valid = key < ke;
    const int64_t slot = valid ? static_cast<int64_t>(table[key / bs]) * bs + key % bs : 0;
    // Scores of this lane's key for every q head of the group.
    float s[kMaxG];
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) s[g] = 0.f;
    if (valid) {
      const uint4* krow = kc4 + (slot * nkv + kvh) * kChunksPerRow;
#pragma unroll
      for (int seg = 0; seg < kSegs; ++seg) {
        uint4 kr[kSegChunks];
#pragma unroll
        for (int c = 0; c < kSegChunks; ++c) kr[c] = __ldg(krow + seg * kSegChunks + c);
#pragma unroll
        for (int c = 0; c < kSegChunks; ++c) {
          T kv[kElemsPerChunk];
          memcpy(kv, &kr[c], 16);
          const int d0 = (seg * kSegChunks + c) * kElemsPerChunk;
#pragma unroll
          for (int g = 0; g < kMaxG; ++g) {
            if (g < group) {
              const float4* q4 = reinterpret_cast<const float4*>(q_s + g * D + d0);
#pragma unroll
              for (int e4 = 0; e4 < kElemsPerChunk / 4; ++e4) {
                const float4 qq = q4[e4];
                s[g] = fmaf(qq.x, ToFloat<T>(kv[4 * e4 + 0]), s[g]);
                s[g] = fmaf(qq.y, ToFloat<T>(kv[4 * e4 + 1]), s[g]);
                s[g] = fmaf(qq.z, ToFloat<T>(kv[4 * e4 + 2]), s[g]);
                s[g] = fmaf(qq.w, ToFloat<T>(kv[4 * e4 + 3]), s[g]);
              }
            }
          }
        }
      }
    }
    // Online softmax per q head (warp-uniform max; per-lane partial sums).
    float p[kMaxG];
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      p[g] = 0.f;
      if (g < group) {
        const float mt = WarpMax(valid ? s[g] : -INFINITY);
        const float mn = fmaxf(m_run[g], mt);
        float alpha = 1.f;
        if (mn != -INFINITY) {
          alpha = expf(m_run[g] - mn);
          p[g] = valid ? expf(s[g] - mn) : 0.f;
        }
        l_lane[g] = l_lane[g] * alpha + p[g];
        m_run[g] = mn;
#pragma unroll
        for (int e = 0; e < kVE; ++e) acc[g][e] *= alpha;
      }
    }
    // P·V: key j's weights and slot come from lane j.
    const int nvalid = min(32, ke - base);
#pragma unroll
    for (int jb = 0; jb < 32; jb += 8) {
      if (jb >= nvalid) break;
      VT vraw[8];
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int64_t sj = __shfl_sync(0xffffffffu, slot, jb + jj);
        if (jb + jj < nvalid) {
          vraw[jj] = __ldg(reinterpret_cast<const VT*>(vc + (sj * nkv + kvh) * D + lane * kVE));
        }
      }
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        if (jb + jj < nvalid) {
          T vv[kVE];
          memcpy(vv, &vraw[jj], kVBytes);
#pragma unroll
          for (int g = 0; g < kMaxG; ++g) {
            if (g < group) {
              const float pj = __shfl_sync(0xffffffffu, p[g], jb + jj);
#pragma unroll
              for (int e = 0; e < kVE; ++e) acc[g][e] = fmaf(pj, ToFloat<T>(vv[e]), acc[g][e]);
            }
          }
        }
      }
    }
  }

  // Merge the warps.
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    if (g < group) {
      const float l = WarpSum(l_lane[g]);
      if (lane == 0) {
        wm_s[warp][g] = m_run[g];
        wl_s[warp][g] = l;
      }
#pragma unroll
      for (int e = 0; e < kVE; ++e) wacc_s[warp][g][lane * kVE + e] = acc[g][e];
    }
  }
  __syncthreads();
  MergeSlicesAndStore<T, D>(a, t, kvh, split, group, group, kWarpDecodeWarps, kMaxG, &wm_s[0][0],
                            &wl_s[0][0], &wacc_s[0][0][0], merge_s);
}

template <typename T, int D, int kMaxG>
absl::Status LaunchWarpDecodeT(const PagedAttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(a.num_splits));
  WarpDecodeAttentionKernel<T, D, kMaxG><<<grid, kWarpDecodeThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchWarpDecodeDispatch(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int group = a.num_q_heads / a.num_kv_heads;
  const bool g4 = group <= 4;
  switch (a.head_dim) {
    case 32:
      return g4 ? LaunchWarpDecodeT<T, 32, 4>(a, stream) : LaunchWarpDecodeT<T, 32, 8>(a, stream);
    case 64:
      return g4 ? LaunchWarpDecodeT<T, 64, 4>(a, stream) : LaunchWarpDecodeT<T, 64, 8>(a, stream);
    case 128:
      return g4 ? LaunchWarpDecodeT<T, 128, 4>(a, stream) : LaunchWarpDecodeT<T, 128, 8>(a, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", a.head_dim));
  }
}

}  // namespace symtp::kernels::internal

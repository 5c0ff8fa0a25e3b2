// The paged-attention kernel template (kernels/ops/attention.h), included by
// one .cu per dtype so that the instantiations compile in parallel.
//
// A block = (item, kv head, split), 128 threads. Rows r = (token i of the
// item, q head g of the group): R = num_tokens * G <= kMaxRows. Keys are
// walked in tiles of 16: the next tile's K/V are loaded into registers
// (16-byte loads) while the current tile is processed from shared memory;
// scores, an online (flash) softmax per row and the P·V update run with fp32
// arithmetic. Thread (d, rs) owns output column d of rows rs, rs+nrs, ...
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/internal/device_utils.cuh"

namespace symtp::kernels::internal {

constexpr int kAttnThreads = 128;
constexpr int kAttnTile = 16;

template <typename T, int D, int kMaxRows>
struct AttnSmem {
  static constexpr int kRowPitch = D + 16 / static_cast<int>(sizeof(T));  // elements, 16 B pad
  static constexpr int kSPitch = kAttnTile + 1;
  static constexpr size_t kQ = sizeof(float) * kMaxRows * D;
  static constexpr size_t kKV = sizeof(T) * kAttnTile * kRowPitch;
  static constexpr size_t kS = sizeof(float) * kMaxRows * kSPitch;
  static constexpr size_t kRows = sizeof(float) * kMaxRows;
  static constexpr size_t kBytes = kQ + 2 * kKV + kS + 3 * kRows + sizeof(int) * kMaxRows;
};

template <typename T, int D>
__device__ __forceinline__ float DotQK(const float* __restrict__ q, const T* __restrict__ k) {
  float acc = 0.f;
  const float4* q4 = reinterpret_cast<const float4*>(q);
  if constexpr (sizeof(T) == 4) {
    const float4* k4 = reinterpret_cast<const float4*>(k);
#pragma unroll
    for (int c = 0; c < D / 4; ++c) {
      const float4 a = q4[c], b = k4[c];
      acc = fmaf(a.x, b.x, acc);
      acc = fmaf(a.y, b.y, acc);
      acc = fmaf(a.z, b.z, acc);
      acc = fmaf(a.w, b.w, acc);
    }
  } else {
    const uint4* k8 = reinterpret_cast<const uint4*>(k);
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      const uint4 raw = k8[c];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
      const float4 a0 = q4[2 * c], a1 = q4[2 * c + 1];
      const float2 f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
      const float2 f2 = __bfloat1622float2(h[2]), f3 = __bfloat1622float2(h[3]);
      acc = fmaf(a0.x, f0.x, acc);
      acc = fmaf(a0.y, f0.y, acc);
      acc = fmaf(a0.z, f1.x, acc);
      acc = fmaf(a0.w, f1.y, acc);
      acc = fmaf(a1.x, f2.x, acc);
      acc = fmaf(a1.y, f2.y, acc);
      acc = fmaf(a1.z, f3.x, acc);
      acc = fmaf(a1.w, f3.y, acc);
    }
  }
  return acc;
}

template <typename T, int D, int kMaxRows>
__global__ void __launch_bounds__(kAttnThreads) PagedAttentionKernel(const PagedAttentionArgs a) {
  static_assert(D % 8 == 0 && kAttnThreads % D == 0, "head_dim must divide 128");
  using S = AttnSmem<T, D, kMaxRows>;
  constexpr int kNrs = kAttnThreads / D;                  // row subsets
  constexpr int kRowsPerThread = kMaxRows / kNrs;         // accumulators per thread
  constexpr int kChunksPerRow = D * sizeof(T) / 16;       // 16-byte chunks per key row
  constexpr int kTileChunks = kAttnTile * kChunksPerRow;  // per tile, K (and again V)
  constexpr int kLoads = (kTileChunks + kAttnThreads - 1) / kAttnThreads;
  constexpr int kPairs = kMaxRows * kAttnTile;
  constexpr int kPairIters = (kPairs + kAttnThreads - 1) / kAttnThreads;
  static_assert(kMaxRows % kNrs == 0, "rows must split evenly");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* q_s = reinterpret_cast<float*>(smem_raw);
  T* k_s = reinterpret_cast<T*>(smem_raw + S::kQ);
  T* v_s = reinterpret_cast<T*>(smem_raw + S::kQ + S::kKV);
  float* s_s = reinterpret_cast<float*>(smem_raw + S::kQ + 2 * S::kKV);
  float* m_s = reinterpret_cast<float*>(smem_raw + S::kQ + 2 * S::kKV + S::kS);
  float* l_s = m_s + kMaxRows;
  float* alpha_s = l_s + kMaxRows;
  int* pos_s = reinterpret_cast<int*>(alpha_s + kMaxRows);

  const AttentionItem item = a.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int group = a.num_q_heads / a.num_kv_heads;
  const int ntok = item.num_tokens;
  const int rows = ntok * group;
  const int tid = threadIdx.x;

  if (tid < kMaxRows) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
    pos_s[tid] = tid < rows ? a.positions[item.token_begin + tid / group] : -1;
  }
  const T* q = static_cast<const T*>(a.q);
  for (int idx = tid; idx < rows * D; idx += kAttnThreads) {
    const int r = idx / D, d = idx - (idx / D) * D;
    const int64_t t = item.token_begin + r / group;
    const int qh = kvh * group + r % group;
    q_s[r * D + d] = ToFloat<T>(q[t * a.q_row_stride + static_cast<int64_t>(qh) * D + d]) * a.scale;
  }
  __syncthreads();

  int max_pos = -1;
  for (int i = 0; i < ntok; ++i) max_pos = max(max_pos, pos_s[i * group]);
  const int key_end = max_pos + 1;
  int kb = 0, ke = key_end;
  const int chunk = a.num_splits > 1 ? SplitChunk(a) : 0;
  if (a.num_splits > 1) {
    kb = split * chunk;
    ke = min(key_end, kb + chunk);
    if (kb >= ke) return;  // block-uniform: nothing in this split; the merge skips it
  }

  const int32_t* table = a.block_tables + static_cast<int64_t>(item.seq) * a.block_table_stride;
  const uint4* kc4 = static_cast<const uint4*>(a.k_cache);
  const uint4* vc4 = static_cast<const uint4*>(a.v_cache);
  const int bs = a.block_size;
  const int64_t slot_chunks = static_cast<int64_t>(a.num_kv_heads) * kChunksPerRow;

  uint4 kreg[kLoads], vreg[kLoads];
  auto load_tile = [&](int t0) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int c = tid + u * kAttnThreads;
      if (c < kTileChunks) {
        const int j = c / kChunksPerRow, cc = c - (c / kChunksPerRow) * kChunksPerRow;
        const int key = t0 + j;
        if (key < ke) {
          const int64_t slot = static_cast<int64_t>(table[key / bs]) * bs + key % bs;
          const int64_t off = slot * slot_chunks + static_cast<int64_t>(kvh) * kChunksPerRow + cc;
          kreg[u] = __ldg(kc4 + off);
          vreg[u] = __ldg(vc4 + off);
        }
      }
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int c = tid + u * kAttnThreads;
      if (c < kTileChunks) {
        const int j = c / kChunksPerRow, cc = c - (c / kChunksPerRow) * kChunksPerRow;
        reinterpret_cast<uint4*>(k_s + j * S::kRowPitch)[cc] = kreg[u];
        reinterpret_cast<uint4*>(v_s + j * S::kRowPitch)[cc] = vreg[u];
      }
    }
  };

  const int d = tid % D;
  const int rs = tid / D;
  float acc[kRowsPerThread];
#pragma unroll
  for (int u = 0; u < kRowsPerThread; ++u) acc[u] = 0.f;

  if (kb < ke) load_tile(kb);
  for (int t0 = kb; t0 < ke; t0 += kAttnTile) {
    __syncthreads();  // the previous tile's P·V is done with k_s / v_s
    store_tile();
    __syncthreads();
    if (t0 + kAttnTile < ke) load_tile(t0 + kAttnTile);  // in flight during this tile
    const int nvalid = min(kAttnTile, ke - t0);

    // Scores s[r][j] = q_r · k_j (q pre-scaled), -inf where masked.
#pragma unroll
    for (int u = 0; u < kPairIters; ++u) {
      const int idx = tid + u * kAttnThreads;
      const int r = idx / kAttnTile, j = idx % kAttnTile;
      if (r < rows) {
        float s = -INFINITY;
        if (j < nvalid && t0 + j <= pos_s[r]) {
          s = DotQK<T, D>(q_s + r * D, k_s + j * S::kRowPitch);
        }
        s_s[r * S::kSPitch + j] = s;
      }
    }
    __syncthreads();

    // Online softmax, one thread per row.
    if (tid < rows) {
      float* srow = s_s + tid * S::kSPitch;
      const float m_old = m_s[tid];
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kAttnTile; ++j) mx = fmaxf(mx, srow[j]);
      const float m_new = fmaxf(m_old, mx);
      float alpha = 1.f, psum = 0.f;
      if (m_new == -INFINITY) {
#pragma unroll
        for (int j = 0; j < kAttnTile; ++j) srow[j] = 0.f;
      } else {
        alpha = expf(m_old - m_new);
#pragma unroll
        for (int j = 0; j < kAttnTile; ++j) {
          const float p = expf(srow[j] - m_new);
          srow[j] = p;
          psum += p;
        }
      }
      l_s[tid] = l_s[tid] * alpha + psum;
      m_s[tid] = m_new;
      alpha_s[tid] = alpha;
    }
    __syncthreads();

    // acc[r][d] = acc * alpha_r + sum_j p[r][j] v[j][d].
#pragma unroll
    for (int u = 0; u < kRowsPerThread; ++u) {
      const int r = rs + u * kNrs;
      if (r < rows) {
        const float* prow = s_s + r * S::kSPitch;
        float x = acc[u] * alpha_s[r];
        for (int j = 0; j < nvalid; ++j)
          x = fmaf(prow[j], ToFloat<T>(v_s[j * S::kRowPitch + d]), x);
        acc[u] = x;
      }
    }
  }
  __syncthreads();  // m_s / l_s final for every row

  const int64_t out_ld = static_cast<int64_t>(a.num_q_heads) * D;
  if (a.num_splits <= 1) {
    T* out = static_cast<T*>(a.out);
#pragma unroll
    for (int u = 0; u < kRowsPerThread; ++u) {
      const int r = rs + u * kNrs;
      if (r < rows) {
        const int64_t t = item.token_begin + r / group;
        const int qh = kvh * group + r % group;
        const float l = l_s[r];
        out[t * out_ld + static_cast<int64_t>(qh) * D + d] =
            FromFloat<T>(l > 0.f ? acc[u] / l : 0.f);
      }
    }
  } else {
    // A row whose keys all lie in split 0 is stored normalized, as without
    // split-K; the merge kernel skips its token (the same bits).
    T* out = static_cast<T*>(a.out);
    float* part = static_cast<float*>(a.workspace);
    float2* ml = reinterpret_cast<float2*>(part + static_cast<int64_t>(a.num_tokens) *
                                                      a.num_q_heads * a.num_splits * D);
#pragma unroll
    for (int u = 0; u < kRowsPerThread; ++u) {
      const int r = rs + u * kNrs;
      if (r < rows) {
        const int64_t t = item.token_begin + r / group;
        const int qh = kvh * group + r % group;
        if (split == 0 && Split0StoresRow(pos_s[r], chunk)) {
          const float l = l_s[r];
          out[t * out_ld + static_cast<int64_t>(qh) * D + d] =
              FromFloat<T>(l > 0.f ? acc[u] / l : 0.f);
          continue;
        }
        const int64_t base = (t * a.num_q_heads + qh) * a.num_splits + split;
        part[base * D + d] = acc[u];
      }
    }
    if (tid < rows && !(split == 0 && Split0StoresRow(pos_s[tid], chunk))) {
      const int64_t t = item.token_begin + tid / group;
      const int qh = kvh * group + tid % group;
      ml[(t * a.num_q_heads + qh) * a.num_splits + split] = make_float2(m_s[tid], l_s[tid]);
    }
  }
}

template <typename T, int D, int kMaxRows>
absl::Status LaunchPagedAttentionT(const PagedAttentionArgs& a, cudaStream_t stream) {
  using S = AttnSmem<T, D, kMaxRows>;
  auto kernel = PagedAttentionKernel<T, D, kMaxRows>;
  if (S::kBytes > 48 * 1024) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(S::kBytes)));
  }
  const dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(a.num_splits));
  kernel<<<grid, kAttnThreads, S::kBytes, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchPagedAttentionDispatch(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int group = a.num_q_heads / a.num_kv_heads;
  const int rows = group * a.max_item_tokens;
  const bool small = rows <= 8;
  if (rows > 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedAttention: %d query rows per block (group %d x %d tokens) > 64", rows,
                        group, a.max_item_tokens));
  }
  switch (a.head_dim) {
    case 32:
      return small ? LaunchPagedAttentionT<T, 32, 8>(a, stream)
                   : LaunchPagedAttentionT<T, 32, 64>(a, stream);
    case 64:
      return small ? LaunchPagedAttentionT<T, 64, 8>(a, stream)
                   : LaunchPagedAttentionT<T, 64, 64>(a, stream);
    case 128:
      return small ? LaunchPagedAttentionT<T, 128, 8>(a, stream)
                   : LaunchPagedAttentionT<T, 128, 64>(a, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: head_dim %d not supported (32, 64, 128)", a.head_dim));
  }
}

}  // namespace symtp::kernels::internal

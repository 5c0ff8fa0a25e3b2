// The end of the tensor-core attention kernels: merge the per-warp
// (key-slice) softmax states of every row and store the row the way the
// tiled kernel does, so one split-K merge kernel serves every kernel.
#pragma once

#include <cstdint>

#include "kernels/ops/attention.h"
#include "kernels/ops/internal/device_utils.cuh"

namespace symtp::kernels::internal {

// Row r (token token_begin + r / group, q head kvh * group + r % group) of
// slice s has its max, sum and unnormalized accumulator at index
// s * slice_rows + r of wm / wl and of wacc's D-float rows; a slice that saw
// no key of the row holds (-inf, 0, 0). Without split-K, or when the row's
// keys all lie in split 0 (the merge kernel skips such tokens), the
// normalized row goes to a.out; otherwise this split's accumulator and
// (max, sum) go to the workspace. `scratch` holds nslices * slice_rows +
// 2 * rows floats of shared memory. Call from every thread of the block
// after a barrier.
//
// Each row's slice weights e^(m_s - M) and denominator are computed once
// (first pass, a thread per row) instead of once per output element: at
// small batch the per-element exps were an eighth of the tensor-core decode
// kernel's stall samples. Same operations in the same order as the
// per-element form, so the same bits.
template <typename T, int D>
__device__ __forceinline__ void MergeSlicesAndStore(const PagedAttentionArgs& a,
                                                    int64_t token_begin, int kvh, int split,
                                                    int group, int rows, int nslices,
                                                    int slice_rows, const float* wm,
                                                    const float* wl, const float* wacc,
                                                    float* scratch) {
  float* wf = scratch;                         // [s * slice_rows + r]: weight of slice s
  float* wden = scratch + nslices * slice_rows;  // [r]
  float* wmax = wden + rows;                     // [r]
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    float m = -INFINITY;
    for (int s = 0; s < nslices; ++s) m = fmaxf(m, wm[s * slice_rows + r]);
    float den = 0.f;
    for (int s = 0; s < nslices; ++s) {
      const int i = s * slice_rows + r;
      float f = 0.f;
      if (m != -INFINITY && wm[i] != -INFINITY) {
        f = expf(wm[i] - m);
        den = fmaf(wl[i], f, den);
      }
      wf[i] = f;
    }
    wden[r] = den;
    wmax[r] = m;
  }
  __syncthreads();
  const int64_t out_ld = static_cast<int64_t>(a.num_q_heads) * D;
  const int chunk = a.num_splits > 1 ? SplitChunk(a) : 0;
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - (idx / D) * D;
    const float m = wmax[r], den = wden[r];
    float num = 0.f;
    if (m != -INFINITY) {
      for (int s = 0; s < nslices; ++s) {
        const int i = s * slice_rows + r;
        if (wm[i] == -INFINITY) continue;
        num = fmaf(wacc[static_cast<int64_t>(i) * D + d], wf[i], num);
      }
    }
    const int64_t t = token_begin + r / group;
    const int qh = kvh * group + r % group;
    if (a.num_splits <= 1 || (split == 0 && Split0StoresRow(a.positions[t], chunk))) {
      static_cast<T*>(a.out)[t * out_ld + static_cast<int64_t>(qh) * D + d] =
          FromFloat<T>(den > 0.f ? num / den : 0.f);
    } else {
      float* part = static_cast<float*>(a.workspace);
      float2* ml = reinterpret_cast<float2*>(part + static_cast<int64_t>(a.num_tokens) *
                                                        a.num_q_heads * a.num_splits * D);
      const int64_t b = (t * a.num_q_heads + qh) * a.num_splits + split;
      part[b * D + d] = num;
      if (d == 0) ml[b] = make_float2(m, den);
    }
  }
}

}  // namespace symtp::kernels::internal

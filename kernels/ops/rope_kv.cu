// RoPE table and rotation, paged KV-cache write (kernels/ops/layer_ops.h).
#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/internal/device_utils.cuh"
#include "kernels/ops/layer_ops.h"

namespace symtp::kernels {
namespace {

using internal::Aligned16;

using internal::FromFloat;
using internal::ToFloat;

__global__ void RopeTableKernel(double2* __restrict__ table, int max_pos, int head_dim,
                                double theta) {
  const int half = head_dim / 2;
  const int64_t total = static_cast<int64_t>(max_pos) * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int p = static_cast<int>(idx / half), i = static_cast<int>(idx % half);
    // Same expression order as model::cpu::RopeTable.
    const double f = pow(theta, -2.0 * i / head_dim);
    const double a = __dmul_rn(static_cast<double>(p), f);
    double s, c;
    sincos(a, &s, &c);
    table[idx] = make_double2(c, s);
  }
}

// Copies `width` elements from src to dst (16-byte chunks when kVec), thread
// `tid` of `nthreads`.
template <typename T, bool kVec>
__device__ __forceinline__ void CopyRow(const T* __restrict__ src, T* __restrict__ dst, int width,
                                        int tid, int nthreads) {
  if constexpr (kVec) {
    const int n = width * static_cast<int>(sizeof(T)) / 16;
    for (int i = tid; i < n; i += nthreads) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
    for (int i = tid; i < width; i += nthreads) dst[i] = src[i];
  }
}

// One row per block of head_dim/2 x H threads: thread (i, y) takes pair i
// (x[i], x[i + D/2]) of heads y, y + H, ... Rotates heads [0, rot_heads) of
// the row in place; with kWriteKv the row is a packed qkv row (q heads, then
// num_kv_heads k heads, then as many v heads) whose k heads (after rotation)
// and v heads also go to the cache slot slots[r] (skipped when negative). A
// position outside [0, max_pos) leaves the row unrotated (k still cached).
// The row's values are loaded up to kU heads at a time, before any is
// stored, and the table entry once per thread. With norm_x (kWriteKv only),
// the row's values are first multiplied by its deferred RMSNorm factor
// (layer_ops.h DeferredNorm).
template <typename T, bool kWriteKv, bool kVec>
__global__ void RopeKvKernel(T* __restrict__ x, int64_t row_stride, int rot_heads, int head_dim,
                             const int32_t* __restrict__ positions,
                             const double2* __restrict__ table, int max_pos, int num_q_heads,
                             int num_kv_heads, const int32_t* __restrict__ slots,
                             T* __restrict__ k_cache, T* __restrict__ v_cache,
                             const T* __restrict__ norm_x, int norm_hidden, float norm_eps) {
  SYMTP_TRACE_KERNEL(kRopeKv);
  // The attention kernel after it may start now: it loads the older keys,
  // which this kernel does not write, before it waits for it.
  internal::AllowDependentLaunch();
  internal::GridDependencyWait();
  constexpr int kU = 8;
  const int64_t r = blockIdx.x;
  const int i = threadIdx.x, half = blockDim.x;
  __shared__ float scratch[32];
  const bool scaled = kWriteKv && norm_x != nullptr;
  const float scale =
      scaled ? internal::BlockRowRms(norm_x + r * norm_hidden, norm_hidden, norm_eps, scratch)
             : 1.f;
  const int pos = positions[r];
  const int32_t slot = kWriteKv ? slots[r] : -1;
  const int width = num_kv_heads * head_dim;
  T* row = x + r * row_stride;
  T* kd = kWriteKv && slot >= 0 ? k_cache + static_cast<int64_t>(slot) * width : nullptr;
  // Heads this block touches: every head to rotate, and the k heads when
  // they go to the cache unrotated.
  const bool rotate = pos >= 0 && pos < max_pos;
  const int heads = rotate ? rot_heads : (kd != nullptr ? num_q_heads + num_kv_heads : 0);
  const int h_begin = rotate ? 0 : num_q_heads;
  const double2 cs = rotate ? table[static_cast<int64_t>(pos) * half + i] : double2{1.0, 0.0};
  for (int h0 = h_begin + static_cast<int>(threadIdx.y); h0 < heads; h0 += kU * blockDim.y) {
    T a[kU], b[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int h = h0 + u * static_cast<int>(blockDim.y);
      if (h < heads) {
        a[u] = row[h * head_dim + i];
        b[u] = row[h * head_dim + i + half];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int h = h0 + u * static_cast<int>(blockDim.y);
      if (h >= heads) continue;
      T t0 = a[u], t1 = b[u];
      if (scaled && !rotate) {  // k heads to the cache, unrotated
        t0 = FromFloat<T>(ToFloat<T>(a[u]) * scale);
        t1 = FromFloat<T>(ToFloat<T>(b[u]) * scale);
      }
      if (rotate) {
        const double x0 = ToFloat<T>(a[u]) * scale, x1 = ToFloat<T>(b[u]) * scale;
        // No contraction into FMAs: the CPU reference rounds each product.
        const double o0 = __dsub_rn(__dmul_rn(x0, cs.x), __dmul_rn(x1, cs.y));
        const double o1 = __dadd_rn(__dmul_rn(x1, cs.x), __dmul_rn(x0, cs.y));
        t0 = FromFloat<T>(__double2float_rn(o0));
        t1 = FromFloat<T>(__double2float_rn(o1));
        row[h * head_dim + i] = t0;
        row[h * head_dim + i + half] = t1;
      }
      if (kd != nullptr && h >= num_q_heads) {
        T* kh = kd + (h - num_q_heads) * head_dim;
        kh[i] = t0;
        kh[i + half] = t1;
      }
    }
  }
  if constexpr (kWriteKv) {
    if (slot < 0) return;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const T* v = row + static_cast<int64_t>(num_q_heads + num_kv_heads) * head_dim;
    T* vd = v_cache + static_cast<int64_t>(slot) * width;
    if (scaled) {
      for (int j = tid; j < width; j += blockDim.x * blockDim.y) {
        vd[j] = FromFloat<T>(ToFloat<T>(v[j]) * scale);
      }
    } else {
      CopyRow<T, kVec>(v, vd, width, tid, blockDim.x * blockDim.y);
    }
  }
}

template <typename T, bool kVec>
__global__ void KvWriteKernel(const T* __restrict__ k, const T* __restrict__ v, int64_t row_stride,
                              const int32_t* __restrict__ slots, T* __restrict__ k_cache,
                              T* __restrict__ v_cache, int width) {
  const int64_t r = blockIdx.x;
  const int32_t slot = slots[r];
  if (slot < 0) return;
  CopyRow<T, kVec>(k + r * row_stride, k_cache + static_cast<int64_t>(slot) * width, width,
                   threadIdx.x, blockDim.x);
  CopyRow<T, kVec>(v + r * row_stride, v_cache + static_cast<int64_t>(slot) * width, width,
                   threadIdx.x, blockDim.x);
}

// Block of RopeKvKernel: head_dim/2 x (up to 512 threads' worth of) heads.
dim3 RopeBlock(int heads, int head_dim) {
  const int half = head_dim / 2;
  const int y = std::max(1, std::min(heads, 512 / std::max(half, 1)));
  return dim3(static_cast<unsigned>(half), static_cast<unsigned>(y));
}

}  // namespace

absl::Status BuildRopeTable(double2* table, int max_pos, int head_dim, float theta,
                            cudaStream_t stream) {
  if (max_pos <= 0 || head_dim <= 0 || head_dim % 2 != 0 || !(theta > 0.f)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "BuildRopeTable: bad max_pos=%d head_dim=%d theta=%g", max_pos, head_dim, theta));
  }
  const int64_t total = static_cast<int64_t>(max_pos) * (head_dim / 2);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  RopeTableKernel<<<blocks, 256, 0, stream>>>(table, max_pos, head_dim, static_cast<double>(theta));
  return CUDA_STATUS(cudaGetLastError());
}

absl::Status ApplyRope(void* x, int64_t row_stride, int num_heads, int head_dim,
                       const int32_t* positions, int64_t rows, const double2* table, int max_pos,
                       DType dtype, cudaStream_t stream) {
  if (rows < 0 || num_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > 2048 ||
      row_stride < static_cast<int64_t>(num_heads) * head_dim || max_pos <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ApplyRope: bad shape rows=%d heads=%d head_dim=%d row_stride=%d max_pos=%d", rows,
        num_heads, head_dim, row_stride, max_pos));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "ApplyRope", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    RopeKvKernel<T, false, false>
        <<<static_cast<unsigned>(rows), RopeBlock(num_heads, head_dim), 0, stream>>>(
            static_cast<T*>(x), row_stride, num_heads, head_dim, positions, table, max_pos, 0, 0,
            nullptr, nullptr, nullptr, nullptr, 0, 0.f);
    return CUDA_STATUS(cudaGetLastError());
  });
}

absl::Status WriteKvCache(const void* k, const void* v, int64_t row_stride,
                          const int32_t* slot_mapping, void* k_cache, void* v_cache, int64_t rows,
                          int num_kv_heads, int head_dim, DType dtype, cudaStream_t stream) {
  const int64_t width = static_cast<int64_t>(num_kv_heads) * head_dim;
  if (rows < 0 || num_kv_heads <= 0 || head_dim <= 0 || row_stride < width) {
    return absl::InvalidArgumentError(
        absl::StrFormat("WriteKvCache: bad shape rows=%d kv_heads=%d head_dim=%d row_stride=%d",
                        rows, num_kv_heads, head_dim, row_stride));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "WriteKvCache", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const bool vec = (width * sizeof(T)) % 16 == 0 && (row_stride * sizeof(T)) % 16 == 0 &&
                     Aligned16(k) && Aligned16(v) && Aligned16(k_cache) && Aligned16(v_cache);
    auto* kernel = vec ? KvWriteKernel<T, true> : KvWriteKernel<T, false>;
    kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(
        static_cast<const T*>(k), static_cast<const T*>(v), row_stride, slot_mapping,
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<int>(width));
    return CUDA_STATUS(cudaGetLastError());
  });
}

absl::Status ApplyRopeWriteKv(void* qkv, int64_t row_stride, int num_q_heads, int num_kv_heads,
                              int head_dim, const int32_t* positions, const int32_t* slot_mapping,
                              int64_t rows, const double2* table, int max_pos, void* k_cache,
                              void* v_cache, DType dtype, cudaStream_t stream,
                              const DeferredNorm& norm) {
  const int64_t width = static_cast<int64_t>(num_kv_heads) * head_dim;
  if (rows < 0 || num_q_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      head_dim > 2048 || row_stride < static_cast<int64_t>(num_q_heads) * head_dim + 2 * width ||
      max_pos <= 0 || (norm.x != nullptr && norm.hidden <= 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ApplyRopeWriteKv: bad shape rows=%d q_heads=%d kv_heads=%d head_dim=%d row_stride=%d "
        "max_pos=%d norm_hidden=%d",
        rows, num_q_heads, num_kv_heads, head_dim, row_stride, max_pos, norm.hidden));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "ApplyRopeWriteKv", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const size_t es = sizeof(T);
    const bool vec = (width * es) % 16 == 0 && (row_stride * es) % 16 == 0 &&
                     (num_q_heads * head_dim * es) % 16 == 0 && Aligned16(qkv) &&
                     Aligned16(k_cache) && Aligned16(v_cache);
    const int rot = num_q_heads + num_kv_heads;
    const dim3 threads = RopeBlock(rot, head_dim);
    return CUDA_STATUS(internal::LaunchDependent(
        vec ? RopeKvKernel<T, true, true> : RopeKvKernel<T, true, false>,
        dim3(static_cast<unsigned>(rows)), threads, 0, stream, static_cast<T*>(qkv), row_stride,
        rot, head_dim, positions, table, max_pos, num_q_heads, num_kv_heads, slot_mapping,
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<const T*>(norm.x),
        norm.hidden, norm.eps));
  });
}

}  // namespace symtp::kernels

// RoPE table and rotation, paged KV-cache write (kernels/ops/layer_ops.h).
#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/internal/device_utils.cuh"
#include "kernels/ops/layer_ops.h"

namespace symtp::kernels {
namespace {

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

template <typename T>
__global__ void RopeKernel(T* __restrict__ x, int64_t row_stride, int num_heads, int head_dim,
                           const int32_t* __restrict__ positions, const double2* __restrict__ table,
                           int max_pos) {
  const int64_t r = blockIdx.x;
  const int pos = positions[r];
  if (pos < 0 || pos >= max_pos) return;
  const int half = head_dim / 2;
  const double2* tab = table + static_cast<int64_t>(pos) * half;
  T* row = x + r * row_stride;
  for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx - h * half;
    T* xh = row + static_cast<int64_t>(h) * head_dim;
    const double a = ToFloat<T>(xh[i]), b = ToFloat<T>(xh[i + half]);
    const double2 cs = tab[i];
    // No contraction into FMAs: the CPU reference rounds each product.
    const double o0 = __dsub_rn(__dmul_rn(a, cs.x), __dmul_rn(b, cs.y));
    const double o1 = __dadd_rn(__dmul_rn(b, cs.x), __dmul_rn(a, cs.y));
    xh[i] = FromFloat<T>(__double2float_rn(o0));
    xh[i + half] = FromFloat<T>(__double2float_rn(o1));
  }
}

template <typename T, bool kVec>
__global__ void KvWriteKernel(const T* __restrict__ k, const T* __restrict__ v, int64_t row_stride,
                              const int32_t* __restrict__ slots, T* __restrict__ k_cache,
                              T* __restrict__ v_cache, int width) {
  const int64_t r = blockIdx.x;
  const int32_t slot = slots[r];
  if (slot < 0) return;
  const T* ks = k + r * row_stride;
  const T* vs = v + r * row_stride;
  T* kd = k_cache + static_cast<int64_t>(slot) * width;
  T* vd = v_cache + static_cast<int64_t>(slot) * width;
  if constexpr (kVec) {
    const int n = width * static_cast<int>(sizeof(T)) / 16;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      reinterpret_cast<uint4*>(kd)[i] = reinterpret_cast<const uint4*>(ks)[i];
      reinterpret_cast<uint4*>(vd)[i] = reinterpret_cast<const uint4*>(vs)[i];
    }
  } else {
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
      kd[i] = ks[i];
      vd[i] = vs[i];
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status ApplyRope(void* x, int64_t row_stride, int num_heads, int head_dim,
                       const int32_t* positions, int64_t rows, const double2* table, int max_pos,
                       DType dtype, cudaStream_t stream) {
  if (rows < 0 || num_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      row_stride < static_cast<int64_t>(num_heads) * head_dim || max_pos <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ApplyRope: bad shape rows=%d heads=%d head_dim=%d row_stride=%d max_pos=%d", rows,
        num_heads, head_dim, row_stride, max_pos));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "ApplyRope", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const int work = num_heads * head_dim / 2;
    const int threads = work >= 512 ? 512 : work >= 256 ? 256 : 128;
    RopeKernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<T*>(x), row_stride, num_heads, head_dim, positions, table, max_pos);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
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
    const int threads = 128;
    if (vec) {
      KvWriteKernel<T, true><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
          static_cast<const T*>(k), static_cast<const T*>(v), row_stride, slot_mapping,
          static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<int>(width));
    } else {
      KvWriteKernel<T, false><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
          static_cast<const T*>(k), static_cast<const T*>(v), row_stride, slot_mapping,
          static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<int>(width));
    }
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

}  // namespace symtp::kernels

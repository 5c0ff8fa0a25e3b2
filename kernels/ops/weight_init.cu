// Synthetic weight generation on the device (kernels/ops/weight_init.h): a
// grid-stride loop computes each element's value of MODEL.md from (block
// key, global flat index) with a SplitMix64 hash and writes it in the target
// dtype, so a shard needs no host copy and matches the CPU reference bit for
// bit.
#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/internal/device_utils.cuh"
#include "kernels/ops/weight_init.h"

namespace symtp::kernels {
namespace {

using internal::bf16;
using internal::Mix64;

// The exact fp32 value of MODEL.md. __fmul_rn/__fadd_rn keep the compiler
// from contracting anything into an FMA (the steps are exact or rounded once).
__device__ __forceinline__ float SyntheticValue(uint64_t key, uint64_t index, int kind,
                                                float scale) {
  const uint64_t h = Mix64(key + index);
  const float u = __fmul_rn(static_cast<float>(static_cast<uint32_t>(h >> 40)), 0x1p-24f);
  const float s = __fadd_rn(__fmul_rn(2.0f, u), -1.0f);
  switch (kind) {
    case 0:
      return __fmul_rn(s, scale);
    case 1:
      return s;
    default:
      return __fadd_rn(__fmul_rn(s, 0.125f), 1.0f);
  }
}

template <typename T>
__global__ void SyntheticInitKernel(T* __restrict__ dst, SyntheticBlock b) {
  const int64_t total = b.rows * b.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / b.cols, c = i - r * b.cols;
    const uint64_t gidx =
        static_cast<uint64_t>((b.row_begin + r) * b.global_cols + b.col_begin + c);
    const float v = SyntheticValue(b.key, gidx, static_cast<int>(b.kind), b.scale);
    dst[r * b.dst_ld + c] = internal::FromFloat<T>(v);
  }
}

template <typename T>
__global__ void ScaleColumnsKernel(T* __restrict__ w, int64_t rows, int64_t cols,
                                   const T* __restrict__ gamma) {
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    w[i] = internal::FromFloat<T>(internal::ToFloat<T>(w[i]) *
                                  internal::ToFloat<T>(gamma[i % cols]));
  }
}

template <typename T>
__global__ void FillOnesKernel(T* __restrict__ x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = internal::FromFloat<T>(1.f);
  }
}

}  // namespace

absl::Status FoldNormWeight(void* w, int64_t rows, int64_t cols, void* gamma, DType dtype,
                            cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || w == nullptr || gamma == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FoldNormWeight: bad shape rows=%d cols=%d or null pointer", rows, cols));
  }
  return internal::DispatchDType(dtype, "FoldNormWeight", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    ScaleColumnsKernel<T><<<internal::GridFor(rows * cols, kThreads, 132 * 64), kThreads, 0,
                            stream>>>(static_cast<T*>(w), rows, cols,
                                      static_cast<const T*>(gamma));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    FillOnesKernel<T><<<internal::CeilDiv(cols, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(gamma), cols);
    return CUDA_STATUS(cudaGetLastError());
  });
}

absl::Status InitSyntheticWeight(void* dst, DType dtype, const SyntheticBlock& block_in,
                                 cudaStream_t stream) {
  SyntheticBlock b = block_in;
  if (b.dst_ld == 0) b.dst_ld = b.cols;
  if (b.rows < 0 || b.cols < 0 || b.row_begin < 0 || b.col_begin < 0 ||
      b.col_begin + b.cols > b.global_cols || b.dst_ld < b.cols) {
    return absl::InvalidArgumentError(
        absl::StrFormat("InitSyntheticWeight: bad block rows=%d cols=%d row_begin=%d col_begin=%d "
                        "global_cols=%d dst_ld=%d",
                        b.rows, b.cols, b.row_begin, b.col_begin, b.global_cols, b.dst_ld));
  }
  if (b.rows == 0 || b.cols == 0) return absl::OkStatus();
  if (dst == nullptr) return absl::InvalidArgumentError("InitSyntheticWeight: null dst");
  return internal::DispatchDType(dtype, "InitSyntheticWeight", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    SyntheticInitKernel<T><<<internal::GridFor(b.rows * b.cols, kThreads, 132 * 64), kThreads, 0,
                             stream>>>(static_cast<T*>(dst), b);
    return CUDA_STATUS(cudaGetLastError());
  });
}

}  // namespace symtp::kernels

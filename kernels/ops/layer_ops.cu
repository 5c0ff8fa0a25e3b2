// Embedding, fused add+RMSNorm, SiLU-and-multiply, row gather, vocab-shard
// assembly and sampled-token forwarding (kernels/ops/layer_ops.h).
#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/internal/device_utils.cuh"
#include "kernels/ops/layer_ops.h"

namespace symtp::kernels {
namespace {

using internal::Aligned16;
using internal::GridFor;

using internal::bf16;
using internal::FromFloat;
using internal::SiluTimes;
using internal::ToFloat;

// ---------------------------------------------------------------- kernels

template <typename T>
__global__ void EmbeddingKernel(const int32_t* __restrict__ tokens, const T* __restrict__ table,
                                T* __restrict__ out, int hidden, int vocab, bool vec16) {
  SYMTP_TRACE_KERNEL(kEmbedding);
  const int64_t r = blockIdx.x;
  const int32_t tok = tokens[r];
  T* dst = out + r * hidden;
  if (tok < 0 || tok >= vocab) {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = FromFloat<T>(0.f);
    return;
  }
  const T* src = table + static_cast<int64_t>(tok) * hidden;
  if (vec16) {
    const int n = hidden * static_cast<int>(sizeof(T)) / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int i = threadIdx.x; i < n; i += blockDim.x) d4[i] = __ldg(s4 + i);
  } else {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
  }
}

template <typename T>
__global__ void AddRmsNormKernel(T* __restrict__ residual, const T* __restrict__ delta,
                                 const T* __restrict__ weight, T* __restrict__ out, int hidden,
                                 float eps) {
  extern __shared__ float smem[];  // [hidden] row values, then 32 scratch
  float* row = smem;
  float* scratch = smem + hidden;
  const int64_t r = blockIdx.x;
  T* res = residual + r * hidden;
  const T* del = delta ? delta + r * hidden : nullptr;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float x = ToFloat<T>(res[i]);
    if (del) {
      const T xr = FromFloat<T>(x + ToFloat<T>(del[i]));
      res[i] = xr;
      x = ToFloat<T>(xr);
    }
    row[i] = x;
    ss += x * x;
  }
  ss = internal::BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(hidden) + eps);
  T* o = out + r * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    o[i] = FromFloat<T>(row[i] * inv * ToFloat<T>(weight[i]));
  }
}

// A 16-byte chunk of a row as floats (8 bf16 or 4 float values).
template <typename T>
struct Vec {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  float v[kN];
  __device__ __forceinline__ void Load(uint4 raw) {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = ToFloat<T>(e[i]);
  }
  __device__ __forceinline__ uint4 Store() const {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kN; ++i) e[i] = FromFloat<T>(v[i]);
    return raw;
  }
};

// The same as AddRmsNormKernel for rows of whole 16-byte chunks (16-byte
// aligned): the row stays in registers, thread t holding chunks t,
// t + blockDim.x, ... (kPer of them), and every load of the row is issued
// before the first store (the scalar kernel's loop could not hoist a load
// above the residual store before it: one memory round trip per element
// group, ~7.7 us for a 4096-wide row on an H200).
template <typename T, int kPer>
__global__ void AddRmsNormVecKernel(T* __restrict__ residual, const T* __restrict__ delta,
                                    const T* __restrict__ weight, T* __restrict__ out, int hidden,
                                    float eps) {
  SYMTP_TRACE_KERNEL(kAddRmsNorm);
  internal::GridDependencyWait();
  internal::AllowDependentLaunch();  // the next GEMM may start loading its weights
  __shared__ float scratch[32];
  constexpr int kN = Vec<T>::kN;
  const int64_t r = blockIdx.x;
  const int nvec = hidden / kN;
  uint4* res = reinterpret_cast<uint4*>(residual + r * hidden);
  const uint4* del = delta ? reinterpret_cast<const uint4*>(delta + r * hidden) : nullptr;
  const uint4* w4 = reinterpret_cast<const uint4*>(weight);
  uint4 raw[kPer], draw[kPer], wraw[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int idx = threadIdx.x + j * blockDim.x;
    if (idx < nvec) {
      raw[j] = res[idx];
      if (del) draw[j] = __ldg(del + idx);
      wraw[j] = __ldg(w4 + idx);
    }
  }
  Vec<T> x[kPer];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int idx = threadIdx.x + j * blockDim.x;
    if (idx >= nvec) continue;
    x[j].Load(raw[j]);
    if (del) {
      Vec<T> d;
      d.Load(draw[j]);
#pragma unroll
      for (int i = 0; i < kN; ++i) x[j].v[i] += d.v[i];
      const uint4 sum = x[j].Store();  // rounded to T, as the residual keeps it
      res[idx] = sum;
      x[j].Load(sum);
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) ss += x[j].v[i] * x[j].v[i];
  }
  ss = internal::BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(hidden) + eps);
  uint4* o = reinterpret_cast<uint4*>(out + r * hidden);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int idx = threadIdx.x + j * blockDim.x;
    if (idx >= nvec) continue;
    Vec<T> w;
    w.Load(wraw[j]);
#pragma unroll
    for (int i = 0; i < kN; ++i) x[j].v[i] = x[j].v[i] * inv * w.v[i];
    o[idx] = x[j].Store();
  }
}

template <typename T>
__global__ void SiluMulVecKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                                 int ffn) {
  SYMTP_TRACE_KERNEL(kSiluMul);
  internal::GridDependencyWait();
  internal::AllowDependentLaunch();  // the next GEMM may start loading its weights
  constexpr int kN = Vec<T>::kN;
  const int per_row = ffn / kN;
  const int64_t total = rows * per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / per_row, c = i - r * per_row;
    const uint4* row = reinterpret_cast<const uint4*>(gate_up + r * 2 * ffn);
    Vec<T> g, u;
    g.Load(__ldg(row + c));
    u.Load(__ldg(row + per_row + c));
#pragma unroll
    for (int k = 0; k < kN; ++k) g.v[k] = SiluTimes(g.v[k], u.v[k]);
    reinterpret_cast<uint4*>(out)[i] = g.Store();
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                              int ffn) {
  const int64_t total = rows * ffn;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / ffn, c = i - r * ffn;
    const T* row = gate_up + r * 2 * ffn;
    const float g = ToFloat<T>(row[c]);
    const float u = ToFloat<T>(row[ffn + c]);
    out[i] = FromFloat<T>(SiluTimes(g, u));
  }
}

// SiluMul with a deferred RMSNorm (DeferredNorm): block b takes row b /
// per_row_blocks, computes the row's factor, and covers its part of the row
// (16-byte chunks with kVec, elements otherwise).
template <typename T, bool kVec>
__global__ void SiluMulNormKernel(const T* __restrict__ gate_up, T* __restrict__ out, int ffn,
                                  int per_row_blocks, const T* __restrict__ norm_x,
                                  int norm_hidden, float norm_eps) {
  SYMTP_TRACE_KERNEL(kSiluMul);
  internal::GridDependencyWait();
  internal::AllowDependentLaunch();  // the next GEMM may start loading its weights
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x / per_row_blocks;
  const int part = static_cast<int>(blockIdx.x % per_row_blocks);
  const float s = internal::BlockRowRms(norm_x + r * norm_hidden, norm_hidden, norm_eps, scratch);
  const int stride = per_row_blocks * static_cast<int>(blockDim.x);
  if constexpr (kVec) {
    constexpr int kN = Vec<T>::kN;
    const int per_row = ffn / kN;
    const uint4* row = reinterpret_cast<const uint4*>(gate_up + r * 2 * ffn);
    uint4* o = reinterpret_cast<uint4*>(out + r * ffn);
    for (int c = part * static_cast<int>(blockDim.x) + threadIdx.x; c < per_row; c += stride) {
      Vec<T> g, u;
      g.Load(row[c]);
      u.Load(row[per_row + c]);
#pragma unroll
      for (int k = 0; k < kN; ++k) g.v[k] = SiluTimes(g.v[k] * s, u.v[k] * s);
      o[c] = g.Store();
    }
  } else {
    const T* row = gate_up + r * 2 * ffn;
    T* o = out + r * ffn;
    for (int c = part * static_cast<int>(blockDim.x) + threadIdx.x; c < ffn; c += stride) {
      o[c] = FromFloat<T>(SiluTimes(ToFloat<T>(row[c]) * s, ToFloat<T>(row[ffn + c]) * s));
    }
  }
}

template <typename T>
__global__ void GatherRowsKernel(const T* __restrict__ src, int64_t src_ld,
                                 const int32_t* __restrict__ index, T* __restrict__ dst,
                                 int64_t dst_ld, int64_t cols) {
  SYMTP_TRACE_KERNEL(kGatherRows);
  const int64_t r = blockIdx.x;
  const T* s = src + static_cast<int64_t>(index[r]) * src_ld;
  T* d = dst + r * dst_ld;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

__global__ void AssembleVocabKernel(const float* __restrict__ gathered, float* __restrict__ out,
                                    int64_t rows, int vl, int tp) {
  const int64_t total = rows * tp * static_cast<int64_t>(vl);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t v = static_cast<int64_t>(tp) * vl;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / v, col = i - row * v;
    const int64_t rank = col / vl, c = col - rank * vl;
    out[i] = gathered[(rank * rows + row) * vl + c];
  }
}

__global__ void ForwardTokensKernel(int32_t* __restrict__ tokens,
                                    const int32_t* __restrict__ prev_tokens,
                                    const int32_t* __restrict__ prev_row, int64_t rows) {
  SYMTP_TRACE_KERNEL(kForwardTokens);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows) {
    const int32_t p = prev_row[i];
    if (p >= 0) tokens[i] = prev_tokens[p];
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

absl::Status EmbeddingLookup(const int32_t* tokens, const void* table, void* out, int64_t rows,
                             int hidden, int vocab, DType dtype, cudaStream_t stream) {
  if (rows < 0 || hidden <= 0 || vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "EmbeddingLookup: bad shape rows=%d hidden=%d vocab=%d", rows, hidden, vocab));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "EmbeddingLookup", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const bool vec16 = (hidden * sizeof(T)) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
    EmbeddingKernel<T><<<static_cast<unsigned>(rows), 128, 0, stream>>>(
        tokens, static_cast<const T*>(table), static_cast<T*>(out), hidden, vocab, vec16);
    return CUDA_STATUS(cudaGetLastError());
  });
}

absl::Status AddRmsNorm(void* residual, const void* delta, const void* weight, void* out,
                        int64_t rows, int hidden, float eps, DType dtype, cudaStream_t stream) {
  if (rows < 0 || hidden <= 0 || hidden > 12288) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AddRmsNorm: bad shape rows=%d hidden=%d (hidden <= 12288)", rows, hidden));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "AddRmsNorm", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    constexpr int kN = 16 / static_cast<int>(sizeof(T));
    const int nvec = hidden / kN;
    if (hidden % kN == 0 && Aligned16(residual) && Aligned16(delta) && Aligned16(weight) &&
        Aligned16(out)) {
      // One to four chunks per thread, at most 1024 threads (hidden <= 12288).
      const int per = nvec <= 1024 ? 1 : nvec <= 2048 ? 2 : 4;
      const int threads =
          std::max(32, static_cast<int>(internal::CeilDiv(nvec, per) + 31) / 32 * 32);
      auto* kernel = per == 1   ? AddRmsNormVecKernel<T, 1>
                     : per == 2 ? AddRmsNormVecKernel<T, 2>
                                : AddRmsNormVecKernel<T, 4>;
      return CUDA_STATUS(internal::LaunchDependent(
          kernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream,
          static_cast<T*>(residual), static_cast<const T*>(delta), static_cast<const T*>(weight),
          static_cast<T*>(out), hidden, eps));
    }
    const int threads = hidden >= 4096 ? 512 : hidden >= 1024 ? 256 : 128;
    const size_t smem = (static_cast<size_t>(hidden) + 32) * sizeof(float);
    AddRmsNormKernel<T><<<static_cast<unsigned>(rows), threads, smem, stream>>>(
        static_cast<T*>(residual), static_cast<const T*>(delta), static_cast<const T*>(weight),
        static_cast<T*>(out), hidden, eps);
    return CUDA_STATUS(cudaGetLastError());
  });
}

absl::Status SiluMul(const void* gate_up, void* out, int64_t rows, int ffn, DType dtype,
                     cudaStream_t stream, const DeferredNorm& norm) {
  if (rows < 0 || ffn <= 0 || (norm.x != nullptr && norm.hidden <= 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SiluMul: bad shape rows=%d ffn=%d norm_hidden=%d", rows, ffn, norm.hidden));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "SiluMul", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    constexpr int kN = 16 / static_cast<int>(sizeof(T));
    if (norm.x != nullptr) {
      // Enough blocks per row to give every SM two at decode's row counts;
      // one per row from 264 rows on, so a row's factor is computed once.
      const bool vec = ffn % kN == 0 && Aligned16(gate_up) && Aligned16(out);
      const int64_t units = vec ? ffn / kN : ffn;
      const int64_t most = std::max<int64_t>(1, internal::CeilDiv(units, 256));
      const int per_row = static_cast<int>(
          std::clamp<int64_t>(internal::CeilDiv(int64_t{264}, rows), 1, most));
      return CUDA_STATUS(internal::LaunchDependent(
          vec ? SiluMulNormKernel<T, true> : SiluMulNormKernel<T, false>,
          dim3(static_cast<unsigned>(rows * per_row)), dim3(256), 0, stream,
          static_cast<const T*>(gate_up), static_cast<T*>(out), ffn, per_row,
          static_cast<const T*>(norm.x), norm.hidden, norm.eps));
    }
    if (ffn % kN == 0 && Aligned16(gate_up) && Aligned16(out)) {
      CUDA_RETURN_IF_ERROR(internal::LaunchDependent(
          SiluMulVecKernel<T>, dim3(GridFor(rows * (ffn / kN), 256)), dim3(256), 0, stream,
          static_cast<const T*>(gate_up), static_cast<T*>(out), rows, ffn));
    } else {
      SiluMulKernel<T><<<GridFor(rows * ffn, 256), 256, 0, stream>>>(
          static_cast<const T*>(gate_up), static_cast<T*>(out), rows, ffn);
    }
    return CUDA_STATUS(cudaGetLastError());
  });
}

absl::Status GatherRows(const void* src, int64_t src_ld, const int32_t* index, void* dst,
                        int64_t dst_ld, int64_t rows, int64_t cols, DType dtype,
                        cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || src_ld < cols || dst_ld < cols) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GatherRows: bad shape rows=%d cols=%d src_ld=%d dst_ld=%d", rows, cols, src_ld, dst_ld));
  }
  if (rows == 0) return absl::OkStatus();
  return internal::DispatchDType(dtype, "GatherRows", [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    constexpr int64_t kN = 16 / static_cast<int64_t>(sizeof(T));
    if (cols % kN == 0 && src_ld % kN == 0 && dst_ld % kN == 0 && Aligned16(src) &&
        Aligned16(dst)) {
      // The same gather over 16-byte chunks.
      GatherRowsKernel<uint4><<<static_cast<unsigned>(rows), 128, 0, stream>>>(
          static_cast<const uint4*>(src), src_ld / kN, index, static_cast<uint4*>(dst), dst_ld / kN,
          cols / kN);
      return CUDA_STATUS(cudaGetLastError());
    }
    GatherRowsKernel<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
        static_cast<const T*>(src), src_ld, index, static_cast<T*>(dst), dst_ld, cols);
    return CUDA_STATUS(cudaGetLastError());
  });
}

absl::Status AssembleVocabShards(const float* gathered, float* out, int64_t rows, int vocab_local,
                                 int tp, cudaStream_t stream) {
  if (rows < 0 || vocab_local <= 0 || tp <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AssembleVocabShards: bad shape rows=%d vocab_local=%d tp=%d", rows, vocab_local, tp));
  }
  if (rows == 0) return absl::OkStatus();
  AssembleVocabKernel<<<GridFor(rows * tp * static_cast<int64_t>(vocab_local), 256), 256, 0,
                        stream>>>(gathered, out, rows, vocab_local, tp);
  return CUDA_STATUS(cudaGetLastError());
}

absl::Status ForwardSampledTokens(int32_t* tokens, const int32_t* prev_tokens,
                                  const int32_t* prev_row, int64_t rows, cudaStream_t stream) {
  if (rows < 0) return absl::InvalidArgumentError("ForwardSampledTokens: rows < 0");
  if (rows == 0) return absl::OkStatus();
  ForwardTokensKernel<<<internal::CeilDiv(rows, 256), 256, 0, stream>>>(tokens, prev_tokens,
                                                                        prev_row, rows);
  return CUDA_STATUS(cudaGetLastError());
}

}  // namespace symtp::kernels

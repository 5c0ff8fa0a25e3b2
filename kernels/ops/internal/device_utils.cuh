// Device-side helpers shared by the kernels of kernels/ops (not public API):
// dtype conversion, warp/block reductions, the launch-dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/kernel_trace.h"

namespace symtp::kernels::internal {

using bf16 = __nv_bfloat16;

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToFloat<bf16>(bf16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 FromFloat<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

// SwiGLU's activation of one element in fp32, SiLU(gate) * up: the one
// formula of SiluMul and of the gate/up GEMV's SwiGLU flush, whose outputs
// must be the same bits.
__device__ __forceinline__ float SiluTimes(float gate, float up) {
  return gate / (1.0f + expf(-gate)) * up;
}

// The splitmix64 finalizer with its golden-ratio increment (MODEL.md "mix";
// model::Mix64 on the host).
__device__ __forceinline__ uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole block (1-, 2- or 3-D, threads in linear order); every
// thread gets the result. `scratch` holds at least 32 floats. Contains
// __syncthreads(): call from all threads.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int lane = tid & 31, warp = tid >> 5;
  const int nwarps = (blockDim.x * blockDim.y * blockDim.z + 31) >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return WarpSum(v);
}

// RMSNorm's factor of one row, 1 / sqrt(mean(x[0:n]^2) + eps), with the
// squares summed in fp32 (AddRmsNorm's formula, in another order); every
// thread of the block gets it. 16-byte loads where the row allows them.
// Contains __syncthreads(): call from all threads.
template <typename T>
__device__ __forceinline__ float BlockRowRms(const T* __restrict__ x, int n, float eps,
                                             float* scratch) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int nt = blockDim.x * blockDim.y * blockDim.z;
  constexpr int kN = 16 / static_cast<int>(sizeof(T));
  float ss = 0.f;
  if (n % kN == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    for (int i = tid; i < n / kN; i += nt) {
      const uint4 raw = x4[i];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        const float f = ToFloat<T>(e[k]);
        ss += f * f;
      }
    }
  } else {
    for (int i = tid; i < n; i += nt) {
      const float f = ToFloat<T>(x[i]);
      ss += f * f;
    }
  }
  ss = BlockSum(ss, scratch);
  return rsqrtf(ss / static_cast<float>(n) + eps);
}

// Runs `f.template operator()<T>()` with T = float or __nv_bfloat16.
template <typename F>
absl::Status DispatchDType(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(bf16{});
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unsupported dtype ", DTypeName(dtype), " (float or bfloat16)"));
  }
}

// The in-graph kernel timeline of a -DSYMTP_KERNEL_TRACE=ON build
// (common/kernel_trace.h): SYMTP_TRACE_KERNEL(kind) first in a kernel records
// each block's entry, first GridDependencyWait return and exit; nothing in
// other builds.
#ifdef SYMTP_KERNEL_TRACE
namespace {  // one ring pointer set per compiled module (common/kernel_trace.h)
__device__ trace::Record* g_trace_ring;
__device__ unsigned long long* g_trace_count;
__device__ unsigned g_trace_mask;
cudaError_t SetTraceRing(trace::Record* ring, unsigned long long* count, unsigned mask) {
  cudaError_t e = cudaMemcpyToSymbol(g_trace_ring, &ring, sizeof ring);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(g_trace_count, &count, sizeof count);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(g_trace_mask, &mask, sizeof mask);
  return e;
}
[[maybe_unused]] const bool g_trace_registered = trace::RegisterModule(&SetTraceRing);
}  // namespace

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool TraceLeader() {
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}
__device__ __forceinline__ uint64_t& TraceWaitTime() {
  __shared__ uint64_t t;
  return t;
}
// Records the block's entry, first wait and exit (the leader thread's).
struct TraceScope {
  uint64_t t0 = 0;
  uint32_t kind;
  __device__ explicit TraceScope(uint32_t k) : kind(k) {
    if (TraceLeader()) {
      t0 = GlobalTimer();
      TraceWaitTime() = 0;
    }
  }
  __device__ ~TraceScope() {
    if (!TraceLeader() || g_trace_ring == nullptr) return;
    const uint64_t t1 = GlobalTimer();
    uint32_t smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    trace::Record r;
    r.kind = kind;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.grid = gridDim.x * gridDim.y * gridDim.z;
    r.smid = smid;
    r.t_entry = t0;
    r.t_wait = TraceWaitTime();
    r.t_exit = t1;
    g_trace_ring[atomicAdd(g_trace_count, 1ull) & g_trace_mask] = r;
  }
};
#define SYMTP_TRACE_KERNEL(kind) \
  ::symtp::kernels::internal::TraceScope symtp_trace_scope_(::symtp::trace::kind)
#else
#define SYMTP_TRACE_KERNEL(kind) static_cast<void>(0)
#endif

// Programmatic dependent launch (PDL, sm_90): LaunchDependent starts
// `kernel` with programmatic stream serialization, so its blocks may be
// scheduled while the kernel before it on the stream is finishing; such a
// kernel must call GridDependencyWait() before it touches memory (it returns
// once the previous kernel has completed and its writes are visible). On a
// kernel launched normally the wait is a no-op.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef SYMTP_KERNEL_TRACE
  if (TraceLeader() && TraceWaitTime() == 0) TraceWaitTime() = GlobalTimer();
#endif
}

// Lets the kernel launched after this one (with LaunchDependent) start its
// blocks before this grid has finished: they fill the SMs this grid leaves
// free and run what precedes their GridDependencyWait(). Without it they
// start only as this grid's blocks exit. Visibility is unchanged: the
// dependent's wait still returns only once this grid has completed.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... KArgs, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...);
}

// Whether a pointer may be read or written as 16-byte vectors.
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned CeilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Blocks of `threads` for a grid-stride loop over `total` elements: one per
// `threads` elements, at least 1, at most `max_blocks`.
inline unsigned GridFor(int64_t total, int threads, int64_t max_blocks = 132 * 32) {
  const int64_t want = (total + threads - 1) / threads;
  return static_cast<unsigned>(want < 1 ? 1 : want > max_blocks ? max_blocks : want);
}

}  // namespace symtp::kernels::internal

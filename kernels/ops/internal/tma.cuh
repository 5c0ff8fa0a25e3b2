// Tensor Memory Accelerator (TMA, sm_90) copies into shared memory: the host
// side encodes a tensor map (cuTensorMapEncodeTiled, reached through the
// runtime's driver entry point so nothing links libcuda), the device side
// issues box copies that complete on a shared-memory mbarrier.
//
// Used by the tensor-core decode attention for its K/V tiles: one lane's
// box copies stream the cache at the copy bandwidth where 16-byte cp.async
// copies from every lane reach 97% of it at large batch and 77% at batch 128
// (llama-8b TP 2 shapes, bench/results/h100/kv_stream/).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace symtp::kernels::internal {

// ---- device ----

__device__ __forceinline__ void MbarInit(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the warp's barrier initializations visible to the copy engine.
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival on `bar` that also expects `bytes` of copies to complete on it.
__device__ __forceinline__ void MbarArriveExpectTx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Orders this thread's earlier shared-memory accesses (generic proxy) before
// later copies into the same memory (async proxy): every thread that wrote
// memory a copy will overwrite runs it before the barrier that precedes the
// copy's issue; the issuing thread runs it before the copy.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Waits until the phase of parity `parity` of `bar` has completed (its copies
// landed and are visible to the waiting threads). A copy that never completes
// is a hardware or addressing fault: after ~2^31 SM cycles (about a second)
// the kernel traps, so the step fails with an error instead of hanging.
__device__ __forceinline__ void MbarWait(unsigned bar, unsigned parity) {
  long long start = 0;
  for (unsigned spin = 1;; ++spin) {
    unsigned done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return;
    if ((spin & 255) == 0) {
      const long long now = clock64();
      if (start == 0) {
        start = now;
      } else if (now - start > (1ll << 31)) {
        __trap();
      }
    }
  }
}

// The box of `map` at coordinates (c0, c1, c2) (innermost first) into shared
// memory at `dst`, completing its bytes on `bar`.
__device__ __forceinline__ void TmaLoad3D(unsigned dst, const CUtensorMap* map, unsigned bar,
                                          int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// ---- host ----

// A bf16 tensor map over a token-major cache [slots][heads][dim] (dim
// contiguous) with boxes of `box_slots` slots x one head x 64 dims (128
// bytes: the 128-byte swizzle's row, so a box lands as rows r of 128 bytes
// whose 16-byte chunk c sits at chunk c ^ (r % 8)). `base` and the row
// pitches must be 16-byte aligned; dim a multiple of 64. L2 promotion is
// the box row's 128 bytes: with 256-byte promotion (a head row's two boxes
// then share each fill, so a quarter of the L2 lookups hit) the decode
// attention ran 2-3.5% slower on an H200 at batch 256-512, its L2 as busy as
// cuDNN's SDPA kernel's for 9% fewer bytes a second
// (bench/results/h200x2/attention_l2_promotion/).
inline absl::StatusOr<CUtensorMap> MakeKvCacheTensorMap(const void* base, int64_t slots, int heads,
                                                        int dim, int box_slots) {
  using EncodeTiledFn =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  if (slots < 1 || slots > (int64_t{1} << 32) || heads < 1 || dim % 64 != 0 ||
      reinterpret_cast<uintptr_t>(base) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache tensor map: %d slots x %d heads x %d dims at %p (1..2^32 slots, dims a "
        "multiple of 64, 16-byte aligned)",
        slots, heads, dim, base));
  }
  static const EncodeTiledFn encode = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  if (encode == nullptr) {
    return absl::UnavailableError("the CUDA driver has no cuTensorMapEncodeTiled");
  }
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(slots)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(dim) * 2,
                                 static_cast<cuuint64_t>(heads) * dim * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_slots)};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrFormat(
        "cuTensorMapEncodeTiled (KV cache %p: %d slots x %d heads x %d dims, box %d slots) "
        "failed: CUresult %d",
        base, slots, heads, dim, box_slots, static_cast<int>(r)));
  }
  return map;
}

}  // namespace symtp::kernels::internal

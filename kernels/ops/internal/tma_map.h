// Host helpers for TMA tensor maps of the sm_90a GEMMs (gemm_sm90.cu,
// gemm_streamk.cu): cuTensorMapEncodeTiled reached through the runtime's
// driver entry point, so nothing links libcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace symtp::kernels::tma {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline absl::StatusOr<EncodeTiledFn> EncodeTiled() {
  struct Entry {
    EncodeTiledFn fn = nullptr;
    std::string error;
  };
  static const Entry entry = [] {
    Entry e;
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                             cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
      e.error = absl::StrFormat("the driver has no cuTensorMapEncodeTiled (%s, query result %d)",
                                cudaGetErrorString(err), static_cast<int>(q));
    } else {
      e.fn = reinterpret_cast<EncodeTiledFn>(p);
    }
    return e;
  }();
  if (entry.fn == nullptr) return absl::UnavailableError(entry.error);
  return entry.fn;
}

// A 2-D bf16 tensor map over rows x cols (row stride ld elements), box of
// box_rows x 64 (one 128-byte row) with the 128-byte swizzle; out-of-bounds
// boxes read zeros (and count toward the transaction bytes).
inline absl::StatusOr<CUtensorMap> MakeBf16Map(const void* ptr, int64_t rows, int64_t cols,
                                               int64_t ld, int box_rows, const char* what) {
  auto encode = EncodeTiled();
  if (!encode.ok()) return encode.status();
  constexpr int kBoxCols = 64;
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBoxCols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r =
      (*encode)(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides,
                box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrFormat(
        "cuTensorMapEncodeTiled(%s: %p, %d x %d, ld %d, box %d x %d) failed: CUresult %d", what,
        ptr, rows, cols, ld, box_rows, kBoxCols, static_cast<int>(r)));
  }
  return map;
}

}  // namespace symtp::kernels::tma

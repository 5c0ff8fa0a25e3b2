// Host helpers shared by the sm_90a GEMMs' launchers (gemm_sm90.cu,
// gemm_streamk.cu): the dynamic shared memory limit, raised once per kernel
// and device, the launch attributes that make a grid cooperative or
// clustered, and the error for a call a kernel cannot run.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "kernels/ops/gemm.h"

namespace symtp::kernels::sm90 {

// Sets cudaFuncAttributeMaxDynamicSharedMemorySize of `kernel` to `bytes` on
// the current device, the first time it is asked for that kernel there (the
// attribute is per device and per function).
inline absl::Status SetMaxDynamicSmemOnce(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device)
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, dev}) != 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert({kernel, dev});
  return absl::OkStatus();
}

// All CTAs resident at once (a cooperative launch).
inline cudaLaunchAttribute CooperativeAttribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeCooperative;
  a.val.cooperative = 1;
  return a;
}

// Thread-block clusters of `x` CTAs along grid x.
inline cudaLaunchAttribute ClusterAttribute(int x) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = static_cast<unsigned>(x);
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// InvalidArgument naming `who`, the call's shape, strides and operands, and
// what the kernel `needs`.
inline absl::Status UnsupportedGemmCall(const char* who, const GemmArgs& g, const char* needs) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: unsupported call m=%d n=%d k=%d lda=%d ldw=%d ldc=%d a=%p w=%p c=%p "
                      "(needs %s)",
                      who, g.m, g.n, g.k, g.lda, g.ldw, g.ldc, g.a, g.w, g.c, needs));
}

}  // namespace symtp::kernels::sm90

// The hand-written Hopper GEMM (internal/sm90_gemm_kernel.cuh) behind Gemm():
// bf16 C[M, N] = A[M, K] · W[N, K]ᵀ with TMA loads, wgmma, and split-K summed
// inside a thread-block cluster. Gemm() picks it per CublasLtHandle's
// GemmKernelChoice; these entry points exist for that dispatch and for the
// tests and benchmarks that compare it with cuBLASLt.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops/gemm.h"

namespace symtp::kernels {

struct Sm90GemmPlan {
  int m_sub = 2;   // 1: 128-row tiles, 2: 256-row tiles (A rows per CTA)
  int splits = 1;  // CTAs per cluster, each a 1/splits share of K (1..8)
  std::string ToString() const;
};

// True when the calling thread's current device is compute capability 9.0
// (the kernel is built for sm_90a only). Cached per device.
bool Sm90GemmDeviceSupported();

// Whether `g` fits the kernel: bf16 in and out, k a multiple of 8, a / w / c
// 16-byte aligned, lda / ldw / ldc multiples of 8, m, n, k below 2^31, no
// sm_count_target. Says nothing about the device.
bool Sm90GemmArgsSupported(const GemmArgs& g);

// Tile height and split count for an (m, n, k) product on `num_sms` SMs.
// The split count minimizes waves x (K steps per split + the cluster
// reduction, counted as two K steps), where a wave holds max_clusters[s]
// clusters of s CTAs (as Sm90GemmMaxActiveClusters reports; null: num_sms / s,
// which the device does not reach for s >= 3) and each split keeps >= 4 K
// steps.
Sm90GemmPlan PlanSm90Gemm(int64_t m, int64_t n, int64_t k, int num_sms,
                          const int* max_clusters = nullptr /* [9], index = splits */);

// PlanSm90Gemm with the current device's SM count and cluster occupancy
// (queried once per device).
absl::StatusOr<Sm90GemmPlan> PlanSm90GemmForDevice(int64_t m, int64_t n, int64_t k);

// How many clusters of `plan.splits` CTAs of the kernel the current device
// runs at once (cudaOccupancyMaxActiveClusters): thread-block clusters are
// placed inside one GPC, so this can be less than num_sms / splits.
absl::StatusOr<int> Sm90GemmMaxActiveClusters(const Sm90GemmPlan& plan);

// Enqueues the product on `stream` (capturable). InvalidArgument when the
// arguments or the device do not fit (see above), a CUDA error otherwise.
absl::Status LaunchSm90Gemm(const GemmArgs& g, const Sm90GemmPlan& plan, cudaStream_t stream);

}  // namespace symtp::kernels

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
  int splits = 1;  // CTAs per output tile, each a 1/splits share of K (1..8)
  // How split partials are summed: false, through distributed shared memory
  // inside a cluster of `splits` CTAs; true, through global memory (the
  // call's workspace) in a cooperative launch (every CTA resident at once:
  // tiles x splits <= SMs), which clusters of 3+ CTAs cannot fill.
  bool global_reduce = false;
  std::string ToString() const;
};

// Diagnostics for kernels_bench --sections sm90probe; Gemm() never sets them.
struct Sm90GemmProbe {
  // flags: parts of the kernel to switch off (its output is then wrong).
  enum Flag : int {
    kSkipA = 1,  // load A only into the ring's first fill (then reuse it)
    kSkipW = 2,  // load W only into the ring's first fill
  };
  // stamps: kSlots values per CTA (index: x + X (y + Y z) of the grid), written
  // by the first consumer thread: %globaltimer (ns) at its start and end;
  // clock64 at its start, when the first stage landed, after the K loop, after
  // its chunks for the other splits were sent, when the other splits' chunks
  // were in (split-K; else after staging), after the sum was staged, at the
  // end (the output's stores issued); the SM id; its K steps.
  enum Slot : int {
    kGlobalStart,
    kGlobalEnd,
    kClockStart,
    kFirstStage,
    kKLoopEnd,
    kStored,
    kSplitsIn,
    kReduced,
    kClockEnd,
    kSm,
    kIters,
    kSlots
  };
  int flags = 0;
  unsigned long long* stamps = nullptr;  // device memory, kSlots x CTAs
};

// Output tiles of an m x n product under `plan`.
int64_t Sm90GemmTiles(int64_t m, int64_t n, const Sm90GemmPlan& plan);
// Workspace bytes a global_reduce plan needs for its partials.
size_t Sm90GemmPartialBytes(int64_t m, int64_t n, const Sm90GemmPlan& plan);

// True when the calling thread's current device is compute capability 9.0
// (the kernel is built for sm_90a only). Cached per device.
bool Sm90GemmDeviceSupported();

// Whether `g` fits the kernel: bf16 in and out, k a multiple of 8, a / w / c
// 16-byte aligned, lda / ldw / ldc multiples of 8, m, n, k below 2^31, no
// sm_count_target. Says nothing about the device.
bool Sm90GemmArgsSupported(const GemmArgs& g);

// Tile height, split count and reduction for an (m, n, k) product on
// `num_sms` SMs: the plan with the least waves x (K steps x step cost +
// epilogue cost), costs fitted to the kernel's measured per-CTA timelines
// (gemm_sm90.cu). 128-row tiles are considered up to m = 256. A wave holds
// max_clusters[s] clusters of s CTAs (as Sm90GemmMaxActiveClusters reports;
// the same for both tile heights; null: num_sms / s, which the device does
// not reach for s >= 3); a global reduction needs one wave and its partials
// to fit in workspace_bytes; each split keeps >= 4 K steps.
Sm90GemmPlan PlanSm90Gemm(int64_t m, int64_t n, int64_t k, int num_sms,
                          const int* max_clusters = nullptr /* [9], index = splits */,
                          size_t workspace_bytes = 0);

// PlanSm90Gemm with the current device's SM count and cluster occupancy
// (queried once per device).
absl::StatusOr<Sm90GemmPlan> PlanSm90GemmForDevice(int64_t m, int64_t n, int64_t k,
                                                   size_t workspace_bytes);

// How many clusters of `plan.splits` CTAs of the kernel the current device
// runs at once (cudaOccupancyMaxActiveClusters): thread-block clusters are
// placed inside one GPC, so this can be less than num_sms / splits.
absl::StatusOr<int> Sm90GemmMaxActiveClusters(const Sm90GemmPlan& plan);

// Enqueues the product on `stream` (capturable). A global_reduce plan takes
// its partials from g.workspace and needs 2 x tiles `counters`, zeroed before
// the first use and left zeroed by every launch (so one launch at a time may
// use them: one stream). InvalidArgument when the arguments, the scratch or
// the device do not fit, a CUDA error otherwise.
absl::Status LaunchSm90Gemm(const GemmArgs& g, const Sm90GemmPlan& plan, cudaStream_t stream,
                            unsigned int* counters = nullptr, int64_t num_counters = 0,
                            const Sm90GemmProbe* probe = nullptr);

}  // namespace symtp::kernels

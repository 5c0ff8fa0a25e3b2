// The stream-K sm_90a GEMM (internal/streamk_gemm_kernel.cuh) for decode
// batches of up to 256 tokens: bf16 C[M, N] = A[M, K] · W[N, K]ᵀ with tiles
// of 64 or 128 W rows (one or two consumer warpgroups) x all tokens (W the
// wgmma A operand) and the tiles' K steps
// shared out evenly over one CTA per SM; partial tiles are summed in CTA
// order through the workspace, so results are the same every launch.
// A study kernel: measured slower than cuBLASLt on every decode shape of an
// H200 (0.55-0.81x at M = 256, kernels_bench --sections streamk), so Gemm()
// never runs it; the kernel header says what the runs showed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops/gemm.h"

namespace symtp::kernels {

// Diagnostics for kernels_bench and the tests; Gemm() never sets them.
struct StreamKGemmProbe {
  // kSlots values per CTA, written by consumer thread 0: %globaltimer (ns)
  // at its start and end; clock64 at its start, when its first unit landed,
  // after its last segment's K loop, after that segment's partial was
  // written (or the later CTAs' partials were added), at its end; the SM id;
  // its units (K steps); how many partials it added.
  enum Slot : int {
    kGlobalStart,
    kGlobalEnd,
    kClockStart,
    kFirstStage,
    kLoopEnd,
    kPartialsIn,
    kClockEnd,
    kSm,
    kUnits,
    kPartialsRead,
    kSlots
  };
  unsigned long long* stamps = nullptr;  // device memory, kSlots x CTAs
};

// The grid of a launch.
struct StreamKGemmPlan {
  // CTAs per thread-block cluster: 1, 2 or 4 (the cluster's CTAs share each
  // unit's token box through TMA multicast and cover 64 W rows each).
  int cluster = 2;
  // CTAs (a multiple of `cluster`); 0: one per SM, as many clusters as the
  // device runs at once, at most `cluster` per unit.
  int64_t ctas = 0;
  // Consumer warpgroups per CTA, 1 or 2: each runs the products of 64 W rows
  // against the same token stage (2: 128-row tiles, half the token bytes per
  // product through shared memory and L2).
  int warpgroups = 1;
  std::string ToString() const;
};

// Whether `g` fits the kernel: bf16 in and out, 1 <= m <= 256, k a multiple
// of 8, a / w / c 16-byte aligned, lda / ldw / ldc multiples of 8, n and k
// below 2^31, no sm_count_target. Says nothing about the device (compute
// capability 9.0: Sm90GemmDeviceSupported()).
bool StreamKGemmArgsSupported(const GemmArgs& g);

// Units (64 x warpgroups x cluster-row W tiles x 64-wide K steps) of an
// n x k product: the work shared out over the grid's clusters.
int64_t StreamKGemmUnits(int64_t n, int64_t k, int cluster, int warpgroups = 1);

// Workspace bytes the partials of `ctas` CTAs take at m tokens.
size_t StreamKGemmWorkspaceBytes(int64_t m, int64_t ctas, int warpgroups = 1);

// The most CTAs a launch of `cluster`-CTA clusters may take at m tokens on
// the current device: every CTA must be resident at once (owners wait for
// later CTAs), so one per SM (cluster 1: a cooperative launch) or as many
// clusters as cudaOccupancyMaxActiveClusters reports (cluster 2 or 4).
// Cached per device.
absl::StatusOr<int64_t> StreamKGemmMaxCtas(int64_t m, int cluster, int warpgroups = 1);

// The grid a plan with ctas = 0 takes: StreamKGemmMaxCtas, at most `cluster`
// CTAs per unit.
absl::StatusOr<int64_t> StreamKGemmDefaultCtas(int64_t m, int64_t n, int64_t k, int cluster,
                                               int warpgroups = 1);

// Enqueues the product on `stream` (capturable). Partials go to g.workspace;
// `flags` (at least as many as CTAs) must be zero before the first launch and
// are left zero by every launch, so one launch at a time may use them (one
// stream). InvalidArgument when the arguments, the plan, the scratch or the
// device do not fit; a CUDA error otherwise. A cluster launch relies on the
// device running all its clusters at once (it asks for no more than
// StreamKGemmMaxCtas): a kernel that holds SMs beside it only delays it; a
// wait that passes ~2 s traps (a launch error), it never hangs.
absl::Status LaunchStreamKGemm(const GemmArgs& g, const StreamKGemmPlan& plan, cudaStream_t stream,
                               unsigned int* flags, int64_t num_flags,
                               const StreamKGemmProbe* probe = nullptr);

}  // namespace symtp::kernels

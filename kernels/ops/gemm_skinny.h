// A weight-streaming GEMM for decode steps with few tokens (M <= 32):
//
//   C[M, N] (bf16) = A[M, K] (bf16) · W[N, K]ᵀ (bf16), fp32 accumulation.
//
// At M <= 32 a linear layer reads its weights once and does ~M FLOPs per
// weight byte: the product is bound by how fast W streams from HBM. Each warp
// takes 16 rows of W through mma.sync.m16n8k16 with the weights as the
// 16-row operand and the tokens as the 8-column one; each thread's fragments
// are 16 contiguous bytes of a W row and of an A row, and both operands use
// the same order of K inside each 32-wide chunk, so neither needs a shuffle.
// W goes through a 3-stage cp.async ring in shared memory, 128 K per stage,
// each warp copying its own 16 rows two whole rows (2 x 256 contiguous bytes)
// per instruction into a swizzled region and sharing them with a warp barrier
// (no block barrier in the K loop); a stage's A (a few KB, shared by the
// block's warps through L1) is loaded just before the warp waits for the
// stage's W.
//
// Work items are 64 rows of W by a K slice (about two items per three
// resident blocks); resident blocks take items in turn. When K has more than one slice, each item
// writes its fp32 partial to the workspace and the block finishing a tile's last item sums the
// tile's partials in slice order (deterministic) and writes C; a counter per tile (zero between
// launches; the summing block re-zeroes it) says who is last.
//
// Opt-in (CublasLtHandle::set_skinny_max_m, --gemm-skinny-max-m): on an H200
// it is still slower than cuBLASLt on every decode shape: 0.74-0.96x at
// M = 8, 0.52-0.80x at M = 32 (bench/results/h200-2026-11-24, run f). Copies
// of 8 rows x 64 bytes per instruction (session 9's kernel) streamed W at
// 39-69% of copy bandwidth even with the products switched off; whole-row
// copies reach 80-89% (512-byte rows), against cuBLASLt's 90-104% on the
// wide layers.
// Kept, with its tests and `kernels_bench --sections skinny`, as the base
// of that work.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/ops/gemm.h"

namespace symtp::kernels {

inline constexpr int64_t kSkinnyMaxM = 32;

// Whether the kernel runs `g`: bf16 -> bf16, 1 <= m <= kSkinnyMaxM, K a
// multiple of 128, A and W 16-byte aligned with strides in multiples of 8
// elements, no sm_count_target, a compute capability >= 8.0 device, and a
// workspace of at least SkinnyGemmWorkspaceBytes.
bool SkinnyGemmSupported(const GemmArgs& g);
// fp32 partials of every (64-row tile, K slice) item; 0 when K is one slice.
size_t SkinnyGemmWorkspaceBytes(int64_t n, int64_t k);
// Tile counters the launch needs (zeroed before the first launch).
int64_t SkinnyGemmCounters(int64_t n);
// The K slice of one work item (a multiple of 128 dividing K), chosen for
// this device's resident blocks.
int64_t SkinnyGemmSliceK(int64_t n, int64_t k);

absl::Status LaunchSkinnyGemm(const GemmArgs& g, unsigned int* counters, int64_t num_counters,
                              cudaStream_t stream);

}  // namespace symtp::kernels

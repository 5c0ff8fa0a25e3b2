// CustomAllReduce: one-shot and two-shot all-reduce over CUDA IPC + NVLink for
// the messages of a tensor-parallel group of 2, 4 or 8 ranks (one process and one
// GPU each). The dispatcher (dispatcher.h) puts it in front of NCCL.
//
//   SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, device,
//                                        /*max_bytes=*/1 << 20, &exchange, deadline));
//   SYMTP_RETURN_IF_ERROR(ar->AllReduceSum(ptr, count, DType::kBF16, stream));
//   ...
//   SYMTP_RETURN_IF_ERROR(ar->Poll());   // a peer that never arrived -> error
//
// Each rank cudaMalloc's one buffer (signals, LL receive lines, staging),
// exports it with cudaIpcGetMemHandle and opens every peer's with
// cudaIpcOpenMemHandle (lazy peer access). Create() then runs a P2P probe
// (cudaDeviceCanAccessPeer + each rank writes a pattern into every peer's
// buffer, the peer verifies it and the writer reads it back through the
// mapping). Every step's verdict is exchanged, so either all ranks get an
// instance or all get the same error (and can fall back together).
//
// Protocols (custom_allreduce_kernels.cuh has the details and the buffer-reuse
// argument): LL for messages up to Options::ll_max_bytes (data and epoch in the
// same 16-byte store; one one-way latency), LL128 above it up to
// Options::ll128_max_bytes (120 data bytes and the epoch in one 128-byte line),
// STAGED above, up to max_bytes (stores into every peer's staging,
// release/acquire flags, reduction from local memory), or TWO-SHOT from
// Options::two_shot_min_bytes (reduce-scatter then all-gather through the
// same staging: 2 (N - 1) / N of the message leaves each rank instead of
// N - 1 times it). All accumulate in
// fp32 in rank order 0..N-1: every rank's result is bitwise identical. Any
// element count and any element-aligned pointer work.
//
// Ordering contract: one instance = one ordered sequence of calls. Every rank
// makes the same calls (count, dtype) in the same order, and a rank's calls on
// one instance must execute in order on the GPU (same stream, or streams
// ordered by events). Several all-reduces in flight at once on different
// streams need one instance each (each has its own buffer and counters);
// concurrent instances must fit on the GPU together (their blocks spin while
// waiting for peers).
//
// CUDA graphs: AllReduceSum is capturable and replays correctly with new
// inputs: the per-call epoch lives in device memory and is advanced by the
// kernels, nothing of the host's is baked in besides pointers and sizes.
//
// Failure: every spin is bounded by Options::timeout_ms (%globaltimer). A
// kernel that gives up records {peer, protocol, block, epoch} and exits; Poll()
// returns DeadlineExceeded naming the peer that never arrived. Abort() makes
// spinning kernels exit promptly. After either, the instance is unusable
// (AllReduceSum returns the sticky error).
//
// Teardown: destroy only when no all-reduce of this instance is in flight on
// any rank (synchronize, then a barrier across ranks), as peers read this
// rank's buffer.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "kernels/allreduce/custom_allreduce_device.h"
#include "kernels/allreduce/custom_allreduce_launch.h"
#include "kernels/allreduce/peer_exchange.h"
#include "kernels/comm.h"

namespace symtp::kernels {

class CustomAllReduce {
 public:
  struct Options {
    // Bound of every spin inside the kernels.
    int64_t timeout_ms = 5'000;
    // Protocol limits by message size: LL up to ll_max_bytes, then LL128 up
    // to ll128_max_bytes, then STAGED; the fused all-reduce + RMSNorm uses
    // LL up to fused_ll_max_bytes (capped at ll_max_bytes), then the same.
    // 0 turns a protocol off; kAuto picks the measured defaults of the group
    // size (AutoLimits in custom_allreduce.cc). Receive regions: LL costs
    // 2 (parity) x size x 2 (lines carry half data) x ll_max_bytes, LL128
    // 2 x size x 128/120 x ll128_max_bytes (capped at max_bytes).
    static constexpr size_t kAuto = ~size_t{0};
    size_t ll_max_bytes = kAuto;
    size_t fused_ll_max_bytes = kAuto;
    size_t ll128_max_bytes = kAuto;
    // Messages that would be STAGED go TWO-SHOT from this size on (and
    // their fused all-reduce + RMSNorm runs as the all-reduce then
    // AddRmsNorm); 0: never; kAuto: 1 MiB at TP 4 and 8, never at TP 2.
    size_t two_shot_min_bytes = kAuto;
    // Fixed grid of each protocol (<= 256; same on every rank). Every block
    // of a call must be able to run at once with the blocks of any other
    // all-reduce in flight (they spin waiting for peers). The fused
    // all-reduce + RMSNorm shares its protocol's grid: at TP 2 (H200 x2) 128 LL
    // blocks made the plain all-reduce faster at 256 KiB (3.93 vs 4.26 us)
    // and the fused one, which a decode step runs, slower at 1-16 rows.
    int staged_blocks = 64;
    int ll_blocks = 64;
    // LL128 at TP 2 (H100 x2, graph-timed): 128 blocks of 512 threads keep
    // one line per thread up to 1 MiB (5.57 us there, 64 blocks: 6.38; 256:
    // 5.53 but two instances in flight would not fit: 2 blocks per SM).
    int ll128_blocks = 128;
    // TWO-SHOT runs on the staged grid (at least 4 blocks). Messages from
    // two_shot_pipeline_min_bytes on are pipelined in chunks of about
    // two_shot_chunk_bytes of each rank's part (at least one per scatter
    // block, at most 256), the first two_shot_scatter_blocks blocks
    // scattering, the next two_shot_reduce_blocks reducing, the rest
    // gathering; smaller ones run one chunk per block. 0: the defaults
    // (AutoTwoShot in custom_allreduce.cc).
    size_t two_shot_pipeline_min_bytes = 0;
    size_t two_shot_chunk_bytes = 0;
    int two_shot_scatter_blocks = 0;
    int two_shot_reduce_blocks = 0;
    // Receive capacity of the copy exchange per op and peer (0: none); scratch
    // grows by 2 x (size - 1) x this.
    size_t copy_bytes = 0;
    // Initial value of every epoch counter (tests start near 2^32 to wrap).
    uint32_t initial_epoch = 0;
  };
  using Protocol = allreduce_internal::Protocol;

  // Collective over `exchange` (every rank calls it with the same size,
  // max_bytes and options). `device` is made current. size must be 2, 4 or 8.
  // Errors: Unimplemented (size), FailedPrecondition (no P2P, probe failed,
  // options differ across ranks; the message names the rank and why),
  // DeadlineExceeded (a peer did not show up), CUDA errors.
  static absl::StatusOr<std::unique_ptr<CustomAllReduce>> Create(int rank, int size, int device,
                                                                  size_t max_bytes,
                                                                  PeerExchange* exchange,
                                                                  Deadline deadline);
  static absl::StatusOr<std::unique_ptr<CustomAllReduce>> Create(int rank, int size, int device,
                                                                  size_t max_bytes,
                                                                  PeerExchange* exchange,
                                                                  Deadline deadline,
                                                                  const Options& options);
  ~CustomAllReduce();
  CustomAllReduce(const CustomAllReduce&) = delete;
  CustomAllReduce& operator=(const CustomAllReduce&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  size_t max_bytes() const { return max_bytes_; }
  size_t ll_max_bytes() const { return ll_max_bytes_; }
  int staged_blocks() const { return args_.staged_blocks; }
  int ll_blocks() const { return args_.ll_blocks; }
  int ll128_blocks() const { return args_.ll128_blocks; }
  // Largest message LL128 carries (0: none); AllReduceSum picks it above
  // ll_max_bytes().
  size_t ll128_max_bytes() const { return ll128_max_bytes_; }
  // Largest message the fused all-reduce + RMSNorm sends with LL.
  size_t fused_ll_max_bytes() const { return fused_ll_max_bytes_; }
  // Smallest message AllReduceSum sends TWO-SHOT (above the LL and LL128
  // limits; SIZE_MAX: none).
  size_t two_shot_min_bytes() const { return two_shot_min_bytes_; }
  // The same for logs: "from N B" or "never".
  std::string TwoShotLimitName() const;
  // Device memory this rank allocated (signals + LL lines + staging).
  size_t scratch_bytes() const { return total_bytes_; }

  // In-place sum of `count` elements at `data` (device memory of `device`),
  // enqueued on `stream`; count * DTypeSize(dtype) <= max_bytes. The protocol
  // is chosen by size (LL up to ll_max_bytes, then LL128 up to
  // ll128_max_bytes, then STAGED, or TWO-SHOT from two_shot_min_bytes).
  absl::Status AllReduceSum(void* data, size_t count, DType dtype, cudaStream_t stream);
  // The protocol AllReduceSum uses for a message of `bytes`.
  Protocol ProtocolFor(size_t bytes) const;
  // "LL", "LL128", "staged" or "two-shot" (as errors and benchmarks name
  // them).
  static const char* ProtocolName(Protocol protocol);
  // Same with the protocol forced (benchmarks, tests). kLL needs
  // bytes <= ll_max_bytes, kLL128 bytes <= ll128_max_bytes.
  absl::Status AllReduceSumWith(Protocol protocol, void* data, size_t count, DType dtype,
                                cudaStream_t stream);

  // The all-reduce of a [norm.rows, norm.hidden] message fused with the
  // residual add and RMSNorm after it (fused_norm_kernels.cuh): one kernel on
  // the same buffers, counters and protocol choice as AllReduceSum, so the
  // two kinds of call interleave freely. `data` is only read. Needs f32 or
  // bf16, hidden a whole number of 16-byte units (at most kFusedMaxUnits),
  // 16-byte aligned pointers and the message within max_bytes (`data`'s
  // alignment is checked by the call, InvalidArgument when it is not).
  bool FusesResidualNorm(const ResidualNorm& norm, DType dtype) const;
  // The protocol AllReduceResidualNorm uses for a message of `bytes`: LL up
  // to fused_ll_max_bytes, then LL128 up to ll128_max_bytes, then STAGED.
  Protocol FusedProtocolFor(size_t bytes) const;
  absl::Status AllReduceResidualNorm(const void* data, const ResidualNorm& norm, DType dtype,
                                     cudaStream_t stream);
  // Whether the producer of a fused call's `data` may send it as LL lines
  // (bf16, FusesResidualNorm, the message within the LL region, 2-8 ranks):
  // fills *push with this instance's LL receive regions. A call made with
  // norm.pushed then runs the LL kernel's receive only, from its start
  // (comm.h, LLPush).
  bool ProducerPush(const ResidualNorm& norm, DType dtype, LLPush* push) const;

  // Copy exchange: the all-reduce of a large row-parallel output in row
  // chunks, each sent by the copy engines (no SMs) while the GEMM of the next
  // chunk runs, and summed by the kernel that applies the residual add and
  // RMSNorm to it. Per step, on every rank in the same order:
  //   CopyBeginStep(main)                 advances the step epoch
  //   CopySend(chunk, op, flag, side)     after the chunk's producer (an event
  //                                       edge from main into side): its bytes
  //                                       into every peer's slot of op, then the
  //                                       step epoch into every peer's flag
  //   CopyReceiveResidualNorm(.., main)   after the same rank's CopySend of
  //                                       that (op, flag) completed (an event
  //                                       edge from side back into main): waits
  //                                       for every peer's flag, sums in rank
  //                                       order, residual + RMSNorm
  // A flag is used once per step; a slot's bytes are rewritten only after every
  // rank consumed them (the callers' data dependencies: a chunk of op 0 is
  // resent only after the next attention, which needs every rank's op 1
  // chunks of the layer before, which follow their op 0 receives). Op is 0 or
  // 1, flag < kCopyFlags, offsets 16-byte aligned within copy_bytes.
  size_t copy_bytes() const { return copy_bytes_; }
  absl::Status CopyBeginStep(cudaStream_t stream);
  absl::Status CopySend(const void* data, size_t offset_bytes, size_t bytes, int op, int flag,
                        cudaStream_t stream);
  // `data`: this rank's rows of the chunk; `row0` the chunk's first row in
  // the op's slots (its offset in CopySend / the row bytes).
  absl::Status CopyReceiveResidualNorm(const void* data, int64_t row0, int op, int flag,
                                       const ResidualNorm& norm, DType dtype, cudaStream_t stream);

  // OK while healthy; DeadlineExceeded naming the peer after a kernel timed
  // out; Aborted after Abort(). Cheap (reads host-mapped memory).
  absl::Status Poll();
  // Makes spinning kernels give up; idempotent.
  void Abort();

 private:
  CustomAllReduce() = default;
  absl::Status Init(int rank, int size, int device, size_t max_bytes, PeerExchange* exchange,
                    Deadline deadline, const Options& options);
  absl::Status Probe(PeerExchange* exchange, Deadline deadline, uint32_t nonce);
  // ProducerPush's condition (the LL region holds ll_max_bytes_).
  bool PushFits(const ResidualNorm& norm, DType dtype) const;
  absl::Status CheckCopy(size_t offset_bytes, size_t bytes, int op, int flag) const;
  absl::Status Sticky();
  // LL up to ll_limit, then LL128 up to ll128_max_bytes_, then STAGED.
  Protocol ProtocolUpTo(size_t bytes, size_t ll_limit) const;

  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  size_t max_bytes_ = 0;
  size_t ll_max_bytes_ = 0;
  size_t fused_ll_max_bytes_ = 0;  // Options::fused_ll_max_bytes capped at ll_max_bytes_
  size_t ll128_max_bytes_ = 0;
  size_t two_shot_min_bytes_ = ~size_t{0};
  size_t total_bytes_ = 0;
  size_t copy_bytes_ = 0;
  int64_t timeout_ms_ = 0;
  char* buffer_ = nullptr;                   // own cudaMalloc
  char* peers_[allreduce_internal::kMaxRanks] = {};  // opened IPC mappings (nullptr for self)
  unsigned long long* error_host_ = nullptr;  // cudaHostAlloc, mapped
  int* abort_host_ = nullptr;                 // cudaHostAlloc, mapped
  allreduce_internal::DeviceArgs args_{};
  std::atomic<bool> aborted_{false};
};

}  // namespace symtp::kernels

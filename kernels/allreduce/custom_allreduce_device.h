// Plain-data handle that the custom all-reduce kernels receive by value (the
// host object is CustomAllReduce, custom_allreduce.h). Host-compilable: no
// CUDA device code here.
//
// Per-rank buffer (one cudaMalloc, exported with cudaIpcGetMemHandle, opened by
// every peer), offsets in bytes from its base:
//
//   [0, kSignalBytes)             signals
//     flags[kMaxBlocks][kMaxRanks]  u32  staged protocol: flags[b][src] is
//                                        written by rank `src` (remote store),
//                                        polled by the owner (local load)
//     epoch_staged[kMaxBlocks]      u32  owner-only per-block call counters
//     epoch_ll[kMaxBlocks]          u32
//     epoch_ll128[kMaxBlocks]       u32
//     error                         u64  first error of a kernel (atomicCAS)
//     abort_mirror[2]               u32  owner-only: [0] the host's abort word
//                                        seen set, [1] when a spinner last read
//                                        it (globaltimer / 1024, ~us)
//     scatter_flags[kMaxBlocks][kMaxRanks] u32  two-shot protocol: its
//                                        scatter step's flags per chunk (its
//                                        reduce step's are flags[chunk])
//   [ll_offset, +ll_bytes)        LL receive lines, [parity 2][src N][lines]
//                                  x 16 B, written by the peers, polled by the
//                                  owner ({data lo, epoch, data hi, epoch})
//   [ll128_offset, +ll128_bytes)  LL128 receive lines, [parity 2][src N]
//                                  [lines] x 128 B (120 data bytes, then the
//                                  epoch twice), written by the peers, polled
//                                  by the owner
//   [stage_offset, +2*(N-1)*stage_bytes) staged and two-shot receive slots,
//                                  [parity 2][src slot N-1][bytes] (src's slot
//                                  is src - (src > owner)), written by the
//                                  peers (remote stores), read by the owner
//   [copy_flags_offset, +kCopyFlags*kMaxRanks*4) copy exchange flags
//                                  [flag][src] u32, written by the peers'
//                                  copy engines (the sender's step epoch),
//                                  polled by the owner
//   [copy_offset, +2*(N-1)*copy_bytes) copy exchange receive slots
//                                  [op 2][src slot N-1][bytes], written by the
//                                  peers' copy engines, read by the owner
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define SYMTP_AR_HD __host__ __device__
#else
#define SYMTP_AR_HD
#endif

namespace symtp::kernels::allreduce_internal {

inline constexpr int kMaxRanks = 8;
inline constexpr int kMaxBlocks = 256;
inline constexpr size_t kFlagsOffset = 0;
inline constexpr size_t kEpochStagedOffset = kFlagsOffset + kMaxBlocks * kMaxRanks * 4;
inline constexpr size_t kEpochLLOffset = kEpochStagedOffset + kMaxBlocks * 4;
inline constexpr size_t kEpochLL128Offset = kEpochLLOffset + kMaxBlocks * 4;
inline constexpr size_t kErrorOffset = kEpochLL128Offset + kMaxBlocks * 4;  // u64, device copy
inline constexpr size_t kAbortMirrorOffset = kErrorOffset + 8;  // u32 [2]
inline constexpr size_t kScatterFlagsOffset = kErrorOffset + 16;
static_assert(kAbortMirrorOffset + 8 <= kScatterFlagsOffset);
// Copy exchange: the step epoch (owner-only; CopyBeginStep advances it, the
// copy engine sends it to the peers after each chunk's data).
inline constexpr size_t kCopyEpochOffset = kScatterFlagsOffset + kMaxBlocks * kMaxRanks * 4;
// Flags of the copy exchange: one per (layer, op, chunk) of a step.
inline constexpr int kCopyFlags = 2048;
inline constexpr size_t kSignalBytes = 32 * 1024;
static_assert(kCopyEpochOffset + 16 <= kSignalBytes);
inline constexpr size_t kLLLineBytes = 16;  // carries 8 data bytes
inline constexpr size_t kLL128LineBytes = 128;
inline constexpr size_t kLL128DataBytes = 120;  // then the 8-byte flag {epoch, epoch}
inline constexpr int kStagedThreads = 512;
inline constexpr int kLLThreads = 256;
inline constexpr int kLL128Threads = 512;

// Error word (64 bit, first error wins): claimed with atomicCAS on the device
// copy in the owner's signal region (kErrorOffset), then mirrored by the
// winning thread into a host-mapped word that Poll() reads:
//   [63:56] code  [55:48] peer rank  [47:40] protocol  [39:32] block
//   [31:0]  epoch of the call
enum ErrorCode : uint32_t { kErrNone = 0, kErrTimeout = 1, kErrAborted = 2 };
enum ProtocolTag : uint32_t {
  kTagStaged = 1,
  kTagLL = 2,
  kTagLL128 = 3,
  kTagTwoShot = 4,
  kTagCopy = 5
};

SYMTP_AR_HD inline uint64_t PackError(uint32_t code, uint32_t peer, uint32_t protocol,
                                      uint32_t block, uint32_t epoch) {
  return (static_cast<uint64_t>(code & 0xff) << 56) | (static_cast<uint64_t>(peer & 0xff) << 48) |
         (static_cast<uint64_t>(protocol & 0xff) << 40) |
         (static_cast<uint64_t>(block & 0xff) << 32) | epoch;
}

struct DeviceArgs {
  char* base[kMaxRanks];             // every rank's buffer, mapped here (own at [rank])
  unsigned long long* error_host;    // host-mapped mirror, device pointer
  const volatile int* abort_word;    // host-mapped, device pointer; nonzero = abort
  unsigned int* abort_mirror;        // own buffer + kAbortMirrorOffset (SpinBound)
  uint64_t timeout_ns;               // bound of every spin (%globaltimer)
  size_t ll_offset;
  size_t ll_lines;                   // capacity in lines per (parity, src)
  size_t stage_offset;
  size_t stage_bytes;                // capacity per (parity, src slot)
  size_t ll128_offset;
  size_t ll128_lines;  // capacity in 128-byte lines per (parity, src)
  int rank;
  int size;
  int staged_blocks;
  int ll_blocks;
  int ll128_blocks;
  // TWO-SHOT (on the staged grid): messages from two_shot_pipeline_min_bytes
  // are pipelined in chunks of about two_shot_chunk_bytes of a rank's part,
  // the first blocks scattering and reducing, the rest gathering.
  size_t two_shot_pipeline_min_bytes;
  size_t two_shot_chunk_bytes;
  int two_shot_scatter_blocks;
  int two_shot_reduce_blocks;
  // Copy exchange (0 bytes: none): receive slots of copy_bytes per (op, src).
  size_t copy_flags_offset;
  size_t copy_offset;
  size_t copy_bytes;
};

// Copy exchange: where rank `src`'s bytes of `op` land in rank `owner`'s
// buffer (src's slot is src - (src > owner)), and src's flag `flag` there.
SYMTP_AR_HD inline size_t CopySlotOffset(const DeviceArgs& a, int op, int owner, int src) {
  const size_t slot = static_cast<size_t>(op) * (a.size - 1) + (src - (src > owner ? 1 : 0));
  return a.copy_offset + slot * a.copy_bytes;
}
SYMTP_AR_HD inline size_t CopyFlagOffset(const DeviceArgs& a, int flag, int src) {
  return a.copy_flags_offset + (static_cast<size_t>(flag) * kMaxRanks + src) * 4;
}

}  // namespace symtp::kernels::allreduce_internal

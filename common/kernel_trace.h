// In-graph kernel timeline (a study build: cmake -DSYMTP_KERNEL_TRACE=ON).
// The project's kernels, built with SYMTP_KERNEL_TRACE, record one Record per
// block: %globaltimer at entry, after the block's first grid-dependency wait
// and at the leader thread's exit, into a device ring that Enable allocates.
// A timeline inside a CUDA graph with programmatic dependent launch, which
// no profiler here gives (ncu serializes kernels).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace symtp::trace {

struct Record {
  uint32_t kind = 0;   // Kind
  uint32_t block = 0;  // linear block index
  uint32_t smid = 0;
  uint32_t grid = 0;  // blocks in the grid
  uint64_t t_entry = 0;
  uint64_t t_wait = 0;  // 0: the block did not wait
  uint64_t t_exit = 0;
};
static_assert(sizeof(Record) == 40);

enum Kind : uint32_t {
  kGemv = 1,
  kFusedNormLL,
  kFusedNormLL128,
  kFusedNormStaged,
  kAllReduceLL,
  kAllReduceLL128,
  kAllReduceStaged,
  kAddRmsNorm,
  kRopeKv,
  kDecodeAttention,
  kMergeSplits,
  kSiluMul,
  kEmbedding,
  kGatherRows,
  kForwardTokens,
  kSample,
  kSampleShardCandidates,
  kSampleFromCandidates,
  kAllReduceTwoShot,
  kFusedNormCopy,
};

// Sets one compiled module's ring pointers (each translation unit with traced
// kernels registers one: without relocatable device code every module has its
// own device symbols).
using ModuleSetter = cudaError_t (*)(Record* ring, unsigned long long* count, unsigned mask);
bool RegisterModule(ModuleSetter setter);

// Whether this build's kernels record (cmake -DSYMTP_KERNEL_TRACE=ON).
#ifdef SYMTP_KERNEL_TRACE
inline constexpr bool kCompiled = true;
#else
inline constexpr bool kCompiled = false;
#endif

// Allocates a ring of 2^log2_records records on the current device and
// points every registered module at it. FailedPrecondition when already
// enabled or when this build's kernels do not record.
absl::Status Enable(int log2_records);
// Stops the kernels' recording (the ring and what it holds stay for
// DumpAndDisable), so that a job's later steps do not overwrite the ones of
// interest. Call with no recording kernel in flight (a kernel that reads the
// ring pointer while it changes may drop its record). No-op when not enabled.
absl::Status Pause();
// Writes the ring's records, oldest first, to `path` and frees it: three
// uint64 (records written, the ring's capacity, records in the file; more
// written than the capacity: the oldest were overwritten), then the Records.
absl::Status DumpAndDisable(const std::string& path);

}  // namespace symtp::trace

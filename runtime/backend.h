// What a worker runs a step on. The CPU backend (CpuModel + shared-memory
// collectives) and the CUDA backend (GpuModel + NCCL / custom all-reduce)
// implement it; the worker loop does not know which one it has.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/batch.h"
#include "models/config.h"
#include "models/sampling.h"
#include "runtime/layout.h"
#include "runtime/options.h"

namespace symtp::runtime {

struct BackendTimings {
  int64_t forward_ns = 0;      // host-observed forward time (GPU: event time when available)
  int64_t sample_ns = 0;
  int64_t device_forward_ns = 0;  // GPU time by events, 0 on the CPU backend
  int64_t device_idle_ns = 0;     // GPU idle since the previous step by events (0: unknown)
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Runs the model over `in` and samples one token per entry of
  // in.sample_index with params[i] at positions[i] (identically on every rank).
  virtual absl::Status Step(const model::BatchInput& in,
                            absl::Span<const model::SamplingParams> params,
                            absl::Span<const int32_t> positions, std::vector<int32_t>* tokens,
                            BackendTimings* timings) = 0;
  // v0 mode: only rank 0 samples; other ranks run the forward pass.
  virtual absl::Status ForwardOnly(const model::BatchInput& in, BackendTimings* timings) = 0;
  // v0 mode: root's `bytes` at `data` reach every rank's `data` (the padded
  // batch broadcast). CPU: through shared memory; CUDA: NCCL on the device.
  virtual absl::Status BroadcastBatch(void* data, size_t bytes, int root) = 0;
  virtual std::string Describe() const = 0;
};

// KV blocks every process derives from the same flags.
int NumKvBlocks(const JobOptions& opts, const model::ModelConfig& cfg);
// The longest sequence (prompt + output) the workload can produce.
int JobMaxSeqLen(const JobOptions& opts, const model::ModelConfig& cfg);

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const JobOptions& opts,
                                                          const model::ModelConfig& cfg,
                                                          int rank, JobHandle* job);
#if defined(SYMTP_HAVE_GPU_MODEL)
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const JobOptions& opts,
                                                           const model::ModelConfig& cfg,
                                                           int rank, int device, JobHandle* job);
#endif

}  // namespace symtp::runtime

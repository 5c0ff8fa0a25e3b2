// What a worker runs a step on. The CPU backend (CpuModel + shared-memory
// collectives) and the CUDA backend (GpuModel + NCCL / custom all-reduce)
// implement it; the worker loop does not know which one it has.
#pragma once

#include <cstdint>
#include <deque>
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
  bool graph = false;             // the forward replayed a CUDA graph
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Runs the model over `in` and samples one token per entry of
  // in.sample_index with params[i] at positions[i] (identically on every rank).
  // With `params` empty it only runs the model (v0's ranks other than 0).
  virtual absl::Status Step(const model::BatchInput& in,
                            absl::Span<const model::SamplingParams> params,
                            absl::Span<const int32_t> positions, std::vector<int32_t>* tokens,
                            BackendTimings* timings) = 0;

  // Pipelined stepping (the v1 worker). Launch starts a step whose input
  // tokens with prev_sample[i] >= 0 are replaced by the previous launched
  // step's sampled token number prev_sample[i] (in its sample order): tokens
  // that are still on the device when the step is launched. Collect waits for
  // the oldest launched step and returns its sampled tokens. At most
  // kMaxInFlight steps are launched and not collected. `prev_sample` is empty
  // or has one entry per input token.
  static constexpr int kMaxInFlight = 2;
  virtual absl::Status Launch(const model::BatchInput& in,
                              absl::Span<const model::SamplingParams> params,
                              absl::Span<const int32_t> positions,
                              absl::Span<const int32_t> prev_sample);
  virtual absl::Status Collect(std::vector<int32_t>* tokens, BackendTimings* timings);
  // Whether Collect would return at once (the oldest launched step is done,
  // or failed). Never blocks.
  virtual bool OldestDone() { return true; }

  virtual std::string Describe() const = 0;
  // What the backend counted over the run, for the worker's last log line
  // (empty: nothing to say).
  virtual std::string RunStats() const { return {}; }
  // KV cache blocks this rank allocated (per layer).
  virtual int num_kv_blocks() const = 0;

 protected:
  int in_flight_ = 0;

 private:
  // The synchronous default of Launch/Collect (CPU): Launch runs Step.
  struct Done {
    std::vector<int32_t> tokens;
    BackendTimings timings;
  };
  std::deque<Done> done_;
  std::vector<int32_t> last_sampled_;
  model::BatchInput substituted_;
};

class BatchBroadcast;  // runtime/v0.h

// The backends. `v0` (null in v1 mode) receives the backend's BatchBroadcast
// for v0 mode, valid while the backend lives.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const JobOptions& opts,
                                                          const model::ModelConfig& cfg,
                                                          int rank, JobHandle* job,
                                                          BatchBroadcast** v0);
#if defined(SYMTP_HAVE_GPU_MODEL)
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const JobOptions& opts,
                                                           const model::ModelConfig& cfg,
                                                           int rank, int device, JobHandle* job,
                                                           BatchBroadcast** v0);
#endif

}  // namespace symtp::runtime

// The step result: what each worker rank returns to the scheduler after step
// `step` (sampled tokens, the rank's state digest, per-phase timings), and its
// wire encoding (same frame header as the diff; see protocol/README.md).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace symtp::proto {

inline constexpr uint32_t kMaxRanks = 1u << 16;
// Header flag bit 0: the step's forward replayed a CUDA graph on this rank.
inline constexpr uint16_t kResultFlagGraph = 1;
inline constexpr uint16_t kResultKnownFlags = kResultFlagGraph;

struct SampledToken {
  uint64_t request_id = 0;
  int32_t token = 0;  // >= 0
  friend bool operator==(const SampledToken&, const SampledToken&) = default;
};

// Per-phase wall times of one step on one rank, nanoseconds.
struct PhaseTimings {
  uint64_t recv_wait_ns = 0;  // waiting for the diff
  uint64_t apply_ns = 0;      // decode + apply the diff
  uint64_t build_ns = 0;      // build the model input
  uint64_t forward_ns = 0;
  uint64_t sample_ns = 0;
  uint64_t total_ns = 0;
  uint64_t gpu_idle_ns = 0;  // GPU idle before this step by events (0: unknown / CPU)
  // Absolute CLOCK_MONOTONIC times (one clock for every process of a host):
  // the diff received, the step launched, its outputs collected, the result
  // about to be published. 0: unknown.
  uint64_t recv_at_ns = 0, launch_at_ns = 0, collect_at_ns = 0, result_at_ns = 0;
  friend bool operator==(const PhaseTimings&, const PhaseTimings&) = default;
};

struct StepResult {
  uint64_t step = 0;
  uint32_t rank = 0;
  uint64_t digest = 0;                // WorkerState::Digest() after the step
  std::vector<SampledToken> sampled;  // in the worker's sample order
  PhaseTimings timings;
  bool graph = false;  // the forward replayed a CUDA graph (header flag kResultFlagGraph)
  friend bool operator==(const StepResult&, const StepResult&) = default;
};

size_t MaxEncodedResultSize(const StepResult& r);
absl::Status EncodeResult(const StepResult& r, std::vector<uint8_t>* out);
absl::StatusOr<size_t> EncodeResultTo(const StepResult& r, absl::Span<uint8_t> out);

// Same checks as DecodeDiff: header, CRC-32C, counts against remaining bytes,
// value ranges, canonical varints, no trailing bytes.
absl::StatusOr<StepResult> DecodeResult(absl::Span<const uint8_t> record);
absl::Status DecodeResultInto(absl::Span<const uint8_t> record, StepResult* out);

}  // namespace symtp::proto

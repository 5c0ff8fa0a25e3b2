// The step diff: what the scheduler sends to every worker rank each step, and
// its wire encoding (see protocol/README.md for the byte layout).
//
// Semantics (the worker side is worker/state/worker_state.h):
//  - Each step t the scheduler publishes exactly one StepDiff with step == t;
//    steps start at 0 and increase by one. A worker applies them in order.
//  - Removals are applied first, in this order: finished, aborted, preempted.
//    The worker drops the request's state. A preempted request is recomputed
//    later: it comes back in `new_requests` with prompt = its original prompt
//    followed by every token generated so far.
//  - Then new requests (id, prompt, sampling params, max_new_tokens, eos,
//    initial block ids, num_scheduled = the size of its first prefill chunk).
//  - Then continuing requests (id, num_scheduled, new block ids appended to
//    its block table). For a request in decode num_scheduled is 1.
//  - Each scheduled request appears once per diff (in new_requests or in
//    continuing); a request in a removal list is not scheduled in the same
//    diff; ids are unique across all lists. A request is scheduled on the
//    tokens [num_computed, num_computed + num_scheduled) of its token list
//    (prompt + sampled tokens); when that range ends at the end of the list,
//    the step samples one token for it.
//  - Sampled tokens are NOT in the diff: every rank samples them itself.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace symtp::proto {

// KV-cache block size in tokens (the model contract, docs/MODEL.md).
inline constexpr int32_t kBlockSize = 16;

// Decoder sanity limits. A count or value above them is a malformed record.
inline constexpr uint64_t kMaxEntriesPerList = 1u << 20;    // requests / ids per list
inline constexpr uint64_t kMaxTokensPerRequest = 1u << 24;  // prompt, num_scheduled, max_new
inline constexpr uint64_t kMaxBlocksPerRequest = 1u << 20;
inline constexpr uint64_t kMaxInt32 = 0x7fffffff;  // token ids, block ids, top_k

// Diff flags (header flags field).
enum DiffFlags : uint16_t {
  kDiffFlagEndOfJob = 1u << 0,  // no step follows this one; workers shut down after it
};
inline constexpr uint16_t kDiffKnownFlags = kDiffFlagEndOfJob;

// The wire copy of model::SamplingParams (models/sampling.h): same fields,
// same meaning. The protocol library sits below models/, so it has its own.
struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy; finite, >= 0
  int32_t top_k = 0;        // 0 = off; >= 0
  float top_p = 1.f;        // in (0, 1]; 1 = off
  uint64_t seed = 0;
  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

struct NewRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;  // non-empty; for a resumed request: prompt + generated
  SamplingParams sampling;
  uint32_t max_new_tokens = 0;     // >= 1; for a resumed request: what remains
  std::optional<int32_t> eos_id;   // >= 0 when set
  uint32_t num_scheduled = 0;      // first prefill chunk, 1..prompt.size()
  std::vector<int32_t> block_ids;  // initial block table, >= ceil(num_scheduled / 16)
  friend bool operator==(const NewRequest&, const NewRequest&) = default;
};

struct ContinuingRequest {
  uint64_t id = 0;
  uint32_t num_scheduled = 0;  // >= 1; 1 for decode
  uint32_t block_offset = 0;   // its new blocks: StepDiff::continuing_blocks[off, off + n)
  uint32_t num_new_blocks = 0;
  friend bool operator==(const ContinuingRequest&, const ContinuingRequest&) = default;
};

struct StepDiff {
  uint64_t step = 0;
  uint16_t flags = 0;  // DiffFlags
  std::vector<NewRequest> new_requests;
  // Flattened so that a steady decode step allocates nothing: each entry's
  // new block ids are a contiguous range of `continuing_blocks`, the ranges
  // in entry order and back to back. Build entries with AddContinuing().
  std::vector<ContinuingRequest> continuing;
  std::vector<int32_t> continuing_blocks;
  std::vector<uint64_t> finished;
  std::vector<uint64_t> aborted;
  std::vector<uint64_t> preempted;

  void AddContinuing(uint64_t id, uint32_t num_scheduled,
                     absl::Span<const int32_t> new_blocks = {});
  absl::Span<const int32_t> NewBlocks(const ContinuingRequest& c) const {
    return absl::MakeConstSpan(continuing_blocks).subspan(c.block_offset, c.num_new_blocks);
  }
  bool end_of_job() const { return (flags & kDiffFlagEndOfJob) != 0; }
  // Number of requests scheduled (new + continuing).
  size_t num_scheduled_requests() const { return new_requests.size() + continuing.size(); }
  // Empties every list, keeping the vectors' capacity.
  void Clear();

  friend bool operator==(const StepDiff&, const StepDiff&) = default;
};

// Full semantic check of a diff on its own (no worker state): every field in
// range, num_scheduled within the prompt, enough initial blocks, continuing
// block ranges contiguous and inside the pool, ids unique across all lists,
// block ids unique across the diff. O(diff) with hash sets; the encoder and
// decoder do only the per-field checks (the worker catches the rest).
absl::Status ValidateDiff(const StepDiff& diff);

// Upper bound of the encoded size (header included). O(diff).
size_t MaxEncodedDiffSize(const StepDiff& diff);

// Encodes into `out` (resized to the exact record size; capacity is reused).
// InvalidArgument if a field is out of range (names the field and request).
absl::Status EncodeDiff(const StepDiff& diff, std::vector<uint8_t>* out);

// Encodes into a caller buffer (e.g. a ring slot), returns the record size.
// ResourceExhausted if `out` is smaller than the record.
absl::StatusOr<size_t> EncodeDiffTo(const StepDiff& diff, absl::Span<uint8_t> out);

// Decodes one record occupying exactly `record`. Checks magic, version, flags,
// payload length, CRC-32C, then every count against the remaining bytes and
// the limits above, every value's range, canonical varints and no trailing
// bytes. Truncation and checksum failures are DataLoss, malformed fields
// InvalidArgument; messages name the field. Never reads out of bounds.
absl::StatusOr<StepDiff> DecodeDiff(absl::Span<const uint8_t> record);

// Same, into `out`, reusing its vectors' capacity (no allocation in a steady
// decode step). On error `out` is left in an unspecified but valid state.
absl::Status DecodeDiffInto(absl::Span<const uint8_t> record, StepDiff* out);

}  // namespace symtp::proto

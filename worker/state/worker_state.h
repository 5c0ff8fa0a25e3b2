// WorkerState: the request state every worker rank caches, kept identical on
// all ranks by applying the same StepDiff sequence and the same sampled tokens.
//
// Per step t (the worker loop):
//   ApplyDiff(diff t)          O(diff): removals, new requests, continuing
//                              requests; checks diff.step == t (the next step)
//   BuildInput(&batch)         O(batch): the step's model input (may be repeated)
//   ... forward, sample the logits at batch.sample_index ...
//   ApplySampled(tokens)       appends one token per sampled sequence, in
//                              sample order; completes step t
//   Digest(), last_sampled()   for the StepResult of step t
//
// The persistent batch: each live request owns one row; new requests are
// appended, removed ones are swap-removed (the last row moves into the hole),
// everything else stays in place. BuildInput emits the scheduled rows in row
// order, so in a steady decode the model input's sequence i is row i and only
// the rows listed by rows_changed() differ from the previous step.
//
// A request's token list is its prompt followed by the tokens sampled so far.
// A step schedules tokens [c, c + n) where c = tokens computed before the step;
// a decode schedules exactly the last sampled token. When c + n reaches the
// end of the list the step samples the next token (position c + n).
//
// Errors: a diff that does not fit the state (wrong step, unknown / duplicate
// id, block out of range or owned by another request, more tokens scheduled
// than the request has, not enough blocks, a sample beyond max_new_tokens) is
// an error naming the step, the request and the field. An error after the
// state started to change poisons the object: every later call fails with
// FailedPrecondition (the worker must stop; its state no longer matches the
// other ranks').
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/batch.h"
#include "models/sampling.h"
#include "protocol/diff.h"
#include "protocol/result.h"

namespace symtp::worker {

struct WorkerStateConfig {
  int32_t num_kv_blocks = 0;   // block ids must be in [0, num_kv_blocks)
  int32_t max_seq_len = 4096;  // prompt + max_new_tokens of any request
  int32_t block_size = 16;     // must be 16 (docs/MODEL.md)
  uint64_t first_step = 0;     // the step number of the first diff
};

inline model::SamplingParams ToModelSampling(const proto::SamplingParams& p) {
  return model::SamplingParams{p.temperature, p.top_k, p.top_p, p.seed};
}

struct CachedRequest {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt + sampled tokens
  int32_t prompt_len = 0;
  int32_t num_computed = 0;  // tokens whose KV is computed once the open step completes
  int32_t num_sampled = 0;
  // tokens[0, confirmed) are known; the rest (at most the last two) are
  // placeholders of sampled tokens still on the device (pipelined worker).
  int32_t confirmed = 0;
  int32_t max_new_tokens = 0;
  std::optional<int32_t> eos_id;
  model::SamplingParams sampling;
  std::vector<int32_t> block_table;
  int32_t row = -1;
  int32_t num_scheduled = 0;  // in step sched_step (stale for other steps)
  // Internal bookkeeping.
  uint64_t sched_step = ~uint64_t{0};  // the last step that scheduled it
  uint64_t static_hash = 0, token_hash = 0, block_hash = 0, contrib = 0;
  bool live = false;
  bool dirty = false;
};

// An input token whose value is a sampled token still on the device: the
// model must take it from the previous step's sample `position` of `request_id`.
struct PendingInput {
  int32_t token_index = 0;  // into BatchInput::tokens
  uint64_t request_id = 0;
  int32_t position = 0;
};

inline constexpr int32_t kPendingToken = 0;  // the placeholder value in tokens

class WorkerState {
 public:
  static absl::StatusOr<WorkerState> Create(const WorkerStateConfig& config);

  absl::Status ApplyDiff(const proto::StepDiff& diff);

  // Fills `out` (its vectors are reused: no allocation once warmed up).
  // FailedPrecondition unless a step is open (ApplyDiff done, ApplySampled not).
  absl::Status BuildInput(model::BatchInput* out);

  // One token per sampled sequence, in sample order (the order of
  // BatchInput::sample_index). InvalidArgument on a count mismatch or a
  // negative token (nothing is appended then).
  absl::Status ApplySampled(absl::Span<const int32_t> tokens_in_sample_order);

  // Pipelined worker: closes the open step like ApplySampled but with the
  // tokens still unknown (they stay on the device and feed the next step):
  // each sampled sequence gets a placeholder (kPendingToken) that the next
  // BuildInput lists in input_pending(). last_sampled() has token -1 then.
  // The digest covers only confirmed tokens, so it is the same whenever the
  // real values arrive.
  absl::Status ApplySampledPending();
  // The real values of placeholders: (request id, position, token) of one
  // step, in any order. Entries of requests removed since, or re-added with
  // the token known, are ignored; confirming out of order (a gap) is an
  // internal error. Call with no step open. The worker calls it at a fixed
  // point (after the next step's ApplySampledPending) so every rank's digest
  // sequence is the same.
  absl::Status ConfirmSampled(absl::Span<const uint64_t> ids, absl::Span<const int32_t> positions,
                              absl::Span<const int32_t> tokens);
  // Input tokens of the last BuildInput that are placeholders.
  absl::Span<const PendingInput> input_pending() const { return input_pending_; }
  // Pipelined worker, after BuildInput: for each input token of the step,
  // the index (in sample order) of the previous step's sampled token it
  // takes on the device, or -1 for a known token; `rows` is left empty when
  // no input token is pending. The previous step is the last one closed by
  // ApplySampledPending. Internal error when a pending token is not one that
  // step sampled.
  absl::Status PreviousSampleRows(std::vector<int32_t>* rows) const;

  // Digest of the state that must agree across ranks (every live request's
  // id, parameters, tokens, block table, computed count and row, and the step
  // number), as of the last completed step. Maintained incrementally: O(diff)
  // per step plus O(1) per sampled token.
  uint64_t Digest() const { return digest_; }

  // (request id, token) sampled by the last completed step, in sample order.
  absl::Span<const proto::SampledToken> last_sampled() const { return last_sampled_; }

  // For the sampler, valid after BuildInput until ApplySampled, in sample
  // order: each sampled sequence's request id, sampling params and the
  // position of the token being sampled (= its sequence length before it is
  // appended; the RNG key of docs/MODEL.md).
  absl::Span<const uint64_t> sample_request_ids() const { return sample_ids_; }
  absl::Span<const model::SamplingParams> sample_params() const { return sample_params_; }
  absl::Span<const int32_t> sample_positions() const { return sample_positions_; }

  // Persistent batch view.
  int32_t num_rows() const { return static_cast<int32_t>(rows_.size()); }
  const CachedRequest& row(int32_t r) const { return slots_[rows_[r]]; }
  // Rows whose request or block table changed in the last ApplyDiff (new,
  // moved by a swap-remove, or blocks appended), ascending order not
  // guaranteed. Rows >= num_rows() were removed.
  absl::Span<const int32_t> rows_changed() const { return rows_changed_; }

  const CachedRequest* Find(uint64_t id) const;
  size_t num_requests() const { return index_.size(); }
  uint64_t next_step() const { return next_step_; }
  bool step_open() const { return step_open_; }
  bool ended() const { return ended_; }
  bool poisoned() const { return !poison_.ok(); }

 private:
  explicit WorkerState(const WorkerStateConfig& config);
  absl::Status ApplyDiffImpl(const proto::StepDiff& diff);
  absl::Status Remove(uint64_t id, const char* list, uint64_t step);
  absl::Status AddNew(const proto::NewRequest& r, size_t index, uint64_t step);
  absl::Status Continue(const proto::ContinuingRequest& c, absl::Span<const int32_t> blocks,
                        size_t index, uint64_t step);
  absl::Status TakeBlocks(uint32_t slot, absl::Span<const int32_t> blocks, uint64_t step);
  void MarkDirty(uint32_t slot);
  void MarkRowChanged(int32_t row);
  void PrepareSampleOrder();
  absl::Status CloseStep(absl::Span<const int32_t> tokens, bool pending);
  absl::Status Poisoned() const;

  WorkerStateConfig config_;
  int32_t max_blocks_per_seq_ = 0;
  std::vector<CachedRequest> slots_;
  std::vector<uint32_t> free_slots_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;  // id -> slot
  std::vector<uint32_t> rows_;                     // row -> slot
  std::vector<int32_t> block_owner_;               // block -> slot, -1 = free
  std::vector<uint32_t> dirty_;
  std::vector<int32_t> rows_changed_;
  std::vector<uint64_t> row_changed_step_;
  uint64_t digest_sum_ = 0;
  uint64_t digest_ = 0;
  uint64_t next_step_ = 0;
  uint64_t open_step_ = 0;
  bool step_open_ = false;
  bool ended_ = false;
  bool open_end_of_job_ = false;
  bool order_ready_ = false;
  std::vector<uint32_t> sample_slots_;
  std::vector<uint64_t> sample_ids_;
  std::vector<model::SamplingParams> sample_params_;
  std::vector<int32_t> sample_positions_;
  std::vector<proto::SampledToken> last_sampled_;
  std::vector<PendingInput> input_pending_;
  int32_t input_tokens_ = 0;  // of the last BuildInput
  // The last step closed by ApplySampledPending: request id -> (position,
  // index in its sample order).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> pending_samples_;
  absl::Status poison_;
};

}  // namespace symtp::worker

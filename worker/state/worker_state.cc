#include "worker/state/worker_state.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/weights.h"

namespace symtp::worker {
namespace {

inline uint64_t Mix(uint64_t x) { return model::Mix64(x); }
inline uint64_t ChainToken(uint64_t h, int32_t tok) {
  return Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tok)) | (1ull << 40)));
}
inline uint64_t ChainBlock(uint64_t h, int32_t b) {
  return Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(b)) | (2ull << 40)));
}
inline uint32_t FloatBits(float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  return v;
}

uint64_t StaticHash(const CachedRequest& r) {
  uint64_t h = Mix(r.id ^ 0x5EED5EED5EED5EEDull);
  h = Mix(h ^ FloatBits(r.sampling.temperature) ^
          (static_cast<uint64_t>(FloatBits(r.sampling.top_p)) << 32));
  h = Mix(h ^ static_cast<uint32_t>(r.sampling.top_k) ^
          (static_cast<uint64_t>(static_cast<uint32_t>(r.max_new_tokens)) << 32));
  h = Mix(h ^ r.sampling.seed);
  h = Mix(h ^ (r.eos_id.has_value() ? static_cast<uint64_t>(*r.eos_id) + 1 : 0) ^
          (static_cast<uint64_t>(static_cast<uint32_t>(r.prompt_len)) << 32));
  return h;
}

inline uint64_t Contribution(const CachedRequest& r) {
  uint64_t h = Mix(r.static_hash ^ r.token_hash);
  h = Mix(h ^ r.block_hash);
  return Mix(h ^
             (static_cast<uint64_t>(static_cast<uint32_t>(r.num_computed)) << 32 |
              static_cast<uint32_t>(r.row)) ^
             (static_cast<uint64_t>(static_cast<uint32_t>(r.num_sampled)) * 0x100000001b3ull) ^
             (static_cast<uint64_t>(static_cast<uint32_t>(r.confirmed)) << 17));
}

}  // namespace

absl::StatusOr<WorkerState> WorkerState::Create(const WorkerStateConfig& config) {
  if (config.block_size != proto::kBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker state: block_size %d, must be 16", config.block_size));
  }
  if (config.num_kv_blocks < 1 || config.num_kv_blocks > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker state: num_kv_blocks %d not in [1, 2^30]", config.num_kv_blocks));
  }
  if (config.max_seq_len < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker state: max_seq_len %d < 2", config.max_seq_len));
  }
  return WorkerState(config);
}

WorkerState::WorkerState(const WorkerStateConfig& config)
    : config_(config),
      max_blocks_per_seq_((config.max_seq_len + config.block_size - 1) / config.block_size),
      block_owner_(config.num_kv_blocks, -1),
      next_step_(config.first_step) {
  digest_ = Mix(digest_sum_ ^ Mix(next_step_ ^ 0xD16E57ull));
}

absl::Status WorkerState::Poisoned() const {
  return absl::FailedPreconditionError(
      absl::StrCat("worker state is unusable after an earlier error: ", poison_.message()));
}

const CachedRequest* WorkerState::Find(uint64_t id) const {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : &slots_[it->second];
}

void WorkerState::MarkDirty(uint32_t slot) {
  CachedRequest& r = slots_[slot];
  if (!r.dirty) {
    r.dirty = true;
    dirty_.push_back(slot);
  }
}

void WorkerState::MarkRowChanged(int32_t row) {
  if (static_cast<size_t>(row) >= row_changed_step_.size()) {
    row_changed_step_.resize(static_cast<size_t>(row) + 1, ~uint64_t{0});
  }
  if (row_changed_step_[row] != open_step_) {
    row_changed_step_[row] = open_step_;
    rows_changed_.push_back(row);
  }
}

absl::Status WorkerState::ApplyDiff(const proto::StepDiff& diff) {
  if (!poison_.ok()) return Poisoned();
  if (ended_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "diff for step %d after the end-of-job step %d", diff.step, next_step_ - 1));
  }
  if (step_open_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("diff for step %d while step %d is still open (ApplySampled not called)",
                        diff.step, open_step_));
  }
  if (diff.step != next_step_) {
    return absl::OutOfRangeError(
        absl::StrFormat("diff sequence error: expected step %d, got step %d (%s)", next_step_,
                        diff.step, diff.step < next_step_ ? "repeat" : "gap"));
  }
  open_step_ = diff.step;
  rows_changed_.clear();
  absl::Status s = ApplyDiffImpl(diff);
  if (!s.ok()) {
    poison_ = s;
    return s;
  }
  step_open_ = true;
  open_end_of_job_ = diff.end_of_job();
  order_ready_ = false;
  return absl::OkStatus();
}

absl::Status WorkerState::ApplyDiffImpl(const proto::StepDiff& diff) {
  const uint64_t step = diff.step;
  absl::Status s;
  for (uint64_t id : diff.finished) {
    if (!(s = Remove(id, "finished", step)).ok()) return s;
  }
  for (uint64_t id : diff.aborted) {
    if (!(s = Remove(id, "aborted", step)).ok()) return s;
  }
  for (uint64_t id : diff.preempted) {
    if (!(s = Remove(id, "preempted", step)).ok()) return s;
  }
  for (size_t i = 0; i < diff.new_requests.size(); ++i) {
    if (!(s = AddNew(diff.new_requests[i], i, step)).ok()) return s;
  }
  for (size_t i = 0; i < diff.continuing.size(); ++i) {
    const proto::ContinuingRequest& c = diff.continuing[i];
    if (static_cast<uint64_t>(c.block_offset) + c.num_new_blocks > diff.continuing_blocks.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "step %d: continuing[%d] (request %d): block range outside the diff", step, i, c.id));
    }
    if (!(s = Continue(c, diff.NewBlocks(c), i, step)).ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WorkerState::Remove(uint64_t id, const char* list, uint64_t step) {
  auto it = index_.find(id);
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("step %d: %s request %d is not cached on this worker", step, list, id));
  }
  const uint32_t slot = it->second;
  CachedRequest& r = slots_[slot];
  for (int32_t b : r.block_table) block_owner_[b] = -1;
  digest_sum_ -= r.contrib;
  r.contrib = 0;
  // Swap-remove its row.
  const int32_t row = r.row;
  const int32_t last = static_cast<int32_t>(rows_.size()) - 1;
  if (row != last) {
    const uint32_t moved = rows_[last];
    rows_[row] = moved;
    slots_[moved].row = row;
    MarkDirty(moved);
    MarkRowChanged(row);
  }
  rows_.pop_back();
  r.live = false;
  r.row = -1;
  index_.erase(it);
  free_slots_.push_back(slot);
  return absl::OkStatus();
}

absl::Status WorkerState::TakeBlocks(uint32_t slot, absl::Span<const int32_t> blocks,
                                     uint64_t step) {
  CachedRequest& r = slots_[slot];
  if (r.block_table.size() + blocks.size() > static_cast<size_t>(max_blocks_per_seq_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step %d: request %d would hold %d blocks, max_seq_len %d allows %d", step, r.id,
        r.block_table.size() + blocks.size(), config_.max_seq_len, max_blocks_per_seq_));
  }
  for (int32_t b : blocks) {
    if (b < 0 || b >= config_.num_kv_blocks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d: request %d: block %d out of range [0, %d)", step, r.id, b,
                          config_.num_kv_blocks));
    }
    if (block_owner_[b] != -1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d: request %d: block %d is already owned by request %d", step,
                          r.id, b, slots_[block_owner_[b]].id));
    }
    block_owner_[b] = static_cast<int32_t>(slot);
    r.block_table.push_back(b);
    r.block_hash = ChainBlock(r.block_hash, b);
  }
  return absl::OkStatus();
}

absl::Status WorkerState::AddNew(const proto::NewRequest& n, size_t index, uint64_t step) {
  if (index_.contains(n.id)) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "step %d: new_requests[%d]: request %d is already cached", step, index, n.id));
  }
  if (n.prompt.empty() || n.num_scheduled < 1 || n.num_scheduled > n.prompt.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d: new request %d: num_scheduled %d with a prompt of %d tokens",
                        step, n.id, n.num_scheduled, n.prompt.size()));
  }
  if (static_cast<int64_t>(n.prompt.size()) + n.max_new_tokens > config_.max_seq_len ||
      n.max_new_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step %d: new request %d: prompt %d + max_new_tokens %d exceeds max_seq_len %d", step, n.id,
        n.prompt.size(), n.max_new_tokens, config_.max_seq_len));
  }
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  CachedRequest& r = slots_[slot];
  r.id = n.id;
  r.tokens.assign(n.prompt.begin(), n.prompt.end());
  r.prompt_len = static_cast<int32_t>(n.prompt.size());
  r.num_computed = 0;
  r.num_sampled = 0;
  r.max_new_tokens = static_cast<int32_t>(n.max_new_tokens);
  r.eos_id = n.eos_id;
  r.sampling = ToModelSampling(n.sampling);
  r.block_table.clear();
  r.row = static_cast<int32_t>(rows_.size());
  r.live = true;
  r.contrib = 0;
  r.static_hash = StaticHash(r);
  r.token_hash = r.static_hash;
  for (int32_t t : r.tokens) r.token_hash = ChainToken(r.token_hash, t);
  r.confirmed = r.prompt_len;
  r.block_hash = 0;
  rows_.push_back(slot);
  index_.emplace(n.id, slot);
  MarkDirty(slot);
  MarkRowChanged(r.row);
  SYMTP_RETURN_IF_ERROR(TakeBlocks(slot, n.block_ids, step));
  const size_t need = (n.num_scheduled + proto::kBlockSize - 1) / proto::kBlockSize;
  if (r.block_table.size() < need) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d: new request %d: %d blocks cannot hold %d scheduled tokens", step,
                        n.id, r.block_table.size(), n.num_scheduled));
  }
  r.num_scheduled = static_cast<int32_t>(n.num_scheduled);
  r.num_computed = r.num_scheduled;
  r.sched_step = step;
  return absl::OkStatus();
}

absl::Status WorkerState::Continue(const proto::ContinuingRequest& c,
                                   absl::Span<const int32_t> blocks, size_t index, uint64_t step) {
  auto it = index_.find(c.id);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "step %d: continuing[%d]: request %d is not cached on this worker", step, index, c.id));
  }
  const uint32_t slot = it->second;
  CachedRequest& r = slots_[slot];
  if (r.sched_step == step) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d: request %d is scheduled twice in one diff", step, c.id));
  }
  const int64_t end = static_cast<int64_t>(r.num_computed) + c.num_scheduled;
  const int64_t have = static_cast<int64_t>(r.tokens.size());
  if (c.num_scheduled < 1 || end > have) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step %d: request %d: %d tokens scheduled after %d computed, but it has %d tokens", step,
        c.id, c.num_scheduled, r.num_computed, have));
  }
  if (end == have && r.num_sampled >= r.max_new_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d: request %d would sample token %d, beyond max_new_tokens %d", step,
                        c.id, r.num_sampled + 1, r.max_new_tokens));
  }
  if (!blocks.empty()) {
    SYMTP_RETURN_IF_ERROR(TakeBlocks(slot, blocks, step));
    MarkRowChanged(r.row);
  }
  if (static_cast<int64_t>(r.block_table.size()) * proto::kBlockSize < end) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d: request %d: %d blocks cannot hold %d tokens", step, c.id,
                        r.block_table.size(), end));
  }
  r.num_scheduled = static_cast<int32_t>(c.num_scheduled);
  r.num_computed = static_cast<int32_t>(end);
  r.sched_step = step;
  MarkDirty(slot);
  return absl::OkStatus();
}

void WorkerState::PrepareSampleOrder() {
  sample_slots_.clear();
  sample_ids_.clear();
  sample_params_.clear();
  sample_positions_.clear();
  for (uint32_t slot : rows_) {
    const CachedRequest& r = slots_[slot];
    if (r.sched_step != open_step_) continue;
    if (r.num_computed == static_cast<int32_t>(r.tokens.size())) {
      sample_slots_.push_back(slot);
      sample_ids_.push_back(r.id);
      sample_params_.push_back(r.sampling);
      sample_positions_.push_back(r.num_computed);
    }
  }
  order_ready_ = true;
}

absl::Status WorkerState::BuildInput(model::BatchInput* out) {
  if (!poison_.ok()) return Poisoned();
  if (!step_open_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("BuildInput with no open step (next step %d)", next_step_));
  }
  const uint64_t step = open_step_;
  int32_t S = 0, T = 0, max_blocks = 0;
  for (uint32_t slot : rows_) {
    const CachedRequest& r = slots_[slot];
    if (r.sched_step != step) continue;
    ++S;
    T += r.num_scheduled;
    max_blocks = std::max(max_blocks, static_cast<int32_t>(r.block_table.size()));
  }
  out->tokens.resize(T);
  out->positions.resize(T);
  out->slot_mapping.resize(T);
  out->seq_start.resize(S + 1);
  out->context_len.resize(S);
  out->max_blocks_per_seq = max_blocks;
  out->block_tables.resize(static_cast<size_t>(S) * max_blocks);
  out->sample_index.clear();
  PrepareSampleOrder();  // the same rows, in the same order, as sample_index below
  input_pending_.clear();

  int32_t* tok = out->tokens.data();
  int32_t* pos = out->positions.data();
  int32_t* slotmap = out->slot_mapping.data();
  int32_t* bt = out->block_tables.data();
  constexpr int32_t B = proto::kBlockSize;
  int32_t t = 0, s = 0;
  for (uint32_t slot : rows_) {
    const CachedRequest& r = slots_[slot];
    if (r.sched_step != step) continue;
    const int32_t n = r.num_scheduled;
    const int32_t start = r.num_computed - n;
    const int32_t* table = r.block_table.data();
    out->seq_start[s] = t;
    std::memcpy(tok + t, r.tokens.data() + start, sizeof(int32_t) * n);
    for (int32_t j = 0; j < n; ++j) {
      const int32_t p = start + j;
      pos[t + j] = p;
      slotmap[t + j] = table[p / B] * B + p % B;
      if (p >= r.confirmed) input_pending_.push_back(PendingInput{t + j, r.id, p});
    }
    t += n;
    out->context_len[s] = r.num_computed;
    const int32_t nb = static_cast<int32_t>(r.block_table.size());
    int32_t* row_bt = bt + static_cast<size_t>(s) * max_blocks;
    std::memcpy(row_bt, table, sizeof(int32_t) * nb);
    std::fill(row_bt + nb, row_bt + max_blocks, -1);
    if (r.num_computed == static_cast<int32_t>(r.tokens.size())) out->sample_index.push_back(t - 1);
    ++s;
  }
  out->seq_start[S] = t;
  input_tokens_ = t;
  return absl::OkStatus();
}

absl::Status WorkerState::PreviousSampleRows(std::vector<int32_t>* rows) const {
  rows->clear();
  if (input_pending_.empty()) return absl::OkStatus();
  rows->assign(input_tokens_, -1);
  for (const PendingInput& p : input_pending_) {
    auto it = pending_samples_.find(p.request_id);
    if (it == pending_samples_.end() || it->second.first != p.position) {
      return absl::InternalError(absl::StrFormat(
          "step %d: request %d's input token at position %d is pending but the previous "
          "step did not sample it",
          open_step_, p.request_id, p.position));
    }
    (*rows)[p.token_index] = it->second.second;
  }
  return absl::OkStatus();
}

absl::Status WorkerState::ApplySampled(absl::Span<const int32_t> tokens) {
  return CloseStep(tokens, /*pending=*/false);
}

absl::Status WorkerState::ApplySampledPending() { return CloseStep({}, /*pending=*/true); }

absl::Status WorkerState::CloseStep(absl::Span<const int32_t> tokens, bool pending) {
  if (!poison_.ok()) return Poisoned();
  if (!step_open_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("ApplySampled with no open step (next step %d)", next_step_));
  }
  if (!order_ready_) PrepareSampleOrder();
  if (!pending && tokens.size() != sample_slots_.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d: %d sampled tokens given, %d sequences sample in this step",
                        open_step_, tokens.size(), sample_slots_.size()));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d: sampled token %d for request %d is negative", open_step_,
                          tokens[i], slots_[sample_slots_[i]].id));
    }
    const CachedRequest& r = slots_[sample_slots_[i]];
    if (r.confirmed != static_cast<int32_t>(r.tokens.size())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "step %d: request %d still has a pending token at position %d; confirm it first",
          open_step_, r.id, r.confirmed));
    }
  }
  last_sampled_.resize(sample_slots_.size());
  pending_samples_.clear();
  for (size_t i = 0; i < sample_slots_.size(); ++i) {
    CachedRequest& r = slots_[sample_slots_[i]];
    if (pending) {
      pending_samples_[r.id] = {static_cast<int32_t>(r.tokens.size()), static_cast<int32_t>(i)};
      r.tokens.push_back(kPendingToken);
      last_sampled_[i] = {r.id, -1};
    } else {
      r.tokens.push_back(tokens[i]);
      r.token_hash = ChainToken(r.token_hash, tokens[i]);
      ++r.confirmed;
      last_sampled_[i] = {r.id, tokens[i]};
    }
    ++r.num_sampled;
  }
  for (uint32_t slot : dirty_) {
    CachedRequest& r = slots_[slot];
    r.dirty = false;
    if (!r.live) continue;
    digest_sum_ -= r.contrib;
    r.contrib = Contribution(r);
    digest_sum_ += r.contrib;
  }
  dirty_.clear();
  digest_ = Mix(digest_sum_ ^ Mix((open_step_ + 1) ^ 0xD16E57ull));
  step_open_ = false;
  next_step_ = open_step_ + 1;
  if (open_end_of_job_) ended_ = true;
  return absl::OkStatus();
}

absl::Status WorkerState::ConfirmSampled(absl::Span<const uint64_t> ids,
                                         absl::Span<const int32_t> positions,
                                         absl::Span<const int32_t> tokens) {
  if (!poison_.ok()) return Poisoned();
  if (step_open_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("ConfirmSampled while step %d is open", open_step_));
  }
  if (ids.size() != positions.size() || ids.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ConfirmSampled: %d ids, %d positions, %d tokens", ids.size(), positions.size(),
        tokens.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (tokens[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ConfirmSampled: token %d for request %d is negative", tokens[i], ids[i]));
    }
    auto it = index_.find(ids[i]);
    if (it == index_.end()) continue;  // finished, aborted or preempted since
    CachedRequest& r = slots_[it->second];
    const int32_t p = positions[i];
    // Re-added (recompute) with every token known, or already confirmed.
    if (p < r.confirmed || p >= static_cast<int32_t>(r.tokens.size())) continue;
    if (p != r.confirmed) {
      poison_ = absl::InternalError(absl::StrFormat(
          "ConfirmSampled: request %d confirms position %d but %d is the first pending", r.id, p,
          r.confirmed));
      return poison_;
    }
    r.tokens[p] = tokens[i];
    r.token_hash = ChainToken(r.token_hash, tokens[i]);
    ++r.confirmed;
    digest_sum_ -= r.contrib;
    r.contrib = Contribution(r);
    digest_sum_ += r.contrib;
  }
  digest_ = Mix(digest_sum_ ^ Mix(next_step_ ^ 0xD16E57ull));
  return absl::OkStatus();
}

}  // namespace symtp::worker

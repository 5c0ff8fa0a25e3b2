// The flat step input shared by the CPU model, the GPU model and the worker.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "models/config.h"

namespace symtp::model {

struct BatchInput {
  std::vector<int32_t> tokens;        // [T] all tokens of this step, sequences concatenated
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> slot_mapping;  // [T] KV-cache slot = block_table[pos/B]*B + pos%B
  std::vector<int32_t> seq_start;     // [S+1] offsets into tokens
  std::vector<int32_t> context_len;   // [S] keys visible to the sequence's last token = last pos + 1
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [S * max_blocks_per_seq], unused entries = -1
  std::vector<int32_t> sample_index;  // token indices (into tokens) whose logits are returned, in order

  // Checks every index and length against `cfg` (B = cfg.block_size) and a
  // cache of `num_kv_blocks` blocks: array sizes; seq_start starts at 0, is
  // strictly increasing and ends at T; tokens in [0, V); each sequence's
  // positions are consecutive, >= 0 and < max_seq_len; context_len = last
  // position + 1; the block table covers ceil(context_len / B) blocks, all in
  // [0, num_kv_blocks) and distinct, other entries -1 or in range;
  // slot_mapping matches the block table; no slot is written twice in the
  // step; sample_index entries in [0, T). An empty batch (S = T = 0) is valid.
  // Errors are InvalidArgument naming the offending sequence / token.
  absl::Status Validate(const ModelConfig& cfg, int num_kv_blocks) const;

  int num_seqs() const { return seq_start.empty() ? 0 : static_cast<int>(seq_start.size()) - 1; }
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  void Clear();
};

// Convenience builder (tests, tools, the CPU worker): appends sequences' chunks
// and fills every derived field. The block table given for a sequence may be
// shorter than max_blocks_per_seq (padded with -1).
class BatchBuilder {
 public:
  BatchBuilder(int block_size, int max_blocks_per_seq);
  // Appends a chunk `tokens` whose first token is at position `start_pos`.
  // If `sample_last`, the chunk's last token is appended to sample_index.
  // Returns InvalidArgument if the chunk is empty, start_pos < 0, or the block
  // table is too long or does not cover the chunk (entries are range-checked
  // later by BatchInput::Validate).
  absl::Status Add(absl::Span<const int32_t> tokens, int start_pos,
                   absl::Span<const int32_t> block_table, bool sample_last);
  // Appends a token index to sample_index explicitly (e.g. every prompt token).
  void AddSampleIndex(int32_t token_index);
  const BatchInput& batch() const { return batch_; }
  BatchInput Take();

 private:
  int block_size_;
  BatchInput batch_;
};

}  // namespace symtp::model

#include "models/batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace symtp::model {
namespace {

absl::Status Bad(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("BatchInput: ", msg));
}

}  // namespace

void BatchInput::Clear() {
  tokens.clear();
  positions.clear();
  slot_mapping.clear();
  seq_start.clear();
  context_len.clear();
  max_blocks_per_seq = 0;
  block_tables.clear();
  sample_index.clear();
}

absl::Status BatchInput::Validate(const ModelConfig& cfg, int num_kv_blocks) const {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int B = cfg.block_size;
  if (B <= 0) return Bad(absl::StrFormat("block_size %d must be positive", B));
  if (num_kv_blocks < 0) return Bad(absl::StrFormat("num_kv_blocks %d < 0", num_kv_blocks));
  if (static_cast<int64_t>(positions.size()) != T || static_cast<int64_t>(slot_mapping.size()) != T) {
    return Bad(absl::StrFormat("tokens (%d), positions (%d) and slot_mapping (%d) differ in size",
                               T, positions.size(), slot_mapping.size()));
  }
  if (T > INT32_MAX / 2) return Bad(absl::StrFormat("too many tokens (%d)", T));
  if (seq_start.empty()) {
    if (T != 0 || !context_len.empty() || !block_tables.empty() || !sample_index.empty()) {
      return Bad("seq_start is empty but the batch has tokens / sequences / samples");
    }
    return absl::OkStatus();
  }
  const int64_t S = static_cast<int64_t>(seq_start.size()) - 1;
  if (static_cast<int64_t>(context_len.size()) != S) {
    return Bad(absl::StrFormat("context_len has %d entries for %d sequences", context_len.size(), S));
  }
  if (max_blocks_per_seq < 0) {
    return Bad(absl::StrFormat("max_blocks_per_seq %d < 0", max_blocks_per_seq));
  }
  if (static_cast<int64_t>(block_tables.size()) != S * max_blocks_per_seq) {
    return Bad(absl::StrFormat("block_tables has %d entries, expected %d sequences * %d",
                               block_tables.size(), S, max_blocks_per_seq));
  }
  if (seq_start[0] != 0) return Bad(absl::StrFormat("seq_start[0] = %d, expected 0", seq_start[0]));
  if (seq_start[S] != T) {
    return Bad(absl::StrFormat("seq_start[%d] = %d, expected the token count %d", S, seq_start[S], T));
  }
  for (int64_t s = 0; s < S; ++s) {
    if (seq_start[s + 1] <= seq_start[s]) {
      return Bad(absl::StrFormat("seq_start not strictly increasing at sequence %d (%d -> %d)", s,
                                 seq_start[s], seq_start[s + 1]));
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= cfg.vocab) {
      return Bad(absl::StrFormat("token %d = %d out of vocabulary [0, %d)", t, tokens[t], cfg.vocab));
    }
  }
  std::vector<int32_t> used;  // one sequence's physical blocks (reused)
  used.reserve(max_blocks_per_seq);
  for (int64_t s = 0; s < S; ++s) {
    const int32_t begin = seq_start[s], end = seq_start[s + 1];
    const int32_t p0 = positions[begin];
    if (p0 < 0) return Bad(absl::StrFormat("sequence %d: position %d < 0", s, p0));
    for (int32_t t = begin; t < end; ++t) {
      if (static_cast<int64_t>(positions[t]) != static_cast<int64_t>(p0) + (t - begin)) {
        return Bad(absl::StrFormat("sequence %d: positions not consecutive at token %d (%d after %d)",
                                   s, t, positions[t], t > begin ? positions[t - 1] : -1));
      }
    }
    const int64_t last = static_cast<int64_t>(p0) + (end - begin - 1);
    if (last >= cfg.max_seq_len) {
      return Bad(absl::StrFormat("sequence %d: position %d >= max_seq_len %d", s, last,
                                 cfg.max_seq_len));
    }
    if (context_len[s] != last + 1) {
      return Bad(absl::StrFormat("sequence %d: context_len %d, expected last position + 1 = %d", s,
                                 context_len[s], last + 1));
    }
    const int64_t needed = (last + 1 + B - 1) / B;
    if (needed > max_blocks_per_seq) {
      return Bad(absl::StrFormat("sequence %d: context of %d tokens needs %d blocks, "
                                 "max_blocks_per_seq is %d", s, last + 1, needed, max_blocks_per_seq));
    }
    const int32_t* table = block_tables.data() + s * max_blocks_per_seq;
    for (int64_t b = 0; b < max_blocks_per_seq; ++b) {
      const int32_t blk = table[b];
      const bool in_range = blk >= 0 && blk < num_kv_blocks;
      if (b < needed ? !in_range : !(in_range || blk == -1)) {
        return Bad(absl::StrFormat("sequence %d: block_tables[%d] = %d out of range [0, %d)%s", s, b,
                                   blk, num_kv_blocks, b < needed ? "" : " and not -1"));
      }
    }
    used.assign(table, table + needed);
    std::sort(used.begin(), used.end());
    if (auto d = std::adjacent_find(used.begin(), used.end()); d != used.end()) {
      return Bad(absl::StrFormat("sequence %d: physical block %d mapped twice", s, *d));
    }
    for (int32_t t = begin; t < end; ++t) {
      const int64_t p = positions[t];
      const int64_t want = static_cast<int64_t>(table[p / B]) * B + p % B;
      if (slot_mapping[t] != want) {
        return Bad(absl::StrFormat("sequence %d token %d (position %d): slot_mapping %d, block "
                                   "table gives %d", s, t, p, slot_mapping[t], want));
      }
    }
  }
  std::vector<int32_t> slots(slot_mapping);
  std::sort(slots.begin(), slots.end());
  if (auto d = std::adjacent_find(slots.begin(), slots.end()); d != slots.end()) {
    return Bad(absl::StrFormat("KV slot %d written by two tokens in one step", *d));
  }
  for (size_t i = 0; i < sample_index.size(); ++i) {
    if (sample_index[i] < 0 || sample_index[i] >= T) {
      return Bad(absl::StrFormat("sample_index[%d] = %d out of range [0, %d)", i, sample_index[i], T));
    }
  }
  return absl::OkStatus();
}

BatchBuilder::BatchBuilder(int block_size, int max_blocks_per_seq) : block_size_(block_size) {
  batch_.max_blocks_per_seq = max_blocks_per_seq;
  batch_.seq_start.push_back(0);
}

absl::Status BatchBuilder::Add(absl::Span<const int32_t> tokens, int start_pos,
                               absl::Span<const int32_t> block_table, bool sample_last) {
  if (tokens.empty()) return Bad("BatchBuilder::Add: empty chunk");
  if (start_pos < 0) return Bad(absl::StrFormat("BatchBuilder::Add: start_pos %d < 0", start_pos));
  if (block_size_ <= 0) return Bad("BatchBuilder: block_size must be positive");
  const int64_t last = static_cast<int64_t>(start_pos) + static_cast<int64_t>(tokens.size()) - 1;
  if (static_cast<int64_t>(block_table.size()) > batch_.max_blocks_per_seq) {
    return Bad(absl::StrFormat("BatchBuilder::Add: block table of %d > max_blocks_per_seq %d",
                               block_table.size(), batch_.max_blocks_per_seq));
  }
  if (last / block_size_ >= static_cast<int64_t>(block_table.size()) || last >= INT32_MAX) {
    return Bad(absl::StrFormat("BatchBuilder::Add: block table of %d blocks does not cover "
                               "position %d", block_table.size(), last));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t p = start_pos + static_cast<int32_t>(i);
    batch_.tokens.push_back(tokens[i]);
    batch_.positions.push_back(p);
    batch_.slot_mapping.push_back(block_table[p / block_size_] * block_size_ + p % block_size_);
  }
  batch_.seq_start.push_back(static_cast<int32_t>(batch_.tokens.size()));
  batch_.context_len.push_back(static_cast<int32_t>(last + 1));
  batch_.block_tables.insert(batch_.block_tables.end(), block_table.begin(), block_table.end());
  batch_.block_tables.insert(batch_.block_tables.end(),
                             batch_.max_blocks_per_seq - block_table.size(), -1);
  if (sample_last) batch_.sample_index.push_back(static_cast<int32_t>(batch_.tokens.size()) - 1);
  return absl::OkStatus();
}

void BatchBuilder::AddSampleIndex(int32_t token_index) { batch_.sample_index.push_back(token_index); }

BatchInput BatchBuilder::Take() {
  BatchInput out = std::move(batch_);
  batch_ = BatchInput();
  batch_.max_blocks_per_seq = out.max_blocks_per_seq;
  batch_.seq_start.push_back(0);
  if (out.seq_start.size() == 1) out.seq_start.clear();
  return out;
}

}  // namespace symtp::model

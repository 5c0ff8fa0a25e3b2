// Test harness for whole-model checks: simulated sequences with paged block
// tables, batches of prefill chunks and decode tokens built with
// model::BatchBuilder, so the CPU reference and the GPU model see the same
// steps.
#pragma once

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "models/batch.h"
#include "models/config.h"

namespace symtp::kernels::testing {

struct SimSeq {
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int prompt_len = 0;
  int cached = 0;  // positions already written to the KV cache
  std::vector<int32_t> blocks;
};

class SimBatch {
 public:
  SimBatch(const model::ModelConfig& cfg, int num_blocks, uint64_t seed)
      : B_(cfg.block_size),
        max_blocks_((cfg.max_seq_len + cfg.block_size - 1) / cfg.block_size),
        rng_(seed) {
    pool_.resize(num_blocks);
    for (int i = 0; i < num_blocks; ++i) pool_[i] = i;
    std::shuffle(pool_.begin(), pool_.end(), rng_);  // scattered physical blocks
  }

  int AddSequence(int prompt_len, int vocab) {
    SimSeq s;
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int i = 0; i < prompt_len; ++i) s.tokens.push_back(tok(rng_));
    s.prompt_len = prompt_len;
    seqs_.push_back(std::move(s));
    return static_cast<int>(seqs_.size()) - 1;
  }

  // One step: every unfinished prompt contributes up to `chunk` tokens, every
  // sequence past its prompt contributes its last token (decode). The last
  // token of a chunk is sampled when it completes the prompt or is a decode
  // token. `rows_of_seq` gets, per sequence, its sample row or -1.
  absl::StatusOr<model::BatchInput> NextStep(int chunk, std::vector<int>* rows_of_seq) {
    model::BatchBuilder b(B_, max_blocks_);
    rows_of_seq->assign(seqs_.size(), -1);
    int rows = 0;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      SimSeq& s = seqs_[i];
      const int avail = static_cast<int>(s.tokens.size()) - s.cached;
      if (avail <= 0) continue;
      const int n = s.cached < s.prompt_len ? std::min(chunk, s.prompt_len - s.cached) : avail;
      const int last = s.cached + n - 1;
      while (static_cast<int>(s.blocks.size()) <= last / B_) {
        if (next_ >= pool_.size()) return absl::ResourceExhaustedError("SimBatch: out of blocks");
        s.blocks.push_back(pool_[next_++]);
      }
      const bool sample = s.cached + n >= s.prompt_len;
      absl::Status st =
          b.Add(absl::MakeConstSpan(s.tokens.data() + s.cached, n), s.cached, s.blocks, sample);
      if (!st.ok()) return st;
      if (sample) (*rows_of_seq)[i] = rows++;
      pending_.push_back({static_cast<int>(i), n});
    }
    return b.Take();
  }

  // Marks the last step's tokens cached; appends sampled tokens (by row).
  void Commit(const std::vector<int>& rows_of_seq, const std::vector<int32_t>& sampled) {
    for (auto [i, n] : pending_) seqs_[i].cached += n;
    pending_.clear();
    for (size_t i = 0; i < seqs_.size(); ++i) {
      if (rows_of_seq[i] >= 0) seqs_[i].tokens.push_back(sampled[rows_of_seq[i]]);
    }
  }

  const std::vector<SimSeq>& seqs() const { return seqs_; }

 private:
  int B_, max_blocks_;
  std::mt19937_64 rng_;
  std::vector<int32_t> pool_;
  size_t next_ = 0;
  std::vector<SimSeq> seqs_;
  std::vector<std::pair<int, int>> pending_;
};

}  // namespace symtp::kernels::testing

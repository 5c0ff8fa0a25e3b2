// v0 mode: the asymmetric baseline the report compares against, as the seed
// article describes it. Rank 0 runs the scheduler inline between forward
// passes, builds the full padded batch tensors every step ([batch,
// max_seq_len] token ids, positions and slot mapping, [batch, max_blocks]
// block tables, [batch] sequence lengths) and broadcasts them; every rank
// derives its model input from the broadcast tensors; only rank 0 samples.
// Same model, kernels and all-reduce as v1; no artificial delays.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "models/config.h"
#include "runtime/backend.h"
#include "runtime/layout.h"
#include "runtime/options.h"

namespace symtp::runtime {

// The one collective v0 adds to a backend's: rank `root`'s `bytes` at `data`
// reach every rank's `data` (the padded batch). The CPU backend broadcasts
// through shared memory, the CUDA backend with NCCL on its stream.
class BatchBroadcast {
 public:
  virtual ~BatchBroadcast() = default;
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  // Host memory of at least `bytes` for the batch tensors, valid until the
  // next call. The CUDA backend's is pinned, so the copies to and from the
  // GPU around the broadcast are plain DMA transfers, as a runtime's input
  // tensors are (pin_memory); the CPU backend's is ordinary memory.
  virtual absl::StatusOr<void*> HostBuffer(size_t bytes) = 0;
};

// Offsets (in int32 words) of the padded tensors inside the broadcast body of
// `b` rows: [b, 3] meta (start, num tokens, samples), [b, s] tokens, [b, s]
// positions, [b, mb] block tables, [b] sequence lengths, [b, s] slot mapping.
struct V0Layout {
  size_t meta, tokens, positions, blocks, seq_lens, slots, words;
  int max_seq, max_blocks;  // s and mb: a row's width in the token and block tensors
  V0Layout(int b, int s, int mb);
};

// One sequence's view for WriteV0Row: its tokens so far (prompt and output),
// block table, and the tokens this step computes.
struct V0Row {
  absl::Span<const int32_t> tokens;
  absl::Span<const int32_t> block_table;
  int start_pos = 0;      // first position this step computes
  int num_scheduled = 0;  // tokens this step computes
};

// Writes every word of row `b` of each tensor of the body laid out by `L`:
// tokens and positions up to the sequence's length, slots up to what its
// block table maps (a prompt's later chunks have no blocks yet), the padding
// after them (0, 0, -1), the block table and its padding (-1), meta and the
// sequence length. Each word is written once; the buffer's old contents do
// not matter. Needs tokens.size() <= L.max_seq, block_table.size() <= L.max_blocks.
void WriteV0Row(int32_t* body, const V0Layout& L, int b, int block_size, const V0Row& row);

// process_start_ns: when this process started (rank 0 reports the start-up
// time, to every rank ready, apart from the measured run).
absl::Status RunV0Worker(const JobOptions& opts, const model::ModelConfig& cfg, int rank,
                         JobHandle* job, Backend* backend, BatchBroadcast* broadcast,
                         int64_t process_start_ns);

}  // namespace symtp::runtime

// The plain C++ fp32 reference implementation of docs/MODEL.md: one
// tensor-parallel rank of the model with its paged KV cache. The reference
// for every GPU check and the backend of CPU-only workers.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/batch.h"
#include "models/config.h"
#include "models/host_comm.h"
#include "models/sharding.h"

namespace symtp::model {

struct CpuModelOptions {
  // Create() fails with ResourceExhausted when this rank's weights + KV cache
  // + tables would exceed this many bytes. 0: the default, min(4 GiB, half
  // of physical memory) -- enough for tiny and small; the llama shapes are for
  // GPUs (a caller that really wants one on the CPU raises the limit).
  size_t max_host_bytes = 0;
};

class CpuModel {
 public:
  // Materializes this rank's weight shard (docs/MODEL.md) and a zeroed KV
  // cache of `num_kv_blocks` blocks per layer. `comm` must have
  // rank() == tp_rank and size() == tp_size and outlive the model; it may be
  // null when tp_size == 1. Errors: InvalidArgument (config / TP / comm /
  // num_kv_blocks), ResourceExhausted (over CpuModelOptions::max_host_bytes;
  // the big presets are only meant for GPUs).
  static absl::StatusOr<CpuModel> Create(const ModelConfig& cfg, int tp_rank, int tp_size,
                                         int num_kv_blocks, HostComm* comm,
                                         const CpuModelOptions& options = {});

  CpuModel(CpuModel&&) noexcept;
  CpuModel& operator=(CpuModel&&) noexcept;
  CpuModel(const CpuModel&) = delete;
  CpuModel& operator=(const CpuModel&) = delete;
  ~CpuModel();

  // Runs one step: validates `in`, writes K/V of every token into the paged
  // cache at slot_mapping, attends causally over the sequence's cache
  // (positions 0..p for a token at position p), and returns logits
  // [sample_index.size(), vocab] row-major (all-gathered when TP > 1; every
  // rank returns the same). Every rank of a TP group must call Forward with the
  // same batch. `logits` is resized (its capacity is reused).
  absl::Status Forward(const BatchInput& in, std::vector<float>* logits);

  const ModelConfig& config() const;
  const ShardLayout& layout() const;
  int num_kv_blocks() const;
  size_t kv_cache_bytes() const;  // K + V over all layers of this rank
  size_t weight_bytes() const;    // fp32 weights held by this rank

  // This rank's cache of one layer, [num_blocks, block_size, kv_heads_local, head_dim].
  absl::Span<const float> k_cache(int layer) const;
  absl::Span<const float> v_cache(int layer) const;

 private:
  struct State;
  explicit CpuModel(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace symtp::model

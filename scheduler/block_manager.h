// KV-cache block manager: a free list of physical block ids [0, num_blocks).
// Blocks are handed out LIFO (the most recently freed first), so allocation
// order is deterministic. Single-threaded; owned by the Scheduler.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace symtp::sched {

class BlockManager {
 public:
  // InvalidArgument unless 1 <= num_blocks <= 2^30.
  static absl::StatusOr<BlockManager> Create(int32_t num_blocks);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_blocks_ - num_free(); }
  bool CanAllocate(int32_t n) const { return n <= num_free(); }
  bool IsAllocated(int32_t block) const {
    return block >= 0 && block < num_blocks_ && allocated_[block];
  }

  // Appends `n` block ids to `table`. ResourceExhausted (nothing allocated) if
  // fewer than `n` are free.
  absl::Status Allocate(int32_t n, std::vector<int32_t>* table);

  // Returns the blocks to the free list. FailedPrecondition naming the block on
  // a double free or an id out of range (nothing is freed then).
  absl::Status Free(absl::Span<const int32_t> blocks);

 private:
  explicit BlockManager(int32_t n);
  int32_t num_blocks_ = 0;
  std::vector<int32_t> free_;  // stack; back() is handed out next
  std::vector<uint8_t> allocated_;
};

// Blocks needed to hold `tokens` tokens.
inline int32_t BlocksForTokens(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

}  // namespace symtp::sched

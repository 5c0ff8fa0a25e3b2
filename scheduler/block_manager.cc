#include "scheduler/block_manager.h"

#include "absl/strings/str_format.h"

namespace symtp::sched {

absl::StatusOr<BlockManager> BlockManager::Create(int32_t num_blocks) {
  if (num_blocks < 1 || num_blocks > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_kv_blocks %d not in [1, 2^30]", num_blocks));
  }
  return BlockManager(num_blocks);
}

BlockManager::BlockManager(int32_t n) : num_blocks_(n), allocated_(n, 0) {
  free_.reserve(n);
  // Block 0 on top: a fresh manager hands out 0, 1, 2, ...
  for (int32_t b = n - 1; b >= 0; --b) free_.push_back(b);
}

absl::Status BlockManager::Allocate(int32_t n, std::vector<int32_t>* table) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrFormat("allocate %d blocks", n));
  if (n > num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("need %d KV blocks, %d of %d free", n, num_free(), num_blocks_));
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    allocated_[b] = 1;
    table->push_back(b);
  }
  return absl::OkStatus();
}

absl::Status BlockManager::Free(absl::Span<const int32_t> blocks) {
  // Validate everything first (marking visited blocks with 2 to catch
  // duplicates inside `blocks`), so a bad call frees nothing.
  absl::Status error;
  size_t marked = 0;
  for (; marked < blocks.size(); ++marked) {
    const int32_t b = blocks[marked];
    if (b < 0 || b >= num_blocks_) {
      error = absl::FailedPreconditionError(
          absl::StrFormat("free of block %d: out of range [0, %d)", b, num_blocks_));
      break;
    }
    if (allocated_[b] != 1) {
      error = absl::FailedPreconditionError(
          allocated_[b] == 2 ? absl::StrFormat("block %d appears twice in one free", b)
                             : absl::StrFormat("double free of block %d", b));
      break;
    }
    allocated_[b] = 2;
  }
  if (!error.ok()) {
    for (size_t i = 0; i < marked; ++i) allocated_[blocks[i]] = 1;
    return error;
  }
  // Freed in reverse so that a table freed and re-allocated comes back in order.
  for (size_t i = blocks.size(); i-- > 0;) {
    allocated_[blocks[i]] = 0;
    free_.push_back(blocks[i]);
  }
  return absl::OkStatus();
}

}  // namespace symtp::sched

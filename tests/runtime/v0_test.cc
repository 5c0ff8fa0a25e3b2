// v0's padded batch body: its layout, and rows written into a reused buffer.
#include "runtime/v0.h"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace symtp::runtime {
namespace {

TEST(V0Layout, SectionsFollowEachOtherInOrder) {
  const V0Layout L(5, 7, 3);
  EXPECT_EQ(L.meta, 0u);
  EXPECT_EQ(L.tokens, 15u);
  EXPECT_EQ(L.positions, 15u + 35);
  EXPECT_EQ(L.blocks, 15u + 70);
  EXPECT_EQ(L.seq_lens, 15u + 70 + 15);
  EXPECT_EQ(L.slots, 15u + 70 + 15 + 5);
  EXPECT_EQ(L.words, 15u + 70 + 15 + 5 + 35);
}

// Rows written into a buffer full of stale nonzero words (the pinned buffer
// is reused every step) equal a body built from a cleared buffer: zeros, -1
// in the block tables and slots, then each row's values. A row's block table
// may map only a prefix of its tokens (a prompt's later chunks).
TEST(V0Layout, RowsWrittenOverAStaleBufferEqualAFreshBody) {
  std::mt19937 rng(11);
  for (int bs : {16, 4}) {
    for (int rows : {1, 2, 5, 64}) {
      const int s = 1 + static_cast<int>(rng() % 40), mb = (s + bs - 1) / bs;
      const V0Layout L(rows, s, mb);
      std::vector<std::vector<int32_t>> tokens(rows), tables(rows);
      std::vector<int> start(rows), n(rows);
      for (int b = 0; b < rows; ++b) {
        const int len = 1 + static_cast<int>(rng() % s);
        for (int p = 0; p < len; ++p) tokens[b].push_back(1 + static_cast<int32_t>(rng() % 1000));
        n[b] = 1 + static_cast<int>(rng() % len);
        start[b] = static_cast<int>(rng() % (len - n[b] + 1));
        const int blocks = (start[b] + n[b] + bs - 1) / bs;  // what this step needs, at least
        const int extra = static_cast<int>(rng() % ((len + bs - 1) / bs - blocks + 1));
        for (int k = 0; k < blocks + extra; ++k) tables[b].push_back(static_cast<int32_t>(rng() % 500));
      }
      std::vector<int32_t> want(L.words, 0);
      std::fill_n(want.begin() + L.blocks, static_cast<size_t>(rows) * mb, -1);
      std::fill(want.begin() + L.slots, want.end(), -1);
      for (int b = 0; b < rows; ++b) {
        const size_t len = tokens[b].size();
        for (size_t p = 0; p < len; ++p) {
          want[L.tokens + b * s + p] = tokens[b][p];
          want[L.positions + b * s + p] = static_cast<int32_t>(p);
          if (p / bs < tables[b].size()) {
            want[L.slots + b * s + p] = tables[b][p / bs] * bs + static_cast<int32_t>(p % bs);
          }
        }
        for (size_t k = 0; k < tables[b].size(); ++k) want[L.blocks + b * mb + k] = tables[b][k];
        want[L.meta + 3 * b] = start[b];
        want[L.meta + 3 * b + 1] = n[b];
        want[L.meta + 3 * b + 2] = start[b] + n[b] == static_cast<int>(len);
        want[L.seq_lens + b] = start[b] + n[b];
      }
      std::vector<int32_t> body(L.words);
      for (int32_t& w : body) w = static_cast<int32_t>(rng() | 1);
      for (int b = 0; b < rows; ++b) {
        WriteV0Row(body.data(), L, b, bs, {tokens[b], tables[b], start[b], n[b]});
      }
      EXPECT_EQ(body, want) << "block size " << bs << " rows " << rows << " s " << s << " mb " << mb;
    }
  }
}

}  // namespace
}  // namespace symtp::runtime

// v0's padded batch body: packing the scheduled rows in place.
#include "runtime/v0.h"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace symtp::runtime {
namespace {

// A body of `batch` rows whose word (section, row, column) holds a nonzero
// value drawn from that position and `seed` alone: a body of fewer rows built
// the same way is what packing the larger one must give.
std::vector<int32_t> Body(int batch, int s, int mb, uint64_t seed) {
  const V0Layout L(batch, s, mb);
  std::vector<int32_t> body(L.words);
  for (int i = 0; i < 6; ++i) {
    const V0Layout::Section& sec = L.sections[i];
    for (size_t r = 0; r < static_cast<size_t>(batch); ++r) {
      for (size_t c = 0; c < sec.row_words; ++c) {
        std::seed_seq seq{seed, static_cast<uint64_t>(i), r, c};
        uint32_t v;
        seq.generate(&v, &v + 1);
        body[sec.start + r * sec.row_words + c] = static_cast<int32_t>(v >> 2) + 1;
      }
    }
  }
  return body;
}

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

TEST(V0Layout, PackInPlaceMatchesACopyOfTheFirstRows) {
  std::mt19937 rng(11);
  for (int batch : {1, 2, 5, 64}) {
    for (int rows = 0; rows <= batch; rows += (batch > 8 ? 7 : 1)) {
      const int s = 1 + static_cast<int>(rng() % 40), mb = 1 + static_cast<int>(rng() % 6);
      const uint64_t seed = rng();
      std::vector<int32_t> body = Body(batch, s, mb, seed);
      const std::vector<int32_t> want = Body(rows, s, mb, seed);
      PackV0Rows(body.data(), batch, rows, s, mb);
      body.resize(want.size());
      EXPECT_EQ(body, want) << "batch " << batch << " rows " << rows << " s " << s << " mb " << mb;
    }
  }
}

}  // namespace
}  // namespace symtp::runtime

// v0's padded batch body: packing the scheduled rows in place.
#include "runtime/v0.h"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace symtp::runtime {
namespace {

// The body of `batch` rows with a distinct random value in every word.
std::vector<int32_t> RandomBody(int batch, int s, int mb, std::mt19937* rng) {
  std::vector<int32_t> body(V0Layout(batch, s, mb).words);
  std::uniform_int_distribution<int32_t> d(1, 1 << 30);
  for (auto& w : body) w = d(*rng);
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
      std::vector<int32_t> body = RandomBody(batch, s, mb, &rng);
      const V0Layout from(batch, s, mb), to(rows, s, mb);
      // What the rows' sections hold, gathered into the smaller layout by copies.
      std::vector<int32_t> want(to.words);
      auto copy = [&](size_t src, size_t dst, size_t n) {
        for (size_t i = 0; i < n; ++i) want[dst + i] = body[src + i];
      };
      const size_t R = rows;
      copy(from.meta, to.meta, R * 3);
      copy(from.tokens, to.tokens, R * s);
      copy(from.positions, to.positions, R * s);
      copy(from.blocks, to.blocks, R * mb);
      copy(from.seq_lens, to.seq_lens, R);
      copy(from.slots, to.slots, R * s);
      PackV0Rows(body.data(), batch, rows, s, mb);
      body.resize(to.words);
      EXPECT_EQ(body, want) << "batch " << batch << " rows " << rows << " s " << s << " mb " << mb;
    }
  }
}

}  // namespace
}  // namespace symtp::runtime

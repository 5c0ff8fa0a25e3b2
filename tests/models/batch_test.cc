#include "models/batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "models/config.h"
#include "tests/testing/status_matchers.h"

namespace symtp::model {
namespace {

using ::symtp::testing::StatusIs;
using ::testing::HasSubstr;

class BatchValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cfg_, PresetConfig("tiny"));
    // Sequence 0: prefill chunk at positions 10..29 over blocks {3, 0}.
    // Sequence 1: decode token at position 16 over blocks {5, 7}.
    // Sequence 2: first chunk at 0..4 over block {1}.
    BatchBuilder b(16, 4);
    std::vector<int32_t> chunk(20);
    for (int i = 0; i < 20; ++i) chunk[i] = i * 7;
    ASSERT_OK(b.Add(chunk, 10, {3, 0}, true));
    ASSERT_OK(b.Add({42}, 16, {5, 7}, true));
    ASSERT_OK(b.Add({1, 2, 3, 4, 5}, 0, {1}, false));
    good_ = b.Take();
  }
  void ExpectRejected(const std::function<void(BatchInput*)>& mutate, const char* needle) {
    BatchInput b = good_;
    mutate(&b);
    EXPECT_THAT(b.Validate(cfg_, kBlocks), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(needle)));
  }
  static constexpr int kBlocks = 8;
  ModelConfig cfg_;
  BatchInput good_;
};

TEST_F(BatchValidateTest, BuilderFillsEveryField) {
  EXPECT_OK(good_.Validate(cfg_, kBlocks));
  EXPECT_EQ(good_.num_seqs(), 3);
  EXPECT_EQ(good_.num_tokens(), 26);
  EXPECT_EQ(good_.seq_start, (std::vector<int32_t>{0, 20, 21, 26}));
  EXPECT_EQ(good_.context_len, (std::vector<int32_t>{30, 17, 5}));
  EXPECT_EQ(good_.sample_index, (std::vector<int32_t>{19, 20}));
  EXPECT_EQ(good_.block_tables, (std::vector<int32_t>{3, 0, -1, -1, 5, 7, -1, -1, 1, -1, -1, -1}));
  EXPECT_EQ(good_.slot_mapping[0], 3 * 16 + 10);   // position 10
  EXPECT_EQ(good_.slot_mapping[6], 0 * 16 + 0);    // position 16 -> block_table[1] = 0
  EXPECT_EQ(good_.slot_mapping[20], 7 * 16 + 0);   // position 16 of sequence 1
  EXPECT_EQ(good_.slot_mapping[21], 1 * 16 + 0);
  EXPECT_OK(BatchInput().Validate(cfg_, kBlocks));  // empty step
}

TEST_F(BatchValidateTest, RejectsBadInputs) {
  ExpectRejected([](BatchInput* b) { b->positions.pop_back(); }, "differ in size");
  ExpectRejected([](BatchInput* b) { b->slot_mapping.push_back(0); }, "differ in size");
  ExpectRejected([](BatchInput* b) { b->tokens[3] = 512; }, "vocabulary");
  ExpectRejected([](BatchInput* b) { b->tokens[3] = -1; }, "vocabulary");
  ExpectRejected([](BatchInput* b) { b->seq_start[0] = 1; }, "seq_start[0]");
  ExpectRejected([](BatchInput* b) { b->seq_start[3] = 25; }, "seq_start[3]");
  ExpectRejected([](BatchInput* b) { b->seq_start[2] = 20; }, "strictly increasing");
  ExpectRejected([](BatchInput* b) { b->context_len.pop_back(); }, "context_len has");
  ExpectRejected([](BatchInput* b) { b->context_len[1] = 16; }, "context_len 16");
  ExpectRejected([](BatchInput* b) { b->positions[5] += 1; }, "not consecutive");
  ExpectRejected([](BatchInput* b) { b->positions[20] = -1; }, "< 0");
  ExpectRejected([](BatchInput* b) { b->block_tables.pop_back(); }, "block_tables has");
  ExpectRejected([](BatchInput* b) { b->max_blocks_per_seq = -1; }, "max_blocks_per_seq");
  ExpectRejected([](BatchInput* b) { b->block_tables[1] = kBlocks; }, "out of range");
  ExpectRejected([](BatchInput* b) { b->block_tables[1] = -1; }, "out of range");
  ExpectRejected([](BatchInput* b) { b->block_tables[2] = 9; }, "and not -1");
  ExpectRejected([](BatchInput* b) { b->block_tables[1] = 3; }, "mapped twice");
  ExpectRejected([](BatchInput* b) { b->slot_mapping[4] += 1; }, "slot_mapping");
  ExpectRejected([](BatchInput* b) { b->sample_index.push_back(26); }, "sample_index");
  ExpectRejected([](BatchInput* b) { b->sample_index.push_back(-1); }, "sample_index");
  // Context beyond the block table.
  ExpectRejected(
      [](BatchInput* b) {
        b->max_blocks_per_seq = 1;
        b->block_tables = {3, 5, 1};
      },
      "needs 2 blocks");
  // Beyond max_seq_len.
  {
    ModelConfig c = cfg_;
    c.max_seq_len = 20;
    EXPECT_THAT(good_.Validate(c, kBlocks), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_seq_len")));
  }
  // seq_start empty but tokens present.
  ExpectRejected([](BatchInput* b) { b->seq_start.clear(); }, "seq_start is empty");
}

TEST_F(BatchValidateTest, RejectsDuplicateSlotsAcrossSequences) {
  BatchBuilder b(16, 2);
  ASSERT_OK(b.Add({1, 2, 3}, 0, {4}, true));
  ASSERT_OK(b.Add({5}, 2, {4}, true));  // position 2 of block 4 again
  EXPECT_THAT(b.Take().Validate(cfg_, kBlocks),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("written by two tokens")));
  // Reading a shared prefix block is fine as long as nothing writes it twice.
  BatchBuilder s(16, 2);
  ASSERT_OK(s.Add({1}, 16, {4, 5}, true));
  ASSERT_OK(s.Add({2}, 16, {4, 6}, true));
  EXPECT_OK(s.Take().Validate(cfg_, kBlocks));
}

TEST(BatchBuilderTest, RejectsBadChunks) {
  BatchBuilder b(16, 2);
  EXPECT_THAT(b.Add({}, 0, {0}, true), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(b.Add({1}, -1, {0}, true), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("start_pos")));
  EXPECT_THAT(b.Add({1}, 16, {0}, true), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cover")));
  EXPECT_THAT(b.Add({1}, 0, {0, 1, 2}, true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_blocks_per_seq")));
  EXPECT_EQ(b.batch().num_tokens(), 0);
}

}  // namespace
}  // namespace symtp::model

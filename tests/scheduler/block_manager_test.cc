#include "scheduler/block_manager.h"

#include "tests/testing/status_matchers.h"

namespace symtp::sched {
namespace {

using ::symtp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BlockManager, CreateRejectsBadSizes) {
  EXPECT_THAT(BlockManager::Create(0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_kv_blocks 0")));
  EXPECT_FALSE(BlockManager::Create(-5).ok());
  EXPECT_TRUE(BlockManager::Create(1).ok());
}

TEST(BlockManager, AllocatesInOrderAndExhausts) {
  ASSERT_OK_AND_ASSIGN(BlockManager bm, BlockManager::Create(5));
  std::vector<int32_t> a, b;
  ASSERT_OK(bm.Allocate(3, &a));
  EXPECT_THAT(a, ElementsAre(0, 1, 2));
  EXPECT_EQ(bm.num_free(), 2);
  EXPECT_TRUE(bm.CanAllocate(2));
  EXPECT_FALSE(bm.CanAllocate(3));
  // Exhaustion allocates nothing.
  EXPECT_THAT(bm.Allocate(3, &b), StatusIs(absl::StatusCode::kResourceExhausted,
                                           HasSubstr("need 3 KV blocks, 2 of 5 free")));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(bm.num_free(), 2);
  ASSERT_OK(bm.Allocate(2, &b));
  EXPECT_THAT(b, ElementsAre(3, 4));
  EXPECT_EQ(bm.num_free(), 0);
  EXPECT_EQ(bm.num_used(), 5);
  ASSERT_OK(bm.Allocate(0, &b));
}

TEST(BlockManager, FreeReturnsBlocksLifo) {
  ASSERT_OK_AND_ASSIGN(BlockManager bm, BlockManager::Create(8));
  std::vector<int32_t> a, b, c;
  ASSERT_OK(bm.Allocate(3, &a));
  ASSERT_OK(bm.Allocate(2, &b));
  ASSERT_OK(bm.Free(a));
  EXPECT_EQ(bm.num_free(), 6);
  EXPECT_FALSE(bm.IsAllocated(1));
  EXPECT_TRUE(bm.IsAllocated(3));
  // A freed table is handed out again in its original order.
  ASSERT_OK(bm.Allocate(3, &c));
  EXPECT_THAT(c, ElementsAre(0, 1, 2));
}

TEST(BlockManager, DoubleFreeAndBadIdsFreeNothing) {
  ASSERT_OK_AND_ASSIGN(BlockManager bm, BlockManager::Create(4));
  std::vector<int32_t> a;
  ASSERT_OK(bm.Allocate(2, &a));
  EXPECT_THAT(bm.Free(std::vector<int32_t>{0, 3}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("double free of block 3")));
  EXPECT_TRUE(bm.IsAllocated(0));  // nothing was freed
  EXPECT_THAT(bm.Free(std::vector<int32_t>{1, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("appears twice")));
  EXPECT_TRUE(bm.IsAllocated(1));
  EXPECT_THAT(bm.Free(std::vector<int32_t>{9}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("out of range")));
  EXPECT_EQ(bm.num_free(), 2);
  ASSERT_OK(bm.Free(a));
  EXPECT_THAT(bm.Free(a),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("double free")));
  EXPECT_EQ(bm.num_free(), 4);
}

TEST(BlockManager, BlocksForTokens) {
  EXPECT_EQ(BlocksForTokens(0, 16), 0);
  EXPECT_EQ(BlocksForTokens(1, 16), 1);
  EXPECT_EQ(BlocksForTokens(16, 16), 1);
  EXPECT_EQ(BlocksForTokens(17, 16), 2);
}

}  // namespace
}  // namespace symtp::sched

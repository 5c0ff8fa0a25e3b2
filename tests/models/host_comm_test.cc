#include "models/host_comm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace symtp::model {
namespace {

using ::symtp::testing::StatusIs;

TEST(HostCommTest, LocalCommIsIdentity) {
  LocalComm c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> d = {1, 2, 3};
  ASSERT_OK(c.AllReduceSum(d.data(), d.size()));
  EXPECT_EQ(d, (std::vector<float>{1, 2, 3}));
  std::vector<float> r(3);
  ASSERT_OK(c.AllGather(d.data(), 3, r.data()));
  EXPECT_EQ(r, d);
}

std::vector<float> RankData(int rank, size_t n) {
  std::mt19937 rng(100 + rank);
  std::uniform_real_distribution<float> u(-1000.f, 1000.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng) * (rank % 2 ? 1e-3f : 1.f);  // mixed magnitudes: order matters
  return v;
}

TEST(HostCommTest, ThreadGroupAllReduceSumsInRankOrder) {
  for (int n : {1, 2, 3, 4, 8}) {
    SCOPED_TRACE(n);
    auto comms = ThreadGroupComm::Create(n, absl::Seconds(20));
    ASSERT_EQ(static_cast<int>(comms.size()), n);
    const size_t count = 1001;
    std::vector<float> want = RankData(0, count);
    for (int r = 1; r < n; ++r) {
      const std::vector<float> d = RankData(r, count);
      for (size_t i = 0; i < count; ++i) want[i] += d[i];  // ((d0 + d1) + d2) + ...
    }
    std::vector<std::vector<float>> data(n);
    std::vector<std::vector<float>> gathered(n, std::vector<float>(n * 7));
    std::vector<absl::Status> st(n);
    std::vector<std::thread> th;
    for (int r = 0; r < n; ++r) {
      th.emplace_back([&, r] {
        EXPECT_EQ(comms[r]->rank(), r);
        EXPECT_EQ(comms[r]->size(), n);
        for (int rep = 0; rep < 3 && st[r].ok(); ++rep) {
          data[r] = RankData(r, count);
          st[r] = comms[r]->AllReduceSum(data[r].data(), count);
          if (!st[r].ok()) break;
          const std::vector<float> mine(7, static_cast<float>(r * 10 + rep));
          st[r] = comms[r]->AllGather(mine.data(), 7, gathered[r].data());
          if (st[r].ok()) st[r] = comms[r]->AllReduceSum(nullptr, 0);
        }
      });
    }
    for (auto& t : th) t.join();
    for (int r = 0; r < n; ++r) {
      ASSERT_OK(st[r]);
      EXPECT_EQ(std::memcmp(data[r].data(), want.data(), count * sizeof(float)), 0) << "rank " << r;
      for (int q = 0; q < n; ++q) {
        for (int i = 0; i < 7; ++i) EXPECT_EQ(gathered[r][q * 7 + i], static_cast<float>(q * 10 + 2));
      }
    }
  }
  EXPECT_TRUE(ThreadGroupComm::Create(0, absl::Seconds(1)).empty());
}

TEST(HostCommTest, ThreadGroupTimesOutAndBreaks) {
  auto comms = ThreadGroupComm::Create(2, absl::Milliseconds(50));
  std::vector<float> d(4, 1.f);
  // Rank 1 never shows up: rank 0 gets DeadlineExceeded instead of hanging.
  EXPECT_THAT(comms[0]->AllReduceSum(d.data(), d.size()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::HasSubstr("rank 0")));
  // The group is broken: later calls on any rank fail at once.
  EXPECT_THAT(comms[1]->AllReduceSum(d.data(), d.size()),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("broken")));
  std::vector<float> r(8);
  EXPECT_THAT(comms[0]->AllGather(d.data(), 4, r.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

TEST(HostCommTest, ThreadGroupRejectsMismatchedCounts) {
  auto comms = ThreadGroupComm::Create(2, absl::Seconds(20));
  std::vector<float> a(4, 1.f), b(5, 1.f);
  absl::Status s0, s1;
  std::thread t([&] { s1 = comms[1]->AllReduceSum(b.data(), b.size()); });
  s0 = comms[0]->AllReduceSum(a.data(), a.size());
  t.join();
  EXPECT_THAT(s0, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("mismatched")));
  EXPECT_THAT(s1, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("mismatched")));
}

}  // namespace
}  // namespace symtp::model

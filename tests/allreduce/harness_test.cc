// CPU-only cases: the multi-process harness (ShmPeerExchange, RunRanks) and the
// host reference conversions. No CUDA call is made in these processes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/allreduce/custom_allreduce.h"
#include "tests/testing/allreduce/multi_process.h"
#include "tests/testing/allreduce/reference.h"
#include "tests/testing/status_matchers.h"

namespace symtp::kernels {
namespace {

namespace kt = ::symtp::kernels::testing;
using ::symtp::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Harness, AllGatherAndBarrierAcrossProcesses) {
  kt::RunOptions opt;
  opt.size = 3;
  opt.timeout_ms = 30'000;
  auto res = kt::RunRanks(opt, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    for (int round = 0; round < 50; ++round) {
      uint64_t mine[4] = {uint64_t(rank), uint64_t(round), uint64_t(rank * 1000 + round), 7};
      std::vector<uint64_t> all(4 * size);
      SYMTP_RETURN_IF_ERROR(ex.AllGather(mine, sizeof(mine), all.data(), Deadline::AfterMs(10'000)));
      for (int r = 0; r < size; ++r) {
        if (all[4 * r] != uint64_t(r) || all[4 * r + 1] != uint64_t(round) ||
            all[4 * r + 2] != uint64_t(r * 1000 + round)) {
          return absl::InternalError(absl::StrCat("round ", round, ": wrong slot of rank ", r));
        }
      }
      SYMTP_RETURN_IF_ERROR(ex.Barrier(Deadline::AfterMs(10'000)));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(res->ok()) << res->Summary();
}

TEST(Harness, FailingRankReleasesPeersWithItsName) {
  kt::RunOptions opt;
  opt.size = 3;
  opt.timeout_ms = 30'000;
  auto res = kt::RunRanks(opt, [](int rank, int, PeerExchange& ex) -> absl::Status {
    if (rank == 1) return absl::InternalError("rank one gives up");
    return ex.Barrier(Deadline::AfterMs(20'000));
  });
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->ranks.size(), 3u);
  EXPECT_EQ(res->ranks[1].kind, kt::RankOutcome::Kind::kError);
  EXPECT_THAT(res->ranks[1].message, HasSubstr("rank one gives up"));
  for (int r : {0, 2}) {
    EXPECT_EQ(res->ranks[r].kind, kt::RankOutcome::Kind::kError) << res->Summary();
    EXPECT_THAT(res->ranks[r].message, HasSubstr("peer rank 1 failed")) << res->Summary();
  }
}

TEST(Harness, BarrierDeadlineNamesMissingRank) {
  kt::RunOptions opt;
  opt.size = 2;
  opt.timeout_ms = 30'000;
  auto res = kt::RunRanks(opt, [](int rank, int, PeerExchange& ex) -> absl::Status {
    if (rank == 1) {
      usleep(1'500'000);  // late, but alive: not a failure
      return absl::OkStatus();
    }
    absl::Status st = ex.Barrier(Deadline::AfterMs(300));
    if (st.code() == absl::StatusCode::kDeadlineExceeded &&
        std::string(st.message()).find("rank(s) 1 did not arrive") != std::string::npos) {
      return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat("unexpected: ", st.ToString()));
  });
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(res->ok()) << res->Summary();
}

TEST(Harness, HungChildIsKilledAtTheTimeoutAndCrashesAreReported) {
  kt::RunOptions opt;
  opt.size = 3;
  opt.timeout_ms = 1'000;
  opt.grace_after_failure_ms = 60'000;  // only the overall timeout ends rank 0
  auto res = kt::RunRanks(opt, [](int rank, int, PeerExchange&) -> absl::Status {
    if (rank == 0) {
      for (;;) pause();
    }
    if (rank == 1) raise(SIGSEGV);
    return absl::OkStatus();
  });
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_FALSE(res->ok());
  EXPECT_EQ(res->ranks[0].kind, kt::RankOutcome::Kind::kTimedOut) << res->Summary();
  EXPECT_EQ(res->ranks[1].kind, kt::RankOutcome::Kind::kCrashed) << res->Summary();
  EXPECT_EQ(res->ranks[1].signal, SIGSEGV);
  EXPECT_EQ(res->ranks[2].kind, kt::RankOutcome::Kind::kOk) << res->Summary();
  // Every child was reaped: nothing is left to wait for.
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
}

TEST(Harness, GracePeriodEndsPeersOfAFailedRank) {
  kt::RunOptions opt;
  opt.size = 2;
  opt.timeout_ms = 60'000;
  opt.grace_after_failure_ms = 200;
  auto res = kt::RunRanks(opt, [](int rank, int, PeerExchange&) -> absl::Status {
    if (rank == 0) return absl::InternalError("boom");
    for (;;) pause();  // e.g. stuck in a GPU wait that the failed rank never satisfies
  });
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->ranks[1].kind, kt::RankOutcome::Kind::kKilledAfterPeerFailure)
      << res->Summary();
}

TEST(Reference, ConversionsRoundToNearestEven) {
  EXPECT_EQ(kt::F32ToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(kt::F32ToBf16Bits(kt::BitsToF32(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(kt::F32ToBf16Bits(kt::BitsToF32(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(kt::F32ToBf16Bits(kt::BitsToF32(0x3f808001u)), 0x3f81);
  EXPECT_EQ(kt::F32ToF16Bits(1.0f), 0x3c00);
  EXPECT_EQ(kt::F32ToF16Bits(65504.0f), 0x7bff);
  EXPECT_EQ(kt::F32ToF16Bits(65520.0f), 0x7c00);
  EXPECT_EQ(kt::F32ToF16Bits(0.1f), 0x2e66);
  EXPECT_EQ(kt::F32ToF16Bits(-2.0f), 0xc000);
  EXPECT_EQ(kt::F32ToF16Bits(5.9604645e-08f), 0x0001);  // 2^-24
  EXPECT_EQ(kt::F32ToF16Bits(6.103515625e-05f), 0x0400);  // 2^-14
  for (uint32_t h : {0x0001u, 0x03ffu, 0x0400u, 0x3c00u, 0x7bffu, 0xbc01u}) {
    EXPECT_EQ(kt::F32ToF16Bits(kt::F16BitsToF32(static_cast<uint16_t>(h))), h);
  }
}

TEST(Reference, RandomInputsAreNeverZeroAndReferenceIsRankOrdered) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    kt::HostArray a = kt::RandomInput(t, 10'000, 42, 1);
    for (size_t i = 0; i < a.count(); ++i) ASSERT_NE(a.at(i), 0.0f) << i;
    kt::HostArray ref = kt::ReferenceSum(t, 100, 42, 4);
    for (size_t i = 0; i < 100; ++i) {
      float acc = kt::RandomInput(t, 100, 42, 0).at(i);
      for (int r = 1; r < 4; ++r) acc += kt::RandomInput(t, 100, 42, r).at(i);
      ASSERT_EQ(ref.bits(i), kt::FromF32(t, acc));
    }
  }
}

TEST(CustomAllReduceCreate, RejectsUnsupportedGroupSizesWithoutTouchingCuda) {
  // A PeerExchange that must not be used.
  struct NoExchange : PeerExchange {
    absl::Status AllGather(const void*, size_t, void*, Deadline) override {
      return absl::InternalError("used");
    }
    absl::Status Barrier(Deadline) override { return absl::InternalError("used"); }
  } ex;
  EXPECT_THAT(CustomAllReduce::Create(0, 3, 0, 1 << 20, &ex, Deadline::AfterMs(1000)),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("TP 2, 4, 8")));
  EXPECT_THAT(CustomAllReduce::Create(2, 2, 0, 1 << 20, &ex, Deadline::AfterMs(1000)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2")));
  EXPECT_THAT(CustomAllReduce::Create(0, 2, 0, 1 << 20, nullptr, Deadline::AfterMs(1000)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("PeerExchange")));
}

}  // namespace
}  // namespace symtp::kernels

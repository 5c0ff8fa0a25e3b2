#include <fcntl.h>

#include <cerrno>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/gpu_power.h"
#include "common/histogram.h"
#include "common/log.h"
#include "common/paired_ab.h"
#include "common/status_macros.h"
#include "tests/testing/status_matchers.h"

namespace symtp {
namespace {

using ::symtp::testing::IsOk;
using ::symtp::testing::StatusIs;
using ::testing::HasSubstr;

absl::Status OpenMissing() {
  ERRNO_RETURN_IF_ERROR(::open("/nonexistent/symtp/x", O_RDONLY));
  return absl::OkStatus();
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  SYMTP_ASSIGN_OR_RETURN(int h, Half(x));
  SYMTP_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

absl::Status Chain(int x) {
  SYMTP_RETURN_IF_ERROR_CTX(Quarter(x).status(), "quartering");
  return absl::OkStatus();
}

TEST(StatusMacros, ErrnoCarriesCallTextLocationAndCode) {
  EXPECT_THAT(OpenMissing(), StatusIs(absl::StatusCode::kNotFound,
                                      AllOf(HasSubstr("::open(\"/nonexistent/symtp/x\""),
                                            HasSubstr("common_test.cc:"),
                                            HasSubstr("errno 2"))));
}

TEST(StatusMacros, AssignOrReturnPropagatesFirstError) {
  EXPECT_THAT(Quarter(8), IsOk());
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 is odd")));
}

TEST(StatusMacros, ContextIsPrepended) {
  EXPECT_THAT(Chain(6), StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("quartering: 3 is odd")));
  EXPECT_THAT(Chain(4), IsOk());
}

TEST(Histogram, PercentilesByNearestRank) {
  LatencyHistogram h;
  for (int i = 100; i >= 1; --i) h.Record(i);
  LatencySummary s = h.Summarize();
  EXPECT_EQ(s.count, 100);
  EXPECT_DOUBLE_EQ(s.p50, 50);
  EXPECT_DOUBLE_EQ(s.p90, 90);
  EXPECT_DOUBLE_EQ(s.p99, 99);
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(h.Percentile(100), 100);
}

TEST(Histogram, ReservoirKeepsBoundAndExactExtremes) {
  LatencyHistogram h(/*max_samples=*/64);
  for (int i = 0; i < 10000; ++i) h.Record(i);
  EXPECT_EQ(h.count(), 10000);
  LatencySummary s = h.Summarize();
  EXPECT_DOUBLE_EQ(s.max, 9999);
  EXPECT_DOUBLE_EQ(s.min, 0);
  // The reservoir is a uniform sample: its median lands near the middle.
  EXPECT_GT(s.p50, 2000);
  EXPECT_LT(s.p50, 8000);
}

TEST(Deadline, ExpiresAndReportsRemaining) {
  Deadline past = Deadline::AfterNs(-1);
  EXPECT_TRUE(past.Expired());
  EXPECT_EQ(past.RemainingNs(), 0);
  Deadline future = Deadline::AfterMs(10'000);
  EXPECT_FALSE(future.Expired());
  EXPECT_GT(future.RemainingNs(), 0);
}

TEST(Log, SpecSelectsPerSubsystemLevel) {
  SetLogSpec("warn,ipc=trace");
  EXPECT_TRUE(LogEnabled(LogLevel::kTrace, "ipc"));
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo, "sched"));
  EXPECT_TRUE(LogEnabled(LogLevel::kError, "sched"));
  SetLogSpec("info");
  EXPECT_FALSE(LogEnabled(LogLevel::kTrace, "ipc"));
}

// The first n steps of a schedule: arms ('s' setup, 'a', 'b') and whether
// each is timed ('t' or '.').
std::pair<std::string, std::string> Schedule(const PairedAb& ab, int64_t n) {
  std::string arms, timed;
  for (int64_t i = 0; i < n; ++i) {
    const PairedAb::Step s = ab.Plan(i);
    arms += s.setup ? 's' : (s.arm == AbArm::kA ? 'a' : 'b');
    timed += s.timed ? 't' : '.';
  }
  return {arms, timed};
}

// The schedule: setup (B, untimed), then A B B A per round; the first
// discard steps of a window after a switch of arm untimed.
TEST(PairedAb, ScheduleAlternatesArmsAndDiscardsWindowHeads) {
  PairedAbOptions o;
  o.setup_steps = 2;
  o.window_steps = 3;
  o.discard_steps = 1;
  o.rounds = 2;
  absl::StatusOr<PairedAb> ab = PairedAb::Create(o);
  ASSERT_THAT(ab.status(), IsOk());
  ASSERT_EQ(ab->total_steps(), 2 + 2 * 4 * 3);
  for (int64_t i = 0; i < ab->total_steps(); ++i) {
    const PairedAb::Step s = ab->Plan(i);
    EXPECT_EQ(s.window, s.setup ? -1 : static_cast<int>((i - 2) / 3)) << i;
  }
  const auto [arms, timed] = Schedule(*ab, ab->total_steps());
  EXPECT_EQ(arms, "ssaaabbbbbbaaaaaabbbbbbaaa");
  EXPECT_EQ(timed, "...tt.ttttt.ttttt.ttttt.tt");
}

// One-step windows (arms that switch for free) with the first round
// untimed: A B B A A B B A ..., every step of later rounds timed. A cost
// that jumps every 16 steps (as when a lockstep decode batch crosses a KV
// block boundary) biases only the rounds it falls in; the median of the
// rounds is the effect of B.
TEST(PairedAb, OneStepWindowsSkipTheFirstRoundAndShrugOffPeriodicJumps) {
  PairedAbOptions o;
  o.setup_steps = 1;
  o.window_steps = 1;
  o.discard_steps = 0;
  o.rounds = 17;
  o.discard_rounds = 1;
  absl::StatusOr<PairedAb> ab = PairedAb::Create(o);
  ASSERT_THAT(ab.status(), IsOk());
  const auto [arms, timed] = Schedule(*ab, 13);
  for (int64_t i = 0; i < ab->total_steps(); ++i) {
    const PairedAb::Step s = ab->Plan(i);
    if (!s.timed) continue;
    const double a = 1000.0 + 30.0 * static_cast<double>((i + 6) / 16);
    ASSERT_THAT(ab->Record(s, s.arm == AbArm::kA ? a : a - 10), IsOk());
  }
  EXPECT_EQ(arms, "sabbaabbaabba");
  EXPECT_EQ(timed, ".....tttttttt");
  absl::StatusOr<PairedAb::Result> r = ab->Decide();
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_EQ(r->ratio.size(), 16u);
  EXPECT_LT(r->median_ratio, -0.0090);
  EXPECT_GT(r->median_ratio, -0.0101);
  EXPECT_EQ(r->winner, AbArm::kB);
  o.discard_rounds = 17;
  EXPECT_THAT(PairedAb::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// Paired medians per round: a B that is 2% faster wins with a 0.5% margin, a
// B within the margin (or slower) does not, though every step is 1% slower
// than the one before (A B B A cancels the drift); an empty window is an
// error, as are values that cannot be times.
TEST(PairedAb, DecidesByTheMedianOfPairedRoundRatios) {
  PairedAbOptions o;
  o.setup_steps = 0;
  o.window_steps = 4;
  o.discard_steps = 1;
  o.rounds = 3;
  o.margin = 0.005;
  o.discard_rounds = 0;
  for (double b_over_a : {0.98, 0.997, 1.03}) {
    absl::StatusOr<PairedAb> ab = PairedAb::Create(o);
    ASSERT_THAT(ab.status(), IsOk());
    for (int64_t i = 0; i < ab->total_steps(); ++i) {
      const PairedAb::Step s = ab->Plan(i);
      if (!s.timed) continue;
      // Both arms drift upwards over the run, 1% per step.
      const double a = 1000.0 * (1 + 0.01 * static_cast<double>(i));
      ASSERT_THAT(ab->Record(s, s.arm == AbArm::kA ? a : a * b_over_a), IsOk());
    }
    absl::StatusOr<PairedAb::Result> r = ab->Decide();
    ASSERT_THAT(r.status(), IsOk());
    ASSERT_EQ(r->ratio.size(), 3u);
    // A's windows time 3 + 3 steps in round 0, then 4 + 3 (the first
    // follows the previous round's last A window: no switch), B's 3 + 4.
    EXPECT_EQ(r->samples_a, 6 + 7 + 7);
    EXPECT_EQ(r->samples_b, 3 * 7);
    // Linear drift cancels exactly only with equal discards in A1 and A2.
    for (int k = 1; k < 3; ++k) EXPECT_NEAR(r->ratio[k], b_over_a - 1, 0.002) << b_over_a;
    EXPECT_EQ(r->winner, b_over_a < 0.99 ? AbArm::kB : AbArm::kA) << b_over_a;
    EXPECT_THAT(PairedAb::Describe(*r, o.margin), HasSubstr(b_over_a < 0.99 ? "B wins" : "A wins"));
  }
  absl::StatusOr<PairedAb> ab = PairedAb::Create(o);
  ASSERT_THAT(ab.status(), IsOk());
  EXPECT_THAT(ab->Decide().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("window 0")));
  EXPECT_THAT(ab->Record(ab->Plan(0), 5.0),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(ab->Record(ab->Plan(1), -1.0),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  o.discard_steps = 4;
  EXPECT_THAT(PairedAb::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// Without the NVIDIA driver the probe is an error naming the library; with
// it, a bus id that names no device is NotFound (or NVML cannot start:
// Unavailable). Reading a real device is a GPU test (kernels_test).
TEST(GpuPowerProbe, OpenIsAnErrorWithoutTheDriverOrForAnUnknownBusId) {
  absl::StatusOr<GpuPowerProbe> p = GpuPowerProbe::Open("ffff:ff:1f.7");
  ASSERT_FALSE(p.ok());
  if (p.status().code() == absl::StatusCode::kUnavailable) {
    EXPECT_THAT(std::string(p.status().message()),
                ::testing::AnyOf(HasSubstr("libnvidia-ml.so.1"), HasSubstr("nvmlInit")));
  } else {
    EXPECT_THAT(p.status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("ffff:ff:1f.7")));
  }
}

}  // namespace
}  // namespace symtp

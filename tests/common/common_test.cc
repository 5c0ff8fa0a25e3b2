#include <fcntl.h>

#include <cerrno>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/histogram.h"
#include "common/json.h"
#include "common/log.h"
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

TEST(JsonString, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonString("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(JsonString(std::string("x\ny\tz\x01", 6)), R"("x\u000ay\u0009z\u0001")");
  EXPECT_EQ(JsonString(std::string("\0end", 4)), R"("\u0000end")");
}

TEST(JsonWriter, CompactAndIndentedNestingAndNumbers) {
  JsonWriter c;
  c.Open('{').Field("a", 1).Field("s", "q\"").Key("l").Open('[').Value(1.5, 2).Null().Close();
  c.Key("e").Open('{').Close().Field("inf", 1.0 / 0.0).Field("t", true).Key("v").Array(std::vector<int>{1, 2});
  EXPECT_EQ(c.Close().Take(),
            R"({"a":1,"s":"q\"","l":[1.50,null],"e":{},"inf":null,"t":true,"v":[1,2]})");
  JsonWriter p(2);
  p.Open('{').Field("a", 1).Key("b").Open('[').Value("x").Close().Close();
  EXPECT_EQ(p.Take(), "{\n  \"a\": 1,\n  \"b\": [\n    \"x\"\n  ]\n}");
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

}  // namespace
}  // namespace symtp

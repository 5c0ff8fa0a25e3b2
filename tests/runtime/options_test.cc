// The flag parser rejects hostile values (NaN, infinities, fractions where an
// integer is meant, surrounding whitespace, overflow) with InvalidArgument
// naming the flag, and round-trips the values it accepts to the children.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/layout.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/options.h"

namespace symtp::runtime {
namespace {

using ::testing::HasSubstr;

absl::Status Parse(const std::vector<std::string>& args, JobOptions* o = nullptr) {
  JobOptions local;
  ProcArgs proc;
  return ParseArgs(args, o != nullptr ? o : &local, &proc);
}

struct Hostile {
  std::vector<std::string> args;
  std::string why;  // in the message
};

TEST(OptionsTest, HostileNumbersAreInvalidArgumentNamingTheFlag) {
  const std::vector<Hostile> cases = {
      {{"--temperature", "nan"}, "--temperature"},
      {{"--temperature", "inf"}, "--temperature"},
      {{"--top-p", "nan"}, "--top-p"},
      {{"--arrival-rate", "nan"}, "--arrival-rate"},
      {{"--arrival-rate", "-inf"}, "--arrival-rate"},
      {{"--kv-cache-mib", "nan"}, "--kv-cache-mib"},
      {{"--kv-cache-fraction", "nan"}, "--kv-cache-fraction"},
      {{"--gemm-tune-margin", "nan"}, "--gemm-tune-margin"},
      {{"--prompt-len", "inf"}, "--prompt-len"},
      {{"--prompt-len", "nan"}, "--prompt-len"},
      {{"--prompt-len", "1e30"}, "--prompt-len"},
      {{"--prompt-len", "3e9"}, "--prompt-len"},
      {{"--prompt-len", "3000000000"}, "--prompt-len"},
      {{"--prompt-len", "1.5"}, "--prompt-len"},
      {{"--prompt-len", " 12"}, "whitespace"},
      {{"--output-len", "inf"}, "--output-len"},
      {{"--prompt-len", "uniform:2.5:8"}, "--prompt-len"},
      {{"--prompt-len", "uniform:8:4"}, "MIN <= MAX"},
      {{"--prompt-len", "normal:nan:1"}, "--prompt-len"},
      {{"--prompt-len", "normal:100:inf"}, "--prompt-len"},
      {{"--prompt-len", "lognormal:1000:0"}, "--prompt-len"},
      {{"--prompt-len", "lognormal:3:nan"}, "--prompt-len"},
      {{"--tp", "2.5"}, "--tp"},
      {{"--tp", " 2"}, "whitespace"},
      {{"--tp", "2 "}, "whitespace"},
      {{"--tp", ""}, "--tp"},
      {{"--num-requests", "1.5"}, "--num-requests"},
      {{"--num-requests", "1e3"}, "--num-requests"},
      {{"--num-requests", "99999999999999999999"}, "--num-requests"},
      {{"--max-batch", "4294967297"}, "--max-batch"},
      {{"--seed", "-1"}, "--seed"},
      {{"--seed", "18446744073709551616"}, "--seed"},
      {{"--step-timeout-ms", "1e3"}, "--step-timeout-ms"},
      {{"--crossover-bytes", "0x10"}, "--crossover-bytes"},
      {{"--rank", "1.0"}, "--rank"},
      {{"--device", " 0"}, "--device"},
  };
  for (const Hostile& h : cases) {
    absl::Status s = Parse(h.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << h.args[0] << " " << h.args[1];
    EXPECT_THAT(std::string(s.message()), HasSubstr(h.why)) << h.args[0] << " '" << h.args[1] << "'";
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << s.message();
  }
}

TEST(OptionsTest, ConflictingFlagsAreOneLineErrors) {
  const std::vector<Hostile> cases = {
      {{"--steady-batch=8", "--max-batch=4"}, "--steady-batch"},
      {{"--kv-cache-mib=64", "--num-kv-blocks=8"}, "at most one"},
      {{"--exchange-transport=copy", "--allreduce=nccl"}, "--exchange-transport"},
      {{"--exchange-transport=sideways"}, "--exchange-transport"},
      {{"--custom-allreduce-max-bytes=100"}, "at least 65536"},
      {{"--custom-allreduce-max-bytes=-2"}, "--custom-allreduce-max-bytes"},
  };
  for (const Hostile& h : cases) {
    const std::string what = absl::StrJoin(h.args, " ");
    absl::Status s = Parse(h.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(h.why)) << what;
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << s.message();
  }
  JobOptions o;
  ASSERT_TRUE(Parse({"--exchange-transport=allreduce", "--allreduce=nccl"}, &o).ok());
  EXPECT_EQ(o.exchange_transport, ExchangeTransport::kAllReduce);
}

TEST(OptionsTest, WellFormedValuesParse) {
  JobOptions o;
  ASSERT_TRUE(Parse({"--tp=2", "--temperature=0.5", "--top-p", "0.9", "--arrival-rate=1e3",
                     "--prompt-len=uniform:3:40", "--output-len=normal:20.5:3.25",
                     "--num-requests=+7", "--seed=18446744073709551615"},
                    &o)
                  .ok());
  EXPECT_EQ(o.tp, 2);
  EXPECT_FLOAT_EQ(o.temperature, 0.5f);
  EXPECT_DOUBLE_EQ(o.arrival_rate, 1000);
  EXPECT_EQ(o.num_requests, 7);
  EXPECT_EQ(o.seed, UINT64_MAX);
  EXPECT_EQ(o.prompt_len.kind, LengthKind::kUniform);
  EXPECT_EQ(o.prompt_len.b, 40);
}

// A limit not given follows the flag it must hold: --max-batch and
// --max-batched-tokens a steady batch, --prefill-chunk a step's token budget. Given, each is the user's and
// a conflict is an error naming both values.
TEST(OptionsTest, LimitsNotGivenFollowTheFlagsTheyMustHold) {
  JobOptions o;
  ASSERT_TRUE(Parse({"--steady-batch=128", "--max-batched-tokens=256"}, &o).ok());
  EXPECT_EQ(o.max_batch, 128);
  EXPECT_EQ(o.prefill_chunk, 256);
  JobOptions d;
  ASSERT_TRUE(Parse({"--steady-batch=8"}, &d).ok());  // below the defaults: kept
  EXPECT_EQ(d.max_batch, JobOptions{}.max_batch);
  EXPECT_EQ(d.prefill_chunk, JobOptions{}.prefill_chunk);
  absl::Status s = Parse({"--max-batched-tokens=256", "--prefill-chunk=512"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--prefill-chunk 512 exceeds --max-batched-tokens 256"));
  s = Parse({"--steady-batch=512", "--max-batch=64"});
  EXPECT_THAT(std::string(s.message()), HasSubstr("--steady-batch 512 exceeds --max-batch 64"));
  // A steady batch's decodes alone would fill every step of a smaller budget.
  s = Parse({"--steady-batch=64", "--max-batched-tokens=32"});
  EXPECT_THAT(std::string(s.message()), HasSubstr("--steady-batch 64 exceeds --max-batched-tokens 32"));
  JobOptions big;
  ASSERT_TRUE(Parse({"--steady-batch=4096"}, &big).ok());
  EXPECT_EQ(big.max_batched_tokens, 4096);
  EXPECT_EQ(big.max_batch, 4096);
  // The children get every value written out, so they agree with the launcher.
  JobOptions again;
  ASSERT_TRUE(Parse(ToArgs(o), &again).ok());
  EXPECT_EQ(again.max_batch, 128);
  EXPECT_EQ(again.prefill_chunk, 256);
}

TEST(OptionsTest, ChildrenReparseExactlyTheLauncherValues) {
  JobOptions o;
  ASSERT_TRUE(Parse({"--output-len=normal:1234567.125:0.1", "--prompt-len=lognormal:2.302585093:0.7",
                     "--arrival-rate=0.123456789012"},
                    &o)
                  .ok());
  JobOptions again;
  ASSERT_TRUE(Parse(ToArgs(o), &again).ok());
  EXPECT_EQ(again.output_len.a, o.output_len.a);
  EXPECT_EQ(again.output_len.b, o.output_len.b);
  EXPECT_EQ(again.prompt_len.a, o.prompt_len.a);
  EXPECT_EQ(again.prompt_len.b, o.prompt_len.b);
  EXPECT_EQ(again.arrival_rate, o.arrival_rate);
}

// Lengths against the model (tiny: max_seq_len from its preset).
TEST(OptionsTest, LengthsBeyondTheModelAreErrorsAtPlanning) {
  JobOptions o;
  ASSERT_TRUE(Parse({"--model=tiny"}, &o).ok());
  auto base = PlanJobLayout(o);
  ASSERT_TRUE(base.ok()) << base.status();
  const int max = base->model.max_seq_len;
  const std::vector<Hostile> cases = {
      {{"--prompt-len", std::to_string(max)}, "max_seq_len"},
      {{"--prompt-len", absl::StrCat("uniform:1:", max + 5)}, "max_seq_len"},
      {{"--prompt-len", absl::StrCat("normal:", max * 2, ":1")}, "median"},
      {{"--output-len", std::to_string(max)}, "--output-len"},
      {{"--steady-batch", "2", "--steady-context", std::to_string(max)}, "--steady-context"},
      {{"--num-kv-blocks", "1", "--prompt-len", "40"}, "cannot hold one sequence"},
      {{"--backend=cpu", "--tp=2", "--kv-cache-mib", "0.01"}, "cannot hold one sequence"},
  };
  for (const Hostile& h : cases) {
    JobOptions c;
    std::vector<std::string> args = {"--model=tiny"};
    args.insert(args.end(), h.args.begin(), h.args.end());
    ASSERT_TRUE(Parse(args, &c).ok()) << h.args[1];
    auto l = PlanJobLayout(c);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << h.args[1];
    EXPECT_THAT(std::string(l.status().message()), HasSubstr(h.why)) << h.args[1];
  }
  JobOptions fits;
  ASSERT_TRUE(Parse({"--model=tiny", "--prompt-len", std::to_string(max - 1), "--output-len",
                     std::to_string(max - 1)},
                    &fits)
                  .ok());
  EXPECT_TRUE(PlanJobLayout(fits).ok());
}

}  // namespace
}  // namespace symtp::runtime

// The run summary (runtime/step_stats.h): metrics from recorded steps and
// requests, the results block, summary.json's fields and requests.jsonl.
#include "runtime/step_stats.h"

#include <cmath>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/build_info.h"

namespace symtp::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kMs = 1'000'000;

JobOptions CpuOptions() {
  JobOptions o;
  o.tp = 2;
  o.resolved_backend = BackendKind::kCpu;
  o.warmup_steps = 0;
  return o;
}

// Steps 0..n-1 whose results arrive in pairs, as pipelined v1 workers
// deliver them: step 2k at k * 2 * period, step 2k + 1 0.01 ms later.
std::vector<StepRecord> PairedSteps(int n, int64_t period_ns, int64_t start_ns) {
  std::vector<StepRecord> steps;
  for (int i = 0; i < n; ++i) {
    StepRecord s;
    s.step = static_cast<uint64_t>(i);
    s.decode_only = true;
    s.num_seqs = 4;
    s.forward_ns = period_ns * 9 / 10;
    s.done_at_ns = start_ns + (i / 2) * 2 * period_ns + (i % 2) * 10'000;
    steps.push_back(s);
  }
  return steps;
}


TEST(MetricStatsTest, SummarizesOneToHundred) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i * 1000.0);
  const MetricStats m = MetricStats::Of(v, 1000.0);
  EXPECT_EQ(m.count, 100);
  EXPECT_DOUBLE_EQ(m.mean, 50.5);
  EXPECT_NEAR(m.std, std::sqrt((100.0 * 100.0 - 1) / 12.0), 1e-9);
  EXPECT_EQ(m.min, 1);
  EXPECT_EQ(m.p50, 50);
  EXPECT_EQ(m.p95, 95);
  EXPECT_EQ(m.p99, 99);
  EXPECT_EQ(m.max, 100);
  EXPECT_THAT(m.ToJson(), HasSubstr("\"std\":28.8661"));
  EXPECT_THAT(m.ToJson(), HasSubstr("\"p95\":95.0000"));
}

TEST(MetricStatsTest, NoSamplesIsNull) {
  EXPECT_EQ(MetricStats::Of({}).count, 0);
  EXPECT_EQ(MetricStats::Of({}).ToJson(), "null");
}

// Completion gaps alternate 0.01 ms / 19.99 ms: their median lands in either
// group; the period over a window of steps is the true 10 ms.
TEST(RunMetricsTest, StepPeriodOfPairedCompletionsIsTheWindowPeriod) {
  JobOptions o = CpuOptions();
  RunSummaryInput in;
  in.opts = &o;
  in.start_ns = 1'000 * kMs;
  in.steps = PairedSteps(41, 10 * kMs, in.start_ns);
  in.end_ns = in.steps.back().done_at_ns;
  const RunMetrics m = ComputeRunMetrics(in);
  EXPECT_EQ(m.measured_steps, 41);
  EXPECT_NEAR(m.step_period_ms, 10.0, 0.01);
  EXPECT_EQ(m.iteration_ms.count, 41 - RunMetrics::kPeriodWindow);
  EXPECT_NEAR(m.iteration_ms.p50, 10.0, 0.01);
  EXPECT_NEAR(m.iteration_ms.min, 10.0, 0.01);
  EXPECT_NEAR(m.iteration_ms.max, 10.0, 0.01);
  // Forward (9 ms) <= period <= 2 x forward.
  EXPECT_GE(m.step_period_ms, m.forward_us.p50 / 1e3);
  EXPECT_LE(m.step_period_ms, 2 * m.forward_us.p50 / 1e3);
}

// Ranks that take turns being slowest: the per-step maximum (8 ms) exceeds
// what either rank computed on average (6 ms), and the step period.
TEST(RunMetricsTest, BusiestRankForwardIsTheLargestPerRankMean) {
  JobOptions o = CpuOptions();
  RunSummaryInput in;
  in.opts = &o;
  in.steps = PairedSteps(10, 7 * kMs, 0);
  for (StepRecord& s : in.steps) {
    s.rank_forward_ns = s.step % 2 == 0 ? std::vector<int64_t>{8 * kMs, 4 * kMs}
                                        : std::vector<int64_t>{4 * kMs, 8 * kMs};
    s.forward_ns = 8 * kMs;
  }
  in.steps[0].rank_forward_ns = {8 * kMs, 6 * kMs};
  const RunMetrics m = ComputeRunMetrics(in);
  EXPECT_NEAR(m.busiest_rank_forward_us, 6200, 1e-6);  // rank 1: (6 + 4 x 4 + 5 x 8) / 10 ms
  EXPECT_EQ(m.forward_us.p50, 8000);
  EXPECT_LT(m.busiest_rank_forward_us / 1e3, m.step_period_ms);
}

TEST(RunMetricsTest, WarmupAndNonSteadyStepsAreNotMeasured) {
  JobOptions o = CpuOptions();
  o.warmup_steps = 3;
  o.steady_batch = 4;
  RunSummaryInput in;
  in.opts = &o;
  in.steps = PairedSteps(20, 10 * kMs, 0);
  in.steps[10].num_seqs = 3;  // not the steady batch
  const RunMetrics m = ComputeRunMetrics(in);
  EXPECT_EQ(m.total_steps, 20);
  EXPECT_EQ(m.measured_steps, 20 - 3 - 1);
  EXPECT_NEAR(m.step_period_ms, 10.0, 0.01);
  // Fewer whole-batch steps than asked for: the results block says so.
  o.steady_steps = 17;
  EXPECT_THAT(FormatResultsBlock(in, m), HasSubstr("Steady steps asked for (not reached):    17\n"));
  o.steady_steps = 16;
  EXPECT_THAT(FormatResultsBlock(in, m), Not(HasSubstr("not reached")));
}

// The context is per step the mean over its sequences, over measured steps
// only, and reaches summary.json and the results block.
TEST(RunMetricsTest, ContextIsTheSequencesMeanPerMeasuredStep) {
  JobOptions o = CpuOptions();
  o.warmup_steps = 2;
  o.steady_batch = 4;
  RunSummaryInput in;
  in.opts = &o;
  in.steps = PairedSteps(7, 10 * kMs, 0);
  // Step i: four sequences at 100 + i + {0, 1, 2, 5} keys (mean 102 + i).
  for (StepRecord& s : in.steps) s.context_tokens = 4 * (100 + s.step) + 8;
  const RunMetrics m = ComputeRunMetrics(in);
  EXPECT_EQ(m.context.count, 5);
  EXPECT_DOUBLE_EQ(m.context.min, 104);  // step 2, the first after the warm-up
  EXPECT_DOUBLE_EQ(m.context.p50, 106);
  EXPECT_DOUBLE_EQ(m.context.max, 108);
  EXPECT_THAT(SummaryJson(in, m), HasSubstr("\"context\": {\"count\":5,\"mean\":106.0000"));
  EXPECT_THAT(FormatResultsBlock(in, m),
              HasSubstr("Median context (keys per sequence):      106.0\n"));
}

// Two requests: times relative to the start of the measurement (after every
// worker was ready), start-up reported apart and kept out of throughput.
RunSummaryInput TwoRequests(const JobOptions* o) {
  RunSummaryInput in;
  in.opts = o;
  in.startup_ns = 7'500 * kMs;
  in.start_ns = 10'000 * kMs;
  in.end_ns = in.start_ns + 2'000 * kMs;
  RequestRecord a;
  a.id = 0;
  a.prompt_len = 100;
  a.tokens = {1, 2, 3};
  a.arrival_ns = in.start_ns;
  a.token_times_ns = {in.start_ns + 50 * kMs, in.start_ns + 70 * kMs, in.start_ns + 90 * kMs};
  a.first_token_ns = a.token_times_ns.front();
  a.finish_ns = a.token_times_ns.back();
  RequestRecord b;
  b.id = 1;
  b.prompt_len = 28;
  b.arrival_ns = in.start_ns + 100 * kMs;  // never got a token
  in.requests = {a, b};
  return in;
}

TEST(RunMetricsTest, LatenciesAndThroughputExcludeStartup) {
  JobOptions o = CpuOptions();
  const RunSummaryInput in = TwoRequests(&o);
  const RunMetrics m = ComputeRunMetrics(in);
  EXPECT_EQ(m.requests, 2);
  EXPECT_EQ(m.finished, 1);
  EXPECT_EQ(m.input_tokens, 128);
  EXPECT_EQ(m.output_tokens, 3);
  EXPECT_DOUBLE_EQ(m.startup_s, 7.5);
  EXPECT_DOUBLE_EQ(m.duration_s, 2.0);
  EXPECT_DOUBLE_EQ(m.request_throughput, 0.5);
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s, 1.5);
  EXPECT_DOUBLE_EQ(m.total_tokens_per_s, 65.5);
  EXPECT_EQ(m.ttft_ms.count, 1);
  EXPECT_DOUBLE_EQ(m.ttft_ms.p50, 50);
  EXPECT_DOUBLE_EQ(m.tpot_ms.p50, 20);
  EXPECT_DOUBLE_EQ(m.e2e_ms.p50, 90);
  EXPECT_EQ(m.itl_ms.count, 2);
}

TEST(ResultsBlockTest, ShowsLatenciesThroughputAndStartup) {
  JobOptions o = CpuOptions();
  const RunSummaryInput in = TwoRequests(&o);
  const std::string b = FormatResultsBlock(in, ComputeRunMetrics(in));
  EXPECT_THAT(b, HasSubstr("Successful requests:                     1 of 2\n"));
  EXPECT_THAT(b, HasSubstr("Start-up, not measured (s):              7.50\n"));
  EXPECT_THAT(b, HasSubstr("Benchmark duration (s):                  2.000\n"));
  EXPECT_THAT(b, HasSubstr("Request throughput (req/s):              0.50\n"));
  EXPECT_THAT(b, HasSubstr("Mean TTFT (ms):                          50.00\n"));
  EXPECT_THAT(b, HasSubstr("Median TPOT (ms):                        20.00\n"));
  EXPECT_THAT(b, HasSubstr("P99 E2E (ms):                            90.00\n"));
  EXPECT_THAT(b, HasSubstr("Step period (ms):                        n/a\n"));
  EXPECT_THAT(b, HasSubstr("GPU idle between steps (us):      n/a (cpu backend)"));
}

// The cuda backend reports how many measured decode steps replayed a CUDA
// graph on every rank; the cpu backend, which has none, does not.
TEST(RunMetricsTest, DecodeStepsFromGraphsOnTheCudaBackend) {
  JobOptions o = CpuOptions();
  o.warmup_steps = 2;
  RunSummaryInput in;
  in.opts = &o;
  in.steps = PairedSteps(10, 10 * kMs, 0);
  in.steps[4].decode_only = false;  // a prefill step, replayed or not, is not counted
  for (StepRecord& s : in.steps) s.graph = s.step != 3 && s.step != 7;
  const RunMetrics m = ComputeRunMetrics(in);
  EXPECT_EQ(m.decode_steps, 7);        // steps 2-9 but 4
  EXPECT_EQ(m.decode_graph_steps, 5);  // not 3 and 7
  EXPECT_THAT(SummaryJson(in, m), Not(HasSubstr("decode_from_graphs")));
  EXPECT_THAT(FormatResultsBlock(in, m), Not(HasSubstr("CUDA graphs")));
  o.resolved_backend = BackendKind::kCuda;
  EXPECT_THAT(SummaryJson(in, m), HasSubstr("\"decode\": 7,\n    \"decode_from_graphs\": 5,\n"));
  EXPECT_THAT(FormatResultsBlock(in, m),
              HasSubstr("Decode steps from CUDA graphs:           5 / 7\n"));
  o.cuda_graphs = false;
  EXPECT_THAT(FormatResultsBlock(in, m), Not(HasSubstr("CUDA graphs")));
}

TEST(SummaryJsonTest, RecordsBuildHostFlagsAndNullsForMissingMetrics) {
  JobOptions o = CpuOptions();
  o.prompt_len = {LengthKind::kUniform, 16, 64};
  o.out_dir = "dir with \"quote\"";
  RunSummaryInput in = TwoRequests(&o);
  in.model_json = "{\"name\":\"tiny\"}";
  in.steps = PairedSteps(12, 10 * kMs, in.start_ns);
  const std::string j = SummaryJson(in, ComputeRunMetrics(in));
  EXPECT_THAT(j, HasSubstr(absl::StrCat("\"commit\": \"", BuildCommit(), "\"")));
  EXPECT_THAT(j, HasSubstr("\"version\": \""));
  EXPECT_THAT(j, HasSubstr("\"date\": \"20"));
  EXPECT_THAT(j, HasSubstr("\"host\": \""));
  EXPECT_THAT(j, HasSubstr("\"devices\": [\n    \"cpu: "));
  EXPECT_THAT(j, HasSubstr("\"flags\": {"));
  EXPECT_THAT(j, HasSubstr("\"tp\": 2,"));
  EXPECT_THAT(j, HasSubstr("\"prompt-len\":\"uniform:16:64\""));
  EXPECT_THAT(j, HasSubstr("\"pipeline\":true"));
  EXPECT_THAT(j, HasSubstr(R"("out":"dir with \"quote\"")"));
  EXPECT_THAT(j, HasSubstr("\"input_tokens\": 128,"));
  EXPECT_THAT(j, HasSubstr("\"startup_s\": 7.500000,"));
  EXPECT_THAT(j, HasSubstr("\"e2e_ms\": {\"count\":1,"));
  EXPECT_THAT(j, HasSubstr("\"period_ms\": 10.0"));
  // The cpu backend has no device times.
  EXPECT_THAT(j, HasSubstr("\"device_forward_us\": null"));
  EXPECT_THAT(j, HasSubstr("\"gpu_idle_us\": null"));
  EXPECT_THAT(j, HasSubstr("\"busiest_rank_forward_us\": null"));
  EXPECT_THAT(j, Not(HasSubstr("\"forward_us\": null")));
}

TEST(RequestsJsonlTest, OneLinePerRequestWithNullForTimesNotReached) {
  JobOptions o = CpuOptions();
  const std::string l = RequestsJsonl(TwoRequests(&o));
  EXPECT_EQ(l,
            "{\"id\":0,\"arrival_s\":0.000000,\"first_token_s\":0.050000,\"finish_s\":0.090000,"
            "\"input_tokens\":100,\"output_tokens\":3}\n"
            "{\"id\":1,\"arrival_s\":0.100000,\"first_token_s\":null,\"finish_s\":null,"
            "\"input_tokens\":28,\"output_tokens\":0}\n");
}

}  // namespace
}  // namespace symtp::runtime

#include "scheduler/scheduler.h"

#include <algorithm>
#include <numeric>

#include "tests/scheduler/fake_model.h"
#include "tests/testing/status_matchers.h"

namespace symtp::sched {
namespace {

using ::symtp::sched::testing::Driver;
using ::symtp::sched::testing::FakeModel;
using ::symtp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

SchedulerConfig SmallConfig() {
  SchedulerConfig c;
  c.max_running_seqs = 8;
  c.max_batched_tokens = 256;
  c.num_kv_blocks = 64;
  c.max_seq_len = 256;
  c.prefill_chunk = 64;
  c.max_inflight_steps = 1;
  return c;
}

std::vector<int32_t> Prompt(int n, int32_t base = 100) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), base);
  return p;
}

Driver MakeDriver(const SchedulerConfig& c, FakeModel m = FakeModel{}) {
  absl::StatusOr<Scheduler> s = Scheduler::Create(c);
  EXPECT_OK(s);
  return Driver(std::move(*s), m);
}

const ScheduledRequest* FindScheduled(const StepPlan& p, uint64_t id) {
  for (const auto& s : p.scheduled) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

TEST(SchedulerConfig, ValidationNamesTheField) {
  SchedulerConfig c = SmallConfig();
  c.block_size = 32;
  EXPECT_THAT(Scheduler::Create(c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
  c = SmallConfig();
  c.max_inflight_steps = 0;
  EXPECT_THAT(Scheduler::Create(c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_inflight_steps")));
  c = SmallConfig();
  c.num_kv_blocks = 15;  // max_seq_len 256 needs 16
  EXPECT_THAT(Scheduler::Create(c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot hold one sequence")));
  c = SmallConfig();
  c.max_batched_tokens = 0;
  EXPECT_THAT(Scheduler::Create(c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_batched_tokens")));
}

TEST(Scheduler, AddRequestValidation) {
  Driver d = MakeDriver(SmallConfig());
  ASSERT_OK(d.sched.AddRequest(1, Prompt(10), 5, {}));
  EXPECT_THAT(d.sched.AddRequest(1, Prompt(10), 5, {}),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("request 1")));
  EXPECT_THAT(d.sched.AddRequest(2, {}, 5, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty prompt")));
  EXPECT_THAT(d.sched.AddRequest(3, Prompt(200), 57, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds max_seq_len")));
  EXPECT_THAT(d.sched.AddRequest(4, {1, -2}, 5, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prompt[1]")));
  EXPECT_THAT(d.sched.AddRequest(5, Prompt(3), 0, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_new_tokens")));
  model::SamplingParams bad;
  bad.top_p = 0.f;
  EXPECT_THAT(d.sched.AddRequest(6, Prompt(3), 5, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("request 6")));
  EXPECT_THAT(d.sched.AddRequest(7, Prompt(3), 5, {}, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eos")));
  EXPECT_EQ(d.sched.num_waiting(), 1);
}

TEST(Scheduler, ChunkedPrefillThenDecodeThenExactMaxTokens) {
  SchedulerConfig c = SmallConfig();
  c.prefill_chunk = 16;
  Driver d = MakeDriver(c);
  ASSERT_OK(d.sched.AddRequest(1, Prompt(40), 3, {}, std::nullopt, /*now_ns=*/0));

  StepPlan p = d.Plan();  // step 0: first chunk
  EXPECT_EQ(p.diff.step, 0u);
  ASSERT_EQ(p.diff.new_requests.size(), 1u);
  EXPECT_EQ(p.diff.new_requests[0].num_scheduled, 16u);
  EXPECT_EQ(p.diff.new_requests[0].prompt, Prompt(40));
  EXPECT_THAT(p.diff.new_requests[0].block_ids, ElementsAre(0));
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_FALSE(p.scheduled[0].samples);
  ASSERT_OK(d.Complete());

  p = d.Plan();  // step 1: second chunk
  ASSERT_EQ(p.diff.continuing.size(), 1u);
  EXPECT_EQ(p.diff.continuing[0].num_scheduled, 16u);
  EXPECT_THAT(p.diff.NewBlocks(p.diff.continuing[0]), ElementsAre(1));
  EXPECT_FALSE(p.scheduled[0].samples);
  ASSERT_OK(d.Complete());

  p = d.Plan();  // step 2: last 8 prompt tokens, samples the first token
  EXPECT_EQ(p.diff.continuing[0].num_scheduled, 8u);
  EXPECT_THAT(p.diff.NewBlocks(p.diff.continuing[0]), ElementsAre(2));
  EXPECT_TRUE(p.scheduled[0].samples);
  EXPECT_EQ(p.scheduled[0].start, 32);
  EXPECT_EQ(ContextTokens(p), 40);  // the last prompt token attends over the whole prompt
  ASSERT_OK(d.Complete());

  p = d.Plan();  // step 3: decode at position 40 (block 2 still has room)
  EXPECT_EQ(p.diff.continuing[0].num_scheduled, 1u);
  EXPECT_EQ(p.diff.continuing[0].num_new_blocks, 0u);
  EXPECT_EQ(p.scheduled[0].start, 40);
  EXPECT_EQ(ContextTokens(p), 41);
  ASSERT_OK(d.Complete());

  p = d.Plan();  // step 4: the 3rd and last token
  EXPECT_TRUE(p.scheduled[0].samples);
  EXPECT_EQ(d.sched.num_running(), 0);  // stopped as soon as its last token is planned
  EXPECT_EQ(d.sched.num_free_blocks(), 64);
  ASSERT_OK(d.Complete());

  p = d.Plan();  // step 5: only delivers the finish
  EXPECT_FALSE(p.idle);
  EXPECT_THAT(p.diff.finished, ElementsAre(1u));
  EXPECT_TRUE(p.scheduled.empty());
  ASSERT_OK(d.Complete());
  EXPECT_TRUE(d.sched.Done());
  EXPECT_TRUE(d.sched.PlanNextStep()->idle);

  const RequestOutput* out = d.sched.GetOutput(1);
  ASSERT_NE(out, nullptr);
  EXPECT_TRUE(out->finished);
  EXPECT_EQ(out->finish_reason, FinishReason::kMaxTokens);
  EXPECT_EQ(out->tokens, d.model.Expected(1, 40, 3, std::nullopt));
  EXPECT_EQ(out->token_times_ns.size(), 3u);
  EXPECT_GT(out->first_token_ns, out->arrival_ns);
  EXPECT_EQ(d.sched.stats().discarded_tokens, 0u);
}

TEST(Scheduler, TokenBudgetAndRunningLimit) {
  SchedulerConfig c = SmallConfig();
  c.max_batched_tokens = 64;
  c.max_running_seqs = 4;
  c.prefill_chunk = 0;  // budget only
  Driver d = MakeDriver(c);
  for (uint64_t id = 0; id < 6; ++id) ASSERT_OK(d.sched.AddRequest(id, Prompt(30), 20, {}));

  StepPlan p = d.Plan();
  EXPECT_EQ(p.num_tokens, 64);
  ASSERT_EQ(p.diff.new_requests.size(), 3u);
  EXPECT_EQ(p.diff.new_requests[0].num_scheduled, 30u);
  EXPECT_EQ(p.diff.new_requests[1].num_scheduled, 30u);
  EXPECT_EQ(p.diff.new_requests[2].num_scheduled, 4u);  // chunk cut by the budget
  ASSERT_OK(d.Complete());

  p = d.Plan();
  // Decodes of 0 and 1 first, then request 2's next chunk, then admit 3 (4 running).
  ASSERT_GE(p.scheduled.size(), 3u);
  EXPECT_EQ(p.scheduled[0].id, 0u);
  EXPECT_EQ(p.scheduled[0].num_tokens, 1);
  EXPECT_EQ(p.scheduled[1].id, 1u);
  EXPECT_EQ(p.scheduled[2].id, 2u);
  EXPECT_EQ(p.scheduled[2].num_tokens, 26);
  EXPECT_EQ(d.sched.num_running(), 4);
  EXPECT_LE(p.num_tokens, 64);
  ASSERT_EQ(p.diff.new_requests.size(), 1u);
  EXPECT_EQ(p.diff.new_requests[0].id, 3u);
  ASSERT_OK(d.Complete());

  for (int i = 0; i < 200 && !d.sched.Done(); ++i) {
    p = d.Plan();
    EXPECT_LE(p.num_tokens, 64);
    EXPECT_LE(d.sched.num_running(), 4);
    if (!p.idle) {
      ASSERT_OK(d.Complete());
    }
  }
  ASSERT_TRUE(d.sched.Done());
  for (uint64_t id = 0; id < 6; ++id) {
    EXPECT_EQ(d.sched.GetOutput(id)->tokens, d.model.Expected(id, 30, 20, std::nullopt));
  }
}

TEST(Scheduler, DecodesGoBeforePrefill) {
  SchedulerConfig c = SmallConfig();
  c.max_batched_tokens = 8;
  Driver d = MakeDriver(c);
  for (uint64_t id = 0; id < 6; ++id) ASSERT_OK(d.sched.AddRequest(id, Prompt(1), 30, {}));
  d.Plan();  // admits all six with their 1-token prompts
  ASSERT_OK(d.Complete());
  ASSERT_OK(d.sched.AddRequest(10, Prompt(20), 5, {}));
  StepPlan p = d.Plan();
  ASSERT_EQ(p.scheduled.size(), 7u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(p.scheduled[i].num_tokens, 1);
  EXPECT_EQ(p.scheduled[6].id, 10u);
  EXPECT_EQ(p.scheduled[6].num_tokens, 2);  // what is left of the budget
  EXPECT_EQ(p.num_tokens, 8);
}

TEST(Scheduler, PreemptsMostRecentlyAdmittedAndResumesByRecompute) {
  SchedulerConfig c = SmallConfig();
  c.num_kv_blocks = 6;
  c.max_seq_len = 80;
  Driver d = MakeDriver(c);
  ASSERT_OK(d.sched.AddRequest(1, Prompt(32, 100), 40, {}));
  ASSERT_OK(d.sched.AddRequest(2, Prompt(32, 200), 40, {}));
  ASSERT_OK(d.sched.AddRequest(3, Prompt(32, 300), 40, {}));
  StepPlan p = d.Plan();  // all three admitted, 2 blocks each: the cache is full
  EXPECT_EQ(p.diff.new_requests.size(), 3u);
  EXPECT_EQ(d.sched.num_free_blocks(), 0);
  ASSERT_OK(d.Complete());

  p = d.Plan();  // request 1's decode at position 32 needs a 3rd block
  EXPECT_THAT(p.diff.preempted, ElementsAre(3u));  // the most recently admitted
  EXPECT_NE(FindScheduled(p, 1), nullptr);
  EXPECT_NE(FindScheduled(p, 2), nullptr);
  EXPECT_EQ(FindScheduled(p, 3), nullptr);
  EXPECT_EQ(d.sched.num_waiting(), 1);
  ASSERT_OK(d.Complete());

  // Run to the end; request 3 must come back as a new request whose prompt is
  // its original prompt plus the token it had generated.
  bool resumed = false;
  for (int i = 0; i < 500 && !d.sched.Done(); ++i) {
    p = d.Plan();
    for (const auto& n : p.diff.new_requests) {
      if (n.id != 3) continue;
      resumed = true;
      std::vector<int32_t> want = Prompt(32, 300);
      const auto& so_far = d.sched.GetOutput(3)->tokens;
      want.insert(want.end(), so_far.begin(), so_far.end());
      EXPECT_EQ(n.prompt, want);
      EXPECT_EQ(n.max_new_tokens, 40u - so_far.size());
    }
    if (!p.idle) {
      ASSERT_OK(d.Complete());
    }
  }
  ASSERT_TRUE(d.sched.Done());
  EXPECT_TRUE(resumed);
  EXPECT_GE(d.sched.stats().preemptions, 1u);
  for (uint64_t id : {1u, 2u, 3u}) {
    EXPECT_EQ(d.sched.GetOutput(id)->tokens, d.model.Expected(id, 32, 40, std::nullopt)) << id;
  }
  EXPECT_GE(d.sched.GetOutput(3)->num_preemptions, 1);
  EXPECT_EQ(d.sched.num_free_blocks(), 6);
}

TEST(Scheduler, AsyncEosCatchUpDiscardsPlannedTokens) {
  SchedulerConfig c = SmallConfig();
  c.max_inflight_steps = 2;
  FakeModel m;
  m.eos_one_in = 0;
  // A request whose 2nd generated token (position 17) is made the EOS id.
  uint64_t id = 5;
  while (m.Token(id, 16) == m.Token(id, 17)) ++id;
  const int32_t eos = m.Token(id, 17);
  Driver d = MakeDriver(c, m);
  ASSERT_OK(d.sched.AddRequest(id, Prompt(16), 50, {}, eos));

  StepPlan p0 = d.Plan();  // prefill, samples position 16
  StepPlan p1 = d.Plan();  // decode, samples position 17 (the EOS) before step 0 is back
  EXPECT_EQ(p1.diff.step, 1u);
  EXPECT_FALSE(d.sched.CanPlan());
  ASSERT_OK(d.Complete());  // step 0: first token
  StepPlan p2 = d.Plan();   // still assumes the request continues
  ASSERT_NE(FindScheduled(p2, id), nullptr);
  ASSERT_OK(d.Complete());  // step 1: EOS
  EXPECT_EQ(d.sched.num_running(), 0);
  EXPECT_EQ(d.sched.num_free_blocks(), c.num_kv_blocks);  // freed at once
  EXPECT_FALSE(d.sched.GetOutput(id)->finished);          // step 2 still in flight
  StepPlan p3 = d.Plan();
  EXPECT_THAT(p3.diff.finished, ElementsAre(id));
  EXPECT_TRUE(p3.scheduled.empty());
  ASSERT_OK(d.Complete());  // step 2: its token is discarded
  EXPECT_EQ(d.sched.stats().discarded_tokens, 1u);
  const RequestOutput* out = d.sched.GetOutput(id);
  EXPECT_TRUE(out->finished);
  EXPECT_EQ(out->finish_reason, FinishReason::kEos);
  EXPECT_EQ(out->tokens, (std::vector<int32_t>{m.Token(id, 16), eos}));
  ASSERT_OK(d.Complete());  // step 3
  EXPECT_TRUE(d.sched.Done());
}

TEST(Scheduler, SynchronousEosWastesNothing) {
  SchedulerConfig c = SmallConfig();
  FakeModel m;
  m.eos_one_in = 0;
  uint64_t id = 5;
  while (m.Token(id, 16) == m.Token(id, 17)) ++id;
  const int32_t eos = m.Token(id, 17);
  Driver d = MakeDriver(c, m);
  ASSERT_OK(d.sched.AddRequest(id, Prompt(16), 50, {}, eos));
  while (!d.sched.Done()) {
    StepPlan p = d.Plan();
    ASSERT_FALSE(p.idle);
    ASSERT_OK(d.Complete());
  }
  EXPECT_EQ(d.sched.stats().discarded_tokens, 0u);
  EXPECT_EQ(d.sched.GetOutput(id)->tokens.size(), 2u);
}

TEST(Scheduler, MaxTokensAreExactUnderAsync) {
  SchedulerConfig c = SmallConfig();
  c.max_inflight_steps = 2;
  Driver d = MakeDriver(c);
  ASSERT_OK(d.sched.AddRequest(1, Prompt(8), 2, {}));
  StepPlan p0 = d.Plan();
  StepPlan p1 = d.Plan();  // samples the 2nd and last token: stops now
  EXPECT_TRUE(p1.scheduled[0].samples);
  EXPECT_EQ(d.sched.num_running(), 0);
  ASSERT_OK(d.Complete());
  StepPlan p2 = d.Plan();
  EXPECT_THAT(p2.diff.finished, ElementsAre(1u));
  EXPECT_TRUE(p2.scheduled.empty());
  ASSERT_OK(d.Complete());
  ASSERT_OK(d.Complete());
  EXPECT_TRUE(d.sched.Done());
  EXPECT_EQ(d.sched.stats().discarded_tokens, 0u);
  EXPECT_EQ(d.sched.GetOutput(1)->tokens.size(), 2u);
}

TEST(Scheduler, AbortWaitingAndRunning) {
  SchedulerConfig c = SmallConfig();
  c.max_inflight_steps = 2;
  c.max_running_seqs = 1;
  Driver d = MakeDriver(c);
  ASSERT_OK(d.sched.AddRequest(1, Prompt(8), 30, {}));
  ASSERT_OK(d.sched.AddRequest(2, Prompt(8), 30, {}));
  EXPECT_THAT(d.sched.Abort(99), StatusIs(absl::StatusCode::kNotFound, HasSubstr("99")));
  d.Plan();  // admits 1 only
  d.Plan();
  // 2 is waiting: aborting it needs no message to the workers.
  ASSERT_OK(d.sched.Abort(2));
  EXPECT_TRUE(d.sched.GetOutput(2)->finished);
  EXPECT_EQ(d.sched.GetOutput(2)->finish_reason, FinishReason::kAborted);
  // 1 is running with two steps in flight.
  ASSERT_OK(d.sched.Abort(1));
  ASSERT_OK(d.sched.Abort(1));  // idempotent
  EXPECT_EQ(d.sched.num_free_blocks(), c.num_kv_blocks);
  EXPECT_FALSE(d.sched.GetOutput(1)->finished);
  ASSERT_OK(d.Complete());
  StepPlan p = d.Plan();
  EXPECT_THAT(p.diff.aborted, ElementsAre(1u));
  EXPECT_THAT(p.diff.new_requests, IsEmpty());
  ASSERT_OK(d.Complete());
  ASSERT_OK(d.Complete());
  EXPECT_TRUE(d.sched.Done());
  EXPECT_TRUE(d.sched.GetOutput(1)->tokens.empty());
  EXPECT_EQ(d.sched.stats().discarded_tokens, 2u);
  ASSERT_OK(d.sched.ReleaseOutput(1));
  EXPECT_EQ(d.sched.GetOutput(1), nullptr);
}

TEST(Scheduler, InflightLimitAndResultErrors) {
  SchedulerConfig c = SmallConfig();
  c.max_inflight_steps = 2;
  Driver d = MakeDriver(c);
  proto::StepResult r;
  EXPECT_THAT(d.sched.OnStepResult(r),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no step is in flight")));
  ASSERT_OK(d.sched.AddRequest(1, Prompt(4), 10, {}));
  ASSERT_OK(d.sched.AddRequest(2, Prompt(4), 10, {}));
  StepPlan p0 = d.Plan();
  StepPlan p1 = d.Plan();
  EXPECT_THAT(d.sched.PlanNextStep().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("2 steps in flight")));

  r = d.ResultFor(p1);
  EXPECT_THAT(d.sched.OnStepResult(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("expected the oldest in-flight step 0")));
  r = d.ResultFor(p0);
  r.sampled.pop_back();
  EXPECT_THAT(d.sched.OnStepResult(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("1 sampled tokens, the plan samples 2")));
  r = d.ResultFor(p0);
  r.sampled[1].request_id = 77;
  EXPECT_THAT(d.sched.OnStepResult(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown request 77")));
  r = d.ResultFor(p0);
  r.sampled[1].request_id = 1;
  EXPECT_THAT(d.sched.OnStepResult(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("request 1 sampled twice")));
  // Nothing was applied by the failed calls.
  EXPECT_TRUE(d.sched.GetOutput(1)->tokens.empty());
  ASSERT_OK(d.Complete());
  ASSERT_OK(d.Complete());
  EXPECT_EQ(d.sched.GetOutput(1)->tokens.size(), 2u);
}

TEST(Scheduler, CheckDigestsNamesStepRanksAndRequest) {
  proto::StepResult a, b, c;
  a.step = b.step = c.step = 12;
  a.rank = 0;
  b.rank = 1;
  c.rank = 2;
  a.digest = b.digest = c.digest = 0xabc;
  a.sampled = b.sampled = c.sampled = {{4, 10}, {9, 11}};
  std::vector<proto::StepResult> all = {a, b, c};
  EXPECT_OK(Scheduler::CheckDigests(12, all));
  all[2].digest = 0xdef;
  all[2].sampled[1].token = 99;
  EXPECT_THAT(
      Scheduler::CheckDigests(12, all),
      StatusIs(absl::StatusCode::kInternal,
               ::testing::AllOf(HasSubstr("step 12"), HasSubstr("ranks [2] disagree"),
                                HasSubstr("request 9 sampled 11 on rank 0, 99 on rank 2"))));
  all[2].sampled[1].token = 11;
  EXPECT_THAT(Scheduler::CheckDigests(12, all),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("sampled tokens identical")));
  // Equal digests but different tokens (a pipelined worker's digest of step t
  // does not cover step t's tokens yet): still an error.
  all[2].digest = 0xabc;
  all[1].sampled[0].token = 7;
  EXPECT_THAT(Scheduler::CheckDigests(12, all),
              StatusIs(absl::StatusCode::kInternal,
                       ::testing::AllOf(HasSubstr("step 12: sampled tokens differ"),
                                        HasSubstr("ranks [1] disagree"),
                                        HasSubstr("request 4 sampled 10 on rank 0, 7 on rank 1"))));
  all[1].sampled[0].token = 10;
  all[1].step = 13;
  EXPECT_THAT(Scheduler::CheckDigests(12, all),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 returned a result for step 13")));
}

TEST(Scheduler, EndOfJob) {
  Driver d = MakeDriver(SmallConfig());
  ASSERT_OK(d.sched.AddRequest(1, Prompt(4), 1, {}));
  d.Plan();
  EXPECT_THAT(d.sched.PlanEndOfJob().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in flight")));
  ASSERT_OK(d.Complete());
  ASSERT_OK_AND_ASSIGN(StepPlan end, d.sched.PlanEndOfJob());
  EXPECT_TRUE(end.diff.end_of_job());
  EXPECT_THAT(end.diff.finished, ElementsAre(1u));
  EXPECT_EQ(end.diff.step, 1u);
  EXPECT_FALSE(d.sched.CanPlan());
  EXPECT_FALSE(d.sched.PlanNextStep().ok());
  EXPECT_FALSE(d.sched.AddRequest(2, Prompt(4), 1, {}).ok());
  ASSERT_OK(d.sched.OnStepResult([] {
    proto::StepResult r;
    r.step = 1;
    return r;
  }()));
  EXPECT_TRUE(d.sched.Done());
}

}  // namespace
}  // namespace symtp::sched

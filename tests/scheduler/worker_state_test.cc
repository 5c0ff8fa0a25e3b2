#include "worker/state/worker_state.h"

#include <numeric>

#include "models/config.h"
#include "tests/testing/status_matchers.h"

namespace symtp::worker {
namespace {

using ::symtp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

WorkerState MakeState(int32_t blocks = 16, int32_t max_seq_len = 64) {
  WorkerStateConfig c;
  c.num_kv_blocks = blocks;
  c.max_seq_len = max_seq_len;
  absl::StatusOr<WorkerState> s = WorkerState::Create(c);
  EXPECT_OK(s);
  return std::move(*s);
}

proto::NewRequest NewReq(uint64_t id, int n_prompt, int32_t base, uint32_t num_scheduled,
                         std::vector<int32_t> blocks, uint32_t max_new = 10) {
  proto::NewRequest r;
  r.id = id;
  r.prompt.resize(n_prompt);
  std::iota(r.prompt.begin(), r.prompt.end(), base);
  r.num_scheduled = num_scheduled;
  r.block_ids = std::move(blocks);
  r.max_new_tokens = max_new;
  return r;
}

model::ModelConfig TinyModel() {
  absl::StatusOr<model::ModelConfig> c = model::PresetConfig("tiny");
  EXPECT_OK(c);
  return *c;
}

TEST(WorkerState, CreateValidates) {
  WorkerStateConfig c;
  c.num_kv_blocks = 0;
  EXPECT_THAT(WorkerState::Create(c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_kv_blocks")));
  c.num_kv_blocks = 4;
  c.block_size = 8;
  EXPECT_FALSE(WorkerState::Create(c).ok());
}

TEST(WorkerState, BuildInputForMixedPrefillAndDecode) {
  WorkerState w = MakeState();
  proto::StepDiff d;
  d.step = 0;
  d.new_requests.push_back(NewReq(1, 20, 100, 16, {3}));
  d.new_requests.push_back(NewReq(2, 5, 200, 5, {7}));
  ASSERT_OK(w.ApplyDiff(d));
  model::BatchInput in;
  ASSERT_OK(w.BuildInput(&in));
  ASSERT_OK(in.Validate(TinyModel(), 16));
  EXPECT_EQ(in.tokens.size(), 21u);
  EXPECT_EQ(in.tokens[0], 100);
  EXPECT_EQ(in.tokens[15], 115);
  EXPECT_EQ(in.tokens[16], 200);
  EXPECT_EQ(in.positions[15], 15);
  EXPECT_EQ(in.positions[16], 0);
  EXPECT_EQ(in.slot_mapping[0], 48);
  EXPECT_EQ(in.slot_mapping[15], 63);
  EXPECT_EQ(in.slot_mapping[20], 116);
  EXPECT_THAT(in.seq_start, ElementsAre(0, 16, 21));
  EXPECT_THAT(in.context_len, ElementsAre(16, 5));
  EXPECT_EQ(in.max_blocks_per_seq, 1);
  EXPECT_THAT(in.block_tables, ElementsAre(3, 7));
  EXPECT_THAT(in.sample_index, ElementsAre(20));  // only request 2 completes its prompt
  EXPECT_THAT(w.sample_request_ids(), ElementsAre(2u));
  EXPECT_THAT(w.sample_positions(), ElementsAre(5));
  ASSERT_OK(w.ApplySampled(std::vector<int32_t>{42}));
  EXPECT_THAT(w.last_sampled(), ElementsAre(proto::SampledToken{2, 42}));
  EXPECT_EQ(w.Find(2)->tokens.back(), 42);

  d.Clear();
  d.step = 1;
  d.AddContinuing(1, 4, std::vector<int32_t>{4});  // rest of the prompt, crosses into block 4
  d.AddContinuing(2, 1);                           // decode of the sampled token
  ASSERT_OK(w.ApplyDiff(d));
  ASSERT_OK(w.BuildInput(&in));
  ASSERT_OK(in.Validate(TinyModel(), 16));
  EXPECT_THAT(in.tokens, ElementsAre(116, 117, 118, 119, 42));
  EXPECT_THAT(in.positions, ElementsAre(16, 17, 18, 19, 5));
  EXPECT_THAT(in.slot_mapping, ElementsAre(64, 65, 66, 67, 117));
  EXPECT_THAT(in.seq_start, ElementsAre(0, 4, 5));
  EXPECT_THAT(in.context_len, ElementsAre(20, 6));
  EXPECT_EQ(in.max_blocks_per_seq, 2);
  EXPECT_THAT(in.block_tables, ElementsAre(3, 4, 7, -1));
  EXPECT_THAT(in.sample_index, ElementsAre(3, 4));
  EXPECT_THAT(w.sample_positions(), ElementsAre(20, 6));
  EXPECT_THAT(w.rows_changed(), ElementsAre(0));  // request 1 got a block
  ASSERT_OK(w.ApplySampled(std::vector<int32_t>{50, 51}));
  EXPECT_THAT(w.last_sampled(),
              ElementsAre(proto::SampledToken{1, 50}, proto::SampledToken{2, 51}));

  // Finishing request 1 swap-removes its row: request 2 moves to row 0.
  d.Clear();
  d.step = 2;
  d.finished = {1};
  d.AddContinuing(2, 1);
  ASSERT_OK(w.ApplyDiff(d));
  EXPECT_EQ(w.num_rows(), 1);
  EXPECT_EQ(w.row(0).id, 2u);
  EXPECT_THAT(w.rows_changed(), ElementsAre(0));
  EXPECT_EQ(w.Find(1), nullptr);
  ASSERT_OK(w.BuildInput(&in));
  EXPECT_THAT(in.tokens, ElementsAre(51));
  EXPECT_THAT(in.positions, ElementsAre(6));
  ASSERT_OK(w.ApplySampled(std::vector<int32_t>{52}));
  EXPECT_THAT(w.Find(2)->tokens, ElementsAre(200, 201, 202, 203, 204, 42, 51, 52));
  // Block 3 and 4 are free again: a new request may take them.
  d.Clear();
  d.step = 3;
  d.new_requests.push_back(NewReq(3, 17, 0, 17, {4, 3}));
  ASSERT_OK(w.ApplyDiff(d));
}

TEST(WorkerState, SequenceGapAndRepeat) {
  WorkerState w = MakeState();
  proto::StepDiff d;
  d.step = 1;
  EXPECT_THAT(w.ApplyDiff(d), StatusIs(absl::StatusCode::kOutOfRange,
                                       HasSubstr("expected step 0, got step 1 (gap)")));
  EXPECT_FALSE(w.poisoned());
  d.step = 0;
  ASSERT_OK(w.ApplyDiff(d));
  d.step = 1;
  EXPECT_THAT(w.ApplyDiff(d),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 0 is still open")));
  ASSERT_OK(w.ApplySampled({}));
  d.step = 0;
  EXPECT_THAT(w.ApplyDiff(d), StatusIs(absl::StatusCode::kOutOfRange,
                                       HasSubstr("expected step 1, got step 0 (repeat)")));
  EXPECT_THAT(w.BuildInput(nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no open step")));
}

TEST(WorkerState, UnknownIdsAndPoisoning) {
  WorkerState w = MakeState();
  proto::StepDiff d;
  d.AddContinuing(9, 1);
  EXPECT_THAT(w.ApplyDiff(d), StatusIs(absl::StatusCode::kNotFound,
                                       HasSubstr("continuing[0]: request 9 is not cached")));
  EXPECT_TRUE(w.poisoned());
  d.Clear();
  EXPECT_THAT(w.ApplyDiff(d), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr("unusable after an earlier error")));

  WorkerState w2 = MakeState();
  d.Clear();
  d.preempted = {5};
  EXPECT_THAT(w2.ApplyDiff(d), StatusIs(absl::StatusCode::kNotFound,
                                        HasSubstr("preempted request 5 is not cached")));
}

// Applies `d` as step 1 on a state that holds request 1 (prompt 16, 1 block,
// fully computed, one token sampled) and returns the status.
absl::Status ApplyAfterOneRequest(proto::StepDiff d, uint32_t max_new = 10) {
  WorkerState w = MakeState();
  proto::StepDiff d0;
  d0.new_requests.push_back(NewReq(1, 16, 0, 16, {0}, max_new));
  absl::Status s = w.ApplyDiff(d0);
  if (!s.ok()) return s;
  s = w.ApplySampled(std::vector<int32_t>{77});
  if (!s.ok()) return s;
  d.step = 1;
  return w.ApplyDiff(d);
}

TEST(WorkerState, InconsistentDiffsAreErrors) {
  proto::StepDiff d;
  d.new_requests.push_back(NewReq(1, 4, 0, 4, {1}));
  EXPECT_THAT(ApplyAfterOneRequest(d),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("request 1 is already cached")));
  d.Clear();
  d.new_requests.push_back(NewReq(2, 4, 0, 4, {0}));
  EXPECT_THAT(ApplyAfterOneRequest(d),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 0 is already owned by request 1")));
  d.Clear();
  d.new_requests.push_back(NewReq(2, 4, 0, 4, {16}));
  EXPECT_THAT(ApplyAfterOneRequest(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("block 16 out of range [0, 16)")));
  d.Clear();
  d.AddContinuing(1, 1);  // position 16 needs a 2nd block
  EXPECT_THAT(ApplyAfterOneRequest(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("1 blocks cannot hold 17 tokens")));
  d.Clear();
  d.AddContinuing(1, 2, std::vector<int32_t>{1});  // only 1 token is available
  EXPECT_THAT(ApplyAfterOneRequest(d),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 tokens scheduled after 16 computed, but it has 17 tokens")));
  d.Clear();
  d.AddContinuing(1, 1, std::vector<int32_t>{1});
  d.AddContinuing(1, 1);
  EXPECT_THAT(ApplyAfterOneRequest(d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scheduled twice")));
  d.Clear();
  d.AddContinuing(1, 1, std::vector<int32_t>{1});
  EXPECT_THAT(ApplyAfterOneRequest(d, /*max_new=*/1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beyond max_new_tokens 1")));
  d.Clear();
  d.AddContinuing(1, 1, std::vector<int32_t>{1, 2, 3, 4});  // 5 blocks > 64 / 16
  EXPECT_THAT(ApplyAfterOneRequest(d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_seq_len 64 allows 4")));
  d.Clear();
  d.new_requests.push_back(NewReq(2, 60, 0, 16, {1}, 5));
  EXPECT_THAT(ApplyAfterOneRequest(d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds max_seq_len")));
  d.Clear();
  d.AddContinuing(1, 1, std::vector<int32_t>{1});
  EXPECT_OK(ApplyAfterOneRequest(d));
}

TEST(WorkerState, ApplySampledChecksCount) {
  WorkerState w = MakeState();
  proto::StepDiff d;
  d.new_requests.push_back(NewReq(1, 3, 0, 3, {0}));
  ASSERT_OK(w.ApplyDiff(d));
  // Without BuildInput the sample order is derived on demand.
  EXPECT_THAT(w.ApplySampled(std::vector<int32_t>{1, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 sampled tokens given, 1 sequences sample")));
  EXPECT_THAT(w.ApplySampled(std::vector<int32_t>{-1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  ASSERT_OK(w.ApplySampled(std::vector<int32_t>{5}));
  EXPECT_EQ(w.next_step(), 1u);
}

TEST(WorkerState, DigestsAgreeForEqualHistoriesAndDifferOtherwise) {
  WorkerState a = MakeState(), b = MakeState(), c = MakeState();
  proto::StepDiff d;
  d.new_requests.push_back(NewReq(1, 10, 0, 10, {2}));
  d.new_requests.push_back(NewReq(2, 12, 0, 12, {5}));
  const uint64_t initial = a.Digest();
  for (WorkerState* w : {&a, &b, &c}) ASSERT_OK(w->ApplyDiff(d));
  ASSERT_OK(a.ApplySampled(std::vector<int32_t>{3, 4}));
  ASSERT_OK(b.ApplySampled(std::vector<int32_t>{3, 4}));
  ASSERT_OK(c.ApplySampled(std::vector<int32_t>{3, 9}));
  EXPECT_EQ(a.Digest(), b.Digest());
  EXPECT_NE(a.Digest(), c.Digest());
  EXPECT_NE(a.Digest(), initial);
  const uint64_t after0 = a.Digest();
  d.Clear();
  d.step = 1;
  d.finished = {1};
  d.AddContinuing(2, 1);
  for (WorkerState* w : {&a, &b}) {
    ASSERT_OK(w->ApplyDiff(d));
    ASSERT_OK(w->ApplySampled(std::vector<int32_t>{6}));
  }
  EXPECT_EQ(a.Digest(), b.Digest());
  EXPECT_NE(a.Digest(), after0);
  // An empty step still changes the digest (it covers the step number).
  d.Clear();
  d.step = 2;
  const uint64_t after1 = a.Digest();
  ASSERT_OK(a.ApplyDiff(d));
  ASSERT_OK(a.ApplySampled({}));
  EXPECT_NE(a.Digest(), after1);
}

TEST(WorkerState, EndOfJob) {
  WorkerState w = MakeState();
  proto::StepDiff d;
  d.flags = proto::kDiffFlagEndOfJob;
  ASSERT_OK(w.ApplyDiff(d));
  ASSERT_OK(w.ApplySampled({}));
  EXPECT_TRUE(w.ended());
  d.Clear();
  d.step = 1;
  EXPECT_THAT(w.ApplyDiff(d), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr("after the end-of-job step 0")));
}

}  // namespace
}  // namespace symtp::worker

namespace symtp::worker {
namespace {

// The pipelined worker: placeholders, input_pending, ConfirmSampled.
TEST(WorkerStatePipelined, PlaceholderFeedsNextStepAndIsConfirmedLater) {
  auto run = [](int32_t real_token, bool remove_second) {
    WorkerState w = MakeState();
    proto::StepDiff d0;
    d0.step = 0;
    d0.new_requests.push_back(NewReq(1, 5, 100, 5, {3}));
    d0.new_requests.push_back(NewReq(2, 3, 200, 3, {4}));
    EXPECT_OK(w.ApplyDiff(d0));
    model::BatchInput in;
    EXPECT_OK(w.BuildInput(&in));
    EXPECT_TRUE(w.input_pending().empty());
    const std::vector<uint64_t> ids(w.sample_request_ids().begin(), w.sample_request_ids().end());
    const std::vector<int32_t> pos(w.sample_positions().begin(), w.sample_positions().end());
    EXPECT_OK(w.ApplySampledPending());
    EXPECT_EQ(w.last_sampled()[0].token, -1);
    EXPECT_EQ(w.Find(1)->tokens.size(), 6u);
    EXPECT_EQ(w.Find(1)->confirmed, 5);
    // Step 1 decodes both (request 2 maybe finished instead) before step 0's tokens are known.
    proto::StepDiff d1;
    d1.step = 1;
    d1.continuing.push_back(proto::ContinuingRequest{1, 1, 0, 0});
    if (remove_second) {
      d1.finished = {2};
    } else {
      d1.continuing.push_back(proto::ContinuingRequest{2, 1, 0, 0});
    }
    EXPECT_OK(w.ApplyDiff(d1));
    EXPECT_OK(w.BuildInput(&in));
    EXPECT_EQ(w.input_pending().size(), remove_second ? 1u : 2u);
    EXPECT_EQ(w.input_pending()[0].token_index, 0);
    EXPECT_EQ(w.input_pending()[0].request_id, 1u);
    EXPECT_EQ(w.input_pending()[0].position, 5);
    // A real sample while a placeholder is pending is refused.
    EXPECT_THAT(w.ApplySampled(std::vector<int32_t>(remove_second ? 1 : 2, 7)),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("pending")));
    EXPECT_OK(w.ApplySampledPending());
    EXPECT_THAT(w.ConfirmSampled(ids, pos, std::vector<int32_t>{real_token, real_token + 1}),
                ::symtp::testing::IsOk());
    EXPECT_EQ(w.Find(1)->tokens[5], real_token);
    EXPECT_EQ(w.Find(1)->confirmed, 6);
    EXPECT_EQ(w.Find(1)->tokens.size(), 7u);
    return w.Digest();
  };
  EXPECT_EQ(run(11, false), run(11, false));
  EXPECT_NE(run(11, false), run(12, false));  // the confirmed values are in the digest
  EXPECT_NE(run(11, true), run(11, false));
}

TEST(WorkerStatePipelined, ConfirmValidates) {
  WorkerState w = MakeState();
  proto::StepDiff d0;
  d0.step = 0;
  d0.new_requests.push_back(NewReq(1, 5, 100, 5, {3}));
  ASSERT_OK(w.ApplyDiff(d0));
  model::BatchInput in;
  ASSERT_OK(w.BuildInput(&in));
  EXPECT_THAT(w.ConfirmSampled(std::vector<uint64_t>{1}, std::vector<int32_t>{5},
                               std::vector<int32_t>{1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("open")));
  ASSERT_OK(w.ApplySampledPending());
  EXPECT_THAT(w.ConfirmSampled(std::vector<uint64_t>{1}, std::vector<int32_t>{5},
                               std::vector<int32_t>{-3}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(w.ConfirmSampled(std::vector<uint64_t>{1, 2}, std::vector<int32_t>{5},
                               std::vector<int32_t>{1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 ids, 1 positions")));
  // Unknown requests and stale positions are ignored.
  ASSERT_OK(w.ConfirmSampled(std::vector<uint64_t>{99, 1}, std::vector<int32_t>{5, 2},
                             std::vector<int32_t>{1, 2}));
  EXPECT_EQ(w.Find(1)->confirmed, 5);
  ASSERT_OK(w.ConfirmSampled(std::vector<uint64_t>{1}, std::vector<int32_t>{5},
                             std::vector<int32_t>{9}));
  EXPECT_EQ(w.Find(1)->tokens[5], 9);
  EXPECT_EQ(w.Find(1)->confirmed, 6);
}

}  // namespace
}  // namespace symtp::worker

// The pacer of v1's late publishing: when it holds the next step back, and
// for how long.
#include "runtime/publish_pacer.h"

#include <gtest/gtest.h>

namespace symtp::runtime {
namespace {

constexpr int64_t kMs = 1'000'000;

PublishPacer::Ahead DecodeAhead(int32_t seqs) {
  PublishPacer::Ahead a;
  a.steps = 1;
  a.decode_only = true;
  a.num_seqs = seqs;
  return a;
}

TEST(PublishPacerTest, PlansTheLeadBeforeTheDecodeStepAheadShouldEnd) {
  PublishPacer p(true, kMs / 2);
  p.OnCollected(100 * kMs, 5 * kMs, /*decode_only=*/true, 16);
  // The step ahead started when the last results came in (100 ms) and should
  // take the last decode step's 5 ms: plan 0.5 ms before 105 ms.
  EXPECT_EQ(p.PlanAt(DecodeAhead(16), /*may_admit=*/true), 104 * kMs + kMs / 2);
  // A larger batch ahead takes longer: planning by the estimate stays early.
  EXPECT_EQ(p.PlanAt(DecodeAhead(20), true), 104 * kMs + kMs / 2);
  // A prefill step collected later moves the start, not the estimate.
  p.OnCollected(110 * kMs, 20 * kMs, /*decode_only=*/false, 17);
  EXPECT_EQ(p.PlanAt(DecodeAhead(17), true), 114 * kMs + kMs / 2);
}

TEST(PublishPacerTest, PlansAtOnceWhereWaitingCannotHelpOrTheEstimateMayBeLate) {
  PublishPacer p(true, kMs / 2);
  // No decode step timed yet.
  EXPECT_EQ(p.PlanAt(DecodeAhead(8), true), 0);
  p.OnCollected(100 * kMs, 5 * kMs, true, 16);
  EXPECT_GT(p.PlanAt(DecodeAhead(16), true), 0);
  // Nothing can be admitted (requests waiting, or none due).
  EXPECT_EQ(p.PlanAt(DecodeAhead(16), false), 0);
  // The GPU has nothing ahead, or two steps queued.
  PublishPacer::Ahead a = DecodeAhead(16);
  a.steps = 0;
  EXPECT_EQ(p.PlanAt(a, true), 0);
  a.steps = 2;
  EXPECT_EQ(p.PlanAt(a, true), 0);
  // A prefill ahead: its time is unknown.
  a = DecodeAhead(16);
  a.decode_only = false;
  EXPECT_EQ(p.PlanAt(a, true), 0);
  // Fewer sequences than the timed step: it may end sooner.
  EXPECT_EQ(p.PlanAt(DecodeAhead(15), true), 0);
  // A lead as long as the step: no time to wait.
  PublishPacer q(true, 5 * kMs);
  q.OnCollected(100 * kMs, 5 * kMs, true, 16);
  EXPECT_EQ(q.PlanAt(DecodeAhead(16), true), 0);
  // Off.
  PublishPacer off(false, kMs / 2);
  off.OnCollected(100 * kMs, 5 * kMs, true, 16);
  EXPECT_EQ(off.PlanAt(DecodeAhead(16), true), 0);
}

}  // namespace
}  // namespace symtp::runtime

// A deterministic fake "model" for the scheduler tests: the token sampled at
// position p of request id depends only on (seed, id, p), so every schedule
// (chunking, batching, preemption, async depth) must produce the same outputs.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "scheduler/scheduler.h"
#include "tests/testing/status_matchers.h"

namespace symtp::sched::testing {

inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct FakeModel {
  uint64_t seed = 1;
  int32_t vocab = 512;
  int32_t eos = 7;
  int32_t eos_one_in = 40;  // roughly one token in eos_one_in is EOS

  int32_t Token(uint64_t id, int64_t position) const {
    const uint64_t h = Mix64(seed ^ Mix64(id * 0x100000001b3ull + static_cast<uint64_t>(position)));
    if (eos_one_in > 0 && h % static_cast<uint64_t>(eos_one_in) == 0) return eos;
    return static_cast<int32_t>((h >> 16) % static_cast<uint64_t>(vocab));
  }

  // The expected output of a request: tokens at positions prompt_len, ...,
  // stopping after EOS (if it has an eos id) or max_new tokens.
  std::vector<int32_t> Expected(uint64_t id, int32_t prompt_len, int32_t max_new,
                                std::optional<int32_t> eos_id) const {
    std::vector<int32_t> out;
    for (int32_t k = 0; k < max_new; ++k) {
      const int32_t t = Token(id, prompt_len + k);
      out.push_back(t);
      if (eos_id.has_value() && t == *eos_id) break;
    }
    return out;
  }
};

// Plans steps and feeds results computed by a FakeModel straight from the
// plans (no workers): for the scheduler policy tests.
class Driver {
 public:
  Driver(Scheduler s, FakeModel m) : sched(std::move(s)), model(m) {}

  // Plans one step; returns the plan (idle plans are not recorded).
  StepPlan Plan() {
    absl::StatusOr<StepPlan> p = sched.PlanNextStep();
    EXPECT_OK(p);
    if (!p.ok()) return StepPlan{};
    if (!p->idle) inflight.push_back(*p);
    return *std::move(p);
  }

  proto::StepResult ResultFor(const StepPlan& plan) const {
    proto::StepResult r;
    r.step = plan.diff.step;
    for (const ScheduledRequest& s : plan.scheduled) {
      if (s.samples) r.sampled.push_back({s.id, model.Token(s.id, s.start + s.num_tokens)});
    }
    return r;
  }

  // Feeds the result of the oldest in-flight step.
  absl::Status Complete() {
    if (inflight.empty()) return absl::FailedPreconditionError("test: nothing in flight");
    StepPlan plan = std::move(inflight.front());
    inflight.pop_front();
    return sched.OnStepResult(ResultFor(plan), ++now);
  }

  Scheduler sched;
  FakeModel model;
  std::deque<StepPlan> inflight;
  int64_t now = 1000;
};

}  // namespace symtp::sched::testing

// Randomized in-process simulation of the whole control plane: the scheduler
// plans steps (asynchronously, up to D in flight), every diff goes through the
// wire encoder/decoder to two WorkerState replicas, each replica builds the
// model input and "samples" with a deterministic fake model (token = hash of
// seed, request id and position, with an EOS that sometimes appears), and the
// results go back through the wire to the scheduler, which checks the digests.
// Arrivals, EOS, max-token stops, aborts and preemptions (a small KV cache)
// all happen. Checked: replicas' inputs and digests always agree, every model
// input validates, each request's output is exactly the fake model's sequence
// truncated at EOS / max tokens / the abort point, and the outputs do not
// depend on the async depth.
#include <map>
#include <random>

#include "models/config.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "scheduler/scheduler.h"
#include "tests/scheduler/fake_model.h"
#include "tests/testing/status_matchers.h"
#include "worker/state/worker_state.h"

namespace symtp::sched {
namespace {

using ::symtp::sched::testing::FakeModel;

struct SimConfig {
  SchedulerConfig sched;
  uint64_t seed = 1;
  int num_requests = 150;
  int max_prompt = 90;
  int max_new = 60;
};

struct RequestSpec {
  int32_t prompt_len = 0;
  int32_t max_new = 0;
  std::optional<int32_t> eos;
  // Abort when the output reaches this many tokens (-1: never; 0: right after
  // arrival, while waiting; -2: right after the plan that first admits it).
  int32_t abort_at = -1;
};

struct SimOutcome {
  std::map<uint64_t, std::vector<int32_t>> outputs;
  std::map<uint64_t, FinishReason> reasons;
  SchedulerStats stats;
  uint64_t steps = 0;
  size_t max_diff_bytes = 0;
};

class Simulation {
 public:
  explicit Simulation(const SimConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {
    model_.seed = cfg.seed * 7 + 1;
    model_.vocab = 512;
    model_.eos = 7;
    model_.eos_one_in = 30;
    std::mt19937_64 spec_rng(cfg.seed + 100);
    auto U = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(spec_rng); };
    for (int i = 0; i < cfg.num_requests; ++i) {
      RequestSpec s;
      s.prompt_len = U(1, cfg.max_prompt);
      s.max_new = U(1, cfg.max_new);
      if (U(0, 4) != 0) s.eos = model_.eos;
      const int a = U(0, 19);
      if (a == 0)
        s.abort_at = 0;
      else if (a == 1)
        s.abort_at = -2;
      else if (a <= 3 && s.max_new > 1)
        s.abort_at = U(1, s.max_new - 1);
      specs_.push_back(s);
    }
  }

  void Run(SimOutcome* out) {
    ASSERT_OK_AND_ASSIGN(Scheduler sched, Scheduler::Create(cfg_.sched));
    worker::WorkerStateConfig wc;
    wc.num_kv_blocks = cfg_.sched.num_kv_blocks;
    wc.max_seq_len = cfg_.sched.max_seq_len;
    ASSERT_OK_AND_ASSIGN(worker::WorkerState w0, worker::WorkerState::Create(wc));
    ASSERT_OK_AND_ASSIGN(worker::WorkerState w1, worker::WorkerState::Create(wc));
    worker::WorkerState* workers[2] = {&w0, &w1};
    ASSERT_OK_AND_ASSIGN(model::ModelConfig mcfg, model::PresetConfig("tiny"));
    mcfg.max_seq_len = cfg_.sched.max_seq_len;

    std::deque<std::array<std::vector<uint8_t>, 2>> results;  // encoded, per rank
    std::vector<uint8_t> wire;
    proto::StepDiff decoded;
    model::BatchInput inputs[2];
    std::vector<int32_t> sampled;
    StepPlan plan;
    int next_request = 0;
    bool ended = false;
    uint64_t iterations = 0;
    std::uniform_int_distribution<int> coin(0, 99);

    while (!ended) {
      ASSERT_LT(++iterations, 200000u) << "simulation does not terminate";
      // Arrivals: a few per iteration while requests remain.
      if (next_request < cfg_.num_requests && coin(rng_) < 35) {
        const int n = 1 + coin(rng_) % 4;
        for (int k = 0; k < n && next_request < cfg_.num_requests; ++k, ++next_request) {
          const RequestSpec& s = specs_[next_request];
          const uint64_t id = 1000 + static_cast<uint64_t>(next_request);
          std::vector<int32_t> prompt(s.prompt_len);
          for (int32_t& t : prompt) t = coin(rng_) * 5;
          model::SamplingParams sp;
          sp.seed = id;
          ASSERT_OK(sched.AddRequest(id, prompt, s.max_new, sp, s.eos));
          if (s.abort_at == 0) {
            ASSERT_OK(sched.Abort(id));
          }
        }
      }
      const bool all_added = next_request == cfg_.num_requests;
      // Either plan a step or deliver the oldest result. Delivering early at
      // random exercises every depth of the pipeline.
      const bool want_result = !results.empty() && (!sched.CanPlan() || coin(rng_) < 30);
      if (!want_result && sched.CanPlan()) {
        if (all_added && sched.num_unfinished() == 0) {
          ASSERT_OK_AND_ASSIGN(plan, sched.PlanEndOfJob());
          ended = true;
        } else {
          ASSERT_OK(sched.PlanNextStep(&plan));
          if (plan.idle) {
            if (results.empty() && all_added) {
              ASSERT_GT(sched.num_unfinished(), 0);
              FAIL() << "scheduler idle with nothing in flight but " << sched.num_unfinished()
                     << " unfinished requests";
            }
            continue;
          }
        }
        CheckPlan(sched, plan);
        // Aborts triggered by admission.
        for (const auto& n : plan.diff.new_requests) {
          const RequestSpec& s = specs_[n.id - 1000];
          if (s.abort_at == -2) {
            ASSERT_OK(sched.Abort(n.id));
          }
        }
        ASSERT_OK(proto::ValidateDiff(plan.diff));
        ASSERT_OK(proto::EncodeDiff(plan.diff, &wire));
        out->max_diff_bytes = std::max(out->max_diff_bytes, wire.size());
        std::array<std::vector<uint8_t>, 2> step_results;
        for (int rank = 0; rank < 2; ++rank) {
          worker::WorkerState& w = *workers[rank];
          ASSERT_OK(proto::DecodeDiffInto(wire, &decoded));
          ASSERT_EQ(decoded, plan.diff);
          ASSERT_OK(w.ApplyDiff(decoded)) << "rank " << rank;
          ASSERT_OK(w.BuildInput(&inputs[rank]));
          ASSERT_OK(inputs[rank].Validate(mcfg, cfg_.sched.num_kv_blocks))
              << "step " << plan.diff.step;
          ASSERT_EQ(static_cast<int32_t>(inputs[rank].tokens.size()), plan.num_tokens);
          ASSERT_EQ(static_cast<int32_t>(inputs[rank].sample_index.size()), plan.num_samples);
          sampled.clear();
          for (size_t i = 0; i < w.sample_request_ids().size(); ++i) {
            const uint64_t id = w.sample_request_ids()[i];
            const int32_t pos = w.sample_positions()[i];
            ASSERT_EQ(inputs[rank].positions[inputs[rank].sample_index[i]] + 1, pos);
            sampled.push_back(model_.Token(id, pos));
          }
          ASSERT_OK(w.ApplySampled(sampled));
          proto::StepResult r;
          r.step = plan.diff.step;
          r.rank = static_cast<uint32_t>(rank);
          r.digest = w.Digest();
          r.sampled.assign(w.last_sampled().begin(), w.last_sampled().end());
          ASSERT_OK(proto::EncodeResult(r, &step_results[rank]));
        }
        EXPECT_EQ(inputs[0].tokens, inputs[1].tokens);
        EXPECT_EQ(inputs[0].slot_mapping, inputs[1].slot_mapping);
        EXPECT_EQ(inputs[0].block_tables, inputs[1].block_tables);
        results.push_back(std::move(step_results));
        ++out->steps;
      } else if (!results.empty()) {
        std::vector<proto::StepResult> rs;
        for (int rank = 0; rank < 2; ++rank) {
          ASSERT_OK_AND_ASSIGN(proto::StepResult r, proto::DecodeResult(results.front()[rank]));
          rs.push_back(std::move(r));
        }
        results.pop_front();
        ASSERT_EQ(rs[0].digest, rs[1].digest) << "step " << rs[0].step;
        ASSERT_OK(sched.OnStepResults(rs));
        // Aborts triggered by output length (deterministic whatever the depth).
        for (const auto& t : rs[0].sampled) {
          const RequestSpec& s = specs_[t.request_id - 1000];
          const RequestOutput* o = sched.GetOutput(t.request_id);
          if (s.abort_at > 0 && !o->finished &&
              static_cast<int32_t>(o->tokens.size()) == s.abort_at) {
            ASSERT_OK(sched.Abort(t.request_id));
          }
        }
      }
    }
    // Drain the results of the last steps.
    while (!results.empty()) {
      std::vector<proto::StepResult> rs;
      for (int rank = 0; rank < 2; ++rank) {
        ASSERT_OK_AND_ASSIGN(proto::StepResult r, proto::DecodeResult(results.front()[rank]));
        rs.push_back(std::move(r));
      }
      results.pop_front();
      ASSERT_OK(sched.OnStepResults(rs));
    }
    EXPECT_TRUE(sched.Done());
    EXPECT_TRUE(w0.ended());
    EXPECT_EQ(w0.num_requests(), 0u);
    EXPECT_EQ(w1.num_requests(), 0u);
    EXPECT_EQ(sched.num_free_blocks(), cfg_.sched.num_kv_blocks);

    for (int i = 0; i < cfg_.num_requests; ++i) {
      const uint64_t id = 1000 + static_cast<uint64_t>(i);
      const RequestSpec& s = specs_[i];
      const RequestOutput* o = sched.GetOutput(id);
      ASSERT_NE(o, nullptr);
      EXPECT_TRUE(o->finished);
      std::vector<int32_t> want = model_.Expected(id, s.prompt_len, s.max_new, s.eos);
      if (o->finish_reason == FinishReason::kAborted) {
        ASSERT_NE(s.abort_at, -1) << id;
        if (s.abort_at > 0) {
          want.resize(std::min<size_t>(want.size(), static_cast<size_t>(s.abort_at)));
        } else {
          want.clear();
        }
      } else if (s.eos.has_value() && !want.empty() && want.back() == *s.eos) {
        EXPECT_EQ(o->finish_reason, FinishReason::kEos) << id;
      } else {
        EXPECT_EQ(o->finish_reason, FinishReason::kMaxTokens) << id;
      }
      EXPECT_EQ(o->tokens, want) << "request " << id;
      EXPECT_EQ(o->token_times_ns.size(), o->tokens.size());
      out->outputs[id] = o->tokens;
      out->reasons[id] = o->finish_reason;
    }
    out->stats = sched.stats();
  }

 private:
  void CheckPlan(const Scheduler& sched, const StepPlan& plan) {
    EXPECT_LE(plan.num_tokens, cfg_.sched.max_batched_tokens);
    EXPECT_LE(static_cast<int32_t>(plan.scheduled.size()), cfg_.sched.max_running_seqs);
    EXPECT_LE(sched.num_running(), cfg_.sched.max_running_seqs);
    int32_t tokens = 0;
    for (const auto& s : plan.scheduled) {
      tokens += s.num_tokens;
      if (cfg_.sched.prefill_chunk > 0) {
        EXPECT_LE(s.num_tokens, cfg_.sched.prefill_chunk);
      }
    }
    EXPECT_EQ(tokens, plan.num_tokens);
  }

  SimConfig cfg_;
  std::mt19937_64 rng_;
  FakeModel model_;
  std::vector<RequestSpec> specs_;
};

SimConfig BaseConfig(int depth, uint64_t seed) {
  SimConfig c;
  c.seed = seed;
  c.num_requests = 250;
  c.sched.max_running_seqs = 24;
  c.sched.max_batched_tokens = 160;
  c.sched.prefill_chunk = 48;
  c.sched.max_seq_len = 160;
  c.sched.num_kv_blocks = 60;  // small: preemptions happen
  c.sched.max_inflight_steps = depth;
  return c;
}

TEST(Simulation, DepthsOneTwoThreeGiveIdenticalOutputs) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SimOutcome o1, o2, o3;
    {
      Simulation sim(BaseConfig(1, seed));
      sim.Run(&o1);
    }
    {
      Simulation sim(BaseConfig(2, seed));
      sim.Run(&o2);
    }
    {
      Simulation sim(BaseConfig(3, seed));
      sim.Run(&o3);
    }
    if (HasFatalFailure()) return;
    EXPECT_EQ(o1.outputs, o2.outputs) << "seed " << seed;
    EXPECT_EQ(o1.outputs, o3.outputs) << "seed " << seed;
    EXPECT_EQ(o1.reasons, o2.reasons) << "seed " << seed;
    EXPECT_GT(o1.steps, 100u);
    // The policy exercised what it should.
    EXPECT_GT(o1.stats.preemptions + o2.stats.preemptions, 0u) << "seed " << seed;
    EXPECT_EQ(o1.stats.discarded_after_eos, 0u);  // synchronous: no catch-up waste
    int eos = 0, max_tokens = 0, aborted = 0;
    for (const auto& [id, r] : o1.reasons) {
      eos += r == FinishReason::kEos;
      max_tokens += r == FinishReason::kMaxTokens;
      aborted += r == FinishReason::kAborted;
    }
    EXPECT_GT(eos, 10);
    EXPECT_GT(max_tokens, 10);
    EXPECT_GT(aborted, 3);
    RecordProperty("steps_d1_seed" + std::to_string(seed), static_cast<int>(o1.steps));
    RecordProperty("preemptions_d2_seed" + std::to_string(seed),
                   static_cast<int>(o2.stats.preemptions));
    RecordProperty("discarded_after_eos_d2_seed" + std::to_string(seed),
                   static_cast<int>(o2.stats.discarded_after_eos));
  }
}

// One replica samples a different token at one step: the digest check at the
// scheduler must name the step, the rank and the request.
TEST(Simulation, DivergentReplicaIsCaught) {
  SchedulerConfig sc;
  sc.num_kv_blocks = 64;
  sc.max_seq_len = 256;
  sc.max_inflight_steps = 1;
  ASSERT_OK_AND_ASSIGN(Scheduler sched, Scheduler::Create(sc));
  worker::WorkerStateConfig wc;
  wc.num_kv_blocks = 64;
  wc.max_seq_len = 256;
  ASSERT_OK_AND_ASSIGN(worker::WorkerState w0, worker::WorkerState::Create(wc));
  ASSERT_OK_AND_ASSIGN(worker::WorkerState w1, worker::WorkerState::Create(wc));
  FakeModel m;
  m.eos_one_in = 0;
  ASSERT_OK(sched.AddRequest(11, {1, 2, 3}, 20, {}));
  ASSERT_OK(sched.AddRequest(12, {4, 5}, 20, {}));
  model::BatchInput in;
  for (uint64_t step = 0; step < 6; ++step) {
    ASSERT_OK_AND_ASSIGN(StepPlan plan, sched.PlanNextStep());
    std::vector<proto::StepResult> rs(2);
    int rank = 0;
    for (worker::WorkerState* w : {&w0, &w1}) {
      ASSERT_OK(w->ApplyDiff(plan.diff));
      ASSERT_OK(w->BuildInput(&in));
      std::vector<int32_t> toks;
      for (size_t i = 0; i < w->sample_request_ids().size(); ++i) {
        int32_t t = m.Token(w->sample_request_ids()[i], w->sample_positions()[i]);
        if (rank == 1 && step == 4 && w->sample_request_ids()[i] == 12) t += 1;
        toks.push_back(t);
      }
      ASSERT_OK(w->ApplySampled(toks));
      rs[rank].step = step;
      rs[rank].rank = static_cast<uint32_t>(rank);
      rs[rank].digest = w->Digest();
      rs[rank].sampled.assign(w->last_sampled().begin(), w->last_sampled().end());
      ++rank;
    }
    absl::Status s = sched.OnStepResults(rs);
    if (step < 4) {
      ASSERT_OK(s);
    } else {
      EXPECT_THAT(
          s, ::symtp::testing::StatusIs(absl::StatusCode::kInternal,
                                        ::testing::AllOf(::testing::HasSubstr("step 4"),
                                                         ::testing::HasSubstr("ranks [1] disagree"),
                                                         ::testing::HasSubstr("request 12"))));
      return;
    }
  }
}

TEST(Simulation, GenerousCacheNoChunkLimit) {
  SimConfig c = BaseConfig(2, 9);
  c.sched.prefill_chunk = 0;
  c.sched.num_kv_blocks = 2000;
  c.sched.max_running_seqs = 64;
  c.num_requests = 200;
  SimOutcome o;
  Simulation sim(c);
  sim.Run(&o);
  EXPECT_EQ(o.stats.preemptions, 0u);
  EXPECT_EQ(o.outputs.size(), 200u);
  EXPECT_GT(o.steps, 50u);
  RecordProperty("steps", static_cast<int>(o.steps));
  RecordProperty("max_diff_bytes", static_cast<int>(o.max_diff_bytes));
}

TEST(Simulation, TinyBudgetAndOneRunningSlot) {
  SimConfig c = BaseConfig(2, 5);
  c.sched.max_running_seqs = 1;
  c.sched.max_batched_tokens = 7;
  c.sched.prefill_chunk = 5;
  c.num_requests = 30;
  SimOutcome o;
  Simulation sim(c);
  sim.Run(&o);
  EXPECT_EQ(o.outputs.size(), 30u);
  RecordProperty("steps", static_cast<int>(o.steps));
}

}  // namespace
}  // namespace symtp::sched

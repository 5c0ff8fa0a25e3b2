// Scheduler benchmarks.
//
//  BM_PlanNextStep/R    PlanNextStep with R running requests in steady decode
//                       (async depth 2: step t+1 is planned before step t's
//                       result; 1 in 16 requests needs a new block per step).
//                       Manual time = PlanNextStep only; OnStepResult's mean is
//                       a counter.
//  BM_ControlPlaneStep/R  one whole in-process v1 control-plane step at R
//                       running requests: plan, encode the diff, decode it,
//                       apply it to a WorkerState, build the model input,
//                       apply fake sampled tokens, encode/decode the result,
//                       OnStepResult. Per-phase means as counters.
//
// Each cycle of 512 decode steps starts from a fresh scheduler whose prefill
// steps run untimed.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "scheduler/scheduler.h"
#include "worker/state/worker_state.h"

namespace symtp {
namespace {

constexpr int kDecodeStepsPerCycle = 512;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "benchmark failed: %s\n", std::string(s.message()).c_str());
    std::abort();
  }
}

int32_t FakeToken(uint64_t id, int32_t pos) {
  return static_cast<int32_t>((id * 2654435761u + static_cast<uint64_t>(pos) * 40503u) % 32000) +
         10;  // never the eos id (2)
}

sched::SchedulerConfig BenchConfig(int running) {
  sched::SchedulerConfig c;
  c.max_running_seqs = running;
  c.max_batched_tokens = 8192;
  c.prefill_chunk = 2048;
  c.max_seq_len = 4096;
  c.num_kv_blocks = running * 64 + 256;  // enough for prompt + 512 decode steps
  c.max_inflight_steps = 2;
  return c;
}

proto::StepResult ResultOf(const sched::StepPlan& plan) {
  proto::StepResult r;
  r.step = plan.diff.step;
  for (const auto& s : plan.scheduled) {
    if (s.samples) r.sampled.push_back({s.id, FakeToken(s.id, s.start + s.num_tokens)});
  }
  return r;
}

// A scheduler with `running` requests, advanced until all of them decode.
struct SchedFixture {
  explicit SchedFixture(int running) : n(running) { Reset(); }

  void Reset() {
    sched = std::make_unique<sched::Scheduler>(*sched::Scheduler::Create(BenchConfig(n)));
    inflight.clear();
    for (int i = 0; i < n; ++i) {
      const int len = 64 + i % 16;
      std::vector<int32_t> prompt(len);
      for (int k = 0; k < len; ++k) prompt[k] = (i * 31 + k) % 32000;
      model::SamplingParams sp;
      sp.seed = static_cast<uint64_t>(i);
      Check(sched->AddRequest(static_cast<uint64_t>(i), std::move(prompt), 2000, sp, 2));
    }
    // Prefill (untimed) until every request has sampled its first token.
    while (true) {
      sched::StepPlan p;
      Check(sched->PlanNextStep(&p));
      bool all_decode =
          !p.scheduled.empty() && static_cast<int>(p.scheduled.size()) == n && p.num_tokens == n;
      inflight.push_back(std::move(p));
      while (static_cast<int>(inflight.size()) >= 1) Pop();
      if (all_decode) break;
    }
    decode_steps = 0;
  }

  void Pop() {
    Check(sched->OnStepResult(ResultOf(inflight.front())));
    spare.push_back(std::move(inflight.front()));  // reuse its vectors' capacity
    inflight.pop_front();
  }

  int n;
  std::unique_ptr<sched::Scheduler> sched;
  std::deque<sched::StepPlan> inflight;
  std::deque<sched::StepPlan> spare;
  int decode_steps = 0;
};

void BM_PlanNextStep(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  SchedFixture fx(n);
  double plan_ns = 0, result_ns = 0;
  int64_t steps = 0, results = 0;
  for (auto _ : st) {
    if (fx.decode_steps >= kDecodeStepsPerCycle) fx.Reset();
    // Keep depth 2: the oldest result comes back after the next plan.
    while (!fx.sched->CanPlan()) {
      const int64_t r0 = MonotonicNs();
      fx.Pop();
      result_ns += static_cast<double>(MonotonicNs() - r0);
      ++results;
    }
    sched::StepPlan plan;
    if (!fx.spare.empty()) {
      plan = std::move(fx.spare.front());
      fx.spare.pop_front();
    }
    const int64_t t0 = MonotonicNs();
    Check(fx.sched->PlanNextStep(&plan));
    const int64_t t1 = MonotonicNs();
    st.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
    plan_ns += static_cast<double>(t1 - t0);
    if (plan.num_tokens != n) {
      std::fprintf(stderr, "expected a pure decode step of %d tokens, got %d\n", n,
                   plan.num_tokens);
      std::abort();
    }
    fx.inflight.push_back(std::move(plan));
    ++fx.decode_steps;
    ++steps;
  }
  st.counters["running"] = n;
  st.counters["plan_ns"] = steps ? plan_ns / static_cast<double>(steps) : 0;
  st.counters["on_result_ns"] = results ? result_ns / static_cast<double>(results) : 0;
}
BENCHMARK(BM_PlanNextStep)->Arg(32)->Arg(128)->Arg(256)->Arg(512)->UseManualTime();

void BM_ControlPlaneStep(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  auto cfg = BenchConfig(n);
  cfg.max_inflight_steps = 1;  // one worker replica, results applied in step order
  double t_plan = 0, t_enc = 0, t_dec = 0, t_apply = 0, t_build = 0, t_sample = 0, t_res = 0;
  int64_t steps = 0;
  std::unique_ptr<sched::Scheduler> s;
  std::unique_ptr<worker::WorkerState> w;
  sched::StepPlan plan;
  proto::StepDiff decoded;
  proto::StepResult result, result_back;
  std::vector<uint8_t> wire, rwire;
  model::BatchInput batch;
  std::vector<int32_t> sampled;
  int cycle_steps = kDecodeStepsPerCycle;
  for (auto _ : st) {
    if (cycle_steps >= kDecodeStepsPerCycle) {
      st.PauseTiming();
      s = std::make_unique<sched::Scheduler>(*sched::Scheduler::Create(cfg));
      worker::WorkerStateConfig wc;
      wc.num_kv_blocks = cfg.num_kv_blocks;
      wc.max_seq_len = cfg.max_seq_len;
      w = std::make_unique<worker::WorkerState>(*worker::WorkerState::Create(wc));
      for (int i = 0; i < n; ++i) {
        const int len = 64 + i % 16;
        std::vector<int32_t> prompt(len, 5);
        Check(s->AddRequest(static_cast<uint64_t>(i), std::move(prompt), 2000, {}, 2));
      }
      cycle_steps = -8;  // the first steps are prefill; they are timed too but few
      st.ResumeTiming();
    }
    const int64_t t0 = MonotonicNs();
    Check(s->PlanNextStep(&plan));
    const int64_t t1 = MonotonicNs();
    Check(proto::EncodeDiff(plan.diff, &wire));
    const int64_t t2 = MonotonicNs();
    Check(proto::DecodeDiffInto(wire, &decoded));
    const int64_t t3 = MonotonicNs();
    Check(w->ApplyDiff(decoded));
    const int64_t t4 = MonotonicNs();
    Check(w->BuildInput(&batch));
    const int64_t t5 = MonotonicNs();
    sampled.resize(w->sample_request_ids().size());
    for (size_t i = 0; i < sampled.size(); ++i) {
      sampled[i] = FakeToken(w->sample_request_ids()[i], w->sample_positions()[i]);
    }
    Check(w->ApplySampled(sampled));
    const int64_t t6 = MonotonicNs();
    result.step = plan.diff.step;
    result.digest = w->Digest();
    result.sampled.assign(w->last_sampled().begin(), w->last_sampled().end());
    Check(proto::EncodeResult(result, &rwire));
    Check(proto::DecodeResultInto(rwire, &result_back));
    Check(s->OnStepResult(result_back));
    const int64_t t7 = MonotonicNs();
    t_plan += static_cast<double>(t1 - t0);
    t_enc += static_cast<double>(t2 - t1);
    t_dec += static_cast<double>(t3 - t2);
    t_apply += static_cast<double>(t4 - t3);
    t_build += static_cast<double>(t5 - t4);
    t_sample += static_cast<double>(t6 - t5);
    t_res += static_cast<double>(t7 - t6);
    ++steps;
    ++cycle_steps;
  }
  const double k = steps ? 1.0 / static_cast<double>(steps) : 0;
  st.counters["running"] = n;
  st.counters["plan_ns"] = t_plan * k;
  st.counters["encode_ns"] = t_enc * k;
  st.counters["decode_ns"] = t_dec * k;
  st.counters["apply_ns"] = t_apply * k;
  st.counters["build_input_ns"] = t_build * k;
  st.counters["apply_sampled_ns"] = t_sample * k;
  st.counters["result_roundtrip_ns"] = t_res * k;
}
BENCHMARK(BM_ControlPlaneStep)->Arg(32)->Arg(128)->Arg(256)->Arg(512);

}  // namespace
}  // namespace symtp

BENCHMARK_MAIN();

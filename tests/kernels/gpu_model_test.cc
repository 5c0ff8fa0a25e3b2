// GpuModel (TP = 1) against the CPU reference: logits of prefill, chunked
// prefill and decode steps (fp32 tight, bf16 loose), greedy decode with
// device-resident sampled tokens, device sampling, CUDA-graph decode vs eager
// decode bitwise, and the row-parallel path through a 1-rank comm.
#include "models/cuda/gpu_model.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "models/cpu_model.h"
#include "models/sampling.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/model_harness.h"
#ifdef SYMTP_TEST_HAVE_NCCL
#include "kernels/nccl/nccl_comm.h"
#endif

namespace symtp::kernels {
namespace {

using model::BatchInput;
using model::CpuModel;
using model::GpuModel;
using model::GpuModelOptions;
using model::StepOptions;
using testing::SimBatch;

constexpr int kBlocks = 160;

model::ModelConfig Cfg(const char* preset, const char* overrides = "") {
  auto c = model::MakeConfig(preset, overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

GpuModelOptions Opts(DType dt, bool graphs, DecodeKernel dk = DecodeKernel::kTiled) {
  GpuModelOptions o;
  o.attention_decode_kernel = dk;
  // The tensor-core decode kernel is tested with the tensor-core prefill.
  o.attention_prefill_kernel = dk == DecodeKernel::kTensorCore ? kernels::PrefillKernel::kTensorCore
                                                               : kernels::PrefillKernel::kTiled;
  o.dtype = dt;
  o.num_kv_blocks = kBlocks;
  o.max_batch_tokens = 256;
  o.max_seqs = 16;
  o.cuda_graphs = graphs;
  o.attention_split_chunk = 64;
  return o;
}

std::vector<float> HostLogits(const GpuModel& m) {
  auto s = m.host_logits();
  return std::vector<float>(s.begin(), s.end());
}

class GpuModelTest : public testing::GpuTest {
 protected:
  // Runs prompts (chunked prefill, then greedy decode on the CPU's tokens)
  // through both models; per step, the GPU logits must be within `rtol` of
  // the CPU's (CheckClose), or within `norm_tol` in norm when rtol == 0.
  void CompareWithCpu(const model::ModelConfig& cfg, DType dt, std::vector<int> prompts, int chunk,
                      int decode_steps, double rtol, double norm_tol,
                      DecodeKernel dk = DecodeKernel::kTiled, bool defer_norm = true) {
    auto cpu = CpuModel::Create(cfg, 0, 1, kBlocks, nullptr);
    ASSERT_OK(cpu);
    GpuModelOptions o = Opts(dt, false, dk);
    o.defer_norm = defer_norm;
    auto gpu = GpuModel::Create(cfg, 0, 1, 0, o, nullptr);
    ASSERT_OK(gpu);
    SimBatch sim(cfg, kBlocks, 42);
    for (int p : prompts) sim.AddSequence(p, cfg.vocab);
    double worst_norm = 0;
    for (int step = 0; step < 64; ++step) {
      std::vector<int> rows;
      auto batch = sim.NextStep(chunk, &rows);
      ASSERT_OK(batch);
      if (batch->num_tokens() == 0) break;
      std::vector<float> want;
      ASSERT_OK(cpu->Forward(*batch, &want));
      ASSERT_OK(gpu->Forward(*batch, stream()));
      ASSERT_OK(gpu->WaitForStep(Deadline::AfterMs(60'000)));
      const std::vector<float> got = HostLogits(*gpu);
      ASSERT_EQ(got.size(), want.size());
      const double nerr = testing::NormRelError(got, want);
      worst_norm = std::max(worst_norm, nerr);
      if (rtol > 0) {
        testing::CheckClose(got, testing::ToDouble(want), rtol,
                            "step " + std::to_string(step) + " logits");
      } else {
        EXPECT_LT(nerr, norm_tol) << "step " << step;
      }
      const int V = cfg.vocab;
      std::vector<int32_t> next(batch->sample_index.size());
      for (size_t i = 0; i < next.size(); ++i) {
        next[i] = model::ArgMax(absl::MakeConstSpan(want.data() + i * V, V));
      }
      sim.Commit(rows, next);
      bool all_done = true;
      for (const auto& s : sim.seqs()) {
        all_done &= static_cast<int>(s.tokens.size()) >= s.prompt_len + decode_steps;
      }
      if (all_done) break;
    }
    std::printf("[ metric ] %s %s%s: worst ||gpu-cpu||/||cpu|| of the logits = %.3g\n",
                cfg.name.c_str(), DTypeName(dt), defer_norm ? "" : " (norm kernels)", worst_norm);
  }
};

TEST_F(GpuModelTest, TinyFp32LogitsMatchCpu) {
  CompareWithCpu(Cfg("tiny"), DType::kF32, {5, 17, 33, 1}, 12, 4, 1e-4, 0);
}

TEST_F(GpuModelTest, SmallTwoLayersFp32LogitsMatchCpu) {
  CompareWithCpu(Cfg("small", "layers=2"), DType::kF32, {40, 9, 23}, 16, 3, 1e-4, 0);
}

TEST_F(GpuModelTest, TinyBf16LogitsCloseToCpu) {
  CompareWithCpu(Cfg("tiny"), DType::kBF16, {5, 17, 33, 1}, 12, 4, 0, 0.08);
}

TEST_F(GpuModelTest, SmallTwoLayersBf16LogitsCloseToCpu) {
  CompareWithCpu(Cfg("small", "layers=2"), DType::kBF16, {30, 9}, 64, 3, 0, 0.08);
}

TEST_F(GpuModelTest, TinyBf16TensorCoreAttentionLogitsCloseToCpu) {
  CompareWithCpu(Cfg("tiny"), DType::kBF16, {5, 17, 33, 1, 70, 9}, 12, 6, 0, 0.08,
                 DecodeKernel::kTensorCore);
}

TEST_F(GpuModelTest, SmallTwoLayersBf16TensorCoreAttentionLogitsCloseToCpu) {
  CompareWithCpu(Cfg("small", "layers=2"), DType::kBF16, {30, 9, 64}, 64, 3, 0, 0.08,
                 DecodeKernel::kTensorCore);
}

// The norm kernels with the weights as they are (defer_norm off), where the
// tests above run the default: the deferred norm in steps of more than
// gemv_max_rows rows (prefill and 6-row decode), the folded weights elsewhere.
TEST_F(GpuModelTest, SmallTwoLayersBf16NormKernelsLogitsCloseToCpu) {
  CompareWithCpu(Cfg("small", "layers=2"), DType::kBF16, {30, 9, 64, 5, 11, 40}, 64, 3, 0, 0.08,
                 DecodeKernel::kTensorCore, /*defer_norm=*/false);
}

// The deferred norm is in effect where it should be: the logits of 7-row
// decode steps (cuBLASLt, the factors applied by RoPE and SiLU) and of
// 3-row ones (the GEMV applying them) differ from the norm kernels' in
// their bits and agree within bf16's rounding, as do a 194-row prefill
// step's (more rows than the deferral takes: the norm kernels on the folded
// weights); an fp32 model (never deferred) gives the same bits either way.
TEST_F(GpuModelTest, DeferredNormChangesOnlyTheRoundingOfBf16Steps) {
  const model::ModelConfig cfg = Cfg("small", "layers=2");
  for (const auto& [dt, prompts] :
       {std::pair<DType, std::vector<int>>{DType::kBF16, {12, 30, 5, 17, 9, 21, 100}},
        {DType::kBF16, {12, 30, 5}},
        {DType::kF32, {12, 30, 5, 17, 9, 21, 100}},
        {DType::kF32, {12, 30, 5}}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(dt) << ", " << prompts.size() << " sequences");
    GpuModelOptions oa = Opts(dt, false, DecodeKernel::kTensorCore);
    GpuModelOptions ob = oa;
    ob.defer_norm = false;
    auto a = GpuModel::Create(cfg, 0, 1, 0, oa, nullptr);
    auto b = GpuModel::Create(cfg, 0, 1, 0, ob, nullptr);
    ASSERT_OK(a);
    ASSERT_OK(b);
    SimBatch sim(cfg, kBlocks, 7);
    for (int p : prompts) sim.AddSequence(p, cfg.vocab);
    for (int step = 0; step < 3; ++step) {  // a prefill step, then two decode steps
      std::vector<int> rows;
      auto batch = sim.NextStep(256, &rows);
      ASSERT_OK(batch);
      ASSERT_OK(a->Forward(*batch, stream()));
      ASSERT_OK(b->Forward(*batch, stream()));
      ASSERT_OK(a->WaitForStep(Deadline::AfterMs(60'000)));
      ASSERT_OK(b->WaitForStep(Deadline::AfterMs(60'000)));
      const std::vector<float> la = HostLogits(*a), lb = HostLogits(*b);
      ASSERT_EQ(la.size(), lb.size());
      const bool same = std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0;
      if (dt == DType::kF32) {
        EXPECT_TRUE(same) << "step " << step;
      } else {
        EXPECT_FALSE(same) << "step " << step << ": the deferred norm did not run";
        EXPECT_LT(testing::NormRelError(la, lb), 0.05) << "step " << step;
      }
      const int V = cfg.vocab;
      std::vector<int32_t> next(batch->sample_index.size());
      for (size_t i = 0; i < next.size(); ++i) {
        next[i] = model::ArgMax(absl::MakeConstSpan(lb.data() + i * V, V));
      }
      sim.Commit(rows, next);
    }
  }
}

// 16 greedy decode steps: the GPU samples on the device and feeds its own
// tokens to the next step without the host (token_from_prev_sample); the CPU
// decodes with ArgMax. The token sequences must be equal.
void GreedyDecode(const model::ModelConfig& cfg, cudaStream_t stream) {
  auto cpu = CpuModel::Create(cfg, 0, 1, kBlocks, nullptr);
  ASSERT_OK(cpu);
  auto gpu = GpuModel::Create(cfg, 0, 1, 0, Opts(DType::kF32, true), nullptr);
  ASSERT_OK(gpu);
  SimBatch cpu_sim(cfg, kBlocks, 7), gpu_sim(cfg, kBlocks, 7);
  const std::vector<int> prompts = {9, 20, 3, 12};
  for (int p : prompts) {
    cpu_sim.AddSequence(p, cfg.vocab);
    gpu_sim.AddSequence(p, cfg.vocab);
  }
  const int V = cfg.vocab;
  std::vector<int32_t> prev_rows;  // previous step: sample row per sequence
  for (int step = 0; step < 17; ++step) {
    std::vector<int> crows, grows;
    auto cb = cpu_sim.NextStep(64, &crows);
    auto gb = gpu_sim.NextStep(64, &grows);
    ASSERT_OK(cb);
    ASSERT_OK(gb);
    std::vector<float> want;
    ASSERT_OK(cpu->Forward(*cb, &want));
    std::vector<int32_t> cpu_next(cb->sample_index.size());
    for (size_t i = 0; i < cpu_next.size(); ++i) {
      cpu_next[i] = model::ArgMax(absl::MakeConstSpan(want.data() + i * V, V));
    }
    StepOptions so;
    so.sampling.assign(gb->sample_index.size(), model::SamplingParams{});  // greedy
    so.copy_logits = false;
    if (step > 0) {
      // Decode: token t of sequence t is what the device sampled for row t.
      so.token_from_prev_sample.resize(gb->num_tokens());
      for (int t = 0; t < gb->num_tokens(); ++t) {
        so.token_from_prev_sample[t] = prev_rows[t];
      }
    }
    BatchInput in = *gb;
    if (step > 0) std::fill(in.tokens.begin(), in.tokens.end(), 0);  // host does not know them
    ASSERT_OK(gpu->Forward(in, stream, so));
    ASSERT_OK(gpu->WaitForStep(Deadline::AfterMs(60'000)));
    auto toks = gpu->host_tokens();
    std::vector<int32_t> gpu_next(toks.begin(), toks.end());
    ASSERT_EQ(gpu_next, cpu_next) << "greedy tokens differ at step " << step;
    cpu_sim.Commit(crows, cpu_next);
    gpu_sim.Commit(grows, gpu_next);
    prev_rows.assign(grows.begin(), grows.end());
  }
  const auto st = gpu->graph_stats();
  std::printf("[ metric ] %s greedy decode: graph captures %lld replays %lld eager %lld\n",
              cfg.name.c_str(), static_cast<long long>(st.captures),
              static_cast<long long>(st.replays), static_cast<long long>(st.eager_steps));
  EXPECT_GT(st.replays, 0);
  EXPECT_EQ(st.capture_failures, 0);
}

TEST_F(GpuModelTest, TinyGreedyDecode16StepsMatchesCpu) { GreedyDecode(Cfg("tiny"), stream()); }

TEST_F(GpuModelTest, SmallTwoLayersGreedyDecode16StepsMatchesCpu) {
  GreedyDecode(Cfg("small", "layers=2"), stream());
}

// The pipelined worker's use: step t + 1 is enqueued before step t's tokens
// are read (they reach step t + 1 on the device); step t's host tokens stay
// readable through host_tokens_of(t) while step t + 1 runs, and must equal
// the CPU reference's greedy tokens. Graphs on, fp32.
TEST_F(GpuModelTest, PipelinedDecodeReadsEachStepWhileTheNextRuns) {
  const model::ModelConfig cfg = Cfg("tiny");
  const int V = cfg.vocab;
  constexpr int kSteps = 14;
  // The CPU reference, one step at a time.
  std::vector<std::vector<int32_t>> want;
  {
    auto cpu = CpuModel::Create(cfg, 0, 1, kBlocks, nullptr);
    ASSERT_OK(cpu);
    SimBatch sim(cfg, kBlocks, 11);
    for (int p : {7, 30, 2, 17, 9}) sim.AddSequence(p, cfg.vocab);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<int> rows;
      auto b = sim.NextStep(64, &rows);
      ASSERT_OK(b);
      std::vector<float> logits;
      ASSERT_OK(cpu->Forward(*b, &logits));
      std::vector<int32_t> next(b->sample_index.size());
      for (size_t i = 0; i < next.size(); ++i) {
        next[i] = model::ArgMax(absl::MakeConstSpan(logits.data() + i * V, V));
      }
      sim.Commit(rows, next);
      want.push_back(next);
    }
  }
  auto gpu = GpuModel::Create(cfg, 0, 1, 0, Opts(DType::kF32, true), nullptr);
  ASSERT_OK(gpu);
  SimBatch sim(cfg, kBlocks, 11);
  for (int p : {7, 30, 2, 17, 9}) sim.AddSequence(p, cfg.vocab);
  std::vector<cuda::Event> done;
  for (int i = 0; i < 2; ++i) {
    auto e = cuda::Event::Create();
    ASSERT_OK(e);
    done.push_back(std::move(*e));
  }
  std::vector<int> prev_rows;
  auto check = [&](int step) {
    ASSERT_EQ(cudaEventSynchronize(done[step % 2].get()), cudaSuccess);
    auto toks = gpu->host_tokens_of(step);
    EXPECT_EQ(std::vector<int32_t>(toks.begin(), toks.end()), want[step]) << "step " << step;
  };
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> rows;
    auto b = sim.NextStep(64, &rows);
    ASSERT_OK(b);
    StepOptions so;
    so.sampling.assign(b->sample_index.size(), model::SamplingParams{});
    BatchInput in = *b;
    if (step > 0) {
      so.token_from_prev_sample.assign(prev_rows.begin(), prev_rows.end());
      std::fill(in.tokens.begin(), in.tokens.end(), 0);  // still on the device
    }
    ASSERT_OK(gpu->Forward(in, stream(), so));
    ASSERT_EQ(cudaEventRecord(done[step % 2].get(), stream()), cudaSuccess);
    EXPECT_EQ(gpu->steps_enqueued(), step + 1);
    // Placeholders: the host does not wait for this step's tokens.
    sim.Commit(rows, std::vector<int32_t>(rows.size(), 0));
    prev_rows.assign(rows.begin(), rows.end());
    if (step > 0) check(step - 1);
    if (step > 1) {
      EXPECT_TRUE(gpu->host_tokens_of(step - 2).empty()) << "out of the window";
    }
  }
  check(kSteps - 1);
  EXPECT_GT(gpu->graph_stats().replays, 0);
}

// Two models, graphs on and off, fed the same steps (each forwards its own
// device samples): logits and tokens must be bitwise equal at every step.
// With fail_first_capture the graph model's first capture fails (after its
// step is recorded): that batch shape must fall back to eager steps.
// `seqs` decode rows (5 are padded to 8 in the graph and run cuBLASLt; at most
// kernels::kGemvMaxRows run kernels::Gemv in bf16). With the split chunk of
// Opts (64 keys) the longest prompts cross it after two decode steps, so the
// padded batch runs first unsplit, then split: two graphs (GraphKey's split
// flag), both checked against the eager steps; `stats` receives the graph
// model's counters.
void GraphVsEager(const model::ModelConfig& cfg, DType dt, cudaStream_t stream,
                  DecodeKernel dk = DecodeKernel::kTiled, bool fail_first_capture = false,
                  int seqs = 5, bool eager_without_gemv_swiglu = false, int split_chunk = 64,
                  model::GraphStats* stats = nullptr, bool warm_up = false,
                  int max_seqs = 16) {
  GpuModelOptions oa = Opts(dt, true, dk);
  oa.attention_split_chunk = split_chunk;
  oa.max_seqs = max_seqs;
  auto a = GpuModel::Create(cfg, 0, 1, 0, oa, nullptr);
  GpuModelOptions ob = Opts(dt, false, dk);
  ob.attention_split_chunk = split_chunk;
  ob.max_seqs = max_seqs;
  ob.gemv_swiglu = !eager_without_gemv_swiglu;
  auto b = GpuModel::Create(cfg, 0, 1, 0, ob, nullptr);
  ASSERT_OK(a);
  ASSERT_OK(b);
  if (fail_first_capture) {
    a->FailNextCaptureForTesting(absl::InternalError("injected capture failure"));
  }
  if (warm_up) {
    // The warm-up writes KV blocks (the first layer's first block changes)
    // and nothing a later step reads: `a` must still match `b` bitwise.
    const size_t block_bytes = static_cast<size_t>(cfg.block_size) *
                               a->layout().kv_heads_local * cfg.head_dim * DTypeSize(dt);
    std::vector<uint8_t> before(block_bytes), after(block_bytes);
    ASSERT_EQ(cudaMemcpy(before.data(), a->k_cache(0), block_bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_OK(a->WarmUp(stream, Deadline::AfterMs(60'000)));
    ASSERT_EQ(cudaMemcpy(after.data(), a->k_cache(0), block_bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_NE(before, after) << "the warm-up wrote no key";
    EXPECT_EQ(a->steps_enqueued(), 0);
    EXPECT_EQ(a->graph_stats().eager_steps, 0);
  }
  SimBatch sim(cfg, kBlocks, 3);
  const std::vector<int> prompts = {60, 20, 62, 1, 45};
  for (int i = 0; i < seqs; ++i) sim.AddSequence(prompts[i], cfg.vocab);
  std::vector<int> prev_rows;
  for (int step = 0; step < 12; ++step) {
    std::vector<int> rows;
    auto batch = sim.NextStep(64, &rows);
    ASSERT_OK(batch);
    StepOptions so;
    so.sampling.resize(batch->sample_index.size());
    for (size_t i = 0; i < so.sampling.size(); ++i) {
      so.sampling[i].temperature = i % 2 ? 0.8f : 0.f;
      so.sampling[i].top_k = 20;
      so.sampling[i].seed = 100 + i;
    }
    BatchInput in = *batch;
    if (step > 0) {
      so.token_from_prev_sample.assign(prev_rows.begin(), prev_rows.end());
      std::fill(in.tokens.begin(), in.tokens.end(), 0);
    }
    ASSERT_OK(a->Forward(in, stream, so));
    ASSERT_OK(b->Forward(in, stream, so));
    ASSERT_OK(a->WaitForStep(Deadline::AfterMs(60'000)));
    ASSERT_OK(b->WaitForStep(Deadline::AfterMs(60'000)));
    const auto la = a->host_logits(), lb = b->host_logits();
    ASSERT_EQ(la.size(), lb.size());
    ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)))
        << "graph and eager logits differ at step " << step;
    const auto ta = a->host_tokens(), tb = b->host_tokens();
    std::vector<int32_t> toks(ta.begin(), ta.end());
    ASSERT_EQ(toks, std::vector<int32_t>(tb.begin(), tb.end())) << "step " << step;
    sim.Commit(rows, toks);
    prev_rows.assign(rows.begin(), rows.end());
  }
  const auto st = a->graph_stats();
  if (stats != nullptr) *stats = st;
  EXPECT_EQ(b->graph_stats().replays, 0);
  if (fail_first_capture) {
    // One decode shape in this run: it failed once and ran eagerly after.
    EXPECT_EQ(st.capture_failures, 1);
    EXPECT_EQ(st.captures, 0);
    EXPECT_EQ(st.replays, 0);
    EXPECT_EQ(st.eager_steps, b->graph_stats().eager_steps);
    return;
  }
  EXPECT_EQ(st.capture_failures, 0);
  EXPECT_GE(st.captures, 1);
  EXPECT_GE(st.replays, 8);
}

TEST_F(GpuModelTest, TinyCudaGraphDecodeEqualsEagerBitwiseBf16) {
  GraphVsEager(Cfg("tiny"), DType::kBF16, stream());
}
TEST_F(GpuModelTest, TinyCudaGraphDecodeEqualsEagerBitwiseGemvBf16) {
  // 3 rows, padded to 4 in the graph: Gemv launched with PDL inside the graph.
  GraphVsEager(Cfg("tiny"), DType::kBF16, stream(), DecodeKernel::kTensorCore, false, 3);
}
TEST_F(GpuModelTest, GemvSwiGluGraphDecodeEqualsEagerGemvThenSiluBitwiseBf16) {
  // The gate/up GEMV writing SiLU(gate) * up itself (the default) against the
  // GEMV then the SiLU kernel: the same bits.
  GraphVsEager(Cfg("tiny"), DType::kBF16, stream(), DecodeKernel::kTensorCore, false, 3,
               /*eager_without_gemv_swiglu=*/true);
}
TEST_F(GpuModelTest, TinyCudaGraphDecodeEqualsEagerBitwiseFp32) {
  GraphVsEager(Cfg("tiny"), DType::kF32, stream());
}
TEST_F(GpuModelTest, TinyCudaGraphDecodeEqualsEagerBitwiseTensorCoreBf16) {
  GraphVsEager(Cfg("tiny"), DType::kBF16, stream(), DecodeKernel::kTensorCore);
}
TEST_F(GpuModelTest, SmallTwoLayersCudaGraphDecodeEqualsEagerBitwiseBf16) {
  GraphVsEager(Cfg("small", "layers=2"), DType::kBF16, stream());
}
TEST_F(GpuModelTest, FailedCaptureFallsBackToEagerStepsBitwiseBf16) {
  // A 256-key chunk: no step splits, one decode graph shape.
  GraphVsEager(Cfg("tiny"), DType::kBF16, stream(), DecodeKernel::kTensorCore,
               /*fail_first_capture=*/true, 5, false, /*split_chunk=*/256);
}
TEST_F(GpuModelTest, CudaGraphPerAttentionSplitDecisionBitwiseBf16) {
  // The same padded batch unsplit (no merge kernel in its graph), then split:
  // two captures, each replayed, every step bitwise the eager one.
  for (DecodeKernel dk : {DecodeKernel::kTiled, DecodeKernel::kTensorCore}) {
    model::GraphStats st;
    GraphVsEager(Cfg("tiny"), DType::kBF16, stream(), dk, false, 5, false, 64, &st);
    EXPECT_EQ(st.captures, 2) << DecodeKernelName(dk);
  }
  // Contexts that never reach the chunk: one graph, never split.
  model::GraphStats st;
  GraphVsEager(Cfg("tiny"), DType::kBF16, stream(), DecodeKernel::kTensorCore, false, 5, false, 256,
               &st);
  EXPECT_EQ(st.captures, 1);
}

TEST_F(GpuModelTest, JobsLargestBatchBetweenGraphSizesGetsItsOwnGraph) {
  // max_seqs = 5 lies between the default sizes 4 and 8: the 5-row decode
  // steps replay a graph of 5 rows (not eager steps), bitwise the eager ones.
  const auto sizes = [](int max_seqs, std::vector<int> requested) {
    GpuModelOptions o = Opts(DType::kBF16, true, DecodeKernel::kTensorCore);
    o.max_seqs = max_seqs;
    o.graph_batch_sizes = std::move(requested);
    auto m = GpuModel::Create(Cfg("tiny"), 0, 1, 0, o, nullptr);
    EXPECT_OK(m);
    return m.ok() ? m->graph_batch_sizes() : std::vector<int>{};
  };
  EXPECT_EQ(sizes(5, {}), (std::vector<int>{1, 2, 4, 5}));
  EXPECT_EQ(sizes(16, {}), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(sizes(3, {}), (std::vector<int>{1, 2, 3}));
  // Sizes the options name are taken as they are (up to the largest batch).
  EXPECT_EQ(sizes(5, {3, 1, 7}), (std::vector<int>{1, 3}));
  // Every 5-row decode step after the first replays the graph, bitwise the
  // eager model's.
  model::GraphStats st;
  GraphVsEager(Cfg("tiny"), DType::kBF16, stream(), DecodeKernel::kTensorCore, false, 5, false,
               /*split_chunk=*/256, &st, false, /*max_seqs=*/5);
  EXPECT_GE(st.replays, 8);
}

TEST_F(GpuModelTest, WarmUpLeavesStepsAndGraphsAsTheyWere) {
  // The same steps after GpuModel::WarmUp: bitwise the eager model's, and the
  // same captures, replays and eager steps as without it (its steps count
  // toward no graph).
  for (DType dt : {DType::kBF16, DType::kF32}) {
    model::GraphStats cold, warm;
    GraphVsEager(Cfg("tiny"), dt, stream(), DecodeKernel::kTensorCore, false, 5, false, 64, &cold);
    GraphVsEager(Cfg("tiny"), dt, stream(), DecodeKernel::kTensorCore, false, 5, false, 64, &warm,
                 /*warm_up=*/true);
    EXPECT_EQ(warm.captures, cold.captures) << DTypeName(dt);
    EXPECT_EQ(warm.replays, cold.replays) << DTypeName(dt);
    EXPECT_EQ(warm.eager_steps, cold.eager_steps) << DTypeName(dt);
  }
}

TEST_F(GpuModelTest, DeviceSamplingDrawsWhatTheCpuSamplerDraws) {
  const auto cfg = Cfg("tiny");
  auto gpu = GpuModel::Create(cfg, 0, 1, 0, Opts(DType::kF32, false), nullptr);
  ASSERT_OK(gpu);
  SimBatch sim(cfg, kBlocks, 9);
  for (int i = 0; i < 12; ++i) sim.AddSequence(3 + 2 * i, cfg.vocab);  // 168 tokens
  std::vector<int> rows;
  auto batch = sim.NextStep(256, &rows);
  ASSERT_OK(batch);
  StepOptions so;
  const int n = static_cast<int>(batch->sample_index.size());
  for (int i = 0; i < n; ++i) {
    model::SamplingParams p;
    p.temperature = 0.3f + 0.2f * (i % 5);
    p.top_k = (i % 3) * 7;
    p.top_p = i % 4 == 0 ? 1.f : 0.6f;
    p.seed = 1000 + i;
    so.sampling.push_back(p);
  }
  ASSERT_OK(gpu->Forward(*batch, stream(), so));
  ASSERT_OK(gpu->WaitForStep(Deadline::AfterMs(60'000)));
  const auto logits = gpu->host_logits();
  const auto toks = gpu->host_tokens();
  ASSERT_EQ(static_cast<int>(toks.size()), n);
  for (int i = 0; i < n; ++i) {
    const uint64_t pos = batch->positions[batch->sample_index[i]] + 1;
    EXPECT_EQ(toks[i],
              model::SampleToken(logits.subspan(static_cast<size_t>(i) * cfg.vocab, cfg.vocab),
                                 so.sampling[i], pos))
        << "row " << i;
  }
}

TEST_F(GpuModelTest, RejectsBadStepsAndOptions) {
  using symtp::testing::StatusIs;
  const auto cfg = Cfg("tiny");
  auto gpu = GpuModel::Create(cfg, 0, 1, 0, Opts(DType::kF32, false), nullptr);
  ASSERT_OK(gpu);
  SimBatch sim(cfg, kBlocks, 1);
  sim.AddSequence(300, cfg.vocab);  // > max_batch_tokens in one chunk
  std::vector<int> rows;
  auto big = sim.NextStep(300, &rows);
  ASSERT_OK(big);
  EXPECT_THAT(gpu->Forward(*big, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("capacity")));
  SimBatch sim2(cfg, kBlocks, 2);
  sim2.AddSequence(4, cfg.vocab);
  auto small = sim2.NextStep(8, &rows);
  ASSERT_OK(small);
  StepOptions so;
  so.token_from_prev_sample.assign(small->num_tokens(), 0);  // nothing sampled before
  EXPECT_THAT(gpu->Forward(*small, stream(), so),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("previous")));
  EXPECT_THAT(gpu->Forward(*small, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("stream")));
  auto bad = GpuModel::Create(Cfg("tiny", "heads=4,kv_heads=2"), 0, 1, 0, Opts(DType::kF32, false),
                              nullptr);  // head_dim 64: fine
  EXPECT_OK(bad);
  auto bad2 = GpuModel::Create(Cfg("tiny", "hidden=384,heads=4,kv_heads=2"), 0, 1, 0,
                               Opts(DType::kF32, false), nullptr);  // head_dim 96
  EXPECT_THAT(bad2, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("head_dim")));
  EXPECT_THAT(GpuModel::Create(cfg, 0, 2, 0, Opts(DType::kF32, false), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("DeviceComm")));
}

// A TP = 2 shard alone (bench_skip_allreduce, no DeviceComm), as the
// benchmarks run one rank's kernels on one GPU: it samples from its own
// vocabulary shard.
TEST_F(GpuModelTest, ShardAloneRunsTheShardsShapes) {
  const auto cfg = Cfg("tiny", "vocab=1000");
  GpuModelOptions o = Opts(DType::kBF16, false);
  o.bench_skip_allreduce = true;
  auto gpu = GpuModel::Create(cfg, 1, 2, 0, o, nullptr);
  ASSERT_OK(gpu);
  SimBatch sim(cfg, kBlocks, 3);
  for (int i = 0; i < 3; ++i) sim.AddSequence(10 + i, cfg.vocab);
  std::vector<int> rows;
  auto batch = sim.NextStep(64, &rows);
  ASSERT_OK(batch);
  StepOptions so;
  so.sampling.assign(batch->sample_index.size(), model::SamplingParams{});
  so.copy_logits = false;
  ASSERT_OK(gpu->Forward(*batch, stream(), so));
  ASSERT_OK(gpu->WaitForStep(Deadline::AfterMs(60'000)));
  const auto toks = gpu->host_tokens();
  ASSERT_EQ(toks.size(), batch->sample_index.size());
  for (int32_t t : toks) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, cfg.vocab / 2) << "sampled outside the shard's vocabulary";
  }
}

TEST_F(GpuModelTest, ProfiledEagerStepReportsClasses) {
  const auto cfg = Cfg("tiny");
  auto gpu = GpuModel::Create(cfg, 0, 1, 0, Opts(DType::kBF16, false), nullptr);
  ASSERT_OK(gpu);
  gpu->set_profiling(true);
  SimBatch sim(cfg, kBlocks, 4);
  sim.AddSequence(20, cfg.vocab);
  std::vector<int> rows;
  auto batch = sim.NextStep(64, &rows);
  ASSERT_OK(batch);
  ASSERT_OK(gpu->Forward(*batch, stream()));
  ASSERT_OK(gpu->WaitForStep(Deadline::AfterMs(60'000)));
  auto prof = gpu->LastStepProfile();
  ASSERT_OK(prof);
  EXPECT_GT(prof->total_ms, 0.0);
  EXPECT_GT(prof->attention_ms, 0.0);
}

#ifdef SYMTP_TEST_HAVE_NCCL
// The row-parallel path through a communicator on one GPU: a 1-rank NCCL
// communicator (all-reduce = identity, then the separate residual +
// RMSNorm kernel) must give the CPU's logits.
TEST_F(GpuModelTest, RowParallelThroughOneRankNccl) {
  auto id = NcclComm::NewUniqueId();
  ASSERT_OK(id);
  auto comm = NcclComm::Create(*id, 0, 1, 0, Deadline::AfterMs(60'000));
  ASSERT_OK(comm);
  const auto cfg = Cfg("tiny");
  auto cpu = CpuModel::Create(cfg, 0, 1, kBlocks, nullptr);
  ASSERT_OK(cpu);
  auto g = GpuModel::Create(cfg, 0, 1, 0, Opts(DType::kF32, true), comm.value().get());
  ASSERT_OK(g);
  SimBatch sim(cfg, kBlocks, 5);
  for (int p : {33, 8, 21}) sim.AddSequence(p, cfg.vocab);
  for (int step = 0; step < 6; ++step) {
    std::vector<int> rows;
    auto batch = sim.NextStep(16, &rows);
    ASSERT_OK(batch);
    std::vector<float> want;
    ASSERT_OK(cpu->Forward(*batch, &want));
    ASSERT_OK(g->Forward(*batch, stream()));
    ASSERT_OK(g->WaitForStep(Deadline::AfterMs(60'000)));
    testing::CheckClose(HostLogits(*g), testing::ToDouble(want), 1e-4,
                        absl::StrCat("step ", step));
    std::vector<int32_t> next(batch->sample_index.size());
    for (size_t i = 0; i < next.size(); ++i) {
      next[i] = model::ArgMax(absl::MakeConstSpan(want.data() + i * cfg.vocab, cfg.vocab));
    }
    sim.Commit(rows, next);
  }
  EXPECT_EQ(g->graph_stats().capture_failures, 0);
}
#endif

}  // namespace
}  // namespace symtp::kernels

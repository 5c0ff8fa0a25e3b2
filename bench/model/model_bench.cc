// CPU reference model: decode and prefill step times (one core, TP = 1), and
// the host-side sampler.
//
//   model_bench [--benchmark_filter=Decode] [--benchmark_out=out.json]
//
// Model: the "tiny" preset. Results are printed, not asserted.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "models/cpu_gemm.h"
#include "models/cpu_model.h"
#include "models/sampling.h"

namespace symtp::model {
namespace {

// A model with `batch` sequences that each already hold `context` tokens.
struct Setup {
  ModelConfig cfg;
  std::vector<std::vector<int32_t>> tables;
  int blocks_per_seq = 0;
};

bool Prepare(benchmark::State& state, int batch, int context, CpuModel** out, Setup* setup) {
  static CpuModel* model = nullptr;
  static int cached_batch = -1, cached_context = -1;
  auto cfg = PresetConfig("tiny");
  if (!cfg.ok()) {
    state.SkipWithError(cfg.status().ToString().c_str());
    return false;
  }
  setup->cfg = *cfg;
  setup->blocks_per_seq = (context + 1 + cfg->block_size - 1) / cfg->block_size + 1;
  setup->tables.assign(batch, {});
  for (int s = 0; s < batch; ++s) {
    for (int b = 0; b < setup->blocks_per_seq; ++b) setup->tables[s].push_back(s * setup->blocks_per_seq + b);
  }
  if (model == nullptr || cached_batch != batch || cached_context != context) {
    delete model;
    model = nullptr;
    auto m = CpuModel::Create(*cfg, 0, 1, batch * setup->blocks_per_seq, nullptr);
    if (!m.ok()) {
      state.SkipWithError(m.status().ToString().c_str());
      return false;
    }
    model = new CpuModel(std::move(*m));
    BatchBuilder b(cfg->block_size, setup->blocks_per_seq);
    for (int s = 0; s < batch; ++s) {
      std::vector<int32_t> toks(context);
      for (int i = 0; i < context; ++i) toks[i] = (s * 31 + i * 7) % cfg->vocab;
      if (absl::Status st = b.Add(toks, 0, setup->tables[s], true); !st.ok()) {
        state.SkipWithError(st.ToString().c_str());
        return false;
      }
    }
    std::vector<float> logits;
    if (absl::Status st = model->Forward(b.Take(), &logits); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return false;
    }
    cached_batch = batch;
    cached_context = context;
  }
  *out = model;
  return true;
}

// One decode step of `batch` sequences at position `context`.
void BM_DecodeTiny(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0)), context = static_cast<int>(state.range(1));
  CpuModel* model = nullptr;
  Setup setup;
  if (!Prepare(state, batch, context, &model, &setup)) return;
  BatchBuilder b(setup.cfg.block_size, setup.blocks_per_seq);
  for (int s = 0; s < batch; ++s) {
    const int32_t tok = (s * 13 + 5) % setup.cfg.vocab;
    if (absl::Status st = b.Add({tok}, context, setup.tables[s], true); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
  }
  const BatchInput step = b.Take();
  std::vector<float> logits;
  for (auto _ : state) {
    if (absl::Status st = model->Forward(step, &logits); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(cpu::KernelIsa());
}
BENCHMARK(BM_DecodeTiny)
    ->ArgNames({"batch", "context"})
    ->Args({1, 128})
    ->Args({16, 128})
    ->Args({64, 128})
    ->Args({64, 1024})
    ->Unit(benchmark::kMillisecond);

// Prefill of one sequence of `len` tokens (only the last token sampled).
void BM_PrefillTiny(benchmark::State& state) {
  const int len = static_cast<int>(state.range(0));
  auto cfg = PresetConfig("tiny");
  const int blocks = (len + cfg->block_size - 1) / cfg->block_size;
  auto m = CpuModel::Create(*cfg, 0, 1, blocks, nullptr);
  if (!m.ok()) {
    state.SkipWithError(m.status().ToString().c_str());
    return;
  }
  std::vector<int32_t> table(blocks), toks(len);
  for (int i = 0; i < blocks; ++i) table[i] = i;
  for (int i = 0; i < len; ++i) toks[i] = (i * 7 + 3) % cfg->vocab;
  BatchBuilder b(cfg->block_size, blocks);
  if (absl::Status st = b.Add(toks, 0, table, true); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  const BatchInput step = b.Take();
  std::vector<float> logits;
  for (auto _ : state) {
    if (absl::Status st = m->Forward(step, &logits); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(len), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(cpu::KernelIsa());
}
BENCHMARK(BM_PrefillTiny)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond);

// SampleToken over a llama-sized vocabulary (host-side cost per sequence per step).
void BM_SampleToken(benchmark::State& state) {
  const int vocab = static_cast<int>(state.range(0));
  std::vector<float> logits(vocab);
  uint64_t x = 1;
  for (float& l : logits) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    l = static_cast<float>(static_cast<int64_t>(x >> 40) % 2000) * 0.005f;
  }
  const SamplingParams params{.temperature = static_cast<float>(state.range(1)) / 10.f,
                              .top_k = static_cast<int>(state.range(2)),
                              .top_p = static_cast<float>(state.range(3)) / 100.f,
                              .seed = 7};
  SamplingScratch scratch;
  uint64_t pos = 0;
  for (auto _ : state) benchmark::DoNotOptimize(SampleToken(logits, params, pos++, &scratch));
}
BENCHMARK(BM_SampleToken)
    ->ArgNames({"vocab", "temp_x10", "top_k", "top_p_pct"})
    ->Args({128256, 0, 0, 100})
    ->Args({128256, 8, 0, 100})
    ->Args({128256, 8, 50, 100})
    ->Args({128256, 8, 0, 90})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace symtp::model

BENCHMARK_MAIN();

#include "models/cpu_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/cpu_gemm.h"
#include "models/sampling.h"
#include "models/sharding.h"
#include "tests/testing/status_matchers.h"

namespace symtp::model {
namespace {

using ::symtp::testing::StatusIs;
using ::testing::HasSubstr;

ModelConfig Tiny(const char* overrides = "") {
  auto c = MakeConfig("tiny", overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = d(rng);
  return t;
}

// Max over rows of max|got - want| / max(1, max|want row|).
double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want, int V) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t r = 0; r * V < std::min(got.size(), want.size()); ++r) {
    double scale = 1;
    for (int i = 0; i < V; ++i) scale = std::max(scale, std::abs(static_cast<double>(want[r * V + i])));
    for (int i = 0; i < V; ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got[r * V + i]) - want[r * V + i]) / scale);
    }
  }
  return worst;
}

// ---------------------------------------------------------------------------
// Independent dense reference: one sequence, every position, all in double,
// straight from MODEL.md and the TP=1 weights.
std::vector<double> NaiveForward(const ModelConfig& c, const std::vector<int32_t>& tokens) {
  const int H = c.hidden, D = c.head_dim, NH = c.heads, NKV = c.kv_heads, F = c.ffn, V = c.vocab;
  const int T = static_cast<int>(tokens.size());
  auto layout = MakeShardLayout(c, 0, 1);
  EXPECT_TRUE(layout.ok());
  auto W = [&](const std::string& name) { return ShardWeights(c, *layout, name); };
  auto matvec = [](const std::vector<double>& x, const std::vector<float>& w, int out, int in) {
    std::vector<double> y(out, 0.0);
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) y[o] += x[i] * w[static_cast<size_t>(o) * in + i];
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const std::vector<float>& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = std::sqrt(ss / x.size() + c.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] / r * w[i];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int heads, int p) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < D / 2; ++i) {
        const double a = p * std::pow(static_cast<double>(c.rope_theta), -2.0 * i / D);
        const double x0 = v[h * D + i], x1 = v[h * D + i + D / 2];
        v[h * D + i] = x0 * std::cos(a) - x1 * std::sin(a);
        v[h * D + i + D / 2] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
  };
  const std::vector<float> embed = W("embed");
  std::vector<std::vector<double>> x(T, std::vector<double>(H));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[t][i] = embed[static_cast<size_t>(tokens[t]) * H + i];
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    const auto an = W(p + "attn_norm"), mn = W(p + "mlp_norm"), wq = W(p + "wq"), wk = W(p + "wk"),
               wv = W(p + "wv"), wo = W(p + "wo"), wg = W(p + "w_gate"), wu = W(p + "w_up"),
               wd = W(p + "w_down");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      const auto h = rmsnorm(x[t], an);
      q[t] = matvec(h, wq, NH * D, H);
      k[t] = matvec(h, wk, NKV * D, H);
      v[t] = matvec(h, wv, NKV * D, H);
      rope(q[t], NH, t);
      rope(k[t], NKV, t);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> a(NH * D, 0.0);
      for (int h = 0; h < NH; ++h) {
        const int g = h / (NH / NKV);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[t][h * D + d] * k[j][g * D + d];
          s[j] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j)
          for (int d = 0; d < D; ++d) a[h * D + d] += s[j] / z * v[j][g * D + d];
      }
      const auto o = matvec(a, wo, H, NH * D);
      for (int i = 0; i < H; ++i) x[t][i] += o[i];
      const auto h2 = rmsnorm(x[t], mn);
      const auto gate = matvec(h2, wg, F, H), up = matvec(h2, wu, F, H);
      std::vector<double> act(F);
      for (int i = 0; i < F; ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const auto dn = matvec(act, wd, H, F);
      for (int i = 0; i < H; ++i) x[t][i] += dn[i];
    }
  }
  const auto fnorm = W("final_norm"), head = W("lm_head");
  std::vector<double> logits;
  for (int t = 0; t < T; ++t) {
    const auto y = matvec(rmsnorm(x[t], fnorm), head, V, H);
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

// Runs `tokens` through a fresh TP=1 model in chunks of `chunk`, on the given
// physical blocks, returning logits of every position.
std::vector<float> RunChunked(const ModelConfig& c, const std::vector<int32_t>& tokens, int chunk,
                              const std::vector<int32_t>& blocks, int num_blocks) {
  auto m = CpuModel::Create(c, 0, 1, num_blocks, nullptr);
  EXPECT_TRUE(m.ok()) << m.status();
  std::vector<float> all, logits;
  for (int s = 0; s < static_cast<int>(tokens.size()); s += chunk) {
    const int n = std::min<int>(chunk, static_cast<int>(tokens.size()) - s);
    BatchBuilder b(c.block_size, static_cast<int>(blocks.size()));
    EXPECT_OK(b.Add(absl::MakeConstSpan(tokens).subspan(s, n), s, blocks, false));
    for (int i = 0; i < n; ++i) b.AddSampleIndex(i);
    EXPECT_OK(m->Forward(b.Take(), &logits));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(CpuModelTest, MatchesNaiveDenseReference) {
  const ModelConfig c = Tiny("seed=5");
  const std::vector<int32_t> tokens = RandomTokens(21, c.vocab, 1);
  const std::vector<double> want = NaiveForward(c, tokens);
  const std::vector<float> got = RunChunked(c, tokens, 21, {3, 1}, 4);
  const std::vector<float> wantf(want.begin(), want.end());
  double maxabs = 0;
  for (double w : want) maxabs = std::max(maxabs, std::abs(w));
  EXPECT_GT(maxabs, 0.5);  // the logits are not degenerate
  EXPECT_LT(MaxRelDiff(got, wantf, c.vocab), 1e-5);
}

TEST(CpuModelTest, ChunkedPrefillAndDecodeMatchFullPrefill) {
  const ModelConfig c = Tiny();
  const std::vector<int32_t> tokens = RandomTokens(40, c.vocab, 2);
  const std::vector<int32_t> blocks = {0, 1, 2};
  const std::vector<float> full = RunChunked(c, tokens, 40, blocks, 3);
  ASSERT_EQ(full.size(), 40u * c.vocab);
  for (int chunk : {1, 5, 16, 17}) {
    EXPECT_LT(MaxRelDiff(RunChunked(c, tokens, chunk, blocks, 3), full, c.vocab), 1e-5) << chunk;
  }
  // Permuted, non-contiguous physical blocks in a bigger cache.
  EXPECT_LT(MaxRelDiff(RunChunked(c, tokens, 40, {9, 2, 7}, 12), full, c.vocab), 1e-5);
  EXPECT_LT(MaxRelDiff(RunChunked(c, tokens, 17, {11, 0, 5}, 12), full, c.vocab), 1e-5);
}

TEST(CpuModelTest, LogitsIdenticalOnEveryKernelVariant) {
  const ModelConfig c = Tiny();
  const std::vector<int32_t> tokens = RandomTokens(23, c.vocab, 4);
  const cpu::Isa best = cpu::DetectedIsa();
  const std::vector<float> want = RunChunked(c, tokens, 7, {1, 0}, 2);
  for (cpu::Isa isa : {cpu::Isa::kBaseline, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (!cpu::SetIsaCap(isa)) continue;
    EXPECT_EQ(RunChunked(c, tokens, 7, {1, 0}, 2), want) << cpu::KernelIsa();
  }
  ASSERT_TRUE(cpu::SetIsaCap(best));
}

TEST(CpuModelTest, PrefillThenDecodeWritesTheSameCache) {
  const ModelConfig c = Tiny();
  const std::vector<int32_t> tokens = RandomTokens(19, c.vocab, 3);
  ASSERT_OK_AND_ASSIGN(CpuModel a, CpuModel::Create(c, 0, 1, 4, nullptr));
  ASSERT_OK_AND_ASSIGN(CpuModel b, CpuModel::Create(c, 0, 1, 4, nullptr));
  std::vector<float> la, lb;
  BatchBuilder ba(16, 2);
  ASSERT_OK(ba.Add(tokens, 0, {2, 0}, true));
  ASSERT_OK(a.Forward(ba.Take(), &la));
  BatchBuilder bb(16, 2);
  ASSERT_OK(bb.Add(absl::MakeConstSpan(tokens).subspan(0, 10), 0, {1, 3}, false));
  ASSERT_OK(b.Forward(bb.Take(), &lb));
  EXPECT_TRUE(lb.empty());  // nothing sampled
  for (int p = 10; p < 19; ++p) {
    BatchBuilder d(16, 2);
    ASSERT_OK(d.Add({tokens[p]}, p, {1, 3}, true));
    ASSERT_OK(b.Forward(d.Take(), &lb));
  }
  EXPECT_LT(MaxRelDiff(lb, la, c.vocab), 1e-5);
  // The caches hold the same K/V at the mapped slots.
  const int kvw = a.layout().kv_heads_local * c.head_dim;
  for (int l = 0; l < c.layers; ++l) {
    for (int p = 0; p < 19; ++p) {
      const size_t sa = (static_cast<size_t>(p < 16 ? 2 : 0) * 16 + p % 16) * kvw;
      const size_t sb = (static_cast<size_t>(p < 16 ? 1 : 3) * 16 + p % 16) * kvw;
      for (int i = 0; i < kvw; ++i) {
        ASSERT_NEAR(a.k_cache(l)[sa + i], b.k_cache(l)[sb + i], 1e-5) << l << " " << p;
        ASSERT_NEAR(a.v_cache(l)[sa + i], b.v_cache(l)[sb + i], 1e-5) << l << " " << p;
      }
    }
  }
}

TEST(CpuModelTest, SequenceLogitsIndependentOfBatch) {
  const ModelConfig c = Tiny();
  const std::vector<int32_t> a = RandomTokens(28, c.vocab, 10);  // 23 prompt + 5 decode
  const std::vector<int32_t> bt = RandomTokens(12, c.vocab, 11);
  const std::vector<int32_t> ct = RandomTokens(45, c.vocab, 12);
  // Alone.
  std::vector<std::vector<float>> alone;
  {
    ASSERT_OK_AND_ASSIGN(CpuModel m, CpuModel::Create(c, 0, 1, 2, nullptr));
    std::vector<float> l;
    BatchBuilder b(16, 2);
    ASSERT_OK(b.Add(absl::MakeConstSpan(a).subspan(0, 23), 0, {0, 1}, true));
    ASSERT_OK(m.Forward(b.Take(), &l));
    alone.push_back(l);
    for (int p = 23; p < 28; ++p) {
      BatchBuilder d(16, 2);
      ASSERT_OK(d.Add({a[p]}, p, {0, 1}, true));
      ASSERT_OK(m.Forward(d.Take(), &l));
      alone.push_back(l);
    }
  }
  // Batched with B (prefill, then decode) and C (chunked prefill then decode),
  // A in the middle of the batch and on other physical blocks.
  ASSERT_OK_AND_ASSIGN(CpuModel m, CpuModel::Create(c, 0, 1, 16, nullptr));
  const std::vector<int32_t> blk_a = {7, 3}, blk_b = {12, 1}, blk_c = {5, 0, 14, 9};
  std::vector<float> l;
  {
    BatchBuilder b(16, 4);
    ASSERT_OK(b.Add(absl::MakeConstSpan(ct).subspan(0, 16), 0, blk_c, false));
    ASSERT_OK(b.Add(absl::MakeConstSpan(a).subspan(0, 23), 0, blk_a, true));
    ASSERT_OK(b.Add(absl::MakeConstSpan(bt).subspan(0, 7), 0, blk_b, true));
    ASSERT_OK(m.Forward(b.Take(), &l));
    ASSERT_EQ(l.size(), 2u * c.vocab);
    EXPECT_LT(MaxRelDiff(std::vector<float>(l.begin(), l.begin() + c.vocab), alone[0], c.vocab), 1e-5);
  }
  for (int step = 0; step < 5; ++step) {
    const int pa = 23 + step, pb = 7 + step;
    BatchBuilder b(16, 4);
    if (step == 0) {
      ASSERT_OK(b.Add(absl::MakeConstSpan(ct).subspan(16, 29), 16, blk_c, true));
    } else {
      ASSERT_OK(b.Add({ct[44]}, 44 + step, blk_c, true));
    }
    ASSERT_OK(b.Add({bt[pb]}, pb, blk_b, true));
    ASSERT_OK(b.Add({a[pa]}, pa, blk_a, true));
    ASSERT_OK(m.Forward(b.Take(), &l));
    ASSERT_EQ(l.size(), 3u * c.vocab);
    EXPECT_LT(MaxRelDiff(std::vector<float>(l.begin() + 2 * c.vocab, l.end()), alone[step + 1], c.vocab), 1e-5)
        << step;
  }
}

// ---------------------------------------------------------------------------
// Tensor parallelism: N ranks as threads over ThreadGroupComm.

struct GenSeq {
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> blocks;
};

struct GenResult {
  std::vector<std::vector<float>> step_logits;  // per step, [num seqs, V]
  std::vector<std::vector<int32_t>> tokens;     // per sequence, prompt + generated
};

// Prefill all prompts in one step, then `steps` decode steps; every rank samples
// on its own from its logits.
absl::Status GenerateOnRank(const ModelConfig& c, CpuModel* m, const std::vector<GenSeq>& seqs,
                            int steps, GenResult* out) {
  out->tokens.clear();
  for (const GenSeq& s : seqs) out->tokens.push_back(s.prompt);
  std::vector<float> logits;
  for (int step = 0; step <= steps; ++step) {
    BatchBuilder b(c.block_size, 4);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto& t = out->tokens[i];
      if (step == 0) {
        SYMTP_RETURN_IF_ERROR(b.Add(t, 0, seqs[i].blocks, true));
      } else {
        SYMTP_RETURN_IF_ERROR(b.Add({t.back()}, static_cast<int>(t.size()) - 1, seqs[i].blocks, true));
      }
    }
    SYMTP_RETURN_IF_ERROR(m->Forward(b.Take(), &logits));
    out->step_logits.push_back(logits);
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto& t = out->tokens[i];
      const int32_t next = SampleToken(absl::MakeConstSpan(logits).subspan(i * c.vocab, c.vocab),
                                       seqs[i].params, t.size());
      t.push_back(next);
    }
  }
  return absl::OkStatus();
}

std::vector<GenResult> GenerateTp(const ModelConfig& c, int n, const std::vector<GenSeq>& seqs,
                                  int steps) {
  auto comms = ThreadGroupComm::Create(n, absl::Seconds(120));
  std::vector<GenResult> results(n);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto m = CpuModel::Create(c, r, n, 16, comms[r].get());
      if (!m.ok()) {
        status[r] = m.status();
        return;
      }
      status[r] = GenerateOnRank(c, &*m, seqs, steps, &results[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_OK(status[r]) << "rank " << r;
  return results;
}

TEST(CpuModelTest, TensorParallelMatchesTp1) {
  const ModelConfig c = Tiny();
  const std::vector<GenSeq> seqs = {
      {RandomTokens(12, c.vocab, 20), SamplingParams{}, {0, 1}},
      {RandomTokens(5, c.vocab, 21), SamplingParams{.temperature = 0.8f, .top_k = 40, .seed = 7}, {4, 2}},
      {RandomTokens(17, c.vocab, 22), SamplingParams{.temperature = 1.f, .top_p = 0.9f, .seed = 8}, {9, 3, 5}},
  };
  const int steps = 20;
  const std::vector<GenResult> tp1 = GenerateTp(c, 1, seqs, steps);
  ASSERT_EQ(tp1.size(), 1u);
  ASSERT_EQ(tp1[0].step_logits.size(), static_cast<size_t>(steps + 1));
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << "TP=" << n);
    const std::vector<GenResult> tp = GenerateTp(c, n, seqs, steps);
    ASSERT_EQ(tp.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(tp[r].step_logits.size(), tp1[0].step_logits.size()) << "rank " << r;
      // Every rank holds bitwise the same logits and draws the same tokens.
      for (size_t s = 0; s < tp[r].step_logits.size(); ++s) {
        ASSERT_EQ(tp[r].step_logits[s], tp[0].step_logits[s]) << "rank " << r << " step " << s;
      }
      EXPECT_EQ(tp[r].tokens, tp[0].tokens) << "rank " << r;
    }
    // Greedy and seeded-sampling tokens equal TP=1's; logits within 1e-5.
    EXPECT_EQ(tp[0].tokens, tp1[0].tokens);
    for (size_t s = 0; s < tp1[0].step_logits.size(); ++s) {
      EXPECT_LT(MaxRelDiff(tp[0].step_logits[s], tp1[0].step_logits[s], c.vocab), 1e-5) << "step " << s;
    }
  }
}

TEST(CpuModelTest, TensorParallelWithReplicatedKvHeads) {
  // 4 heads, 1 kv head: at TP 2 and 4 every rank holds a copy of the one kv head.
  const ModelConfig c = Tiny("hidden=128,heads=4,kv_heads=1,layers=1,ffn=256,vocab=256");
  const std::vector<GenSeq> seqs = {{RandomTokens(9, c.vocab, 30), SamplingParams{}, {1, 0}}};
  const std::vector<GenResult> tp1 = GenerateTp(c, 1, seqs, 6);
  for (int n : {2, 4}) {
    const std::vector<GenResult> tp = GenerateTp(c, n, seqs, 6);
    ASSERT_EQ(tp.size(), static_cast<size_t>(n));
    EXPECT_EQ(tp[0].tokens, tp1[0].tokens) << n;
    for (size_t s = 0; s < tp1[0].step_logits.size(); ++s) {
      EXPECT_LT(MaxRelDiff(tp[0].step_logits[s], tp1[0].step_logits[s], c.vocab), 1e-5) << n << " " << s;
    }
  }
}

// ---------------------------------------------------------------------------

TEST(CpuModelTest, CreateRejectsBadArguments) {
  const ModelConfig c = Tiny();
  LocalComm local;
  auto comms = ThreadGroupComm::Create(2, absl::Seconds(1));
  EXPECT_THAT(CpuModel::Create(c, 0, 3, 4, nullptr), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3")));
  EXPECT_THAT(CpuModel::Create(c, 0, 2, 4, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("HostComm")));
  EXPECT_THAT(CpuModel::Create(c, 1, 2, 4, comms[0].get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 0 of 2")));
  EXPECT_THAT(CpuModel::Create(c, 0, 2, 4, &local),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 0 of 1")));
  EXPECT_THAT(CpuModel::Create(c, 0, 1, 0, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_kv_blocks")));
  EXPECT_THAT(CpuModel::Create(c, 0, 1, 4, nullptr, CpuModelOptions{.max_host_bytes = 1024}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_host_bytes")));
}

TEST(CpuModelTest, BigPresetsFailFastInsteadOfAllocating) {
  // The default host limit (min(4 GiB, half of RAM)) rejects the llama shapes
  // before anything is allocated, at TP 1 and as one rank of TP 8.
  for (const char* name : {"llama-70b-shape", "llama-8b-shape"}) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig(name));
    EXPECT_THAT(CpuModel::Create(c, 0, 1, 1024, nullptr),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         ::testing::AllOf(HasSubstr(name), HasSubstr("GiB"), HasSubstr("max_host_bytes"))));
    auto comms = ThreadGroupComm::Create(8, absl::Seconds(1));
    EXPECT_THAT(CpuModel::Create(c, 3, 8, 1024, comms[3].get()),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("rank 3/8")));
  }
}

TEST(CpuModelTest, ForwardEdgeCases) {
  const ModelConfig c = Tiny();
  ASSERT_OK_AND_ASSIGN(CpuModel m, CpuModel::Create(c, 0, 1, 4, nullptr));
  EXPECT_EQ(m.kv_cache_bytes(), 2u * c.layers * 4 * 16 * 2 * 32 * sizeof(float));
  EXPECT_EQ(m.weight_bytes(), ParamCount(c) * sizeof(float));
  EXPECT_EQ(m.num_kv_blocks(), 4);
  EXPECT_EQ(m.config().name, "tiny");
  EXPECT_EQ(m.layout().tp_size, 1);
  std::vector<float> l = {1, 2, 3};
  ASSERT_OK(m.Forward(BatchInput(), &l));
  EXPECT_TRUE(l.empty());
  // A bad batch is rejected and leaves the model usable.
  BatchBuilder bad(16, 1);
  ASSERT_OK(bad.Add({1, 2}, 0, {4}, true));  // block 4 of 4 blocks
  EXPECT_THAT(m.Forward(bad.Take(), &l), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_tables")));
  BatchBuilder good(16, 1);
  ASSERT_OK(good.Add({1, 2}, 0, {3}, true));
  ASSERT_OK(m.Forward(good.Take(), &l));
  EXPECT_EQ(l.size(), static_cast<size_t>(c.vocab));
  // Same token, same position, other block -> same logits (pure function of the cache contents).
  std::vector<float> l2;
  BatchBuilder again(16, 1);
  ASSERT_OK(again.Add({1, 2}, 0, {0}, true));
  ASSERT_OK(m.Forward(again.Take(), &l2));
  EXPECT_EQ(l, l2);
  // sample_index may repeat and reorder rows (more samples than tokens).
  BatchBuilder rep(16, 1);
  ASSERT_OK(rep.Add({1, 2}, 0, {1}, false));
  for (int32_t i : {1, 0, 1, 1, 0}) rep.AddSampleIndex(i);
  std::vector<float> l3;
  ASSERT_OK(m.Forward(rep.Take(), &l3));
  ASSERT_EQ(l3.size(), 5u * c.vocab);
  const std::vector<float> row1(l3.begin(), l3.begin() + c.vocab), row0(l3.begin() + c.vocab, l3.begin() + 2 * c.vocab);
  EXPECT_EQ(row1, l);  // token 1 of the chunk is the same (token, position, history) as before
  EXPECT_NE(row0, row1);
  for (int r : {2, 3}) EXPECT_TRUE(std::equal(row1.begin(), row1.end(), l3.begin() + r * c.vocab));
  EXPECT_TRUE(std::equal(row0.begin(), row0.end(), l3.begin() + 4 * c.vocab));
  // Moved-from.
  CpuModel moved = std::move(m);
  EXPECT_THAT(m.Forward(BatchInput(), &l), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  ASSERT_OK(moved.Forward(BatchInput(), &l));
}

}  // namespace
}  // namespace symtp::model

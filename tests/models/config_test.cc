#include "models/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace symtp::model {
namespace {

using ::symtp::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Row {
  const char* name;
  int h, l, nh, nkv, d, f, v;
};

TEST(ConfigTest, PresetsMatchModelMdTable) {
  const Row rows[] = {
      {"tiny", 256, 2, 8, 2, 32, 512, 512},
      {"small", 2048, 4, 16, 4, 128, 5632, 16384},
      {"llama-8b-shape", 4096, 32, 32, 8, 128, 14336, 128256},
      {"llama-70b-shape", 8192, 80, 64, 8, 128, 28672, 128256},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig(r.name));
    EXPECT_EQ(c.name, r.name);
    EXPECT_EQ(c.hidden, r.h);
    EXPECT_EQ(c.layers, r.l);
    EXPECT_EQ(c.heads, r.nh);
    EXPECT_EQ(c.kv_heads, r.nkv);
    EXPECT_EQ(c.head_dim, r.d);
    EXPECT_EQ(c.ffn, r.f);
    EXPECT_EQ(c.vocab, r.v);
    EXPECT_EQ(c.rope_theta, 10000.f);
    EXPECT_EQ(c.rms_eps, 1e-5f);
    EXPECT_EQ(c.block_size, 16);
    EXPECT_EQ(c.max_seq_len, 4096);
    EXPECT_EQ(c.seed, 1234u);
    EXPECT_OK(ValidateConfig(c));
  }
  EXPECT_EQ(PresetNames().size(), 4u);
}

TEST(ConfigTest, UnknownPresetListsValidNames) {
  EXPECT_THAT(PresetConfig("huge"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("huge"), HasSubstr("tiny"), HasSubstr("small"),
                             HasSubstr("llama-8b-shape"), HasSubstr("llama-70b-shape"))));
}

TEST(ConfigTest, OverridesParse) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig("tiny"));
  ASSERT_OK(ApplyOverrides("layers=4,max_seq_len=2048,seed=7", &c));
  EXPECT_EQ(c.layers, 4);
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.hidden, 256);  // untouched
  ASSERT_OK(ApplyOverrides(" rope_theta = 500000 , rms_eps=1e-6 ", &c));
  EXPECT_EQ(c.rope_theta, 500000.f);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  ASSERT_OK(ApplyOverrides("", &c));
  ASSERT_OK(ApplyOverrides("seed=18446744073709551615", &c));
  EXPECT_EQ(c.seed, 18446744073709551615ull);
  // hidden/heads re-derive head_dim unless given.
  ASSERT_OK(ApplyOverrides("hidden=512,ffn=1024", &c));
  EXPECT_EQ(c.head_dim, 64);
  ASSERT_OK(ApplyOverrides("heads=16,kv_heads=4", &c));
  EXPECT_EQ(c.head_dim, 32);
  // heads x head_dim need not equal hidden (one TP rank's shapes as a model).
  ASSERT_OK(ApplyOverrides("heads=8,kv_heads=2,head_dim=32", &c));
  EXPECT_EQ(c.heads * c.head_dim, c.hidden / 2);
  ASSERT_OK_AND_ASSIGN(ModelConfig m, MakeConfig("small", "layers=1"));
  EXPECT_EQ(m.layers, 1);
  EXPECT_EQ(m.hidden, 2048);
}

TEST(ConfigTest, OverridesReject) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig base, PresetConfig("tiny"));
  for (const char* bad :
       {"layers=0", "layers=-1", "layers=abc", "layers=", "foo=1", "layers", "=4",
        "layers=4,layers=5", "layers=4,", "heads=3", "kv_heads=3", "head_dim=31", "rms_eps=-1",
        "rope_theta=nan", "rope_theta=inf", "seed=-1", "max_seq_len=2.5", "layers=99999999999"}) {
    SCOPED_TRACE(bad);
    ModelConfig c = base;
    EXPECT_THAT(ApplyOverrides(bad, &c), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
    EXPECT_EQ(ToJson(c), ToJson(base)) << "config changed on error";
  }
  ModelConfig c = base;
  EXPECT_THAT(ApplyOverrides("fo0=1", &c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fo0")));
}

TEST(ConfigTest, ValidateForTp) {
  ASSERT_OK_AND_ASSIGN(ModelConfig tiny, PresetConfig("tiny"));
  for (int n : {1, 2, 4, 8}) EXPECT_OK(ValidateForTp(tiny, n)) << n;
  EXPECT_THAT(ValidateForTp(tiny, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("3"), HasSubstr("heads"), HasSubstr("tiny"))));
  EXPECT_THAT(ValidateForTp(tiny, 16), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("heads (8) % tp (16)")));
  EXPECT_THAT(ValidateForTp(tiny, 0), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(">= 1")));
  EXPECT_THAT(ValidateForTp(tiny, -2), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  // kv heads: 8 heads, 4 kv heads at TP 8 is fine (replicated); 6 kv heads at TP 4 is not.
  ModelConfig c = tiny;
  ASSERT_OK(ApplyOverrides("kv_heads=4", &c));
  EXPECT_OK(ValidateForTp(c, 8));
  ASSERT_OK(ApplyOverrides("hidden=384,heads=12,kv_heads=6,ffn=768,vocab=768", &c));
  EXPECT_OK(ValidateForTp(c, 3));
  EXPECT_OK(ValidateForTp(c, 6));
  EXPECT_THAT(ValidateForTp(c, 4), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("kv_heads (6) and tp (4)")));
  // ffn / vocab divisibility.
  c = tiny;
  ASSERT_OK(ApplyOverrides("vocab=500", &c));
  EXPECT_THAT(ValidateForTp(c, 8), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab")));
  c = tiny;
  ASSERT_OK(ApplyOverrides("ffn=500", &c));
  EXPECT_THAT(ValidateForTp(c, 8), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ffn")));

  for (const char* big : {"llama-8b-shape", "llama-70b-shape"}) {
    ASSERT_OK_AND_ASSIGN(ModelConfig b, PresetConfig(big));
    for (int n : {1, 2, 4, 8}) EXPECT_OK(ValidateForTp(b, n)) << big << " " << n;
  }
}

TEST(ConfigTest, JsonAndParamCount) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig("tiny"));
  const std::string j = ToJson(c);
  for (const char* s : {"\"name\":\"tiny\"", "\"hidden\":256", "\"layers\":2", "\"heads\":8",
                        "\"kv_heads\":2", "\"head_dim\":32", "\"ffn\":512", "\"vocab\":512",
                        "\"rope_theta\":10000", "\"block_size\":16", "\"max_seq_len\":4096",
                        "\"seed\":1234"}) {
    EXPECT_THAT(j, HasSubstr(s));
  }
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(j.back(), '}');
  // Llama-3-8B's published parameter count (untied embeddings, GQA 8 kv heads).
  ASSERT_OK_AND_ASSIGN(ModelConfig l8, PresetConfig("llama-8b-shape"));
  EXPECT_EQ(ParamCount(l8), 8030261248u);
  // tiny by hand: embed + lm_head 512x256 each; per layer two norms, wq and wo
  // 256x256, wk and wv 64x256, three 512x256 MLP matrices; final norm.
  const size_t per_layer = 2 * 256 + 2 * 256 * 256 + 2 * 64 * 256 + 3 * 512 * 256;
  EXPECT_EQ(ParamCount(c), 2 * 512 * 256 + 2 * per_layer + 256);
}

}  // namespace
}  // namespace symtp::model

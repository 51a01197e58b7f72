#include "engine/model_config.h"

#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/runfiles.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr float kInf = std::numeric_limits<float>::infinity();

using common::Runfile;

// A small valid Nemotron-H config.json, stated only by hybrid_override_pattern.
Json NemotronBase() {
  return Json{
      {"model_type", "nemotron_h"},
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"hybrid_override_pattern", "M*M-"},
      {"mamba_num_heads", 4},
      {"mamba_head_dim", 16},
      {"ssm_state_size", 8},
      {"n_groups", 2},
      {"conv_kernel", 4},
      {"chunk_size", 16},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 8},
      {"intermediate_size", 48},
      {"mlp_hidden_act", "relu2"},
      {"layer_norm_epsilon", 1e-5},
      {"eos_token_id", 2},
  };
}

Json Mamba2Base() {
  return Json{
      {"model_type", "mamba2"},
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"num_hidden_layers", 3},
      {"num_heads", 4},
      {"head_dim", 16},
      {"state_size", 8},
      {"n_groups", 2},
      {"expand", 2},
      {"chunk_size", 32},
      {"tie_word_embeddings", true},
  };
}

absl::Status ParseStatus(const Json& j) { return ParseModelConfig(j.dump()).status(); }

void ExpectError(const Json& j, absl::StatusCode code, absl::string_view substring) {
  absl::Status s = ParseStatus(j);
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(substring)));
}

TEST(ModelConfigTest, NemotronHTinyFixtureParsesFromLayersBlockType) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(Runfile("tests/fixtures/golden/nemotron_h_tiny/config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kNemotronH);
  EXPECT_EQ(c->vocab_size, 96);
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->LayerPattern(), "M*M-M*-");
  EXPECT_EQ(c->CountLayers(LayerKind::kMamba2), 3);
  EXPECT_EQ(c->CountLayers(LayerKind::kAttention), 2);
  EXPECT_EQ(c->CountLayers(LayerKind::kMlp), 2);
  const Mamba2Params& m = c->mamba;
  EXPECT_EQ(m.num_heads, 4);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.state_size, 16);
  EXPECT_EQ(m.n_groups, 2);
  EXPECT_EQ(m.conv_kernel, 4);
  EXPECT_EQ(m.chunk_size, 16);
  EXPECT_TRUE(m.use_conv_bias);
  EXPECT_FALSE(m.use_in_proj_bias);
  EXPECT_FALSE(m.use_out_proj_bias);
  EXPECT_EQ(m.d_inner(), 64);
  EXPECT_EQ(m.conv_dim(), 128);
  EXPECT_EQ(m.in_proj_rows(), 196);
  EXPECT_EQ(m.norm_group_size, 32);  // d_inner / n_groups
  EXPECT_FLOAT_EQ(m.time_step_min, 0.001f);
  EXPECT_FLOAT_EQ(m.time_step_max, 0.1f);
  EXPECT_EQ(m.time_step_limit.min, 0.0f);
  EXPECT_EQ(m.time_step_limit.max, kInf);  // {"__float__": "Infinity"}
  EXPECT_EQ(m.prefill_dt_clamp.min, 0.001f);
  EXPECT_EQ(m.prefill_dt_clamp.max, kInf);
  EXPECT_TRUE(m.decode_dt_clamp.IsNoOp());
  EXPECT_EQ(c->attention.num_heads, 4);
  EXPECT_EQ(c->attention.num_kv_heads, 2);
  EXPECT_EQ(c->attention.head_dim, 8);
  EXPECT_FALSE(c->attention.use_rope);
  EXPECT_EQ(c->mlp.intermediate_size, 64);
  EXPECT_EQ(c->mlp.activation, MlpActivation::kRelu2);
  EXPECT_FALSE(c->mlp.use_bias);
  EXPECT_FLOAT_EQ(c->norm_eps, 1e-5f);
  EXPECT_FALSE(c->residual_in_fp32);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_THAT(c->bos_token_ids, ElementsAre(1));
  EXPECT_THAT(c->pad_token_ids, ElementsAre(0));
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_EQ(c->dtype, "float32");
}

TEST(ModelConfigTest, Mamba2TinyFixtureParsesWithWholeWidthNormAndLimitClamps) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(Runfile("tests/fixtures/golden/mamba2_tiny/config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kMamba2);
  EXPECT_EQ(c->LayerPattern(), "MMMM");
  EXPECT_EQ(c->mamba.num_heads, 4);
  EXPECT_EQ(c->mamba.head_dim, 16);
  EXPECT_EQ(c->mamba.state_size, 16);
  EXPECT_EQ(c->mamba.n_groups, 2);
  EXPECT_EQ(c->mamba.chunk_size, 16);
  EXPECT_EQ(c->mamba.norm_group_size, 32);  // d_inner 64 / n_groups 2, as transformers' Mamba2
  EXPECT_EQ(c->mamba.prefill_dt_clamp.min, 0.0f);
  EXPECT_EQ(c->mamba.prefill_dt_clamp.max, kInf);
  EXPECT_TRUE(c->mamba.decode_dt_clamp.IsNoOp());
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->residual_in_fp32);
  EXPECT_EQ(c->vocab_size, 96);
}

TEST(ModelConfigTest, DefaultModelParsesFromBothPatternForms) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(Runfile("models/default/config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerPattern(), "M-M*-M-M*-M-");
  EXPECT_EQ(c->num_layers(), 12);
  EXPECT_EQ(c->vocab_size, 259);
  EXPECT_EQ(c->hidden_size, 128);
  EXPECT_EQ(c->mamba.chunk_size, 64);
  EXPECT_EQ(c->mamba.d_inner(), 256);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(258));
  EXPECT_EQ(c->max_position_embeddings, 8192);
}

TEST(ModelConfigTest, PatternStringMapsSymbolsToKinds) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(NemotronBase().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layers,
            (std::vector<LayerKind>{LayerKind::kMamba2, LayerKind::kAttention, LayerKind::kMamba2, LayerKind::kMlp}));
  // Defaults of fields left out.
  EXPECT_TRUE(c->bos_token_ids.empty());
  EXPECT_EQ(c->max_position_embeddings, 0);
  EXPECT_EQ(c->dtype, "");
}

TEST(ModelConfigTest, LegacyBlockTypeNamesAreAccepted) {
  Json j = NemotronBase();
  j.erase("hybrid_override_pattern");
  j["layers_block_type"] = {"mamba", "attention", "linear_attention", "mlp", "full_attention"};
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerPattern(), "M*M-*");
}

TEST(ModelConfigTest, AgreeingPatternFormsAndLayerCountAreAccepted) {
  Json j = NemotronBase();
  j["layers_block_type"] = {"linear_attention", "full_attention", "linear_attention", "mlp"};
  j["num_hidden_layers"] = 4;
  EXPECT_TRUE(ParseModelConfig(j.dump()).ok());
}

TEST(ModelConfigTest, DisagreeingPatternFormsAreInvalid) {
  Json j = NemotronBase();
  j["layers_block_type"] = {"linear_attention", "mlp", "linear_attention", "mlp"};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "hybrid_override_pattern (\"M*M-\") and layers_block_type");
}

TEST(ModelConfigTest, LayerCountMismatchIsInvalid) {
  Json j = NemotronBase();
  j["num_hidden_layers"] = 5;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "num_hidden_layers (5)");
}

TEST(ModelConfigTest, UnknownLayerSymbolsAreInvalid) {
  Json j = NemotronBase();
  j["hybrid_override_pattern"] = "M*X";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "unknown symbol 'X'");
  j = NemotronBase();
  j.erase("hybrid_override_pattern");
  j["layers_block_type"] = {"linear_attention", "conv"};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "layers_block_type[1] has unknown block type \"conv\"");
  j["layers_block_type"] = {"linear_attention", 3};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "layers_block_type[1] must be a string");
}

TEST(ModelConfigTest, MissingOrEmptyPatternIsInvalid) {
  Json j = NemotronBase();
  j.erase("hybrid_override_pattern");
  ExpectError(j, absl::StatusCode::kInvalidArgument, "hybrid_override_pattern or layers_block_type is required");
  j["hybrid_override_pattern"] = "";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "layer pattern is empty");
}

TEST(ModelConfigTest, LegacyMambaFieldNamesAreAccepted) {
  Json j = NemotronBase();
  for (const char* key : {"n_groups", "conv_kernel", "chunk_size"}) j.erase(key);
  j["mamba_n_groups"] = 4;
  j["mamba_d_conv"] = 3;
  j["mamba_chunk_size"] = 64;
  j["mamba_conv_bias"] = false;
  j["mamba_expand"] = 2;
  j["mamba_dt_min"] = 0.002;
  j["mamba_dt_max"] = 0.2;
  j["mamba_dt_limit"] = {0.0, 10.0};
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mamba.n_groups, 4);
  EXPECT_EQ(c->mamba.conv_kernel, 3);
  EXPECT_EQ(c->mamba.chunk_size, 64);
  EXPECT_FALSE(c->mamba.use_conv_bias);
  EXPECT_FLOAT_EQ(c->mamba.time_step_min, 0.002f);
  EXPECT_FLOAT_EQ(c->mamba.time_step_max, 0.2f);
  EXPECT_EQ(c->mamba.time_step_limit.max, 10.0f);
  EXPECT_EQ(c->mamba.norm_group_size, 16);
  // Nemotron-H's prefill clamp is time_step_min; time_step_limit is ignored.
  EXPECT_EQ(c->mamba.prefill_dt_clamp.min, 0.002f);
  EXPECT_EQ(c->mamba.prefill_dt_clamp.max, kInf);
}

TEST(ModelConfigTest, LegacyAndCurrentNamesMustAgree) {
  Json j = NemotronBase();
  j["mamba_n_groups"] = 4;  // n_groups is 2
  ExpectError(j, absl::StatusCode::kInvalidArgument, "n_groups (2) and its legacy name mamba_n_groups (4) disagree");
  j = NemotronBase();
  j["mamba_n_groups"] = 2;
  EXPECT_TRUE(ParseModelConfig(j.dump()).ok());
}

TEST(ModelConfigTest, BareInfinityTokenIsAcceptedOutsideStrings) {
  std::string text = NemotronBase().dump();
  text.pop_back();  // the closing brace
  text += R"(,"time_step_limit":[0.0, Infinity],"dtype":"Infinity NaN -Infinity"})";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mamba.time_step_limit.max, kInf);
  EXPECT_EQ(c->dtype, "Infinity NaN -Infinity");  // strings are left alone
}

TEST(ModelConfigTest, NegativeOrNanLimitsAreInvalid) {
  std::string text = NemotronBase().dump();
  text.pop_back();
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text + R"(,"time_step_limit":[-Infinity, Infinity]})");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("time_step_limit"));
  c = ParseModelConfig(text + R"(,"time_step_limit":[NaN, 1.0]})");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  c = ParseModelConfig(text + R"(,"time_step_limit":[0.0]})");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, HeadsNotDivisibleByGroupsIsInvalid) {
  Json j = NemotronBase();
  j["mamba_num_heads"] = 24;
  j["n_groups"] = 5;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "mamba_num_heads (24) is not divisible by n_groups (5)");
  j = Mamba2Base();
  j["n_groups"] = 3;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "num_heads (4) is not divisible by n_groups (3)");
}

TEST(ModelConfigTest, Mamba2HeadsTimesHeadDimMustEqualExpandTimesHidden) {
  Json j = Mamba2Base();
  j["head_dim"] = 8;
  ExpectError(j, absl::StatusCode::kInvalidArgument,
              "num_heads (4) * head_dim (8) = 32 does not match expand (2) * hidden_size (32) = 64");
}

TEST(ModelConfigTest, NemotronExpandIsNotTiedToMambaWidth) {
  Json j = NemotronBase();
  j["expand"] = 3;  // 4 * 16 != 3 * 32, as in real Nemotron-Nano-9B-v2 configs
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mamba.d_inner(), 64);
}

TEST(ModelConfigTest, AttentionHeadsNotDivisibleByKvHeadsIsInvalid) {
  Json j = NemotronBase();
  j["num_attention_heads"] = 6;
  j["num_key_value_heads"] = 4;
  ExpectError(j, absl::StatusCode::kInvalidArgument,
              "num_attention_heads (6) is not divisible by num_key_value_heads (4)");
}

TEST(ModelConfigTest, NullKvHeadsMeansOneKvHeadPerQueryHead) {
  Json j = NemotronBase();
  j["num_key_value_heads"] = nullptr;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.num_kv_heads, 4);
}

TEST(ModelConfigTest, ChunkSizeMustBeAPowerOfTwo) {
  Json j = NemotronBase();
  j["chunk_size"] = 100;
  ExpectError(j, absl::StatusCode::kInvalidArgument,
              "chunk_size (100) must be a power of two (the engine runs powers of two only; transformers runs any)");
  j["chunk_size"] = 0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "chunk_size (0)");
}

TEST(ModelConfigTest, MissingRequiredFieldsAreNamed) {
  for (const char* key : {"vocab_size", "hidden_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                          "n_groups", "num_attention_heads", "head_dim", "intermediate_size", "model_type"}) {
    Json j = NemotronBase();
    j.erase(key);
    ExpectError(j, absl::StatusCode::kInvalidArgument, absl::StrCat(key, " is required but missing"));
  }
  for (const char* key : {"num_hidden_layers", "num_heads", "head_dim", "state_size", "n_groups"}) {
    Json j = Mamba2Base();
    j.erase(key);
    ExpectError(j, absl::StatusCode::kInvalidArgument, absl::StrCat(key, " is required but missing"));
  }
}

TEST(ModelConfigTest, KindFieldsAreRequiredOnlyWhenTheKindIsPresent) {
  Json j = NemotronBase();
  j["hybrid_override_pattern"] = "M-M-";
  for (const char* key : {"num_attention_heads", "num_key_value_heads", "head_dim"}) j.erase(key);
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.num_heads, 0);
  j = NemotronBase();
  j["hybrid_override_pattern"] = "*-";
  for (const char* key : {"mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups"}) j.erase(key);
  EXPECT_TRUE(ParseModelConfig(j.dump()).ok());
}

TEST(ModelConfigTest, WrongTypesAreNamed) {
  Json j = NemotronBase();
  j["hidden_size"] = "32";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "hidden_size must be an integer");
  j = NemotronBase();
  j["hidden_size"] = 32.5;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "hidden_size must be an integer");
  j = NemotronBase();
  j["use_conv_bias"] = 1;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "use_conv_bias must be true or false");
  j = NemotronBase();
  j["hybrid_override_pattern"] = Json::array({"M"});
  ExpectError(j, absl::StatusCode::kInvalidArgument, "hybrid_override_pattern must be a string");
  j = NemotronBase();
  j["layer_norm_epsilon"] = "small";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "layer_norm_epsilon must be a number");
  j = NemotronBase();
  j["eos_token_id"] = Json::array({2, "x"});
  ExpectError(j, absl::StatusCode::kInvalidArgument, "eos_token_id[1] must be an integer");
}

TEST(ModelConfigTest, OutOfRangeValuesAreNamed) {
  Json j = NemotronBase();
  j["hidden_size"] = 0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "hidden_size (0)");
  j = NemotronBase();
  j["vocab_size"] = -3;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "vocab_size (-3)");
  j = NemotronBase();
  j["mamba_head_dim"] = int64_t{1} << 40;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "mamba_head_dim");
  j = NemotronBase();
  j["eos_token_id"] = 64;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "eos_token_id (64) is outside the vocabulary");
  j = NemotronBase();
  j["layer_norm_epsilon"] = 0.0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "layer_norm_epsilon");
  j = NemotronBase();
  j["time_step_min"] = 0.5;
  j["time_step_max"] = 0.1;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "time_step_min (0.5) and time_step_max (0.1)");
  j = NemotronBase();
  j["conv_kernel"] = 0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "conv_kernel (0)");
}

TEST(ModelConfigTest, UnsupportedFeaturesAreUnimplementedAndNamed) {
  Json j = NemotronBase();
  j["model_type"] = "llama";
  ExpectError(j, absl::StatusCode::kUnimplemented, "model_type \"llama\"");
  j = NemotronBase();
  j["mlp_hidden_act"] = "gelu";
  ExpectError(j, absl::StatusCode::kUnimplemented, "mlp_hidden_act \"gelu\"");
  j = NemotronBase();
  j["mamba_hidden_act"] = "relu";
  ExpectError(j, absl::StatusCode::kUnimplemented, "mamba_hidden_act \"relu\"");
  j = Mamba2Base();
  j["hidden_act"] = "gelu";
  ExpectError(j, absl::StatusCode::kUnimplemented, "hidden_act \"gelu\"");
}

// What transformers 5.23 reads and then does not use is accepted and changes
// nothing: NemotronHAttention has no biases and attends to the whole prefix
// whatever attention_bias and sliding_window say; Mamba2Mixer gates before its
// norm whatever norm_before_gate says. The same model, the same fingerprint.
TEST(ModelConfigTest, FieldsTransformersIgnoresAreAcceptedAndChangeNothing) {
  const std::string nemotron = ParseModelConfig(NemotronBase().dump())->CanonicalString();
  Json j = NemotronBase();
  j["attention_bias"] = true;
  j["sliding_window"] = 1024;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->attention.use_bias);
  EXPECT_EQ(c->CanonicalString(), nemotron);
  j["sliding_window"] = nullptr;
  ASSERT_TRUE(ParseModelConfig(j.dump()).ok());
  j["sliding_window"] = "wide";  // still read: a malformed value is refused by name
  ExpectError(j, absl::StatusCode::kInvalidArgument, "sliding_window");
  j = NemotronBase();
  j["attention_bias"] = "yes";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "attention_bias must be true or false");

  const std::string mamba2 = ParseModelConfig(Mamba2Base().dump())->CanonicalString();
  j = Mamba2Base();
  j["norm_before_gate"] = true;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->mamba.norm_before_gate);
  EXPECT_EQ(c->CanonicalString(), mamba2);
  j["norm_before_gate"] = 1;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "norm_before_gate must be true or false");
}

TEST(ModelConfigTest, MalformedJsonIsInvalid) {
  EXPECT_EQ(ParseModelConfig("{\"model_type\": ").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfig("[1, 2]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfig("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfig("{} trailing").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, TokenIdsAcceptIntListOrNull) {
  Json j = NemotronBase();
  j["eos_token_id"] = {2, 3};
  j["bos_token_id"] = nullptr;
  j["pad_token_id"] = 0;
  j["torch_dtype"] = "bfloat16";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2, 3));
  EXPECT_TRUE(c->bos_token_ids.empty());
  EXPECT_THAT(c->pad_token_ids, ElementsAre(0));
  EXPECT_EQ(c->dtype, "bfloat16");
}

TEST(ModelConfigTest, NameOrPathIsReadAndLeftOutOfTheCanonicalString) {
  Json j = NemotronBase();
  absl::StatusOr<ModelConfig> unnamed = ParseModelConfig(j.dump());
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  EXPECT_EQ(unnamed->name_or_path, "");
  j["_name_or_path"] = "nvidia/Nemotron-H-8B-Base-8K";
  absl::StatusOr<ModelConfig> named = ParseModelConfig(j.dump());
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->name_or_path, "nvidia/Nemotron-H-8B-Base-8K");
  EXPECT_EQ(named->CanonicalString(), unnamed->CanonicalString());
  j["_name_or_path"] = 3;
  EXPECT_THAT(ParseModelConfig(j.dump()).status().message(), HasSubstr("_name_or_path must be a string"));
}

TEST(ModelConfigTest, Mamba2DefaultsFollowTransformers) {
  Json j = Mamba2Base();
  j.erase("chunk_size");
  j.erase("expand");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mamba.chunk_size, 256);
  EXPECT_EQ(c->mamba.conv_kernel, 4);
  EXPECT_TRUE(c->mamba.use_conv_bias);
  EXPECT_TRUE(c->residual_in_fp32);
  j = Mamba2Base();
  j["time_step_limit"] = {0.01, 5.0};
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mamba.prefill_dt_clamp.min, 0.01f);
  EXPECT_EQ(c->mamba.prefill_dt_clamp.max, 5.0f);
  EXPECT_TRUE(c->mamba.decode_dt_clamp.IsNoOp());  // transformers' one-step decode does not clamp
}

TEST(ModelConfigTest, CanonicalStringIsStableAndSeparatesModels) {
  absl::StatusOr<ModelConfig> a = ParseModelConfig(NemotronBase().dump());
  absl::StatusOr<ModelConfig> b = ParseModelConfig(NemotronBase().dump());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->CanonicalString(), b->CanonicalString());
  Json j = NemotronBase();
  j["chunk_size"] = 32;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->CanonicalString(), c->CanonicalString());
  j = NemotronBase();
  j["eos_token_id"] = 3;  // does not change what the model computes
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(a->CanonicalString(), c->CanonicalString());
}

TEST(ModelConfigTest, ValidateRejectsHandEditedInconsistency) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(Mamba2Base().dump());
  ASSERT_TRUE(c.ok());
  ModelConfig edited = *c;
  edited.layers.push_back(LayerKind::kAttention);
  EXPECT_EQ(edited.Validate().code(), absl::StatusCode::kInvalidArgument);
  edited = *c;
  edited.mamba.norm_group_size = 48;  // does not divide d_inner 64
  EXPECT_EQ(edited.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadModelConfig("/nonexistent/config.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hybridserve::engine

// ModelConfig of the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5 dense and
// MoE, text-only and image-text forms): blocks, kind parameters, state layout,
// fingerprint, refusals.

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "engine/model_config.h"
#include "engine/state_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// A small Qwen3-Next: attention first, a dense layer (mlp_only_layers), n_v = 2 n_k, dk != dv.
Json Qwen3NextBase() {
  return Json{
      {"model_type", "qwen3_next"},
      {"vocab_size", 256},
      {"hidden_size", 64},
      {"num_hidden_layers", 4},
      {"layer_types", {"full_attention", "linear_attention", "linear_attention", "full_attention"}},
      {"linear_num_key_heads", 2},
      {"linear_num_value_heads", 4},
      {"linear_key_head_dim", 16},
      {"linear_value_head_dim", 8},
      {"linear_conv_kernel_dim", 4},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 16},
      {"partial_rotary_factor", 0.25},
      {"rope_theta", 10000.0},
      {"rms_norm_eps", 1e-6},
      {"intermediate_size", 96},
      {"num_experts", 8},
      {"num_experts_per_tok", 2},
      {"moe_intermediate_size", 32},
      {"shared_expert_intermediate_size", 48},
      {"mlp_only_layers", {1}},
      {"eos_token_id", 2},
      {"tie_word_embeddings", false},
  };
}

absl::StatusOr<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump()); }

TEST(ModelConfigQwenTest, Qwen3NextIsMixerThenFeedForwardPerDecoderLayer) {
  absl::StatusOr<ModelConfig> c = Parse(Qwen3NextBase());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen3Next);
  EXPECT_EQ(c->LayerPattern(), "*EDGDE*E");
  EXPECT_EQ(c->RecurrentLayers(), 2);
  EXPECT_EQ(c->SsmLayers(), 0);
  EXPECT_EQ(c->KvLayers(), 2);
  EXPECT_EQ(c->chunk_size(), 64);
  EXPECT_EQ(c->gdn.num_k_heads, 2);
  EXPECT_EQ(c->gdn.num_v_heads, 4);
  EXPECT_EQ(c->gdn.conv_dim(), 2 * 2 * 16 + 4 * 8);
  EXPECT_EQ(c->gdn.in_proj_rows(), c->gdn.conv_dim() + 4 * 8 + 2 * 4);
  EXPECT_TRUE(c->attention.output_gate);
  EXPECT_TRUE(c->attention.qk_norm);
  EXPECT_TRUE(c->attention.use_rope);
  EXPECT_EQ(c->attention.rotary_dim, 4);
  EXPECT_EQ(c->moe.router, MoeRouter::kSoftmaxTopK);
  EXPECT_TRUE(c->moe.shared_gate);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.shared_intermediate_size, 48);
  EXPECT_EQ(c->gated_mlp.intermediate_size, 96);
  EXPECT_FLOAT_EQ(c->norm_eps, 1e-6f);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{2});

  // The recurrent arrays: [v_heads, k_head_dim, v_head_dim] and [conv_dim, kernel - 1].
  const StateLayout l = StateLayout::ForModel(*c, 16);
  EXPECT_EQ(l.mamba_layers, 2);
  EXPECT_EQ(l.ssm_heads, 4);
  EXPECT_EQ(l.ssm_head_dim, 16);
  EXPECT_EQ(l.ssm_state, 8);
  EXPECT_EQ(l.conv_dim, 96);
  EXPECT_EQ(l.conv_kernel, 4);
  EXPECT_EQ(l.attention_layers, 2);
  EXPECT_EQ(l.recurrent_state_bytes(), 2 * 4 * (4 * 16 * 8 + 96 * 3));
}

TEST(ModelConfigQwenTest, Qwen35DenseTextFormTakesThePatternFromTheInterval) {
  Json j = Qwen3NextBase();
  j["model_type"] = "qwen3_5_text";
  j.erase("layer_types");
  j["full_attention_interval"] = 2;
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                          "shared_expert_intermediate_size", "mlp_only_layers"}) {
    j.erase(key);
  }
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen3_5);
  EXPECT_EQ(c->LayerPattern(), "DG*GDG*G");
  EXPECT_EQ(c->CountLayers(LayerKind::kMoe), 0);
}

TEST(ModelConfigQwenTest, Qwen35MoeImageTextFormReadsItsTextConfig) {
  Json text = Qwen3NextBase();
  text["model_type"] = "qwen3_5_moe_text";
  text.erase("mlp_only_layers");
  text.erase("tie_word_embeddings");
  text["eos_token_id"] = 7;
  const Json j{{"model_type", "qwen3_5_moe"},
               {"text_config", text},
               {"vision_config", {{"depth", 2}}},
               {"tie_word_embeddings", true},
               {"dtype", "bfloat16"}};
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen3_5Moe);
  EXPECT_EQ(c->LayerPattern(), "*EDEDE*E");
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{7});
  EXPECT_TRUE(c->tie_word_embeddings);  // the image-text form ties by its top-level field
  EXPECT_EQ(c->dtype, "bfloat16");
  EXPECT_EQ(c->hidden_size, 64);
  // The vision tower is named among what is not run.
  bool vision = false;
  for (const std::string& what : c->ignored) vision = vision || what.rfind("vision_config", 0) == 0;
  EXPECT_TRUE(vision) << "ignored: " << c->ignored.size();
}

TEST(ModelConfigQwenTest, TheFingerprintCoversTheNewKindsAndTheFamily) {
  const std::string base = Parse(Qwen3NextBase())->CanonicalString();
  EXPECT_THAT(base, HasSubstr("gated_deltanet{k_heads=2,v_heads=4,k_dim=16,v_dim=8,conv=4,chunk=64};"));
  EXPECT_THAT(base, HasSubstr("attention_gated{output_gate=1,qk_norm=1};"));
  EXPECT_THAT(base, HasSubstr("moe_shared_gate=1;"));
  EXPECT_THAT(base, HasSubstr("zero_centred_norms=1;"));
  for (const char* key : {"linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"}) {
    Json j = Qwen3NextBase();
    j[key] = j[key].get<int64_t>() * 2;
    absl::StatusOr<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << key << ": " << c.status();
    EXPECT_NE(c->CanonicalString(), base) << key;
  }
  Json j = Qwen3NextBase();
  j["model_type"] = "qwen3_5_moe_text";
  j.erase("mlp_only_layers");
  Json k = Qwen3NextBase();
  k.erase("mlp_only_layers");
  EXPECT_NE(Parse(j)->CanonicalString(), Parse(k)->CanonicalString());
}

TEST(ModelConfigQwenTest, WhatCannotRunIsRefusedByName) {
  Json j = Qwen3NextBase();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  absl::Status s = Parse(j).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rope_type \"yarn\""));

  j = Qwen3NextBase();
  j["linear_num_value_heads"] = 3;
  s = Parse(j).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("linear_num_value_heads"));

  j = Qwen3NextBase();
  j["eos_token_id"] = 256;
  s = Parse(j).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("eos_token_id"));
}

TEST(ModelConfigQwenTest, ValidateRefusesGatedDeltaNetBlocksOutsideTheQwenFamilies) {
  ModelConfig c = *Parse(Qwen3NextBase());
  c.family = ModelFamily::kBamba;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("Gated DeltaNet"));
  c = *Parse(Qwen3NextBase());
  c.gdn.chunk_size = 48;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("power of two"));
}

}  // namespace
}  // namespace hybridserve::engine

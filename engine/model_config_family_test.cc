// Parsing the config.json of the decoder-layer families (Bamba,
// GraniteMoeHybrid): each decoder layer becomes a mixer block and a
// feed-forward block; what cannot run is refused by name.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// As transformers 5.23 writes a small BambaConfig.
Json BambaBase() {
  return Json{
      {"model_type", "bamba"},
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"intermediate_size", 48},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"attn_layer_indices", {1}},
      {"mamba_n_heads", 4},
      {"mamba_d_head", 16},
      {"mamba_n_groups", 2},
      {"mamba_d_state", 8},
      {"mamba_expand", 2},
      {"mamba_chunk_size", 16},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-5},
      {"rope_parameters", {{"partial_rotary_factor", 0.5}, {"rope_theta", 10000.0}, {"rope_type", "default"}}},
      {"time_step_limit", {0.0, {{"__float__", "Infinity"}}}},
  };
}

// As transformers 5.23 writes a small GraniteMoeHybridConfig (MoE, no RoPE).
Json GraniteBase() {
  return Json{
      {"model_type", "granitemoehybrid"},
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"intermediate_size", 16},
      {"shared_intermediate_size", 24},
      {"num_local_experts", 4},
      {"num_experts_per_tok", 2},
      {"num_hidden_layers", 3},
      {"layer_types", {"linear_attention", "full_attention", "linear_attention"}},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"mamba_n_heads", 4},
      {"mamba_d_head", 16},
      {"mamba_d_state", 8},
      {"mamba_chunk_size", 16},
      {"position_embedding_type", nullptr},
      {"embedding_multiplier", 12.0},
      {"residual_multiplier", 0.22},
      {"attention_multiplier", 0.0078125},
      {"logits_scaling", 6.0},
  };
}

// As transformers 5.23 writes a small NemotronHConfig with an 'E' block.
Json NemotronMoeBase() {
  return Json{
      {"model_type", "nemotron_h"},
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"layers_block_type", {"linear_attention", "moe", "full_attention", "mlp"}},
      {"mamba_num_heads", 4},
      {"mamba_head_dim", 16},
      {"ssm_state_size", 8},
      {"n_groups", 2},
      {"chunk_size", 16},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 8},
      {"intermediate_size", 48},
      {"n_routed_experts", 8},
      {"moe_intermediate_size", 16},
      {"moe_shared_expert_intermediate_size", 24},
      {"num_experts_per_tok", 2},
      {"n_group", 2},
      {"topk_group", 1},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", 2.5},
      {"moe_latent_size", nullptr},
  };
}

absl::StatusOr<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump()); }

void ExpectError(const Json& j, absl::StatusCode code, absl::string_view substring) {
  absl::Status s = Parse(j).status();
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(substring)));
}

TEST(ModelConfigFamilyTest, BambaLayersAreMixerThenGatedMlp) {
  absl::StatusOr<ModelConfig> c = Parse(BambaBase());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kBamba);
  EXPECT_EQ(c->LayerPattern(), "MG*GMGMG");
  EXPECT_EQ(c->mamba.d_inner(), 64);
  EXPECT_EQ(c->mamba.norm_group_size, 32);
  EXPECT_EQ(c->mamba.prefill_dt_clamp.min, 0.0f);
  EXPECT_TRUE(c->mamba.decode_dt_clamp.IsNoOp());
  EXPECT_EQ(c->attention.head_dim, 8);
  EXPECT_TRUE(c->attention.use_rope);
  EXPECT_EQ(c->attention.rotary_dim, 4);  // rope_parameters.partial_rotary_factor 0.5
  EXPECT_EQ(c->attention.rope_theta, 10000.0);
  EXPECT_EQ(c->attention.scale, 0.0f);
  EXPECT_EQ(c->gated_mlp.intermediate_size, 48);
  EXPECT_FALSE(c->gated_mlp.use_bias);
  EXPECT_EQ(c->residual_multiplier, 1.0f);
}

TEST(ModelConfigFamilyTest, BambaWithoutAttentionIndicesIsAllMamba) {
  Json j = BambaBase();
  j.erase("attn_layer_indices");
  j["mlp_bias"] = true;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerPattern(), "MGMGMGMG");
  EXPECT_TRUE(c->gated_mlp.use_bias);
}

TEST(ModelConfigFamilyTest, GraniteMoeLayersAndMultipliers) {
  absl::StatusOr<ModelConfig> c = Parse(GraniteBase());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kGraniteMoeHybrid);
  EXPECT_EQ(c->LayerPattern(), "ME*EME");
  EXPECT_EQ(c->moe.num_experts, 4);
  EXPECT_EQ(c->moe.top_k, 2);
  EXPECT_EQ(c->moe.intermediate_size, 16);
  EXPECT_EQ(c->moe.shared_intermediate_size, 24);
  EXPECT_FALSE(c->attention.use_rope);
  EXPECT_EQ(c->attention.scale, 0.0078125f);
  EXPECT_EQ(c->embedding_multiplier, 12.0f);
  EXPECT_EQ(c->residual_multiplier, 0.22f);
  EXPECT_EQ(c->logits_scaling, 6.0f);
  EXPECT_EQ(c->norm_eps, 1e-6f);  // GraniteMoeHybridConfig's default
}

TEST(ModelConfigFamilyTest, GraniteDenseWithRopeAndLegacyBlockTypes) {
  Json j = GraniteBase();
  j.erase("layer_types");
  j["layers_block_type"] = {"attention", "mamba", "mamba"};
  j["num_local_experts"] = 0;
  j["position_embedding_type"] = "rope";
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerPattern(), "*GMGMG");
  EXPECT_EQ(c->gated_mlp.intermediate_size, 24);  // the shared MLP alone
  EXPECT_TRUE(c->attention.use_rope);
  EXPECT_EQ(c->attention.rotary_dim, 8);
  EXPECT_EQ(c->attention.rope_theta, 500000.0);
}

// The published Granite 4.0-H configs say "nope"; transformers builds rotary
// embeddings only for "rope". null, absent and "nope" are one model: the same
// canonical config (so the same model fingerprint for the same weights).
TEST(ModelConfigFamilyTest, GraniteNopeIsNoPositionsAndTheSameModelAsNull) {
  Json j = GraniteBase();
  absl::StatusOr<ModelConfig> null_positions = Parse(j);
  ASSERT_TRUE(null_positions.ok()) << null_positions.status();
  j["position_embedding_type"] = "nope";
  absl::StatusOr<ModelConfig> nope = Parse(j);
  ASSERT_TRUE(nope.ok()) << nope.status();
  EXPECT_FALSE(nope->attention.use_rope);
  EXPECT_EQ(nope->attention.rotary_dim, 0);
  EXPECT_EQ(nope->CanonicalString(), null_positions->CanonicalString());
  j.erase("position_embedding_type");
  absl::StatusOr<ModelConfig> absent = Parse(j);
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->CanonicalString(), nope->CanonicalString());
  j["position_embedding_type"] = "rope";
  absl::StatusOr<ModelConfig> rope = Parse(j);
  ASSERT_TRUE(rope.ok()) << rope.status();
  EXPECT_TRUE(rope->attention.use_rope);
  EXPECT_NE(rope->CanonicalString(), nope->CanonicalString());
}

// transformers 5.23 GraniteMoeHybridModel builds rotary embeddings only for
// "rope": any other string is no positions, as null and "nope" are.
TEST(ModelConfigFamilyTest, GraniteAnyPositionTypeButRopeIsNoPositions) {
  const std::string none = Parse(GraniteBase())->CanonicalString();
  for (const char* type : {"alibi", "NoPE", "absolute"}) {
    Json j = GraniteBase();
    j["position_embedding_type"] = type;
    absl::StatusOr<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << type << ": " << c.status();
    EXPECT_FALSE(c->attention.use_rope) << type;
    EXPECT_EQ(c->CanonicalString(), none) << type;
  }
}

// BambaAttention and GraniteMoeHybridAttention build q/k/v/o_proj with
// bias=config.attention_bias (transformers 5.23), as Falcon-H1 does.
TEST(ModelConfigFamilyTest, BambaAndGraniteAttentionBiases) {
  for (Json base : {BambaBase(), GraniteBase()}) {
    const std::string without = Parse(base)->CanonicalString();
    EXPECT_FALSE(Parse(base)->attention.use_bias);
    Json j = base;
    j["attention_bias"] = true;
    absl::StatusOr<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << base["model_type"] << ": " << c.status();
    EXPECT_TRUE(c->attention.use_bias) << base["model_type"];
    EXPECT_THAT(c->CanonicalString(), HasSubstr("attention_bias=1;"));
    EXPECT_NE(c->CanonicalString(), without);
    j["attention_bias"] = false;
    EXPECT_EQ(Parse(j)->CanonicalString(), without);
    j["attention_bias"] = "yes";
    ExpectError(j, absl::StatusCode::kInvalidArgument, "attention_bias must be true or false");
  }
}

// transformers 5.23 convert_rope_params_to_dict: a set rope_scaling replaces
// rope_parameters; what the object lacks (rope_theta, partial_rotary_factor)
// comes from the top level. Bamba head_dim 8.
TEST(ModelConfigFamilyTest, RopeParametersAsTransformersReadsThem) {
  Json j = BambaBase();
  j["rope_parameters"] = {{"rope_type", "default"}};
  j["rope_theta"] = 500000.0;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.rope_theta, 500000.0);
  EXPECT_EQ(c->attention.rotary_dim, 4);  // BambaConfig's partial_rotary_factor 0.5
  j["rope_scaling"] = {{"type", "default"}, {"partial_rotary_factor", 0.25}};
  j["rope_theta"] = 700000.0;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1.0}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.rope_theta, 700000.0);
  EXPECT_EQ(c->attention.rotary_dim, 2);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  ExpectError(j, absl::StatusCode::kUnimplemented,
              "rope_scaling.rope_type \"linear\" is not supported (only default RoPE is implemented)");
  j["rope_scaling"] = "linear";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "rope_scaling must be an object");
  j["rope_scaling"] = nullptr;  // null: rope_parameters
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.rope_theta, 1.0);
}

TEST(ModelConfigFamilyTest, NemotronHMoeBlocks) {
  absl::StatusOr<ModelConfig> c = Parse(NemotronMoeBase());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerPattern(), "ME*-");
  EXPECT_EQ(c->moe.router, MoeRouter::kSigmoidGroupTopK);
  EXPECT_EQ(c->moe.expert, ExpertKind::kRelu2);
  EXPECT_EQ(c->moe.num_experts, 8);
  EXPECT_EQ(c->moe.up_rows(16), 16);
  EXPECT_EQ(c->moe.shared_intermediate_size, 24);
  EXPECT_EQ(c->moe.n_group, 2);
  EXPECT_EQ(c->moe.routed_scaling_factor, 2.5f);
  Json j = NemotronMoeBase();
  j.erase("layers_block_type");
  j["hybrid_override_pattern"] = "MEE*";
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->CountLayers(LayerKind::kMoe), 2);
}

// moe_latent_size (Nemotron 3 Super and Ultra: 1024 and 2048 at hidden 4096
// and 8192): the routed experts run at that width, the rest of the block at
// hidden_size. null (what save_pretrained writes without it) means none.
TEST(ModelConfigFamilyTest, NemotronHMoeLatentSizeSetsTheExpertWidth) {
  absl::StatusOr<ModelConfig> c = Parse(NemotronMoeBase());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.latent_size, 0);
  EXPECT_EQ(c->moe.expert_dim(c->hidden_size), 32);
  Json j = NemotronMoeBase();
  j["moe_latent_size"] = 12;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.latent_size, 12);
  EXPECT_EQ(c->moe.expert_dim(c->hidden_size), 12);
  EXPECT_EQ(c->moe.intermediate_size, 16);
  EXPECT_EQ(c->moe.shared_intermediate_size, 24);
  // Wider than hidden_size: transformers builds and runs it, so do we.
  j["moe_latent_size"] = 48;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.expert_dim(c->hidden_size), 48);
}

// transformers types moe_latent_size `int | None` (its strict config refuses
// 12.0, true and "12"); 0 builds a zero-width projection its forward fails on,
// a negative size fails at construction.
TEST(ModelConfigFamilyTest, NemotronHMoeLatentSizeMustBeAPositiveInteger) {
  Json j = NemotronMoeBase();
  j["moe_latent_size"] = 0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "moe_latent_size (0) must be in [1, ");
  j["moe_latent_size"] = -4;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "moe_latent_size (-4) must be in [1, ");
  j["moe_latent_size"] = 12.0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "moe_latent_size must be an integer, got 12.0");
  j["moe_latent_size"] = true;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "moe_latent_size must be an integer, got true");
  j["moe_latent_size"] = "12";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "moe_latent_size must be an integer");
  j["moe_latent_size"] = int64_t{1} << 25;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "moe_latent_size (33554432) must be in [1, ");
  // A struct edited by hand is checked too.
  ModelConfig c = *Parse(NemotronMoeBase());
  c.moe.latent_size = -1;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("moe_latent_size (-1)"));
}

// transformers 5.23 NemotronHMoE: shared_experts is a NemotronHMLP (up/down
// with bias=mlp_bias); the routed experts' 3-D weights have no biases.
TEST(ModelConfigFamilyTest, NemotronHMoeMlpBiasIsTheSharedExpertsBiases) {
  const ModelConfig base = *Parse(NemotronMoeBase());
  EXPECT_FALSE(base.moe.shared_bias);
  Json j = NemotronMoeBase();
  j["mlp_bias"] = true;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->moe.shared_bias);
  EXPECT_TRUE(c->mlp.use_bias);  // and the '-' layer's, as before
  EXPECT_THAT(c->CanonicalString(), HasSubstr("moe_shared_bias=1;"));
  EXPECT_NE(c->CanonicalString(), base.CanonicalString());
  j["mlp_bias"] = "yes";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "mlp_bias must be true or false");
  ModelConfig swiglu = *c;  // only the relu2 shared expert has them
  swiglu.moe.expert = ExpertKind::kSwiGlu;
  EXPECT_THAT(std::string(swiglu.Validate().message()), HasSubstr("mlp_bias"));
  // With latent projections transformers gives fc1/fc2_latent_proj biases too: not implemented.
  j["mlp_bias"] = true;
  j["moe_latent_size"] = 12;
  ExpectError(j, absl::StatusCode::kUnimplemented, "mlp_bias true with moe_latent_size is not supported");
}

TEST(ModelConfigFamilyTest, NemotronHMoeRefusals) {
  Json j = NemotronMoeBase();
  j["n_group"] = 3;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "n_group (3) must divide");
  j = NemotronMoeBase();
  j["topk_group"] = 3;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "topk_group (3)");
  j = NemotronMoeBase();
  j["num_experts_per_tok"] = 5;  // one group of 4 experts kept
  ExpectError(j, absl::StatusCode::kInvalidArgument, "exceeds the experts of topk_group groups");
  j = NemotronMoeBase();
  j["mlp_hidden_act"] = "silu";
  ExpectError(j, absl::StatusCode::kUnimplemented, "mlp_hidden_act \"silu\"");
  j = NemotronMoeBase();
  j.erase("moe_intermediate_size");
  ExpectError(j, absl::StatusCode::kInvalidArgument, "moe_intermediate_size");
}

// As transformers 5.23 writes a small FalconH1Config.
Json FalconBase() {
  return Json{
      {"model_type", "falcon_h1"},
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"intermediate_size", 48},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"mamba_d_ssm", 64},
      {"mamba_n_heads", 4},
      {"mamba_d_head", 16},
      {"mamba_n_groups", 2},
      {"mamba_d_state", 8},
      {"mamba_expand", 2},
      {"mamba_chunk_size", 16},
      {"mamba_norm_before_gate", true},
      {"mamba_rms_norm", false},
      {"rope_parameters", {{"rope_theta", 1e11}, {"rope_type", "default"}}},
      {"mlp_multipliers", {0.5, 2.0}},
      {"ssm_multipliers", {1.0, 0.5, 0.25, 0.125, 2.0}},
      {"ssm_in_multiplier", 0.75},
      {"ssm_out_multiplier", 1.5},
      {"attention_in_multiplier", 0.25},
      {"attention_out_multiplier", 0.625},
      {"key_multiplier", 0.375},
      {"embedding_multiplier", 5.0},
      {"lm_head_multiplier", 0.03125},
  };
}

TEST(ModelConfigFamilyTest, FalconH1LayersAreParallelThenGatedMlp) {
  absl::StatusOr<ModelConfig> c = Parse(FalconBase());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kFalconH1);
  EXPECT_EQ(c->LayerPattern(), "PGPG");
  EXPECT_EQ(c->SsmLayers(), 2);
  EXPECT_EQ(c->KvLayers(), 2);
  EXPECT_EQ(c->mamba.d_inner(), 64);
  EXPECT_FALSE(c->mamba.gated_norm);
  EXPECT_TRUE(c->mamba.norm_before_gate);
  EXPECT_EQ(c->mamba.in_multiplier, 0.75f);
  EXPECT_EQ(c->mamba.out_multiplier, 1.5f);
  EXPECT_EQ(c->mamba.segment_multipliers[3], 0.125f);
  EXPECT_TRUE(c->attention.use_rope);
  EXPECT_EQ(c->attention.rotary_dim, 8);
  EXPECT_EQ(c->attention.rope_theta, 1e11);
  EXPECT_EQ(c->attention.key_multiplier, 0.375f);
  EXPECT_EQ(c->attention.in_multiplier, 0.25f);
  EXPECT_EQ(c->attention.out_multiplier, 0.625f);
  EXPECT_EQ(c->gated_mlp.gate_multiplier, 0.5f);
  EXPECT_EQ(c->gated_mlp.down_multiplier, 2.0f);
  EXPECT_EQ(c->embedding_multiplier, 5.0f);
  EXPECT_EQ(c->logits_multiplier, 0.03125f);
}

// transformers' FalconH1Mixer: in_proj has a bias with mamba_proj_bias,
// out_proj with projectors_bias; every combination runs. Equal flags keep the
// canonical config the one model with both biases or neither always had.
TEST(ModelConfigFamilyTest, FalconH1MixerBiasesFollowTheirOwnFlags) {
  std::string neither;
  for (bool in_bias : {false, true}) {
    for (bool out_bias : {false, true}) {
      SCOPED_TRACE(absl::StrCat("mamba_proj_bias ", in_bias, ", projectors_bias ", out_bias));
      Json j = FalconBase();
      j["mamba_proj_bias"] = in_bias;
      j["projectors_bias"] = out_bias;
      absl::StatusOr<ModelConfig> c = Parse(j);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ(c->mamba.use_in_proj_bias, in_bias);
      EXPECT_EQ(c->mamba.use_out_proj_bias, out_bias);
      const std::string canonical = c->CanonicalString();
      EXPECT_THAT(canonical, HasSubstr(absl::StrCat(",bias=", in_bias ? 1 : 0, ",")));
      EXPECT_EQ(canonical.find("mamba2_out_proj_bias=") != std::string::npos, in_bias != out_bias);
      if (in_bias != out_bias) {
        EXPECT_THAT(canonical, HasSubstr(absl::StrCat("mamba2_out_proj_bias=", out_bias ? 1 : 0, ";")));
      }
      if (!in_bias && !out_bias) neither = canonical;
      if (in_bias || out_bias) EXPECT_NE(canonical, neither);
    }
  }
  // Absent flags are transformers' defaults (false).
  Json j = FalconBase();
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->mamba.use_in_proj_bias);
  EXPECT_FALSE(c->mamba.use_out_proj_bias);
  EXPECT_FALSE(c->attention.use_bias);
  EXPECT_EQ(c->CanonicalString(), neither);
  // attention_bias: q/k/v/o biases (FalconH1Attention), another model.
  j["attention_bias"] = true;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention.use_bias);
  EXPECT_FALSE(c->mamba.use_in_proj_bias);
  EXPECT_THAT(c->CanonicalString(), HasSubstr("attention_bias=1;"));
  EXPECT_NE(c->CanonicalString(), neither);
}

TEST(ModelConfigFamilyTest, FalconH1Refusals) {
  Json j = FalconBase();
  j["ssm_multipliers"] = {1.0, 2.0};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "ssm_multipliers must be a list of 5 numbers");
  j = FalconBase();
  j["mlp_multipliers"] = {0.0, 1.0};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "mlp_multipliers[0] (0)");
  j = FalconBase();
  j["projectors_bias"] = 1;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "projectors_bias must be true or false");
  j = FalconBase();
  j["mamba_d_ssm"] = 48;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "mamba_d_head (16) must equal d_inner (48");
  j = FalconBase();
  j["attention_bias"] = "yes";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "attention_bias must be true or false");
  Json bamba = BambaBase();
  ModelConfig c = *Parse(bamba);
  c.layers[0] = LayerKind::kParallel;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("only a falcon_h1 model has parallel blocks"));
}

// As transformers 5.23 writes a small Zamba2Config.
Json ZambaBase() {
  return Json{
      {"model_type", "zamba2"},
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"num_hidden_layers", 4},
      {"layers_block_type", {"linear_attention", "hybrid", "linear_attention", "hybrid"}},
      {"mamba_d_state", 8},
      {"n_mamba_heads", 4},
      {"mamba_headdim", 16},
      {"mamba_ngroups", 2},
      {"chunk_size", 16},
      {"intermediate_size", 48},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 4},
      {"num_mem_blocks", 1},
      {"use_shared_attention_adapter", true},
      {"adapter_rank", 4},
      {"use_mem_rope", true},
      {"hidden_act", "gelu"},
  };
}

TEST(ModelConfigFamilyTest, Zamba2HybridLayers) {
  absl::StatusOr<ModelConfig> c = Parse(ZambaBase());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kZamba2);
  EXPECT_EQ(c->LayerPattern(), "MZMZ");
  EXPECT_EQ(c->SsmLayers(), 4);
  EXPECT_EQ(c->KvLayers(), 2);
  EXPECT_EQ(c->attention.head_dim, 16);        // 2 * hidden / heads
  EXPECT_EQ(c->attention.scale, 0.35355338f);  // (head_dim / 2)^-0.5
  EXPECT_TRUE(c->attention.use_rope);
  EXPECT_EQ(c->attention.rotary_dim, 16);
  EXPECT_EQ(c->gated_mlp.activation, GateActivation::kGelu);
  EXPECT_EQ(c->zamba.adapter_rank, 4);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->mamba.prefill_dt_clamp.min, 0.001f);
  EXPECT_TRUE(c->mamba.decode_dt_clamp.IsNoOp());
  EXPECT_EQ(c->mamba.gated_norm_eps, 1e-5f);
}

// transformers 5.23 Zamba2: conv1d has a bias whatever use_conv_bias says, and
// use_long_context only raises max_position_embeddings to 16384 (the rotary
// embedding keeps rope_theta). Accepted; the same model, the same fingerprint.
TEST(ModelConfigFamilyTest, Zamba2FieldsTransformersIgnoresChangeNothing) {
  const ModelConfig base = *Parse(ZambaBase());
  Json j = ZambaBase();
  j["use_conv_bias"] = false;
  j["use_long_context"] = true;
  j["use_mem_rope"] = true;
  j["max_position_embeddings"] = 4096;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->mamba.use_conv_bias);
  EXPECT_EQ(c->max_position_embeddings, 16384);
  j["use_long_context"] = false;
  const ModelConfig rope = *Parse(j);
  EXPECT_EQ(rope.max_position_embeddings, 4096);
  EXPECT_EQ(c->CanonicalString(), rope.CanonicalString());
  EXPECT_EQ(c->attention.rope_theta, rope.attention.rope_theta);
  j = ZambaBase();
  j["use_conv_bias"] = false;
  EXPECT_EQ(Parse(j)->CanonicalString(), base.CanonicalString());
  j["use_conv_bias"] = "no";
  ExpectError(j, absl::StatusCode::kInvalidArgument, "use_conv_bias must be true or false");
}

TEST(ModelConfigFamilyTest, Zamba2Refusals) {
  Json j = ZambaBase();
  j["num_key_value_heads"] = 2;
  ExpectError(j, absl::StatusCode::kUnimplemented, "num_key_value_heads != num_attention_heads");
  j = ZambaBase();
  j["layers_block_type"] = {"linear_attention", "hybrid", "attention", "hybrid"};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "layers_block_type[2]");
  j = ZambaBase();
  j["hidden_act"] = "relu";
  ExpectError(j, absl::StatusCode::kUnimplemented, "hidden_act \"relu\"");
  j = ZambaBase();
  j["num_attention_heads"] = 5;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "must divide the attention width");
}

TEST(ModelConfigFamilyTest, FamiliesFingerprintTheirOwnFields) {
  const ModelConfig a = *Parse(GraniteBase());
  Json j = GraniteBase();
  j["residual_multiplier"] = 0.25;
  const ModelConfig b = *Parse(j);
  EXPECT_NE(a.CanonicalString(), b.CanonicalString());
  j = GraniteBase();
  j["num_experts_per_tok"] = 1;
  EXPECT_NE(a.CanonicalString(), Parse(j)->CanonicalString());
  j = BambaBase();
  const ModelConfig bamba = *Parse(j);
  j["rope_parameters"]["rope_theta"] = 20000.0;
  EXPECT_NE(bamba.CanonicalString(), Parse(j)->CanonicalString());
  const ModelConfig falcon = *Parse(FalconBase());
  for (const char* key : {"ssm_in_multiplier", "ssm_out_multiplier", "attention_in_multiplier", "key_multiplier",
                          "attention_out_multiplier", "embedding_multiplier", "lm_head_multiplier"}) {
    j = FalconBase();
    j[key] = 3.0;
    EXPECT_NE(falcon.CanonicalString(), Parse(j)->CanonicalString()) << key;
  }
  j = FalconBase();
  j["ssm_multipliers"][4] = 3.0;
  EXPECT_NE(falcon.CanonicalString(), Parse(j)->CanonicalString());
  j = FalconBase();
  j["mlp_multipliers"][1] = 3.0;
  EXPECT_NE(falcon.CanonicalString(), Parse(j)->CanonicalString());
  j = FalconBase();
  j["mamba_rms_norm"] = true;
  EXPECT_NE(falcon.CanonicalString(), Parse(j)->CanonicalString());
  // Two models that differ only in moe_latent_size (or in having one) must not
  // share cache entries; null leaves the string of a model without it as it was.
  j = NemotronMoeBase();
  const std::string no_latent = Parse(j)->CanonicalString();
  j.erase("moe_latent_size");
  EXPECT_EQ(Parse(j)->CanonicalString(), no_latent);
  EXPECT_THAT(no_latent, ::testing::Not(HasSubstr("latent")));
  j["moe_latent_size"] = 12;
  const std::string latent12 = Parse(j)->CanonicalString();
  j["moe_latent_size"] = 16;
  const std::string latent16 = Parse(j)->CanonicalString();
  EXPECT_NE(latent12, no_latent);
  EXPECT_NE(latent12, latent16);
  EXPECT_THAT(latent12, HasSubstr("moe_latent{size=12};"));
}

TEST(ModelConfigFamilyTest, UnsupportedFeaturesAreRefusedByName) {
  ExpectError(Json{{"model_type", "jamba"}, {"vocab_size", 8}, {"hidden_size", 8}}, absl::StatusCode::kUnimplemented,
              "model_type \"jamba\"");
  ExpectError(Json{{"model_type", "qwen3_6"}, {"vocab_size", 8}, {"hidden_size", 8}}, absl::StatusCode::kUnimplemented,
              "model_type \"qwen3_6\"");
  Json j = BambaBase();
  j["rope_parameters"]["rope_type"] = "yarn";
  ExpectError(j, absl::StatusCode::kUnimplemented, "rope_type \"yarn\"");
  j = BambaBase();
  j["hidden_act"] = "gelu";
  ExpectError(j, absl::StatusCode::kUnimplemented, "hidden_act \"gelu\"");
  j = GraniteBase();
  j["position_embedding_type"] = 0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "position_embedding_type must be a string");
}

TEST(ModelConfigFamilyTest, InconsistentValuesAreInvalid) {
  Json j = BambaBase();
  j["attn_layer_indices"] = {4};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "attn_layer_indices[0] (4)");
  j = BambaBase();
  j["mamba_d_head"] = 8;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "mamba_n_heads (4) * mamba_d_head (8)");
  j = GraniteBase();
  j["num_experts_per_tok"] = 5;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "num_experts_per_tok (5)");
  j = GraniteBase();
  j["layer_types"] = {"linear_attention", "full_attention"};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "does not match the 2 entries of layer_types");
  j = GraniteBase();
  j["layer_types"] = {"linear_attention", "mlp", "linear_attention"};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "must be a mixer");
  j = GraniteBase();
  j["residual_multiplier"] = 0.0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "residual_multiplier");
  j = GraniteBase();
  j["logits_scaling"] = {{"__float__", "Infinity"}};
  ExpectError(j, absl::StatusCode::kInvalidArgument, "logits_scaling");
  j = GraniteBase();
  j["attention_multiplier"] = -1.0;
  ExpectError(j, absl::StatusCode::kInvalidArgument, "attention_multiplier");
}

TEST(ModelConfigFamilyTest, ValidateRejectsABrokenDecoderLayer) {
  ModelConfig c = *Parse(BambaBase());
  c.layers[1] = LayerKind::kMamba2;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("mixer then a feed-forward block"));
  c = *Parse(BambaBase());
  c.layers.pop_back();
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("two blocks per decoder layer"));
}

}  // namespace
}  // namespace hybridserve::engine

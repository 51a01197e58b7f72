// engine/qwen3_next_config: the Qwen3-Next / Qwen3.5 config reader.
//
// 1. Against transformers 5.23 (tests/fixtures/qwen3_next_config/
//    transformers_reference.json, written by tools/gen_qwen3_next_config_fixture.py):
//    for each case (every transformers default by model_type alone, an
//    interval pattern with a sparse step and mlp_only_layers, an image-text MoE
//    with rope_parameters, and every public config) each field transformers
//    resolves equals ours, and the language model's tensors (names and shapes)
//    are exactly transformers' model's (experts fused) and, where recorded,
//    exactly those its save_pretrained writes (one tensor per expert).
// 2. The published configs, with the numbers their files state written here.
// 3. The refusals, each naming its field.
#include "engine/qwen3_next_config.h"

#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/runfiles.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::hybridserve::common::Runfile;
using Json = nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const Json& Reference() {
  static const Json* ref =
      new Json(Json::parse(ReadFile(Runfile("tests/fixtures/qwen3_next_config/transformers_reference.json"))));
  return *ref;
}

std::vector<std::string> KindNames(const Qwen3NextConfig& c) {
  std::vector<std::string> out;
  for (QwenLayerKind k : c.layer_kinds) out.emplace_back(QwenLayerKindName(k));
  return out;
}

TEST(Qwen3NextConfigTest, MatchesTransformersOnEveryReferenceCase) {
  const Json& cases = Reference().at("cases");
  ASSERT_EQ(cases.size(), 10u);
  std::map<std::string, int> compared;
  for (auto it = cases.begin(); it != cases.end(); ++it) {
    SCOPED_TRACE(it.key());
    const Json& r = it.value().at("resolved");
    auto parsed = ParseQwen3NextConfig(it.value().at("config").dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const Qwen3NextConfig& c = *parsed;
    EXPECT_EQ(c.text_model_type, r.at("text_model_type").get<std::string>());
    EXPECT_EQ(c.hidden_size, r.at("hidden_size").get<int64_t>());
    EXPECT_EQ(c.vocab_size, r.at("vocab_size").get<int64_t>());
    EXPECT_EQ(c.num_hidden_layers, r.at("num_hidden_layers").get<int64_t>());
    EXPECT_EQ(KindNames(c), r.at("layer_types").get<std::vector<std::string>>());
    EXPECT_EQ(c.linear_num_key_heads, r.at("linear_num_key_heads").get<int64_t>());
    EXPECT_EQ(c.linear_num_value_heads, r.at("linear_num_value_heads").get<int64_t>());
    EXPECT_EQ(c.linear_key_head_dim, r.at("linear_key_head_dim").get<int64_t>());
    EXPECT_EQ(c.linear_value_head_dim, r.at("linear_value_head_dim").get<int64_t>());
    EXPECT_EQ(c.linear_conv_kernel_dim, r.at("linear_conv_kernel_dim").get<int64_t>());
    EXPECT_EQ(c.num_attention_heads, r.at("num_attention_heads").get<int64_t>());
    EXPECT_EQ(c.num_key_value_heads, r.at("num_key_value_heads").get<int64_t>());
    EXPECT_EQ(c.head_dim, r.at("head_dim").get<int64_t>());
    EXPECT_EQ(c.partial_rotary_factor, r.at("partial_rotary_factor").get<double>());
    EXPECT_EQ(c.rope_theta, r.at("rope_theta").get<double>());
    EXPECT_EQ(c.rope_type, r.at("rope_type").get<std::string>());
    EXPECT_EQ(c.rms_norm_eps, r.at("rms_norm_eps").get<double>());
    EXPECT_EQ(c.attention_bias, r.at("attention_bias").get<bool>());
    EXPECT_EQ(c.tie_word_embeddings, r.at("tie_word_embeddings").get<bool>());
    EXPECT_EQ(c.intermediate_size, r.value("intermediate_size", int64_t{0}));
    EXPECT_EQ(c.num_experts, r.value("num_experts", int64_t{0}));
    EXPECT_EQ(c.num_experts_per_tok, r.value("num_experts_per_tok", int64_t{0}));
    EXPECT_EQ(c.moe_intermediate_size, r.value("moe_intermediate_size", int64_t{0}));
    EXPECT_EQ(c.shared_expert_intermediate_size, r.value("shared_expert_intermediate_size", int64_t{0}));
    EXPECT_EQ(c.norm_topk_prob, r.value("norm_topk_prob", true));
    EXPECT_EQ(c.decoder_sparse_step, r.value("decoder_sparse_step", int64_t{1}));
    EXPECT_EQ(c.mlp_only_layers, r.value("mlp_only_layers", std::vector<int64_t>{}));

    // As the model holds them (always recorded) and as save_pretrained writes
    // them (recorded where under 2,000 tensors: not for 512 experts x 48 layers).
    for (auto [key, layout] : {std::pair<const char*, QwenExpertLayout>{"tensors", QwenExpertLayout::kFused},
                               {"checkpoint_tensors", QwenExpertLayout::kPerExpert}}) {
      SCOPED_TRACE(key);
      if (!it.value().contains(key)) continue;
      ++compared[key];
      std::map<std::string, std::vector<int64_t>> want, got;
      for (const Json& row : it.value().at(key)) {
        want[row.at(0).get<std::string>()] = row.at(1).get<std::vector<int64_t>>();
      }
      const std::vector<QwenTensorSpec> tensors = QwenLanguageModelTensors(c, layout);
      for (const QwenTensorSpec& t : tensors) got[t.name] = t.shape;
      EXPECT_EQ(got.size(), tensors.size()) << "a tensor name is listed twice";
      EXPECT_EQ(got, want);
    }
  }
  EXPECT_EQ(compared["tensors"], 10);
  EXPECT_EQ(compared["checkpoint_tensors"], 7);
}

std::string PublicConfig(const std::string& file) { return ReadFile(Runfile("tests/fixtures/public_configs/" + file)); }

// ngxson/qwen3_next_tiny_test: 10 layers, 3:1 linear:full from layer_types,
// 4 experts top-2, every layer sparse.
TEST(Qwen3NextConfigTest, PublicQwen3NextTinyTest) {
  auto c = ParseQwen3NextConfig(PublicConfig("qwen3_next/qwen3_next_tiny_test.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3_next");
  EXPECT_EQ(c->tensor_prefix, "model.");
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->num_hidden_layers, 10);
  EXPECT_TRUE(c->layer_types_explicit);
  EXPECT_EQ(KindNames(*c),
            (std::vector<std::string>{"linear_attention", "linear_attention", "linear_attention", "full_attention",
                                      "linear_attention", "linear_attention", "linear_attention", "full_attention",
                                      "linear_attention", "linear_attention"}));
  EXPECT_EQ(c->linear_num_key_heads, 8);
  EXPECT_EQ(c->linear_num_value_heads, 16);
  EXPECT_EQ(c->linear_key_head_dim, 128);
  EXPECT_EQ(c->linear_value_head_dim, 128);
  EXPECT_EQ(c->linear_conv_kernel_dim, 4);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->partial_rotary_factor, 0.25);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_TRUE(c->is_moe);
  EXPECT_EQ(c->intermediate_size, 2048);
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 256);
  EXPECT_EQ(c->shared_expert_intermediate_size, 256);
  EXPECT_TRUE(c->norm_topk_prob);
  for (int64_t i = 0; i < 10; ++i) EXPECT_TRUE(c->LayerIsMoe(i)) << i;
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_TRUE(c->ignored.empty());
}

// optimum-intel-internal-testing/tiny-random-qwen3-next: no
// full_attention_interval, a pattern with its attention at layer 2,
// rope_parameters null (rope_theta at the top level).
TEST(Qwen3NextConfigTest, PublicTinyRandomQwen3Next) {
  auto c = ParseQwen3NextConfig(PublicConfig("qwen3_next/tiny-random-qwen3-next.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->vocab_size, 49155);
  EXPECT_EQ(KindNames(*c),
            (std::vector<std::string>{"linear_attention", "linear_attention", "full_attention", "linear_attention"}));
  EXPECT_EQ(c->linear_num_key_heads, 2);
  EXPECT_EQ(c->linear_num_value_heads, 2);
  EXPECT_EQ(c->linear_key_head_dim, 8);
  EXPECT_EQ(c->linear_value_head_dim, 8);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_EQ(c->moe_intermediate_size, 16);
  EXPECT_EQ(c->shared_expert_intermediate_size, 16);
  // embed, norm, lm_head; per linear layer 7 + 2 norms + 7 MoE; per attention layer 6 + 2 + 7.
  EXPECT_EQ(QwenLanguageModelTensors(*c, QwenExpertLayout::kFused).size(), 3u + 3 * (7 + 2 + 7) + (6 + 2 + 7));
  // A checkpoint: the 2 fused expert tensors of each layer are 4 experts x 3.
  EXPECT_EQ(QwenLanguageModelTensors(*c).size(), 3u + 3 * (7 + 2 + 17) + (6 + 2 + 17));
}

// qikp/qwen3.5-tiny-random: the text-only dense form, tied, rope_parameters.
TEST(Qwen3NextConfigTest, PublicQwen35TinyRandom) {
  auto c = ParseQwen3NextConfig(PublicConfig("qwen3_5/qwen3.5-tiny-random.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3_5_text");
  EXPECT_EQ(c->tensor_prefix, "model.");
  EXPECT_EQ(c->hidden_size, 128);
  EXPECT_EQ(c->vocab_size, 4096);
  EXPECT_EQ(c->num_hidden_layers, 4);
  EXPECT_EQ(c->linear_num_key_heads, 16);
  EXPECT_EQ(c->linear_num_value_heads, 32);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->partial_rotary_factor, 0.25);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->is_moe);
  EXPECT_EQ(c->intermediate_size, 256);
  EXPECT_FALSE(c->LayerIsMoe(0));
  EXPECT_TRUE(c->tie_word_embeddings);
  bool lm_head = false;
  for (const QwenTensorSpec& t : QwenLanguageModelTensors(*c)) lm_head |= t.name == "lm_head.weight";
  EXPECT_FALSE(lm_head);
}

TEST(Qwen3NextConfigTest, ImageTextFormListsWhatItIgnores) {
  const Json& raw = Reference().at("cases").at("image_text_moe_small").at("config");
  auto c = ParseQwen3NextConfig(raw.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tensor_prefix, "model.language_model.");
  std::vector<std::string> keys;
  for (const std::string& line : c->ignored) keys.push_back(line.substr(0, line.find(':')));
  EXPECT_EQ(keys, (std::vector<std::string>{"text_config.rope_parameters.mrope_section",
                                            "text_config.rope_parameters.mrope_interleaved",
                                            "text_config.mtp_num_hidden_layers", "vision_config"}));
}

// Keys other Qwen configs carry that transformers does not read for this
// model_type are named, not applied: a qwen3_5_moe layer is sparse even when
// mlp_only_layers lists it (as in transformers 5.23).
TEST(Qwen3NextConfigTest, NamesFieldsTransformersDoesNotReadForTheType) {
  auto moe = ParseQwen3NextConfig(
      R"({"model_type": "qwen3_5_moe_text", "num_hidden_layers": 4, "intermediate_size": 32,
          "mlp_only_layers": [1], "norm_topk_prob": false, "mamba_ssm_dtype": "float32"})");
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->intermediate_size, 0);
  EXPECT_TRUE(moe->mlp_only_layers.empty());
  EXPECT_TRUE(moe->norm_topk_prob);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(moe->LayerIsMoe(i)) << i;
  std::vector<std::string> keys;
  for (const std::string& line : moe->ignored) keys.push_back(line.substr(0, line.find(':')));
  EXPECT_EQ(keys, (std::vector<std::string>{"intermediate_size", "mlp_only_layers", "norm_topk_prob"}));

  auto dense = ParseQwen3NextConfig(R"({"model_type": "qwen3_5", "text_config": {"num_experts": 8}})");
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_FALSE(dense->is_moe);
  EXPECT_EQ(dense->num_experts, 0);
  ASSERT_EQ(dense->ignored.size(), 1u);
  EXPECT_EQ(dense->ignored[0],
            "text_config.num_experts: not read by transformers 5.23 for qwen3_5_text (every layer is a dense MLP)");
}

struct Refusal {
  const char* name;
  std::string config;
  const char* message_start;
};

TEST(Qwen3NextConfigTest, RefusesByField) {
  const std::string small = R"("hidden_size": 64, "num_hidden_layers": 4, "num_experts": 4, "num_experts_per_tok": 2)";
  auto next = [&](const std::string& extra) { return "{\"model_type\": \"qwen3_next\", " + small + extra + "}"; };
  const std::vector<Refusal> refusals = {
      {"not json", "{", "config.json is not valid JSON"},
      {"too large", "{\"model_type\": \"qwen3_next\", \"pad\": \"" + std::string(16 << 20, 'x') + "\"}",
       "config.json is 16777255 bytes, over the limit of 16777216"},
      {"no model_type", "{}", "model_type is required"},
      {"other family", R"({"model_type": "qwen3"})", "model_type: \"qwen3\" is not"},
      {"v heads", next(R"(, "linear_num_key_heads": 16, "linear_num_value_heads": 24)"),
       "linear_num_value_heads: (24) must be a multiple of linear_num_key_heads (16)"},
      {"q heads", next(R"(, "num_attention_heads": 6, "num_key_value_heads": 4)"),
       "num_attention_heads: (6) must be a multiple of num_key_value_heads (4)"},
      {"layer_types length", next(R"(, "layer_types": ["linear_attention", "full_attention"])"),
       "layer_types: has 2 entries but num_hidden_layers is 4"},
      {"layer kind", next(R"(, "layer_types": ["linear_attention", "mamba", "linear_attention", "full_attention"])"),
       "layer_types[1]: unknown layer kind \"mamba\""},
      {"interval", next(R"(, "full_attention_interval": 0)"), "full_attention_interval: must be positive, got 0"},
      {"zero dim", next(R"(, "linear_key_head_dim": 0)"), "linear_key_head_dim: must be positive, got 0"},
      {"top-k", next(R"(, "num_experts_per_tok": 5)"), "num_experts_per_tok: (5) exceeds num_experts (4)"},
      {"mlp_only_layers", next(R"(, "mlp_only_layers": [4])"), "mlp_only_layers[0]: layer 4 is outside [0, 4)"},
      {"rotary", next(R"(, "head_dim": 10, "partial_rotary_factor": 0.3)"),
       "partial_rotary_factor: (0.3) times head_dim (10) must be an even integer"},
      {"rope disagreement",
       next(R"(, "rope_theta": 5.0, "rope_parameters": {"rope_theta": 7.0, "rope_type": "default"})"),
       "rope_theta: 5 disagrees with rope_parameters.rope_theta (7)"},
      {"eps", next(R"(, "rms_norm_eps": 0.0)"), "rms_norm_eps: must be a positive number"},
      {"act", next(R"(, "hidden_act": "gelu")"), "hidden_act: must be silu, got gelu"},
      {"text_config type", R"({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_moe_text"}})",
       "text_config.model_type: \"qwen3_5_moe_text\" does not match model_type qwen3_5"},
      {"text_config field", R"({"model_type": "qwen3_5_moe", "text_config": {"num_experts": 0}})",
       "text_config.num_experts: must be positive"},
      {"text_config not object", R"({"model_type": "qwen3_5", "text_config": 3})", "text_config: must be an object"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.name);
    auto c = ParseQwen3NextConfig(r.config);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(c.status().message(), r.message_start)) << c.status().message();
  }
}

}  // namespace
}  // namespace hybridserve::engine

// ModelWeights of the Gated DeltaNet hybrids, on transformers-made checkpoints
// (tests/fixtures/golden/qwen3_*): the engine's row orders (in_proj, the
// query / gate split of q_proj, the router's shared-gate row), the zero-centred
// norms held as 1 + w, the expert layouts, what is ignored (vision tower, MTP)
// and what is refused.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/model_test_util.h"
#include "engine/model_weights.h"
#include "engine/model_weights_test_util.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"

namespace hybridserve::engine {
namespace {

using weights_testing::Config;
using weights_testing::ExpectInvalid;
using weights_testing::Floats;
using weights_testing::LoadStatus;
using weights_testing::OwnedTensor;
using weights_testing::ReadTensors;
using weights_testing::TensorMap;
using weights_testing::WriteModel;

// Row r of a [rows, cols] fp32 tensor.
std::vector<float> Row(const std::vector<float>& m, int64_t cols, int64_t r) {
  return std::vector<float>(m.begin() + r * cols, m.begin() + (r + 1) * cols);
}

std::unique_ptr<ModelWeights> Load(const ModelConfig& config, const TensorMap& tensors, const std::string& name) {
  auto w = ModelWeights::Load(config, WriteModel(name, tensors));
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? std::move(*w) : nullptr;
}

TEST(ModelWeightsQwenTest, Qwen3NextRowsGoIntoTheEngineOrder) {
  const ModelConfig config = Config(testing::kQwen3NextTiny);
  const TensorMap file = ReadTensors(testing::kQwen3NextTiny);
  std::unique_ptr<ModelWeights> w = Load(config, file, "qwen3_next");
  ASSERT_NE(w, nullptr);
  const int64_t h = config.hidden_size;
  const GatedDeltaNetParams& g = config.gdn;
  const int64_t r = g.num_v_heads / g.num_k_heads;
  const int64_t group = 2 * g.k_head_dim + 2 * r * g.v_head_dim;
  ASSERT_EQ(config.LayerPattern(), "*EDEDE*EDE");

  // Block 2 is decoder layer 1's Gated DeltaNet.
  const GatedDeltaNetLayerWeights& d = w->layer(2).gated_deltanet();
  const std::string p = "model.layers.1.linear_attn.";
  const std::vector<float> qkvz = Floats(file.at(p + "in_proj_qkvz.weight"));
  const std::vector<float> ba = Floats(file.at(p + "in_proj_ba.weight"));
  ASSERT_EQ(d.in_proj.f32.size(), static_cast<size_t>(g.in_proj_rows() * h));
  const std::vector<float>& in = d.in_proj.f32;
  // Key head j's query row i, key row i, its value heads' value and z rows, b and a.
  for (int64_t j = 0; j < g.num_k_heads; ++j) {
    for (int64_t i = 0; i < g.k_head_dim; ++i) {
      EXPECT_EQ(Row(in, h, j * g.k_head_dim + i), Row(qkvz, h, j * group + i));
      EXPECT_EQ(Row(in, h, g.key_dim() + j * g.k_head_dim + i), Row(qkvz, h, j * group + g.k_head_dim + i));
    }
    for (int64_t i = 0; i < r * g.v_head_dim; ++i) {
      EXPECT_EQ(Row(in, h, 2 * g.key_dim() + j * r * g.v_head_dim + i), Row(qkvz, h, j * group + 2 * g.k_head_dim + i));
      EXPECT_EQ(Row(in, h, g.conv_dim() + j * r * g.v_head_dim + i),
                Row(qkvz, h, j * group + 2 * g.k_head_dim + r * g.v_head_dim + i));
    }
    for (int64_t i = 0; i < r; ++i) {
      EXPECT_EQ(Row(in, h, g.conv_dim() + g.value_dim() + j * r + i), Row(ba, h, j * 2 * r + i));
      EXPECT_EQ(Row(in, h, g.conv_dim() + g.value_dim() + g.num_v_heads + j * r + i), Row(ba, h, j * 2 * r + r + i));
    }
  }
  // The gated norm's [v_head_dim] weight repeated per value head (plain w, not 1 + w).
  const std::vector<float> norm = Floats(file.at(p + "norm.weight"));
  for (int64_t v = 0; v < g.num_v_heads; ++v) EXPECT_EQ(Row(d.norm, g.v_head_dim, v), norm);

  // Zero-centred norms: 1 + w in fp32.
  const std::vector<float> ln = Floats(file.at("model.layers.1.input_layernorm.weight"));
  for (size_t i = 0; i < ln.size(); ++i) EXPECT_EQ(w->layer(2).norm[i], 1.0f + ln[i]);
  const std::vector<float> final_norm = Floats(file.at("model.norm.weight"));
  for (size_t i = 0; i < final_norm.size(); ++i) EXPECT_EQ(w->norm_f()[i], 1.0f + final_norm[i]);

  // Block 0 is decoder layer 0's attention: q_proj's rows per head [q_h | gate_h] split.
  const AttentionLayerWeights& a = w->layer(0).attention();
  const std::vector<float> q = Floats(file.at("model.layers.0.self_attn.q_proj.weight"));
  const int64_t hd = config.attention.head_dim;
  for (int64_t head = 0; head < config.attention.num_heads; ++head) {
    for (int64_t i = 0; i < hd; ++i) {
      EXPECT_EQ(Row(a.q_proj.f32, h, head * hd + i), Row(q, h, 2 * head * hd + i));
      EXPECT_EQ(Row(a.gate_proj.f32, h, head * hd + i), Row(q, h, 2 * head * hd + hd + i));
    }
  }
  const std::vector<float> qn = Floats(file.at("model.layers.0.self_attn.q_norm.weight"));
  for (size_t i = 0; i < qn.size(); ++i) EXPECT_EQ(a.q_norm[i], 1.0f + qn[i]);

  // Block 1 is layer 0's MoE: the router's rows, then shared_expert_gate's.
  const MoeLayerWeights& m = w->layer(1).moe();
  const std::vector<float> router = Floats(file.at("model.layers.0.mlp.gate.weight"));
  const std::vector<float> shared_gate = Floats(file.at("model.layers.0.mlp.shared_expert_gate.weight"));
  ASSERT_EQ(m.router.f32.size(), router.size() + shared_gate.size());
  EXPECT_TRUE(std::equal(router.begin(), router.end(), m.router.f32.begin()));
  EXPECT_TRUE(std::equal(shared_gate.begin(), shared_gate.end(), m.router.f32.begin() + router.size()));
}

// transformers' fused experts (gate_up_proj [E, 2 inter, hidden], down_proj
// [E, hidden, inter]) hold the same weights as the per-expert tensors.
TEST(ModelWeightsQwenTest, FusedExpertsLoadAsThePerExpertTensors) {
  const ModelConfig config = Config(testing::kQwen3NextTiny);
  const TensorMap file = ReadTensors(testing::kQwen3NextTiny);
  TensorMap fused;
  for (const auto& [name, t] : file) {
    if (name.find(".mlp.experts.") == std::string::npos) fused[name] = t;
  }
  const int64_t e_count = config.moe.num_experts;
  const int64_t inter = config.moe.intermediate_size;
  const int64_t h = config.hidden_size;
  for (int64_t layer = 0; layer < config.num_layers() / 2; ++layer) {
    const std::string p = absl::StrCat("model.layers.", layer, ".mlp.experts.");
    if (!file.count(p + "0.gate_proj.weight")) continue;
    OwnedTensor gate_up{DType::kF32, {e_count, 2 * inter, h}, {}};
    OwnedTensor down{DType::kF32, {e_count, h, inter}, {}};
    for (int64_t e = 0; e < e_count; ++e) {
      for (const char* part : {"gate_proj", "up_proj"}) {
        const auto& b = file.at(absl::StrCat(p, e, ".", part, ".weight")).bytes;
        gate_up.bytes.insert(gate_up.bytes.end(), b.begin(), b.end());
      }
      const auto& b = file.at(absl::StrCat(p, e, ".down_proj.weight")).bytes;
      down.bytes.insert(down.bytes.end(), b.begin(), b.end());
    }
    fused[p + "gate_up_proj"] = gate_up;
    fused[p + "down_proj"] = down;
  }
  std::unique_ptr<ModelWeights> a = Load(config, file, "per_expert");
  std::unique_ptr<ModelWeights> b = Load(config, fused, "fused");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    if (config.layers[static_cast<size_t>(i)] != LayerKind::kMoe) continue;
    EXPECT_EQ(a->layer(i).moe().experts_up.f32, b->layer(i).moe().experts_up.f32) << "block " << i;
    EXPECT_EQ(a->layer(i).moe().experts_down.f32, b->layer(i).moe().experts_down.f32) << "block " << i;
  }
}

// Qwen3.5-MoE's image-text checkpoint: model.language_model.* read, the vision
// tower and an MTP head left alone; a stray or missing tensor refused by name.
TEST(ModelWeightsQwenTest, ImageTextCheckpointIgnoresTheVisionTowerAndMtpOnly) {
  const ModelConfig config = Config(testing::kQwen35MoeTiny);
  TensorMap file = ReadTensors(testing::kQwen35MoeTiny);
  int visual = 0;
  for (const auto& [name, t] : file) visual += name.rfind("model.visual.", 0) == 0 ? 1 : 0;
  EXPECT_GT(visual, 0);
  file["mtp.layers.0.input_layernorm.weight"] = file.at("model.language_model.norm.weight");
  std::unique_ptr<ModelWeights> w = Load(config, file, "image_text");
  ASSERT_NE(w, nullptr);

  TensorMap stray = file;
  stray["model.language_model.layers.0.linear_attn.extra.weight"] = file.at("model.language_model.norm.weight");
  ExpectInvalid(LoadStatus(config, stray, "stray"), "model.language_model.layers.0.linear_attn.extra.weight");
  TensorMap missing = file;
  missing.erase("model.language_model.layers.0.linear_attn.in_proj_b.weight");
  ExpectInvalid(LoadStatus(config, missing, "missing"), "model.language_model.layers.0.linear_attn.in_proj_b.weight");
  TensorMap no_gate = file;
  no_gate.erase("model.language_model.layers.0.mlp.shared_expert_gate.weight");
  ExpectInvalid(LoadStatus(config, no_gate, "no_gate"), "shared_expert_gate.weight");
}

// A bf16 checkpoint stays bf16 through the row reordering, and the model's
// logits are those of the fp32 model made of the same (bf16-rounded) values
// (fast mode: bf16 weights widened exactly; the CPU's avx512_bf16
// deterministic path rounds the activations to bf16 too).
TEST(ModelWeightsQwenTest, Bf16CheckpointKeepsBf16RowsInTheEngineOrder) {
  const ModelConfig config = Config(testing::kQwen35Tiny);
  const TensorMap file = ReadTensors(testing::kQwen35Tiny);
  TensorMap bf16, rounded;
  for (const auto& [name, t] : file) {
    const std::vector<float> f = Floats(t);
    OwnedTensor b{DType::kBF16, t.shape, std::vector<uint8_t>(f.size() * 2)};
    OwnedTensor r{DType::kF32, t.shape, std::vector<uint8_t>(f.size() * 4)};
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t bits = kernels::FloatToBf16(f[i]);
      std::memcpy(&b.bytes[2 * i], &bits, 2);
      const float back = kernels::Bf16ToFloat(bits);
      std::memcpy(&r.bytes[4 * i], &back, 4);
    }
    bf16[name] = b;
    rounded[name] = r;
  }
  std::unique_ptr<ModelWeights> wb = Load(config, bf16, "bf16");
  std::unique_ptr<ModelWeights> wr = Load(config, rounded, "rounded");
  ASSERT_NE(wb, nullptr);
  ASSERT_NE(wr, nullptr);
  EXPECT_TRUE(wb->has_bf16_matrices());
  const GatedDeltaNetLayerWeights& d = wb->layer(0).gated_deltanet();
  ASSERT_TRUE(d.in_proj.is_bf16());
  EXPECT_EQ(d.in_proj.ToFloat32(), wr->layer(0).gated_deltanet().in_proj.f32);

  ModelOptions options;
  options.max_pages = 64;
  options.matmul_mode = kernels::MatmulMode::kFast;
  std::unique_ptr<Model> mb = testing::MakeModel(*wb, options);
  std::unique_ptr<Model> mr = testing::MakeModel(*wr, options);
  ASSERT_NE(mb, nullptr);
  ASSERT_NE(mr, nullptr);
  const std::vector<TokenId> prompt = testing::RandomTokens(7, 90, config.vocab_size);
  auto a = mb->sequences().New();
  auto b = mr->sequences().New();
  ASSERT_TRUE(a.ok() && b.ok());
  auto la = mb->Prefill(*a, prompt);
  auto lb = mr->Prefill(*b, prompt);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_TRUE(testing::BitEqual(la->logits, lb->logits)) << testing::MaxAbsDiff(la->logits, lb->logits);
}

}  // namespace
}  // namespace hybridserve::engine

#include "engine/model_weights.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/hash.h"
#include "common/runfiles.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/model_test_util.h"
#include "engine/model_weights_test_util.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"

namespace hybridserve::engine {
namespace {

using ::testing::HasSubstr;

constexpr absl::string_view kNemotronTiny = "tests/fixtures/golden/nemotron_h_tiny";
constexpr absl::string_view kMamba2Tiny = "tests/fixtures/golden/mamba2_tiny";
constexpr absl::string_view kNemotronTiedTiny = "tests/fixtures/golden/nemotron_h_tied_tiny";
constexpr absl::string_view kDefault = "models/default";
// Falcon-H1 with projectors_bias (out_proj's bias) and no mamba_proj_bias (in_proj's).
constexpr absl::string_view kFalconOutBiasTiny = "tests/fixtures/golden/falcon_h1_out_bias_tiny";
// Granite 4.0-H whose config.json says position_embedding_type "nope".
constexpr absl::string_view kGraniteNopeTiny = "tests/fixtures/golden/granite_nope_tiny";
// "ME*E-M", 8 experts of 16, moe_latent_size 12, hidden 32.
constexpr absl::string_view kNemotronLatentMoeTiny = "tests/fixtures/golden/nemotron_h_latent_moe_tiny";

using common::Runfile;

using weights_testing::Config;
using weights_testing::ExpectInvalid;
using weights_testing::Floats;
using weights_testing::LoadStatus;
using weights_testing::MustLoad;
using weights_testing::OwnedTensor;
using weights_testing::ReadTensors;
using weights_testing::Serialize;
using weights_testing::TempDir;
using weights_testing::TensorMap;
using weights_testing::TotalElements;
using weights_testing::WriteFile;
using weights_testing::WriteModel;

TEST(ModelWeightsTest, NemotronHTinyLoadsEveryLayerWithConfigShapes) {
  std::unique_ptr<ModelWeights> w = MustLoad(Runfile(kNemotronTiny));
  ASSERT_NE(w, nullptr);
  const ModelConfig& c = w->config();
  ASSERT_EQ(w->layers().size(), 7u);
  EXPECT_EQ(w->embeddings().size(), 96u * 32);
  EXPECT_EQ(w->norm_f().size(), 32u);
  EXPECT_EQ(w->lm_head().size(), 96u * 32);
  EXPECT_NE(&w->lm_head(), &w->embeddings());
  for (int64_t i = 0; i < c.num_layers(); ++i) {
    const LayerWeights& layer = w->layer(i);
    EXPECT_EQ(layer.kind, c.layers[i]);
    EXPECT_EQ(layer.norm.size(), 32u);
    switch (layer.kind) {
      case LayerKind::kMamba2: {
        const Mamba2LayerWeights& m = layer.mamba2();
        EXPECT_EQ(m.in_proj.size(), 196u * 32);
        EXPECT_TRUE(m.in_proj_bias.empty());
        EXPECT_EQ(m.conv1d_weight.size(), 128u * 4);
        EXPECT_EQ(m.conv1d_bias.size(), 128u);
        EXPECT_EQ(m.dt_bias.size(), 4u);
        EXPECT_EQ(m.A_log.size(), 4u);
        EXPECT_EQ(m.D.size(), 4u);
        EXPECT_EQ(m.norm.size(), 64u);
        EXPECT_EQ(m.out_proj.size(), 32u * 64);
        EXPECT_TRUE(m.out_proj_bias.empty());
        break;
      }
      case LayerKind::kAttention: {
        const AttentionLayerWeights& a = layer.attention();
        EXPECT_EQ(a.q_proj.size(), 32u * 32);
        EXPECT_EQ(a.k_proj.size(), 16u * 32);
        EXPECT_EQ(a.v_proj.size(), 16u * 32);
        EXPECT_EQ(a.o_proj.size(), 32u * 32);
        break;
      }
      case LayerKind::kMlp: {
        EXPECT_EQ(layer.mlp().up_proj.size(), 64u * 32);
        EXPECT_EQ(layer.mlp().down_proj.size(), 32u * 64);
        EXPECT_TRUE(layer.mlp().up_proj_bias.empty());
        break;
      }
      case LayerKind::kGatedMlp:
      case LayerKind::kMoe:
      case LayerKind::kParallel:
      case LayerKind::kZambaHybrid:
      case LayerKind::kGatedDeltaNet:
        ADD_FAILURE() << "a Nemotron-H without experts has no " << LayerKindName(layer.kind) << " block";
        break;
    }
  }
  const TensorMap file = ReadTensors(kNemotronTiny);
  EXPECT_EQ(w->num_parameters(), TotalElements(file));
  // Values are the stored floats, in the stored order ([conv_dim, 1, K] -> [conv_dim, K]).
  EXPECT_EQ(w->embeddings().f32, Floats(file.at("backbone.embeddings.weight")));
  EXPECT_EQ(w->lm_head().f32, Floats(file.at("lm_head.weight")));
  EXPECT_EQ(w->layer(4).mamba2().conv1d_weight, Floats(file.at("backbone.layers.4.mixer.conv1d.weight")));
  EXPECT_EQ(w->layer(4).mamba2().A_log, Floats(file.at("backbone.layers.4.mixer.A_log")));
  EXPECT_EQ(w->layer(5).attention().o_proj.f32, Floats(file.at("backbone.layers.5.mixer.o_proj.weight")));
  EXPECT_EQ(w->layer(6).norm, Floats(file.at("backbone.layers.6.norm.weight")));
}

// moe_latent_size L: mixer.fc1_latent_proj.weight [L, hidden] and
// mixer.fc2_latent_proj.weight [hidden, L], and experts L wide.
TEST(ModelWeightsTest, LatentMoeLoadsItsProjectionsAndLatentWideExperts) {
  std::unique_ptr<ModelWeights> w = MustLoad(Runfile(kNemotronLatentMoeTiny));
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->config().moe.latent_size, 12);
  const TensorMap file = ReadTensors(kNemotronLatentMoeTiny);
  EXPECT_EQ(w->num_parameters(), TotalElements(file));
  for (int layer : {1, 3}) {
    SCOPED_TRACE(layer);
    const std::string p = absl::StrCat("backbone.layers.", layer, ".mixer.");
    const MoeLayerWeights& m = w->layer(layer).moe();
    EXPECT_EQ(m.router.size(), 8u * 32);
    EXPECT_EQ(m.latent_in.f32, Floats(file.at(p + "fc1_latent_proj.weight")));
    EXPECT_EQ(m.latent_out.f32, Floats(file.at(p + "fc2_latent_proj.weight")));
    EXPECT_EQ(m.latent_in.size(), 12u * 32);
    EXPECT_EQ(m.latent_out.size(), 32u * 12);
    ASSERT_EQ(m.experts_up.size(), 8u * 16 * 12);
    ASSERT_EQ(m.experts_down.size(), 8u * 12 * 16);
    // Expert e's rows, in expert order.
    for (int e : {0, 5, 7}) {
      const std::vector<float> up = Floats(file.at(absl::StrCat(p, "experts.", e, ".up_proj.weight")));
      const std::vector<float> down = Floats(file.at(absl::StrCat(p, "experts.", e, ".down_proj.weight")));
      EXPECT_TRUE(std::equal(up.begin(), up.end(), m.experts_up.f32.begin() + e * 16 * 12)) << e;
      EXPECT_TRUE(std::equal(down.begin(), down.end(), m.experts_down.f32.begin() + e * 12 * 16)) << e;
    }
    EXPECT_EQ(m.shared_up.size(), 24u * 32);  // the shared expert reads hidden
    EXPECT_EQ(m.shared_down.size(), 32u * 24);
  }
  // Without latent projections the other MoE fixture's blocks have none.
  std::unique_ptr<ModelWeights> plain = MustLoad(Runfile("tests/fixtures/golden/nemotron_h_moe_tiny"));
  ASSERT_NE(plain, nullptr);
  EXPECT_TRUE(plain->layer(1).moe().latent_in.empty());
  EXPECT_EQ(plain->layer(1).moe().experts_up.size(), 8u * 16 * 32);
}

TEST(ModelWeightsTest, LatentMoeTensorsAreNamedWhenMissingOrMisshapen) {
  const ModelConfig config = Config(kNemotronLatentMoeTiny);
  TensorMap tensors = ReadTensors(kNemotronLatentMoeTiny);
  tensors.erase("backbone.layers.3.mixer.fc2_latent_proj.weight");
  ExpectInvalid(LoadStatus(config, tensors, "latent_missing"),
                "missing tensor backbone.layers.3.mixer.fc2_latent_proj.weight (expected shape [32, 12])");
  tensors = ReadTensors(kNemotronLatentMoeTiny);
  OwnedTensor& fc1 = tensors.at("backbone.layers.1.mixer.fc1_latent_proj.weight");
  fc1.shape = {32, 12};  // the transpose: same bytes
  ExpectInvalid(LoadStatus(config, tensors, "latent_transposed"),
                "tensor backbone.layers.1.mixer.fc1_latent_proj.weight has shape [32, 12], expected [12, 32]");
  // The same file read as a model without latent projections: its experts are
  // 12 wide, not hidden wide.
  ModelConfig plain = config;
  plain.moe.latent_size = 0;
  ExpectInvalid(ModelWeights::Load(plain, Runfile(kNemotronLatentMoeTiny)).status(),
                "tensor backbone.layers.1.mixer.experts.0.up_proj.weight has shape [16, 12], expected [16, 32]");
  // A latent config over a file without the projections.
  ModelConfig latent = Config("tests/fixtures/golden/nemotron_h_moe_tiny");
  latent.moe.latent_size = 12;
  ExpectInvalid(ModelWeights::Load(latent, Runfile("tests/fixtures/golden/nemotron_h_moe_tiny")).status(),
                "missing tensor backbone.layers.1.mixer.fc1_latent_proj.weight (expected shape [12, 32])");
}

TEST(ModelWeightsTest, Mamba2TinyLoadsWithTiedHead) {
  std::unique_ptr<ModelWeights> w = MustLoad(Runfile(kMamba2Tiny));
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->layers().size(), 4u);
  for (const LayerWeights& layer : w->layers()) {
    ASSERT_EQ(layer.kind, LayerKind::kMamba2);
    EXPECT_EQ(layer.mamba2().in_proj.size(), 196u * 32);
  }
  EXPECT_EQ(&w->lm_head(), &w->embeddings());  // shared, not copied
  EXPECT_EQ(w->num_parameters(), TotalElements(ReadTensors(kMamba2Tiny)));
}

// The embedded model, trained by tools/train_default_model.py with the shapes of
// gen_model.py's default preset (its values are pinned by model_golden_test).
TEST(ModelWeightsTest, DefaultModelLoads) {
  std::unique_ptr<ModelWeights> w = MustLoad(Runfile(kDefault));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->config().LayerPattern(), "M-M*-M-M*-M-");
  ASSERT_EQ(w->layers().size(), 12u);
  EXPECT_EQ(w->embeddings().size(), 259u * 128);
  EXPECT_EQ(w->layer(0).mamba2().in_proj.size(), 648u * 128);
  EXPECT_EQ(w->layer(3).attention().k_proj.size(), 64u * 128);
  EXPECT_EQ(w->layer(1).mlp().up_proj.size(), 256u * 128);
  EXPECT_EQ(w->num_parameters(), TotalElements(ReadTensors(kDefault)));
}

TEST(ModelWeightsTest, FingerprintsAreStableAndDifferBetweenModels) {
  std::unique_ptr<ModelWeights> a1 = MustLoad(Runfile(kNemotronTiny));
  std::unique_ptr<ModelWeights> a2 = MustLoad(Runfile(kNemotronTiny));
  std::unique_ptr<ModelWeights> b = MustLoad(Runfile(kMamba2Tiny));
  std::unique_ptr<ModelWeights> c = MustLoad(Runfile(kDefault));
  ASSERT_TRUE(a1 && a2 && b && c);
  EXPECT_EQ(a1->fingerprint(), a2->fingerprint());
  EXPECT_NE(a1->fingerprint(), b->fingerprint());
  EXPECT_NE(a1->fingerprint(), c->fingerprint());
  EXPECT_NE(b->fingerprint(), c->fingerprint());
  EXPECT_NE(a1->fingerprint(), common::Hash128{});
}

// "nope" and null are one model (no positions either way): the same weights
// under either config have one fingerprint, so one cache namespace; "rope" is
// another model.
TEST(ModelWeightsTest, GraniteNopeAndNullPositionsHaveOneFingerprint) {
  std::ifstream in(Runfile(absl::StrCat(kGraniteNopeTiny, "/config.json")));
  const std::string nope((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_THAT(nope, HasSubstr("\"position_embedding_type\": \"nope\""));
  const std::string null_positions =
      absl::StrReplaceAll(nope, {{"\"position_embedding_type\": \"nope\"", "\"position_embedding_type\": null"}});
  const std::string rope =
      absl::StrReplaceAll(nope, {{"\"position_embedding_type\": \"nope\"", "\"position_embedding_type\": \"rope\""}});
  std::vector<common::Hash128> fingerprints;
  for (const std::string& text : {nope, null_positions, rope}) {
    absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
    ASSERT_TRUE(config.ok()) << config.status();
    auto w = ModelWeights::Load(*config, Runfile(kGraniteNopeTiny));
    ASSERT_TRUE(w.ok()) << w.status();
    fingerprints.push_back((*w)->fingerprint());
  }
  EXPECT_EQ(fingerprints[0], fingerprints[1]);
  EXPECT_NE(fingerprints[0], fingerprints[2]);
}

TEST(ModelWeightsTest, FingerprintIgnoresPrefixButSeesEveryWeightByte) {
  const ModelConfig config = Config(kNemotronTiny);
  std::unique_ptr<ModelWeights> base = MustLoad(Runfile(kNemotronTiny));
  ASSERT_NE(base, nullptr);
  TensorMap renamed;
  for (const auto& [name, t] : ReadTensors(kNemotronTiny)) {
    renamed[absl::StartsWith(name, "backbone.") ? "model." + name.substr(9) : name] = t;
  }
  auto w = ModelWeights::Load(config, WriteModel("renamed", renamed));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->fingerprint(), base->fingerprint());

  TensorMap edited = ReadTensors(kNemotronTiny);
  edited.at("backbone.layers.2.mixer.D").bytes[0] ^= 1;  // one ulp of one weight
  w = ModelWeights::Load(config, WriteModel("edited", edited));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE((*w)->fingerprint(), base->fingerprint());

  ModelConfig other_chunk = config;
  other_chunk.mamba.chunk_size = 32;
  w = ModelWeights::Load(other_chunk, Runfile(kNemotronTiny));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE((*w)->fingerprint(), base->fingerprint());
}

TEST(ModelWeightsTest, ShardedCheckpointLoadsToTheSameWeightsAndFingerprint) {
  const TensorMap all = ReadTensors(kNemotronTiny);
  TensorMap first, second;
  std::string weight_map;
  for (const auto& [name, t] : all) {
    const bool in_first = absl::StrContains(name, "layers.") && name < "backbone.layers.4";
    (in_first ? first : second)[name] = t;
    absl::StrAppend(&weight_map, weight_map.empty() ? "" : ",", "\"", name, "\":\"",
                    in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors", "\"");
  }
  ASSERT_FALSE(first.empty());
  const std::string dir = TempDir("sharded");
  WriteFile(dir + "/model-00001-of-00002.safetensors", Serialize(first));
  WriteFile(dir + "/model-00002-of-00002.safetensors", Serialize(second));
  WriteFile(dir + "/model.safetensors.index.json", absl::StrCat("{\"weight_map\":{", weight_map, "}}"));
  auto sharded = ModelWeights::Load(Config(kNemotronTiny), dir);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  std::unique_ptr<ModelWeights> single = MustLoad(Runfile(kNemotronTiny));
  ASSERT_NE(single, nullptr);
  EXPECT_EQ((*sharded)->fingerprint(), single->fingerprint());
  EXPECT_EQ((*sharded)->layer(2).mamba2().in_proj.f32, single->layer(2).mamba2().in_proj.f32);
  EXPECT_EQ((*sharded)->lm_head().f32, single->lm_head().f32);
}

TEST(ModelWeightsTest, Bf16CheckpointConvertsExactlyAndHasItsOwnFingerprint) {
  TensorMap tensors = ReadTensors(kMamba2Tiny);
  for (auto& [name, t] : tensors) {
    std::vector<uint8_t> bf16(t.bytes.size() / 2);
    for (size_t i = 0; i < bf16.size() / 2; ++i) {  // truncate each float to its top 16 bits
      bf16[2 * i] = t.bytes[4 * i + 2];
      bf16[2 * i + 1] = t.bytes[4 * i + 3];
    }
    t = OwnedTensor{DType::kBF16, t.shape, bf16};
  }
  auto w = ModelWeights::Load(Config(kMamba2Tiny), WriteModel("bf16", tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  std::unique_ptr<ModelWeights> fp32 = MustLoad(Runfile(kMamba2Tiny));
  ASSERT_NE(fp32, nullptr);
  // Matrices stay bf16 (no fp32 copy); vectors are widened.
  EXPECT_TRUE((*w)->has_bf16_matrices());
  EXPECT_FALSE(fp32->has_bf16_matrices());
  EXPECT_TRUE((*w)->layer(1).mamba2().out_proj.is_bf16());
  EXPECT_TRUE((*w)->layer(1).mamba2().out_proj.f32.empty());
  // The matrices (tied embeddings once, in_proj and out_proj per layer) cost
  // half; the vectors are fp32 on both sides.
  int64_t matrix_elements = static_cast<int64_t>(fp32->embeddings().size());
  for (const LayerWeights& layer : fp32->layers()) {
    matrix_elements += static_cast<int64_t>(layer.mamba2().in_proj.size() + layer.mamba2().out_proj.size());
  }
  EXPECT_EQ(fp32->resident_bytes() - (*w)->resident_bytes(), 2 * matrix_elements);
  const std::vector<float> got = (*w)->layer(1).mamba2().out_proj.ToFloat32();
  const std::vector<float>& full = fp32->layer(1).mamba2().out_proj.f32;
  ASSERT_EQ(got.size(), full.size());
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &full[i], 4);
    ASSERT_EQ(got[i], kernels::Bf16ToFloat(static_cast<uint16_t>(bits >> 16))) << i;
  }
  EXPECT_NE((*w)->fingerprint(), fp32->fingerprint());
}

TEST(ModelWeightsTest, LegacyMamba2EmbeddingNameIsAccepted) {
  TensorMap tensors = ReadTensors(kMamba2Tiny);
  tensors["backbone.embedding.weight"] = tensors.at("backbone.embeddings.weight");
  tensors.erase("backbone.embeddings.weight");
  auto w = ModelWeights::Load(Config(kMamba2Tiny), WriteModel("legacy_embedding", tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  std::unique_ptr<ModelWeights> base = MustLoad(Runfile(kMamba2Tiny));
  ASSERT_NE(base, nullptr);
  EXPECT_EQ((*w)->fingerprint(), base->fingerprint());
}

TEST(ModelWeightsTest, MissingTensorIsNamed) {
  TensorMap tensors = ReadTensors(kNemotronTiny);
  tensors.erase("backbone.layers.2.mixer.D");
  ExpectInvalid(LoadStatus(Config(kNemotronTiny), tensors, "missing"),
                "missing tensor backbone.layers.2.mixer.D (expected shape [4])");
  tensors = ReadTensors(kNemotronTiny);
  tensors.erase("lm_head.weight");
  ExpectInvalid(LoadStatus(Config(kNemotronTiny), tensors, "missing_head"), "missing tensor lm_head.weight");
  tensors = ReadTensors(kNemotronTiny);
  tensors.erase("backbone.embeddings.weight");
  ExpectInvalid(LoadStatus(Config(kNemotronTiny), tensors, "missing_embeddings"),
                "missing tensor backbone.embeddings.weight");
}

TEST(ModelWeightsTest, WrongShapeIsNamed) {
  TensorMap tensors = ReadTensors(kNemotronTiny);
  OwnedTensor& in_proj = tensors.at("backbone.layers.0.mixer.in_proj.weight");
  in_proj.shape = {196, 16};
  in_proj.bytes.resize(196 * 16 * 4);
  ExpectInvalid(LoadStatus(Config(kNemotronTiny), tensors, "wrong_shape"),
                "tensor backbone.layers.0.mixer.in_proj.weight has shape [196, 16], expected [196, 32]");
  tensors = ReadTensors(kNemotronTiny);
  tensors.at("backbone.layers.0.mixer.conv1d.weight").shape = {128, 4};  // same bytes, rank 2
  ExpectInvalid(LoadStatus(Config(kNemotronTiny), tensors, "conv_rank"),
                "tensor backbone.layers.0.mixer.conv1d.weight has shape [128, 4], expected [128, 1, 4]");
}

TEST(ModelWeightsTest, ConfigOfAnotherModelIsRejectedByShape) {
  absl::Status s = ModelWeights::Load(Config(kDefault), Runfile(kNemotronTiny)).status();
  ExpectInvalid(s, "tensor backbone.embeddings.weight has shape [96, 32], expected [259, 128]");
  s = ModelWeights::Load(Config(kMamba2Tiny), Runfile(kNemotronTiny)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelWeightsTest, UnexpectedTensorsAreListed) {
  TensorMap tensors = ReadTensors(kNemotronTiny);
  tensors["backbone.layers.0.mixer.extra"] = tensors.at("backbone.layers.0.mixer.D");
  ExpectInvalid(LoadStatus(Config(kNemotronTiny), tensors, "extra"),
                "1 unexpected tensor(s) for a nemotron_h model with pattern \"M*M-M*-\": "
                "backbone.layers.0.mixer.extra");
  for (int i = 0; i < 6; ++i) tensors[absl::StrCat("z.extra", i)] = tensors.at("backbone.layers.0.mixer.D");
  absl::Status s = LoadStatus(Config(kNemotronTiny), tensors, "extras");
  ExpectInvalid(s, "7 unexpected tensor(s)");
  EXPECT_THAT(std::string(s.message()), HasSubstr("z.extra3, ..."));
  // A bias the config does not have is unexpected too.
  tensors = ReadTensors(kNemotronTiny);
  tensors["backbone.layers.3.mixer.up_proj.bias"] = OwnedTensor{DType::kF32, {64}, std::vector<uint8_t>(256)};
  ExpectInvalid(LoadStatus(Config(kNemotronTiny), tensors, "bias"), "backbone.layers.3.mixer.up_proj.bias");
}

TEST(ModelWeightsTest, OptionalBiasesFollowTheConfig) {
  ModelConfig config = Config(kNemotronTiny);
  config.mamba.use_conv_bias = false;
  ExpectInvalid(
      ModelWeights::Load(config, Runfile(kNemotronTiny)).status(),
      "unexpected tensor(s) for a nemotron_h model with pattern \"M*M-M*-\": backbone.layers.0.mixer.conv1d.bias");
  config = Config(kNemotronTiny);
  config.mlp.use_bias = true;
  ExpectInvalid(ModelWeights::Load(config, Runfile(kNemotronTiny)).status(),
                "missing tensor backbone.layers.3.mixer.up_proj.bias (expected shape [64])");
  TensorMap tensors = ReadTensors(kNemotronTiny);
  for (int layer : {3, 6}) {
    const std::string p = absl::StrCat("backbone.layers.", layer, ".mixer.");
    tensors[p + "up_proj.bias"] = OwnedTensor{DType::kF32, {64}, std::vector<uint8_t>(256)};
    tensors[p + "down_proj.bias"] = OwnedTensor{DType::kF32, {32}, std::vector<uint8_t>(128)};
  }
  auto w = ModelWeights::Load(config, WriteModel("mlp_bias", tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->layer(3).mlp().up_proj_bias, std::vector<float>(64, 0.0f));
  EXPECT_EQ((*w)->layer(6).mlp().down_proj_bias.size(), 32u);
}

// Falcon-H1's mixer: in_proj.bias exactly when mamba_proj_bias, out_proj.bias
// exactly when projectors_bias, each without the other.
TEST(ModelWeightsTest, FalconH1MixerBiasesAreExpectedAsTheirOwnFlagsSay) {
  const ModelConfig config = Config(kFalconOutBiasTiny);
  ASSERT_FALSE(config.mamba.use_in_proj_bias);
  ASSERT_TRUE(config.mamba.use_out_proj_bias);
  auto w = ModelWeights::Load(config, Runfile(kFalconOutBiasTiny));
  ASSERT_TRUE(w.ok()) << w.status();
  const TensorMap tensors = ReadTensors(kFalconOutBiasTiny);
  for (int64_t i = 0; i < 2; ++i) {
    const Mamba2LayerWeights& m = (*w)->layer(2 * i).parallel().mamba;
    EXPECT_TRUE(m.in_proj_bias.empty());
    EXPECT_EQ(m.out_proj_bias, Floats(tensors.at(absl::StrCat("model.layers.", i, ".mamba.out_proj.bias"))));
  }
  TensorMap missing = tensors;
  missing.erase("model.layers.1.mamba.out_proj.bias");
  ExpectInvalid(LoadStatus(config, missing, "falcon_missing_out_bias"),
                "missing tensor model.layers.1.mamba.out_proj.bias (expected shape [32])");
  // The other flag's tensor is unexpected, and expected (shape [in_proj_rows]) once its flag is set.
  TensorMap extra = tensors;
  extra["model.layers.0.mamba.in_proj.bias"] = OwnedTensor{DType::kF32, {196}, std::vector<uint8_t>(196 * 4)};
  ExpectInvalid(LoadStatus(config, extra, "falcon_extra_in_bias"), "model.layers.0.mamba.in_proj.bias");
  ModelConfig both = config;
  both.mamba.use_in_proj_bias = true;
  ExpectInvalid(ModelWeights::Load(both, Runfile(kFalconOutBiasTiny)).status(),
                "missing tensor model.layers.0.mamba.in_proj.bias (expected shape [196])");
  ModelConfig in_only = both;
  in_only.mamba.use_out_proj_bias = false;
  extra["model.layers.1.mamba.in_proj.bias"] = extra.at("model.layers.0.mamba.in_proj.bias");
  ExpectInvalid(LoadStatus(in_only, extra, "falcon_in_only"), "model.layers.0.mamba.out_proj.bias");
  for (int i = 0; i < 2; ++i) extra.erase(absl::StrCat("model.layers.", i, ".mamba.out_proj.bias"));
  auto reversed = ModelWeights::Load(in_only, WriteModel("falcon_in_only_ok", extra));
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  EXPECT_EQ((*reversed)->layer(0).parallel().mamba.in_proj_bias, std::vector<float>(196, 0.0f));
  EXPECT_TRUE((*reversed)->layer(2).parallel().mamba.out_proj_bias.empty());
}

OwnedTensor F32Tensor(const std::vector<float>& values) {
  OwnedTensor t{DType::kF32, {static_cast<int64_t>(values.size())}, std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

// Bamba and Granite (BambaAttention, GraniteMoeHybridAttention): q/k/v/o_proj
// biases under save_pretrained's names exactly when attention_bias.
TEST(ModelWeightsTest, GraniteAttentionBiasesLoadExactlyWhenTheConfigSaysSo) {
  const ModelConfig config = Config(testing::kGraniteAttnBiasTiny);
  ASSERT_TRUE(config.attention.use_bias);
  auto w = ModelWeights::Load(config, Runfile(testing::kGraniteAttnBiasTiny));
  ASSERT_TRUE(w.ok()) << w.status();
  const TensorMap tensors = ReadTensors(testing::kGraniteAttnBiasTiny);
  for (int64_t i : {0, 2}) {  // "*M*M": decoder layers 0 and 2 attend (engine layers 0 and 4)
    const AttentionLayerWeights& a = (*w)->layer(2 * i).attention();
    const std::string p = absl::StrCat("model.layers.", i, ".self_attn.");
    EXPECT_EQ(a.q_proj_bias, Floats(tensors.at(p + "q_proj.bias")));
    EXPECT_EQ(a.k_proj_bias, Floats(tensors.at(p + "k_proj.bias")));
    EXPECT_EQ(a.v_proj_bias, Floats(tensors.at(p + "v_proj.bias")));
    EXPECT_EQ(a.o_proj_bias, Floats(tensors.at(p + "o_proj.bias")));
    EXPECT_EQ(a.q_proj_bias.size(), 32u);
    EXPECT_EQ(a.k_proj_bias.size(), 16u);
    EXPECT_EQ(a.o_proj_bias.size(), 32u);
  }
  TensorMap missing = tensors;
  missing.erase("model.layers.2.self_attn.k_proj.bias");
  ExpectInvalid(LoadStatus(config, missing, "granite_missing_k_bias"),
                "missing tensor model.layers.2.self_attn.k_proj.bias (expected shape [16])");
  ModelConfig without = config;
  without.attention.use_bias = false;
  ExpectInvalid(ModelWeights::Load(without, Runfile(testing::kGraniteAttnBiasTiny)).status(),
                "model.layers.0.self_attn.o_proj.bias");
}

TEST(ModelWeightsTest, BambaAttentionBiasesLoadUnderSavePretrainedNames) {
  ModelConfig config = Config(testing::kBambaTiny);  // "M*MM": decoder layer 1 attends
  ASSERT_FALSE(config.attention.use_bias);
  config.attention.use_bias = true;
  TensorMap tensors = ReadTensors(testing::kBambaTiny);
  ExpectInvalid(LoadStatus(config, tensors, "bamba_no_bias"),
                "missing tensor model.layers.1.self_attn.q_proj.bias (expected shape [32])");
  const std::string p = "model.layers.1.self_attn.";
  std::vector<float> q(32), k(16), v(16), o(32);
  for (size_t i = 0; i < 32; ++i) q[i] = 0.5f + static_cast<float>(i), o[i] = -static_cast<float>(i);
  for (size_t i = 0; i < 16; ++i) k[i] = 0.25f * static_cast<float>(i), v[i] = 100.0f + static_cast<float>(i);
  tensors[p + "q_proj.bias"] = F32Tensor(q);
  tensors[p + "k_proj.bias"] = F32Tensor(k);
  tensors[p + "v_proj.bias"] = F32Tensor(v);
  tensors[p + "o_proj.bias"] = F32Tensor(o);
  auto w = ModelWeights::Load(config, WriteModel("bamba_bias", tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  const AttentionLayerWeights& a = (*w)->layer(2).attention();
  EXPECT_EQ(a.q_proj_bias, q);
  EXPECT_EQ(a.k_proj_bias, k);
  EXPECT_EQ(a.v_proj_bias, v);
  EXPECT_EQ(a.o_proj_bias, o);
}

// Nemotron-H mlp_bias with MoE blocks: the shared experts' up/down biases
// (NemotronHMLP), none for the routed experts; the '-' layer's as before.
TEST(ModelWeightsTest, NemotronHMoeSharedExpertBiasesLoadWhenMlpBias) {
  const ModelConfig config = Config(testing::kNemotronMoeBiasTiny);  // "ME*E-M"
  ASSERT_TRUE(config.moe.shared_bias);
  auto w = ModelWeights::Load(config, Runfile(testing::kNemotronMoeBiasTiny));
  ASSERT_TRUE(w.ok()) << w.status();
  const TensorMap tensors = ReadTensors(testing::kNemotronMoeBiasTiny);
  for (int64_t i : {1, 3}) {
    const MoeLayerWeights& m = (*w)->layer(i).moe();
    const std::string p = absl::StrCat("backbone.layers.", i, ".mixer.shared_experts.");
    EXPECT_EQ(m.shared_up_bias, Floats(tensors.at(p + "up_proj.bias")));
    EXPECT_EQ(m.shared_down_bias, Floats(tensors.at(p + "down_proj.bias")));
    EXPECT_EQ(m.shared_up_bias.size(), 24u);
    EXPECT_EQ(m.shared_down_bias.size(), 32u);
  }
  EXPECT_EQ((*w)->layer(4).mlp().up_proj_bias, Floats(tensors.at("backbone.layers.4.mixer.up_proj.bias")));
  TensorMap missing = tensors;
  missing.erase("backbone.layers.3.mixer.shared_experts.down_proj.bias");
  ExpectInvalid(LoadStatus(config, missing, "nemotron_missing_shared_bias"),
                "missing tensor backbone.layers.3.mixer.shared_experts.down_proj.bias (expected shape [32])");
  ModelConfig without = config;
  without.moe.shared_bias = false;
  ExpectInvalid(ModelWeights::Load(without, Runfile(testing::kNemotronMoeBiasTiny)).status(),
                "backbone.layers.1.mixer.shared_experts.up_proj.bias");
}

TEST(ModelWeightsTest, MultiTokenPredictionTensorsAreSkipped) {
  TensorMap tensors = ReadTensors(kNemotronTiny);
  tensors["mtp.layers.0.norm.weight"] = tensors.at("backbone.norm_f.weight");
  auto w = ModelWeights::Load(Config(kNemotronTiny), WriteModel("mtp", tensors));
  ASSERT_TRUE(w.ok()) << w.status();
}

// save_pretrained of a Nemotron-H with tie_word_embeddings=true writes its own
// head, and transformers computes the logits with it (model_weights.h).
TEST(ModelWeightsTest, TiedNemotronHUsesItsStoredHeadNotTheEmbeddings) {
  std::unique_ptr<ModelWeights> w = MustLoad(Runfile(kNemotronTiedTiny));
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->config().tie_word_embeddings);
  const TensorMap file = ReadTensors(kNemotronTiedTiny);
  const std::vector<float> head = Floats(file.at("lm_head.weight"));
  const std::vector<float> embeddings = Floats(file.at("backbone.embeddings.weight"));
  ASSERT_NE(head, embeddings);
  EXPECT_EQ(w->lm_head().f32, head);
  EXPECT_EQ(w->embeddings().f32, embeddings);
  EXPECT_NE(&w->lm_head(), &w->embeddings());
  EXPECT_EQ(w->num_parameters(), TotalElements(file));

  // The stored head is fingerprinted: one ulp of it, or the embeddings in its
  // place, is another model.
  TensorMap edited = file;
  edited.at("lm_head.weight").bytes[0] ^= 1;
  auto other = ModelWeights::Load(w->config(), WriteModel("tied_head_edited", edited));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->fingerprint(), w->fingerprint());
  edited.at("lm_head.weight") = file.at("backbone.embeddings.weight");
  other = ModelWeights::Load(w->config(), WriteModel("tied_head_copy", edited));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(&(*other)->lm_head(), &(*other)->embeddings());
  EXPECT_NE((*other)->fingerprint(), w->fingerprint());

  // Without a stored head, a tied model's head is its embeddings.
  edited.erase("lm_head.weight");
  auto headless = ModelWeights::Load(w->config(), WriteModel("tied_headless", edited));
  ASSERT_TRUE(headless.ok()) << headless.status();
  EXPECT_EQ(&(*headless)->lm_head(), &(*headless)->embeddings());
  EXPECT_EQ((*headless)->fingerprint(), (*other)->fingerprint());  // an exact copy adds nothing
}

// Mamba2ForCausalLM ties only a head equal to the embeddings; a different
// stored head is kept (PreTrainedModel.tie_weights), so it is the head here too.
TEST(ModelWeightsTest, TiedHeadStoredAnywayIsSharedWhenACopyAndUsedWhenDifferent) {
  TensorMap tensors = ReadTensors(kMamba2Tiny);
  tensors["lm_head.weight"] = tensors.at("backbone.embeddings.weight");
  auto w = ModelWeights::Load(Config(kMamba2Tiny), WriteModel("tied_copy", tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(&(*w)->lm_head(), &(*w)->embeddings());
  std::unique_ptr<ModelWeights> base = MustLoad(Runfile(kMamba2Tiny));
  ASSERT_NE(base, nullptr);
  EXPECT_EQ((*w)->fingerprint(), base->fingerprint());
  EXPECT_EQ((*w)->num_parameters(), base->num_parameters());

  tensors["lm_head.weight"].bytes[5] ^= 0x10;
  w = ModelWeights::Load(Config(kMamba2Tiny), WriteModel("tied_differs", tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE(&(*w)->lm_head(), &(*w)->embeddings());
  EXPECT_EQ((*w)->lm_head().f32, Floats(tensors.at("lm_head.weight")));
  EXPECT_EQ((*w)->embeddings().f32, base->embeddings().f32);
  EXPECT_NE((*w)->fingerprint(), base->fingerprint());
  EXPECT_EQ((*w)->num_parameters(), TotalElements(tensors));

  // A stored head of the wrong shape is an error even when tied.
  tensors["lm_head.weight"].shape = {32, 96};
  ExpectInvalid(LoadStatus(Config(kMamba2Tiny), tensors, "tied_wrong_shape"),
                "tensor lm_head.weight has shape [32, 96], expected [96, 32]");
}

TEST(ModelWeightsTest, AmbiguousPrefixIsInvalid) {
  TensorMap tensors = ReadTensors(kMamba2Tiny);
  tensors["model.embeddings.weight"] = tensors.at("backbone.embeddings.weight");
  ExpectInvalid(LoadStatus(Config(kMamba2Tiny), tensors, "ambiguous"), "ambiguous embeddings");
}

TEST(ModelWeightsTest, InvalidConfigIsRejectedBeforeReading) {
  ModelConfig config = Config(kNemotronTiny);
  config.mamba.n_groups = 3;
  ExpectInvalid(ModelWeights::Load(config, Runfile(kNemotronTiny)).status(), "n_groups (3)");
}

TEST(ModelWeightsTest, MissingDirectoryIsNotFound) {
  EXPECT_EQ(ModelWeights::LoadDirectory("/nonexistent/model").status().code(), absl::StatusCode::kNotFound);
  ModelConfig config = Config(kNemotronTiny);
  EXPECT_EQ(ModelWeights::Load(config, TempDir("no_weights")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hybridserve::engine

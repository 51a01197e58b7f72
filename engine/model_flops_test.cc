#include "engine/model_flops.h"

#include <vector>

#include "common/runfiles.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

// Tiny configs, one per block kind, with every FLOP count worked out by hand
// below (h = 8 throughout). All values are small integers: exact in double.
ModelConfig Tiny(std::vector<LayerKind> layers) {
  ModelConfig c;
  c.hidden_size = 8;
  c.vocab_size = 16;
  c.layers = std::move(layers);
  // Mamba2: d_inner = 2*4 = 8, conv_dim = 8 + 2*1*4 = 16.
  //   in_proj 2*8*(2*8 + 2*1*4 + 2) = 416, conv 2*16*4 = 128,
  //   scan 4*8*4 = 128, out_proj 2*8*8 = 128: 800.
  c.mamba.num_heads = 2;
  c.mamba.head_dim = 4;
  c.mamba.state_size = 4;
  c.mamba.n_groups = 1;
  c.mamba.conv_kernel = 4;
  c.mamba.chunk_size = 16;
  // Attention: q_dim 2*4 = 8, kv_dim 1*4 = 4.
  //   2*8*(8 + 2*4) + 2*8*8 = 384 per token; 4*8 = 32 per context token.
  c.attention.num_heads = 2;
  c.attention.num_kv_heads = 1;
  c.attention.head_dim = 4;
  c.mlp.intermediate_size = 16;        // 4*8*16 = 512
  c.gated_mlp.intermediate_size = 16;  // 6*8*16 = 768
  return c;
}

constexpr double kMamba = 800;
constexpr double kAttention = 384;
constexpr double kAttentionContext = 32;

TEST(ModelFlopsTest, PureMamba2HasNoContextTerm) {
  const PrefillCost cost = ModelPrefillCost(Tiny({LayerKind::kMamba2, LayerKind::kMamba2}));
  EXPECT_EQ(cost.flops_per_token, 2 * kMamba);
  EXPECT_EQ(cost.flops_per_token_context, 0);
}

TEST(ModelFlopsTest, NemotronHSumsMambaAttentionAndMlp) {
  const PrefillCost cost = ModelPrefillCost(Tiny({LayerKind::kMamba2, LayerKind::kAttention, LayerKind::kMlp}));
  EXPECT_EQ(cost.flops_per_token, 800 + 384 + 512);
  EXPECT_EQ(cost.flops_per_token_context, kAttentionContext);
  // Tokens 0..2: 3*1696 + 32*(1 + 2 + 3).
  EXPECT_EQ(cost.PrefixFlops(3), 3 * 1696 + 32 * 6);
  EXPECT_EQ(cost.PrefixFlops(0), 0);
}

TEST(ModelFlopsTest, GatedMlpCountsGateUpAndDown) {
  // Bamba: two decoder layers, each a mixer then a gated MLP.
  const PrefillCost cost =
      ModelPrefillCost(Tiny({LayerKind::kMamba2, LayerKind::kGatedMlp, LayerKind::kAttention, LayerKind::kGatedMlp}));
  EXPECT_EQ(cost.flops_per_token, 800 + 768 + 384 + 768);
  EXPECT_EQ(cost.flops_per_token_context, kAttentionContext);
}

TEST(ModelFlopsTest, MoeCountsRouterActiveExpertsAndSharedExpert) {
  ModelConfig c = Tiny({LayerKind::kAttention, LayerKind::kMoe});
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.intermediate_size = 16;
  c.moe.shared_intermediate_size = 8;
  c.moe.expert = ExpertKind::kSwiGlu;
  // Router 2*8*4 = 64. A SwiGLU expert of 16: up 2*8*32 = 512, down 2*16*8 =
  // 256: 768, two active: 1536. The shared one of 8: 2*8*16 + 2*8*8 = 384.
  EXPECT_EQ(ModelPrefillCost(c).flops_per_token, kAttention + 64 + 1536 + 384);
  // relu2 experts (Nemotron-H): up 2*8*16 = 256, down 256: 512, two: 1024;
  // shared of 8: 2*8*8 + 2*8*8 = 256.
  c.moe.expert = ExpertKind::kRelu2;
  EXPECT_EQ(ModelPrefillCost(c).flops_per_token, kAttention + 64 + 1024 + 256);
  // No shared expert, one active expert.
  c.moe.shared_intermediate_size = 0;
  c.moe.top_k = 1;
  EXPECT_EQ(ModelPrefillCost(c).flops_per_token, kAttention + 64 + 512);
  EXPECT_EQ(ModelPrefillCost(c).flops_per_token_context, kAttentionContext);
}

TEST(ModelFlopsTest, LatentMoeCountsItsProjectionsAndNarrowerExperts) {
  ModelConfig c = Tiny({LayerKind::kAttention, LayerKind::kMoe});
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.intermediate_size = 16;
  c.moe.shared_intermediate_size = 8;
  c.moe.expert = ExpertKind::kRelu2;
  c.moe.latent_size = 4;
  // Router 2*8*4 = 64 (on hidden). fc1 2*8*4 = 64 and fc2 2*4*8 = 64: 128.
  // A relu2 expert of 16 on 4 channels: up 2*4*16 = 128, down 128: 256, two
  // active: 512. The shared one reads hidden: 2*8*8 + 2*8*8 = 256.
  EXPECT_EQ(ModelPrefillCost(c).flops_per_token, kAttention + 64 + 128 + 512 + 256);
  // Without the projections (latent_size 0) it is the hidden-wide block above.
  c.moe.latent_size = 0;
  EXPECT_EQ(ModelPrefillCost(c).flops_per_token, kAttention + 64 + 1024 + 256);
}

TEST(ModelFlopsTest, ParallelBlockCountsBothMixers) {
  // Falcon-H1: a parallel block, then a gated MLP.
  const PrefillCost cost = ModelPrefillCost(Tiny({LayerKind::kParallel, LayerKind::kGatedMlp}));
  EXPECT_EQ(cost.flops_per_token, kMamba + kAttention + 768);
  EXPECT_EQ(cost.flops_per_token_context, kAttentionContext);
}

TEST(ModelFlopsTest, ZambaHybridCountsSharedBlockAdaptersAndLinear) {
  ModelConfig c = Tiny({LayerKind::kMamba2, LayerKind::kZambaHybrid});
  c.family = ModelFamily::kZamba2;
  // The shared block attends over [h | e] (16 wide): 4 heads of 4, q = kv = 16.
  c.attention.num_heads = 4;
  c.attention.num_kv_heads = 4;
  c.attention.head_dim = 4;
  c.zamba.num_mem_blocks = 1;
  c.zamba.use_adapters = true;
  c.zamba.adapter_rank = 2;
  // Attention: 2*16*(16 + 2*16) + 2*16*8 = 1536 + 256 = 1792.
  // q, k, v adapters: down 2*16*(3*2) = 192, up 2*2*(16 + 2*16) = 192: 384.
  // Gated MLP 6*8*16 = 768; its adapter: down 2*8*2 = 32, up 2*2*32 = 128: 160.
  // linear 2*8*8 = 128. With the layer's own Mamba2: 800 + 3232 = 4032.
  const PrefillCost cost = ModelPrefillCost(c);
  EXPECT_EQ(cost.flops_per_token, kMamba + 4032);
  EXPECT_EQ(cost.flops_per_token_context, 4 * 16);
  c.zamba.use_adapters = false;  // the MLP's adapter stays (Zamba2 has it either way)
  EXPECT_EQ(ModelPrefillCost(c).flops_per_token, kMamba + 4032 - 384);
}

TEST(ModelFlopsTest, DefaultModelKnownAnswer) {
  // models/default: h 128; 5 Mamba2 (d_inner 256, 2 groups of d_state 32,
  // 8 heads): 2*128*648 + 2*384*4 + 4*256*32 + 2*256*128 = 267264 each;
  // 2 attention (q 128, kv 64): 2*128*256 + 2*128*128 = 98304 each; 5 MLP
  // of 256: 131072 each. A = 4*128*2.
  absl::StatusOr<ModelConfig> config = LoadModelConfig(common::Runfile("models/default/config.json"));
  ASSERT_TRUE(config.ok()) << config.status();
  const PrefillCost cost = ModelPrefillCost(*config);
  EXPECT_EQ(cost.flops_per_token, 5 * 267264 + 2 * 98304 + 5 * 131072);
  EXPECT_EQ(cost.flops_per_token_context, 1024);
}

}  // namespace
}  // namespace hybridserve::engine
